"""What a restore does where its writes are cheap: files whose only change is their mtime
(git freshening its objects) get it back in one native call per directory
(``touch_captured``, ``Restorer._touch``), through a descriptor of the very inode the
capture saw, anything else left to ``_fix_meta``, which decides each on its own (a planted
hard link keeps its own metadata, issue 15); and its flush, begun while the last writes
land, fails the restore wherever a write-back error is reported."""

from __future__ import annotations

import os
import stat
from typing import Any

import pytest

from sprite_env.checkpoints import Engine
from sprite_env.checkpoints.engine import RestoreFailed
from sprite_env.snapshot import restore as restore_mod
from sprite_env.store.check import check
from tests.helpers import trees
from tests.helpers.races import when_restore_starts

pytestmark = pytest.mark.skipif(
    restore_mod._touch_captured is None, reason="built without touch_captured"
)

NEW_NS = 2_000_000_000_123_456_789
OLD_NS = 1_000_000_000_987_654_321


def _item(path: str, name: bytes, new_ns: int) -> tuple[bytes, int, int, int, int, int, int, int]:
    st = os.lstat(path)
    return (name, st.st_mode, st.st_uid, st.st_gid, st.st_nlink, st.st_mtime_ns, st.st_size, new_ns)


def test_touch_captured_sets_only_the_inode_it_was_told_of(tmp_path: os.PathLike[str]) -> None:
    d = os.fspath(tmp_path)
    j = os.path.join
    for n in ("same", "mode", "size", "owner", "links", "gone", "sym-target"):
        with open(j(d, n), "wb") as f:
            f.write(b"x" * 10)
    items = [_item(j(d, n), n.encode(), NEW_NS) for n in ("same", "mode", "size", "links", "gone")]
    os.chmod(j(d, "mode"), 0o600)  # each of these is no longer what was captured
    with open(j(d, "size"), "ab") as f:
        f.write(b"y")
    os.link(j(d, "links"), j(d, "links2"))
    os.unlink(j(d, "gone"))
    os.symlink("sym-target", j(d, "sym"))
    os.mkfifo(j(d, "fifo"))
    os.mkdir(j(d, "dir"))
    target = os.lstat(j(d, "sym-target"))
    # a symlink (not followed), a FIFO and a directory are no regular file
    items += [
        (b"sym", stat.S_IFREG | 0o644, 0, 0, 1, target.st_mtime_ns, 10, NEW_NS),
        _item(j(d, "fifo"), b"fifo", NEW_NS),
        _item(j(d, "dir"), b"dir", NEW_NS),
    ]
    if os.geteuid() == 0:
        items.append(_item(j(d, "owner"), b"owner", NEW_NS))
        os.chown(j(d, "owner"), 1000, 1000)
    before = {n: os.lstat(j(d, n)) for n in os.listdir(d)}
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        left = restore_mod._touch_captured(fd, items)
    finally:
        os.close(fd)
    assert left == list(range(1, len(items)))
    st = os.lstat(j(d, "same"))
    assert (st.st_mtime_ns, st.st_atime_ns) == (NEW_NS, NEW_NS)
    for n, old in before.items():
        if n != "same":
            assert os.lstat(j(d, n)).st_mtime_ns == old.st_mtime_ns, n
    assert os.stat(j(d, "sym-target")).st_mtime_ns == target.st_mtime_ns


def test_touch_captured_refuses_a_path(tmp_path: os.PathLike[str]) -> None:
    fd = os.open(os.fspath(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        for bad in (b"a/b", b"a\0b", b""):
            with pytest.raises(ValueError, match="without NUL or slash"):
                restore_mod._touch_captured(fd, [(bad, stat.S_IFREG | 0o644, 0, 0, 1, 0, 0, 0)])
        assert restore_mod._touch_captured(fd, []) == []
    finally:
        os.close(fd)


def _count_fix_meta(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    calls: list[bytes] = []
    real = restore_mod.Restorer._fix_meta

    def fix_meta(self: restore_mod.Restorer, fd: int, name: bytes, *a: Any) -> None:
        calls.append(name)
        real(self, fd, name, *a)

    monkeypatch.setattr(restore_mod.Restorer, "_fix_meta", fix_meta)
    return calls


def test_an_undo_of_freshened_files_touches_them_in_one_call(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The undo of a step that only freshened files (as ``git`` does its objects): every
    mtime comes back, exact, with no file through ``_fix_meta``; a mode change still goes
    there."""
    root = os.path.join(os.fspath(tmp_path), "layer")
    spec: trees.Spec = {
        **{f"objects/{i % 4:02x}/obj{i}": trees.File(b"object %d" % i) for i in range(24)},
        "etc/key": trees.File(b"secret\n", mode=0o600),
    }
    trees.build_tree(root, spec)
    with Engine(root, os.path.join(os.fspath(tmp_path), "store")) as e:
        e.create("c0")
        before = trees.snapshot_tree(root)
        for i in range(24):
            os.utime(os.path.join(root, f"objects/{i % 4:02x}/obj{i}"), ns=(NEW_NS, NEW_NS))
        os.chmod(os.path.join(root, "etc/key"), 0o644)
        calls = _count_fix_meta(monkeypatch)
        rep = e.restore("v0")
        trees.assert_trees_equal(before, root)
        assert calls == [b"key"]
        assert rep.stats.meta == 24 + 1
        assert check(e.store, read_data=True).ok


def test_a_hard_link_planted_over_a_freshened_file_keeps_its_own_times(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file whose only change was its mtime, replaced by a hard link to a file outside the
    layer after the check: the native call leaves it (another inode: two links), and
    ``_fix_meta`` writes the checkpoint's file anew; the outside file keeps its times."""
    base = os.fspath(tmp_path)
    root, outside = os.path.join(base, "layer"), os.path.join(base, "outside")
    os.makedirs(outside)
    secret = os.path.join(outside, "secret")
    with open(secret, "wb") as f:
        f.write(b"object 0")  # the same bytes and size
    os.utime(secret, ns=(OLD_NS, OLD_NS))
    trees.build_tree(root, {f"objects/obj{i}": trees.File(b"object %d" % i) for i in range(5)})
    name = os.path.join(root, "objects", "obj0")
    with Engine(root, os.path.join(base, "store")) as e:
        e.create("c0")
        before = trees.snapshot_tree(root)
        for i in range(5):
            os.utime(os.path.join(root, f"objects/obj{i}"), ns=(NEW_NS, NEW_NS))

        def plant() -> None:
            os.unlink(name)
            os.link(secret, name)
            os.utime(secret, ns=(NEW_NS, NEW_NS))  # what the capture saw, but for the links

        when_restore_starts(monkeypatch, e, plant)
        calls = _count_fix_meta(monkeypatch)
        e.restore("v0")
        assert calls == [b"obj0"]
        trees.assert_trees_equal(before, root)
    st = os.stat(secret)
    assert st.st_mtime_ns == NEW_NS  # untouched by the restore
    assert st.st_nlink == 1
    assert os.lstat(name).st_ino != st.st_ino


@pytest.mark.parametrize("failing", [1, 2])
def test_a_flush_that_fails_fails_the_restore(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch, failing: int
) -> None:
    """A restore flushes twice (the first while its last writes land): a write-back error
    reported to either fails it, recorded as a failed restore (a ``syncfs`` reports an
    error once per descriptor, so the second may never see what the first reported)."""
    root = os.path.join(os.fspath(tmp_path), "layer")
    trees.build_tree(root, {"a": trees.File(b"a"), "d/b": trees.File(b"b")})
    calls: list[int] = []

    def syncfs(fd: int) -> None:
        calls.append(fd)
        if len(calls) == failing:
            raise OSError(5, "Input/output error")

    with Engine(root, os.path.join(os.fspath(tmp_path), "store")) as e:
        e.create("c0")
        with open(os.path.join(root, "d/b"), "wb") as f:
            f.write(b"changed")
        monkeypatch.setattr(restore_mod, "syncfs", syncfs)
        with pytest.raises(RestoreFailed, match="Input/output error"):
            e.restore("v0")
        assert len(calls) == 2
        intent = e.pending_restore()
        assert intent is not None
        assert "Input/output error" in intent["failed"]["error"]


@pytest.mark.parametrize("ns", [-1_500_000_001, -1, 0, 1_700_000_000_999_999_999])
def test_native_times_match_pythons_before_and_after_1970(
    tmp_path: os.PathLike[str], ns: int
) -> None:
    """The extension's one conversion of nanosecond times (``native/nstime.h``): a time set
    by ``touch_captured`` or ``set_mtime`` reads back exact, seconds rounded down before
    1970 as ``os.utime(ns=...)`` splits them, and ``scan_dir`` signs it as Python does."""
    from sprite_env._native import scan_dir, set_mtime
    from sprite_env.snapshot import dircache

    d = os.fspath(tmp_path)
    for n in ("a", "b"):
        with open(os.path.join(d, n), "wb") as f:
            f.write(b"x")
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert restore_mod._touch_captured(fd, [_item(os.path.join(d, "a"), b"a", ns)]) == []
        bfd = os.open(os.path.join(d, "b"), os.O_RDONLY)
        try:
            set_mtime(bfd, ns)
        finally:
            os.close(bfd)
        for n in ("a", "b"):
            st = os.lstat(os.path.join(d, n))
            assert (st.st_mtime_ns, st.st_atime_ns) == (ns, ns), n
        now = 2_000_000_000_000_000_000  # nothing racy
        blob = scan_dir(fd, now, dircache.RACY_NS, os.fstat(fd).st_dev)[0]
        sigs = {n: dircache.sig_of(os.lstat(os.path.join(d, n)), now) for n in ("a", "b")}
        assert blob == dircache.encode_sigs({n.encode(): s for n, s in sigs.items()})
    finally:
        os.close(fd)
