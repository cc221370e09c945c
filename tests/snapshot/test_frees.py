"""Deferred frees (``snapshot/frees.py``): the inodes an undo removes are held open and
freed after it commits; nothing of them is ever on the layer, and a kill loses nothing."""

from __future__ import annotations

import os
import resource
from typing import TYPE_CHECKING

from sprite_env.checkpoints import Engine
from sprite_env.checkpoints.verify import verify_store
from sprite_env.snapshot import frees as frees_mod
from tests.helpers import trees
from tests.snapshot.test_restore_undo import _layer, _open_fds, _restore_killed_at, _step

if TYPE_CHECKING:
    import pytest

#: What ``_step`` adds and the undo removes: 4 directories of 45 files, and a symlink.
REMOVED = 4 + 4 * 45 + 1


class _Released:
    """Records, at each release, where its descriptors point (``/proc/self/fd``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.targets: list[str] = []
        inner = frees_mod._close_all

        def close_all(fds: list[int]) -> None:
            self.targets += [os.readlink(f"/proc/self/fd/{fd}") for fd in fds]
            inner(fds)

        monkeypatch.setattr(frees_mod, "_close_all", close_all)


def test_an_undo_holds_what_it_removes_until_it_committed(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = os.path.join(os.fspath(tmp_path), "layer")
    _layer(root)
    before = trees.snapshot_tree(root)
    released = _Released(monkeypatch)
    with Engine(root, os.path.join(os.fspath(tmp_path), "store")) as e:
        e.create("c0")
        _step(root)
        e.restore("v0")
        frees_mod.wait_released()
        trees.assert_trees_equal(before, root, check_holes="exact")
        # the removed entries and the files renamed over (a.py, sparse2, the hard links)
        assert REMOVED < len(released.targets) <= REMOVED + 6
        assert all(t.endswith(" (deleted)") for t in released.targets), released.targets
        assert sum("/pkg/lexers/more/" in t for t in released.targets) == 45
        assert not [t for t in _open_fds() if t.startswith(root)]
        assert verify_store(e.store, read_data=True).ok


def test_while_held_the_layer_is_already_the_target(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release is what frees, not what removes: with it held back, the layer is
    exact, a capture of it is the checkpoint, and nothing of the removed entries shows."""
    root = os.path.join(os.fspath(tmp_path), "layer")
    _layer(root)
    before = trees.snapshot_tree(root)
    held: list[list[int]] = []
    monkeypatch.setattr(frees_mod, "_close_all", held.append)
    with Engine(root, os.path.join(os.fspath(tmp_path), "store")) as e:
        c0 = e.create("c0")
        _step(root)
        e.restore("v0")
        try:
            (fds,) = held
            assert len(fds) > REMOVED
            trees.assert_trees_equal(before, root, check_holes="exact")
            assert e.create("again").top_tree == c0.top_tree
        finally:
            for fd in held[0] if held else []:
                os.close(fd)


def test_over_the_limit_entries_are_freed_at_once(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(frees_mod, "MAX_HELD", 7)
    root = os.path.join(os.fspath(tmp_path), "layer")
    _layer(root)
    before = trees.snapshot_tree(root)
    released = _Released(monkeypatch)
    with Engine(root, os.path.join(os.fspath(tmp_path), "store")) as e:
        e.create("c0")
        _step(root)
        e.restore("v0")
        frees_mod.wait_released()
        assert len(released.targets) == 7
        trees.assert_trees_equal(before, root, check_holes="exact")
        assert not [t for t in _open_fds() if t.startswith(root)]


def test_the_limit_leaves_room_to_everything_else() -> None:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    room = frees_mod.Frees()._limit  # may raise the soft limit towards the hard one
    now, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert now >= soft
    assert 0 <= room <= frees_mod.MAX_HELD
    assert room == max(0, min(frees_mod.MAX_HELD, now - frees_mod.SPARE_FDS))


def test_kill_before_the_commit_with_inodes_held(tmp_path: os.PathLike[str]) -> None:
    """Killed after the writes, every removed inode still held: the kernel frees them at
    the exit, and the reopened engine finishes the restore; nothing is left behind."""
    root, store, before = _restore_killed_at(tmp_path, "restore-before-commit")
    trees.assert_trees_equal(before, root, check_holes="exact")
    with Engine(root, store) as e:
        assert e.pending_restore() is None
        trees.assert_trees_equal(before, root, check_holes="exact")
        assert e.active() == "v0"
        assert verify_store(e.store, read_data=True).ok
