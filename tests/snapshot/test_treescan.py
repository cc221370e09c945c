"""The native full walk (``scan_tree``, issue 11.4): what it vouches for, and the oracle.

A full walk with a files cache first lets ``scan_tree`` compare every directory with its
row in one native call, then walks only what it could not vouch for. The oracle: that
capture equals, field by field, the Python full walk (one ``scan_dir`` per directory) of
the same state from the same files cache at the same instant, and its top tree equals a
walk that trusts nothing.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import shutil
import socket
import subprocess
import time
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sprite_env.snapshot import capture as capture_mod
from sprite_env.snapshot import dircache
from sprite_env.snapshot.capture import Capturer, CaptureResult, Excludes
from sprite_env.store import open_store
from tests.helpers import trees
from tests.journal.test_oracle import NAMES, World, _seed

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sprite_env.ids import ObjectId
    from sprite_env.snapshot.dircache import CachedDir
    from sprite_env.store import Store

native = pytest.importorskip("sprite_env._native")
PAST_RACY = dircache.RACY_NS / 1e9 + 0.01


class Pair:
    """One layer captured like a full walk does, from a files cache kept between captures:
    each time twice from the same rows at the same instant, with the native walk and with
    the Python one, and the two results compared field by field."""

    def __init__(self, root: str, store: Store, excludes: Excludes | None = None) -> None:
        self.root = root
        self.store = store
        self.excludes = excludes or Excludes()
        self.cache: dict[bytes, CachedDir] = {}

    def _run(
        self, start_ns: int, *, scan: bool, reread: frozenset[bytes]
    ) -> tuple[CaptureResult, Capturer]:
        with self.store.writer() as w, pytest.MonkeyPatch.context() as mp:
            if not scan:
                mp.setattr(capture_mod, "_scan_tree", None)
            c = Capturer(
                os.fsencode(self.root),
                w,
                self.store.read,
                dict(self.cache),
                excludes=self.excludes,
                reread=reread,
            )
            c.start_ns = start_ns  # the same instant: the same racy timestamps
            r = c.run()
            w.flush()
            w.commit()
        return r, c

    def capture(self, reread: frozenset[bytes] | None = None) -> tuple[CaptureResult, Capturer]:
        if reread is None:  # as the journal's plan names them (a full walk's too)
            reread = _mapped_writable(os.fsencode(self.root))
        start = time.time_ns()
        r, c = self._run(start, scan=True, reread=reread)
        want, _ = self._run(start, scan=False, reread=reread)
        assert r.top_tree == want.top_tree
        # (files_read may differ: two names of a hard-link group on two reader threads at
        # once are both read, whichever walk)
        assert _counts(r) == _counts(want)
        assert sorted(r.warnings, key=repr) == sorted(want.warnings, key=repr)
        assert r.cache_changed == want.cache_changed
        assert r.cache_removed == want.cache_removed
        assert not r.cache_removed_trees
        assert (r.walk, r.walk_reason) == (want.walk, want.walk_reason) == ("full", "")
        assert r.memo is not None
        assert want.memo is not None
        assert r.memo.totals == want.memo.totals
        assert r.memo.link_dirs == want.memo.link_dirs
        assert r.memo.link_inos == want.memo.link_inos
        assert r.memo.root_ino == want.memo.root_ino
        for p in r.cache_removed:
            self.cache.pop(p, None)
        self.cache.update(r.cache_changed)
        return r, c

    def truth(self) -> ObjectId:
        """The top tree of a walk that trusts nothing (no files cache)."""
        with self.store.writer() as w:
            top = Capturer(
                os.fsencode(self.root), w, self.store.read, {}, excludes=self.excludes
            ).run()
            w.flush()
            w.commit()
        return top.top_tree


def _mapped_writable(root: bytes) -> frozenset[bytes]:
    """Files below ``root`` this process maps shared and writable: a write through the
    mapping moves no signature until written back."""
    out = set()
    with open("/proc/self/maps", "rb") as f:
        for line in f.read().split(b"\n"):
            parts = line.split(None, 5)
            shared_writable = len(parts) == 6 and parts[1][1:2] == b"w" and parts[1][3:4] == b"s"
            if shared_writable and parts[5].startswith(root + b"/"):
                out.add(parts[5][len(root) + 1 :])
    return frozenset(out)


def _counts(r: CaptureResult) -> tuple[int, ...]:
    s = r.stats
    return (s.files, s.dirs, s.symlinks, s.specials, s.bytes, s.dirs_reused)


@pytest.fixture
def pair_for(tmp_path: os.PathLike[str]) -> Iterator[Any]:
    stores: list[Store] = []

    def make(root: str, excludes: Excludes | None = None) -> Pair:
        s = open_store(os.path.join(os.fspath(tmp_path), f"store{len(stores)}"), create=True)
        stores.append(s)
        return Pair(root, s, excludes)

    yield make
    for s in stores:
        s.close()


def _scan(root: bytes, cache: dict[bytes, CachedDir], **kw: Any) -> tuple[list[bytes], Any]:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        rows = {p: c.stat for p, c in cache.items()}
        return native.scan_tree(  # type: ignore[no-any-return]
            fd,
            kw.get("now", time.time_ns()),
            dircache.RACY_NS,
            os.fstat(fd).st_dev,
            rows,
            kw.get("inodes", []),
            kw.get("patterns", []),
            kw.get("threads", 2),
        )
    finally:
        os.close(fd)


def _dirs(root: bytes) -> list[bytes]:
    """Every directory below ``root`` on its file system (relative; ``b""`` the root)."""
    out = [b""]
    dev = os.lstat(root).st_dev
    for top, dnames, _ in os.walk(root):
        rel = top[len(root) + 1 :]
        for d in list(dnames):
            if os.path.islink(os.path.join(top, d)) or os.lstat(os.path.join(top, d)).st_dev != dev:
                dnames.remove(d)
                continue
            out.append(rel + b"/" + d if rel else d)
    return out


def _at_or_below(p: bytes, top: bytes) -> bool:
    return not top or p == top or p.startswith(top + b"/")


def test_every_directory_is_dirty_exactly_where_scan_dir_differs(
    tmp_path: os.PathLike[str], pair_for: Any
) -> None:
    root = os.path.join(os.fsencode(tmp_path), b"t")
    trees.build_tree(root, trees.sample_spec(socket=True))
    time.sleep(PAST_RACY)
    pair = pair_for(os.fsdecode(root))
    pair.capture()
    with open(os.path.join(root, b"etc", b"passwd"), "ab") as f:
        f.write(b"changed\n")  # etc is dirty: its row holds the old signature
    time.sleep(PAST_RACY)
    now = time.time_ns()
    for threads in (1, 2, 4):
        dirty, totals = _scan(root, pair.cache, now=now, threads=threads)
        assert len(dirty) == len(set(dirty))
        expect_dirty, counts = set(), {}
        for rel in _dirs(root):
            fd = os.open(os.path.join(root, rel) if rel else root, os.O_RDONLY | os.O_DIRECTORY)
            try:
                blob, _subs, files, nbytes, links, specials, odd = native.scan_dir(
                    fd, now, dircache.RACY_NS, os.fstat(fd).st_dev
                )
            finally:
                os.close(fd)
            row = pair.cache.get(rel)
            if odd or row is None or row.stat != blob:
                expect_dirty.add(rel)
            counts[rel] = (files, 1, links, specials, nbytes)
        assert set(dirty) == expect_dirty
        assert {b"etc", b"run", b"hard", b"times"} <= expect_dirty  # a change, socket, links, 2100
        clean = {rel for rel in counts if not any(_at_or_below(d, rel) for d in expect_dirty)}
        assert set(totals) == clean
        assert b"deep" in clean
        for rel in clean:
            below = [p for p in counts if _at_or_below(p, rel)]
            want = tuple(sum(counts[p][i] for p in below) for i in range(5))
            assert totals[rel] == want


def test_an_unchanged_layer_is_walked_in_native_code_only(
    tmp_path: os.PathLike[str], pair_for: Any
) -> None:
    root = os.path.join(os.fspath(tmp_path), "t")
    # without the file dated 2100 (always racy) and the hard links (always re-derived)
    spec = {k: v for k, v in trees.sample_spec().items() if not k.startswith((b"times", b"hard"))}
    trees.build_tree(root, spec)
    time.sleep(PAST_RACY)
    pair = pair_for(root)
    first, c = pair.capture()
    assert c.visited  # no rows yet: the native walk has nothing to vouch with
    again, c = pair.capture()
    assert again.top_tree == first.top_tree == pair.truth()
    assert c.visited == set()  # every directory kept on the native walk's word
    assert c.kept == {b""}
    assert again.stats.dirs_reused == again.stats.dirs == first.stats.dirs
    assert again.stats.files_read == 0
    assert (again.stats.files, again.stats.bytes) == (first.stats.files, first.stats.bytes)


def test_mount_points_excludes_sockets_links_and_rereads(
    tmp_path: os.PathLike[str], pair_for: Any
) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    root = os.path.join(os.fspath(tmp_path), "t")
    for d in ("mnt", "store/packs", "skip/deep", "brk/x1", "keep/x2", "ok/sub", "ln"):
        os.makedirs(os.path.join(root, d))
    for f in ("skip/deep/f", "brk/x1/f", "keep/x2/f", "ok/sub/f", "ok/f.log", "ln/a", "m"):
        with open(os.path.join(root, f), "w") as out:
            out.write(f)
    os.link(os.path.join(root, "ln", "a"), os.path.join(root, "ln", "b"))
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.path.join(root, "ok", "sock"))
    s.close()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", os.path.join(root, "mnt")], check=True)
    try:
        with open(os.path.join(root, "mnt", "inside"), "w") as out:
            out.write("another file system")
        ex = Excludes([b"skip", b"*.log", b"b[r]k/x?"])  # '[': left to the rows
        ex.add_dir(os.path.join(root, "store"))
        time.sleep(PAST_RACY)
        pair = pair_for(root, ex)
        pair.capture()
        r, _c = pair.capture()
        assert r.top_tree == pair.truth()
        assert {w.code for w in r.warnings} == {"mount_point", "socket_skipped"}
        st_store = os.stat(os.path.join(root, "store"))
        dirty, totals = _scan(
            os.fsencode(root),
            pair.cache,
            inodes=[(st_store.st_dev, st_store.st_ino)],
            patterns=ex.patterns,
        )
        # not descended into: the mount point, the excluded store and pattern 'skip'
        for p in totals.keys() | set(dirty):
            assert not p.startswith((b"mnt", b"store", b"skip")), p
        assert b"brk/x1" in dirty  # reached ('[' is not evaluated natively), and it has no row
        assert b"brk" in dirty  # its row lacks what the pattern left out
        # the parents of all that, of the socket and of the hard links: walked in Python
        assert {b"", b"ok", b"ln"} <= set(dirty)
        assert b"keep" in totals
        assert b"ok/sub" in totals
        # a file mapped writable is read again although its signature did not move
        os.unlink(os.path.join(root, "ln", "b"))  # (a hard-link group is read every time)
        time.sleep(PAST_RACY)
        assert pair.capture()[0].stats.files_read == 1  # ln/a: its ctime moved
        r, c = pair.capture(frozenset({b"keep/x2/f"}))
        assert b"keep/x2" in c.visited
        assert r.stats.files_read == 1
        assert r.top_tree == pair.truth()
    finally:
        subprocess.run(["umount", "-l", os.path.join(root, "mnt")], check=False)


def test_a_hard_link_group_is_named_by_its_first_member_in_walk_order(
    tmp_path: os.PathLike[str], pair_for: Any
) -> None:
    # a/ gets a new name of b/f3 (a changed directory), b/ does not change: a/a comes first
    # in the walk (names sorted, depth first), so the group is named a/a in both entries,
    # whichever directory a shortcut would capture first (the oracle test found this)
    layer = os.path.join(os.fspath(tmp_path), "layer")
    os.mkdir(layer)
    _seed(layer)
    time.sleep(PAST_RACY)
    pair = pair_for(layer)
    pair.capture()
    os.link(os.path.join(layer, "b", "f3"), os.path.join(layer, "a", "a"))
    with open(os.path.join(layer, "a", "a"), "ab") as f:
        f.write(b"+")
    time.sleep(PAST_RACY)
    assert pair.capture()[0].top_tree == pair.truth()


PATTERN = st.text("ab/*?", min_size=1, max_size=6).map(str.encode)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(pattern=PATTERN)
def test_native_patterns_match_as_fnmatchcase(tmp_path: os.PathLike[str], pattern: bytes) -> None:
    root = os.path.join(os.fsencode(tmp_path), b"p")
    if not os.path.isdir(root):
        for d in (b"a/b/ab", b"b/a", b"ab/ba/a", b"a*/?", b"ba"):
            os.makedirs(os.path.join(root, d))
    paths = [p for p in _dirs(root) if p]
    dirty, totals = _scan(root, {}, patterns=[pattern])
    reached = set(dirty) | set(totals)
    for p in paths:
        parent_excluded = any(
            fnmatch.fnmatchcase(p[:i], pattern) for i in range(len(p)) if p[i : i + 1] == b"/"
        )
        if not parent_excluded:
            assert (p not in reached) == fnmatch.fnmatchcase(p, pattern), (p, pattern)


def test_bad_arguments_are_errors_not_crashes(tmp_path: os.PathLike[str]) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(TypeError, match="bytes to bytes"):
            native.scan_tree(fd, 0, 0, 0, {b"": "str"}, [], [], 2)
        with pytest.raises(TypeError, match="patterns must be bytes"):
            native.scan_tree(fd, 0, 0, 0, {}, [], ["*"], 2)
        with pytest.raises(TypeError):
            native.scan_tree(fd, 0, 0, 0, {}, [(1,)], [], 2)
        assert native.scan_tree(fd, 0, 0, os.fstat(fd).st_dev, {}, [], [], 0) == ([b""], {})
    finally:
        os.close(fd)
    with pytest.raises(OSError, match="Bad file descriptor"):
        native.scan_tree(-1, 0, 0, 0, {}, [], [], 2)


class Layer(World):
    """The journal oracle's changes plus what only a full walk must get right here."""

    def step(self, data: Any) -> str:
        extra = data.draw(st.sampled_from(["socket", "excluded", "none", "none", "none"]))
        dirs = self.listing()[0]
        target = os.path.join(data.draw(st.sampled_from(dirs)), data.draw(st.sampled_from(NAMES)))
        with contextlib.suppress(OSError):
            if extra == "socket":
                s = socket.socket(socket.AF_UNIX)
                try:
                    s.bind(self.p(target))
                finally:
                    s.close()
            elif extra == "excluded":
                os.makedirs(self.p(os.path.join(target, "cache")), exist_ok=True)
                with open(self.p(os.path.join(target, "x.tmp")), "w") as f:
                    f.write("excluded by pattern")
        return super().step(data)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_the_native_full_walk_equals_the_python_one(
    data: Any, tmp_path: os.PathLike[str], pair_for: Any
) -> None:
    layer = os.path.join(os.fspath(tmp_path), "layer")
    shutil.rmtree(layer, ignore_errors=True)
    os.mkdir(layer)
    _seed(layer)
    world = Layer(layer)
    pair = pair_for(layer, Excludes([b"*/cache", b"*.tmp", b"[c]/d/a"]))
    try:
        if data.draw(st.booleans()):
            time.sleep(PAST_RACY)
        pair.capture()
        for _round in range(data.draw(st.integers(2, 5))):
            for _ in range(data.draw(st.integers(1, 5))):
                world.step(data)
            if data.draw(st.integers(0, 2)):
                time.sleep(PAST_RACY)  # past the racy window: the rows alone decide
            r, _c = pair.capture()
            assert r.top_tree == pair.truth()
    finally:
        world.close()
