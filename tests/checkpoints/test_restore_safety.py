"""A restore never writes outside the root, whatever symlinks the live tree holds."""

from __future__ import annotations

import os
import subprocess

import pytest

from sprite_env.checkpoints import Engine
from tests.helpers import trees


@pytest.fixture
def outside(tmp_path: os.PathLike[str]) -> str:
    d = os.path.join(os.fspath(tmp_path), "outside")
    os.mkdir(d)
    with open(os.path.join(d, "victim"), "w") as f:
        f.write("untouched")
    os.mkdir(os.path.join(d, "dir"))
    return d


def test_symlinks_planted_where_dirs_and_files_were(
    engine: Engine, root: str, outside: str
) -> None:
    trees.build_tree(
        root,
        {
            "d/file": trees.File(b"inside"),
            "d/sub/deeper": trees.File(b"deeper"),
            "victim": trees.File(b"restored content"),
            "dir": trees.Dir(),
        },
    )
    before = trees.snapshot_tree(root)
    engine.create()
    # an attacker replaces a directory and a file with symlinks that point outside
    os.rename(os.path.join(root, "d"), os.path.join(root, "d.old"))
    os.symlink(outside, os.path.join(root, "d"))
    os.unlink(os.path.join(root, "victim"))
    os.symlink(os.path.join(outside, "victim"), os.path.join(root, "victim"))
    os.rmdir(os.path.join(root, "dir"))
    os.symlink(os.path.join(outside, "dir"), os.path.join(root, "dir"))
    outside_before = trees.snapshot_tree(outside)
    engine.restore("v0")
    trees.assert_trees_equal(outside_before, outside)  # nothing written through the links
    trees.assert_trees_equal(before, root)


def test_symlinked_directory_is_never_entered_while_removing(
    engine: Engine, root: str, outside: str
) -> None:
    engine.create()  # v0: empty
    os.symlink(outside, os.path.join(root, "link-to-outside"))
    os.mkdir(os.path.join(root, "d"))
    os.symlink(outside, os.path.join(root, "d", "nested-link"))
    outside_before = trees.snapshot_tree(outside)
    engine.restore("v0")
    assert os.listdir(root) == []
    trees.assert_trees_equal(outside_before, outside)


def test_excluded_paths_are_neither_captured_nor_removed(
    tmp_path: os.PathLike[str], root: str
) -> None:
    os.makedirs(os.path.join(root, "cache/pip"))
    with open(os.path.join(root, "cache/pip/blob"), "w") as f:
        f.write("keep me")
    with Engine(root, os.path.join(os.fspath(tmp_path), "store"), excludes=["cache"]) as e:
        v0 = e.create()
        assert v0.files == 0
        with open(os.path.join(root, "new"), "w") as f:
            f.write("x")
        e.restore("v0")
    assert sorted(os.listdir(root)) == ["cache"]
    with open(os.path.join(root, "cache/pip/blob")) as f:
        assert f.read() == "keep me"


def test_store_inside_the_root_is_left_out(tmp_path: os.PathLike[str], root: str) -> None:
    store = os.path.join(root, ".sprite", "store")
    os.makedirs(os.path.dirname(store))
    with open(os.path.join(root, "a"), "w") as f:
        f.write("a")
    with Engine(root, store) as e:
        v0 = e.create()
        assert v0.files == 1
        e.create()
        e.restore("v0")  # must not delete or rewrite its own store
        assert e.checkpoints(include_auto=True)
        assert e.diff("v0", "v1") == []


def test_other_file_systems_are_neither_captured_nor_touched(engine: Engine, root: str) -> None:
    mnt = os.path.join(root, "mnt")
    os.mkdir(mnt)
    if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", mnt], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with open(os.path.join(mnt, "data"), "w") as f:
            f.write("on another file system")
        v0 = engine.create()
        assert any(w["path"] == "mnt" and "mount point" in w["message"] for w in v0.warnings)
        assert v0.files == 0
        with open(os.path.join(root, "new"), "w") as f:
            f.write("x")
        engine.restore("v0")
        with open(os.path.join(mnt, "data")) as f:
            assert f.read() == "on another file system"
        assert not os.path.exists(os.path.join(root, "new"))
    finally:
        subprocess.run(["umount", mnt], check=True)
