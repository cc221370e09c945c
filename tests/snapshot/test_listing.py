"""A first capture takes the native walk's listings (``scan_listing``) instead of listing
every directory again, and reads ahead of its walk (``_ReadAhead``), issue 12: the same top
tree and the same stored objects as the walk that lists for itself, excluded files kept out
of the store, and a directory that changes between the listing and the walk is walked again
by the next capture."""

from __future__ import annotations

import dataclasses
import os
import stat
import time
from typing import TYPE_CHECKING

import pytest

from sprite_env.snapshot import capture as capture_mod
from sprite_env.snapshot.capture import IN_PLACE_MIN, CaptureResult, Excludes, capture
from sprite_env.snapshot.dircache import RACY_NS
from sprite_env.store.repository import open_store
from tests.helpers import trees
from tests.snapshot.test_bulk_read import _objects

if TYPE_CHECKING:
    from sprite_env.snapshot.dircache import CachedDir

native = pytest.importorskip("sprite_env._native")


def _layer(root: str) -> None:
    trees.build_tree(root, trees.sample_spec(socket=True))
    for d in range(12):  # more directories than the read-ahead window below
        sub = os.path.join(root, "many", f"d{d:02d}", "leaf")
        os.makedirs(sub)
        for i in range(d % 4 + 1):
            with open(os.path.join(sub, f"f{i}"), "wb") as f:
                f.write(os.urandom(100 * d + i))
    for i, big in enumerate(("many/d02/big", "many/d09/leaf/big", "many/d03/big.key")):
        with open(os.path.join(root, big), "wb") as f:  # (the .key one is excluded)
            f.write(os.urandom(IN_PLACE_MIN + 4096 * i))
    os.makedirs(os.path.join(root, "skip", "inner"))
    with open(os.path.join(root, "skip", "inner", "secret"), "wb") as f:
        f.write(b"an excluded directory's file " * 10)
    with open(os.path.join(root, "many", "d03", "private.key"), "wb") as f:
        f.write(b"an excluded file " * 10)
    # Past the racy window: a directory changed within RACY_NS of a capture's start gets a
    # racy signature, so two captures in a row would otherwise differ by their timing.
    time.sleep(RACY_NS / 1e9 * 1.5)


EXCLUDES = [b"skip", b"*.key", b"[m]any/d07"]  # '[': not evaluated in C, the walk does


def _capture(
    root: str, store: str, listing: bool, cache: dict[bytes, CachedDir] | None = None
) -> tuple[CaptureResult, str]:
    saved = capture_mod._scan_listing
    if not listing:
        capture_mod._scan_listing = None  # type: ignore[assignment]
    try:
        with open_store(store, create=True) as s, s.writer() as w:
            r = capture(root, w, s.read, cache, excludes=Excludes(list(EXCLUDES)))
            w.commit()
            return r, store
    finally:
        capture_mod._scan_listing = saved


def test_the_listing_is_lstat_of_every_child(tmp_path: os.PathLike[str]) -> None:
    root = os.path.join(os.fspath(tmp_path), "layer")
    _layer(root)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        got = native.scan_listing(fd, os.fstat(fd).st_dev, [], [b"skip"], 3)
    finally:
        os.close(fd)
    broot = os.fsencode(root)
    want = {}
    for top, dirs, _files in os.walk(broot):
        rel = os.path.relpath(top, broot)
        rel = b"" if rel == b"." else rel
        if rel == b"skip" or rel.startswith(b"skip/"):
            continue  # excluded by a pattern: not descended into
        names = sorted(os.listdir(top))
        want[rel] = [(n, os.lstat(os.path.join(top, n))) for n in names]
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(top, d))]
    assert got.keys() == want.keys()
    for rel, kids in want.items():
        assert [n for n, _ in got[rel]] == [n for n, _ in kids], rel
        for (_name, a), (_, b) in zip(got[rel], kids, strict=True):
            assert isinstance(a, os.stat_result)
            # every field but the access time (the listing itself may not move it, lstat
            # does not either, but another reader of the test tree could)
            fields = [f for f in dir(b) if f.startswith("st_") and "atime" not in f]
            assert {f: getattr(a, f) for f in fields} == {f: getattr(b, f) for f in fields}
    assert any(stat.S_ISSOCK(st.st_mode) for _, st in got[b"run"])  # sockets are listed
    assert [n for n, _ in got[b""]].count(b"skip") == 1  # the excluded child is listed


@pytest.mark.parametrize("window", [1, 3, 64])
def test_the_same_tree_and_objects_as_listing_in_the_walk(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch, window: int
) -> None:
    work = os.fspath(tmp_path)
    root = os.path.join(work, "layer")
    _layer(root)
    monkeypatch.setattr(capture_mod, "AHEAD_DIRS", window)
    a, store_a = _capture(root, os.path.join(work, "listed"), True)
    b, store_b = _capture(root, os.path.join(work, "walked"), False)
    assert a.top_tree == b.top_tree
    # (files_read may differ by a hard link's member: one is read again when the walk meets
    # it before its group's first read finished, whichever way the directory was listed)
    keep = {"files_read": 0, "bytes_read": 0}
    assert dataclasses.replace(a.stats, **keep) == dataclasses.replace(b.stats, **keep)
    assert sorted(w.to_json()["path"] for w in a.warnings) == sorted(
        w.to_json()["path"] for w in b.warnings
    )
    assert {p: (c.tree, c.stat) for p, c in a.cache_changed.items()} == {
        p: (c.tree, c.stat) for p, c in b.cache_changed.items()
    }
    objects = _objects(store_a)
    assert objects == _objects(store_b)
    stored = b"".join(payload for _, _, _, payload in objects.values())
    assert b"an excluded" not in stored  # (stored compressed or raw: neither is repetitive)


def test_every_small_file_is_read_ahead(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a window wider than the tree, the walk starts no batch of its own: every
    directory's small files were started before it got there."""
    work = os.fspath(tmp_path)
    root = os.path.join(work, "layer")
    _layer(root)
    by_walk = []
    flush = capture_mod._Batches.flush

    def counted(self: capture_mod._Batches) -> None:
        if self.group.items:
            by_walk.append([name for _, name, _ in self.group.items])
        flush(self)

    monkeypatch.setattr(capture_mod._Batches, "flush", counted)
    r, _ = _capture(root, os.path.join(work, "store"), True)
    assert r.stats.files_read > 20
    assert by_walk == []


def test_big_files_are_read_from_the_start(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The big files the walk will read are started before it begins and taken by it (the
    excluded one is not read at all); one that changed between the listing and its early
    read ends with another stat than the walk's listing and is read again by the walk."""
    work = os.fspath(tmp_path)
    root = os.path.join(work, "layer")
    _layer(root)
    seen: list[capture_mod.Capturer] = []
    early: list[bytes] = []
    start_big = capture_mod.Capturer._start_big
    listing = native.scan_listing

    def then_change(*args: object) -> object:
        out = listing(*args)
        with open(os.path.join(root, "many", "d02", "big"), "r+b") as f:
            f.write(b"changed after the listing")
        return out

    def started(self: capture_mod.Capturer, fd: int) -> None:
        seen.append(self)
        start_big(self, fd)
        early.extend(sorted(self._early))

    monkeypatch.setattr(capture_mod.Capturer, "_start_big", started)
    monkeypatch.setattr(capture_mod, "_scan_listing", then_change)
    a, store_a = _capture(root, os.path.join(work, "listed"), True)
    monkeypatch.setattr(capture_mod, "_scan_listing", listing)
    (c,) = seen
    mine = [p for p in early if p.startswith(b"many/")]  # (the sample tree has its own)
    assert mine == [b"many/d02/big", b"many/d09/leaf/big"]
    assert c.early_started == len(early) >= 3
    assert c.early_taken == c.early_started - 1  # d02/big changed: read again by the walk
    b, store_b = _capture(root, os.path.join(work, "walked"), False)
    assert a.top_tree == b.top_tree  # the changed version, in both
    assert _objects(store_b).keys() <= _objects(store_a).keys()


def test_a_directory_changed_after_its_listing_is_walked_again(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file created after the native walk listed its directory is missed by this capture
    (as one created after a ``scandir`` would be), one removed is left out, and the files
    cache's row is the listing the walk used: the next capture finds the directory changed
    and captures what is there."""
    work = os.fspath(tmp_path)
    root = os.path.join(work, "layer")
    _layer(root)
    d = os.path.join(root, "many", "d05", "leaf")
    listing = native.scan_listing

    def then_change(*args: object) -> object:
        out = listing(*args)
        with open(os.path.join(d, "new"), "wb") as f:
            f.write(b"created after the listing")
        os.unlink(os.path.join(d, "f0"))
        return out

    monkeypatch.setattr(capture_mod, "_scan_listing", then_change)
    store = os.path.join(work, "store")
    with open_store(store, create=True) as s, s.writer() as w:
        first = capture(root, w, s.read)
        w.commit()
    monkeypatch.setattr(capture_mod, "_scan_listing", listing)
    assert first.warnings == [] or all(w.code == "socket_skipped" for w in first.warnings)
    with open_store(store) as s, s.writer() as w:
        second = capture(root, w, s.read, first.cache_changed)
        w.commit()
    with open_store(os.path.join(work, "fresh"), create=True) as s, s.writer() as w:
        fresh = capture(root, w, s.read)
        w.commit()
    assert first.top_tree != fresh.top_tree
    assert second.top_tree == fresh.top_tree
    assert first.stats.files == fresh.stats.files - 1  # f0 gone, "new" not listed yet
