"""A restore that cannot be done is refused before it changes anything; one that fails
part-way anyway is recorded, reported and finished (or rolled back) on request, and never
stops the store from opening (issue 15, point 2)."""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING

import pytest

from sprite_env.checkpoints import Engine
from sprite_env.snapshot.preflight import CheckpointDamaged, RestoreWontFit
from sprite_env.store import codec
from sprite_env.store.pack import ENTRY, pack_path
from tests.helpers.cli import run_cli
from tests.helpers.daemon import write_file
from tests.helpers.trees import assert_trees_equal, snapshot_tree

if TYPE_CHECKING:
    from collections.abc import Iterator

MiB = 1 << 20


@pytest.fixture
def small_fs(tmp_path: os.PathLike[str]) -> Iterator[str]:
    """A real 4 MiB file system (tmpfs) for the layer: a disk that fills up."""
    mnt = os.path.join(os.fspath(tmp_path), "small")
    os.mkdir(mnt)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mnt], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", mnt], check=False)


def _fill_to(root: str, name: str, leave: int) -> None:
    """Writes ``name`` until ``root``'s file system has about ``leave`` bytes free."""
    st = os.statvfs(root)
    free = st.f_bavail * st.f_frsize
    write_file(os.path.join(root, name), os.urandom(max(0, free - leave)))


def test_a_restore_that_will_not_fit_is_refused_before_anything_changes(
    small_fs: str, tmp_path: os.PathLike[str]
) -> None:
    store = os.path.join(os.fspath(tmp_path), "store")
    with Engine(small_fs, store) as e:
        write_file(os.path.join(small_fs, "data.bin"), os.urandom(2 * MiB))
        write_file(os.path.join(small_fs, "notes.txt"), b"v0\n")
        e.create("v0")
        os.unlink(os.path.join(small_fs, "data.bin"))
        _fill_to(small_fs, "other.bin", 1 * MiB)  # 2 MiB cannot come back beside it
        before = snapshot_tree(small_fs)
        with pytest.raises(RestoreWontFit, match="nothing was changed") as info:
            e.restore("v0")
        assert info.value.code == "no_space"
        assert "free" in str(info.value)
        assert_trees_equal(before, small_fs)
        assert e.pending_restore() is None  # no intent: nothing to finish or report
        assert e.interrupted_restore() is None
        # Once there is room, the same restore goes through.
        os.unlink(os.path.join(small_fs, "other.bin"))
        e.restore("v0")
        assert sorted(os.listdir(small_fs)) == ["data.bin", "notes.txt"]


def test_a_damaged_chunk_is_found_before_the_layer_is_touched(engine: Engine, root: str) -> None:
    blob = os.urandom(12_000)  # below the chunker's minimum: one object, id = its hash
    write_file(os.path.join(root, "app", "blob"), blob)
    write_file(os.path.join(root, "app", "keep"), b"same in both\n")
    engine.create("v0")
    write_file(os.path.join(root, "app", "blob"), b"changed")
    write_file(os.path.join(root, "new"), b"made after v0")
    loc = engine.store.catalog.locate(codec.object_id(blob))
    assert loc is not None
    path = pack_path(engine.store.packs_dir, loc.pack)
    with open(path, "r+b") as f:  # flip a byte of the compressed payload
        f.seek(loc.entry.offset + ENTRY.size + 5)
        b = f.read(1)
        f.seek(loc.entry.offset + ENTRY.size + 5)
        f.write(bytes([b[0] ^ 0x40]))
    engine.store.forget_pack(loc.pack)
    before = snapshot_tree(root)
    with pytest.raises(CheckpointDamaged) as info:
        engine.restore("v0")
    message = str(info.value)
    assert "checkpoint v0" in message
    assert "app/blob" in message
    assert "nothing was changed" in message
    assert_trees_equal(before, root)
    assert engine.pending_restore() is None


def test_a_restore_failing_part_way_is_reported_and_finished_on_request(
    tmp_path: os.PathLike[str],
) -> None:
    """A real process, the disk failing (ENOSPC) at the second file written."""
    root = os.path.join(os.fspath(tmp_path), "layer")
    for i in range(6):
        write_file(os.path.join(root, "src", f"m{i}.py"), b"# v0 %d\n" % i)
    assert run_cli("--root", root, "store", "init").returncode == 0
    assert run_cli("--root", root, "checkpoints", "create").returncode == 0
    target = snapshot_tree(root, ignore=[".sprite"])
    for i in range(6):
        write_file(os.path.join(root, "src", f"m{i}.py"), b"# later %d\n" % i)
    fault = {"SPRITE_ENV_CRASH_AT": "restore-entry-written:2:ENOSPC"}
    r = run_cli("--root", root, "restore", "v0", "--yes", env=fault)
    assert r.returncode == 6, r
    assert "failed part-way" in r.stderr
    assert "partly restored" in r.stderr
    assert "nothing was kept" not in r.stderr
    assert "sprite-env restore v0 --yes" in r.stderr  # how to finish
    assert "roll back with: sprite-env restore auto-" in r.stderr
    assert "Traceback" not in r.stderr

    # The store still opens; list works and says what state the layer is in.
    r = run_cli("--root", root, "checkpoints", "list", "--include-auto")
    assert r.returncode == 0, r
    assert "v0" in r.stdout
    assert "did not finish" in r.stderr
    assert "No space left on device" in r.stderr

    # Finish it: the restore asked for again.
    r = run_cli("--root", root, "restore", "v0", "--yes")
    assert r.returncode == 0, r
    assert_trees_equal(target, snapshot_tree(root, ignore=[".sprite"]))
    r = run_cli("--root", root, "checkpoints", "list")
    assert "did not finish" not in r.stderr
    r = run_cli("--root", root, "store", "check", "--read-data")
    assert r.returncode == 0, r
