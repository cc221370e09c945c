"""kill -9 in the middle of a capture, a restore or a delete loses nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from sprite_env.checkpoints import Engine
from sprite_env.checkpoints.verify import verify_store
from tests.helpers import trees

SCRIPT = r"""
import sys
from sprite_env.checkpoints import Engine
root, store, action, arg = sys.argv[1:5]
with Engine(root, store) as e:
    getattr(e, action)(arg)
"""


def _run(root: str, store: str, action: str, arg: str, crash_at: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "SPRITE_ENV_CRASH_AT"}
    if crash_at:
        env["SPRITE_ENV_CRASH_AT"] = crash_at
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT, root, store, action, arg],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return p.returncode


def _two_states(root: str, store: str) -> tuple[trees.Snapshot, trees.Snapshot]:
    spec = trees.sample_spec()
    spec.update({f"many/f{i}".encode(): trees.File(os.urandom(3000 + i)) for i in range(40)})
    trees.build_tree(root, spec)
    a = trees.snapshot_tree(root)
    with Engine(root, store) as e:
        e.create("a")
        for i in range(30):
            with open(os.path.join(root, f"etc/new{i}"), "wb") as f:
                f.write(os.urandom(1000 + i))
        os.unlink(os.path.join(root, "hard/a1"))
        for i in range(0, 40, 2):
            os.unlink(os.path.join(root, f"many/f{i}"))
        os.chmod(os.path.join(root, "tmp"), 0o755)
        e.create("b")
    return a, trees.snapshot_tree(root)


@pytest.mark.parametrize(
    "point",
    [
        "restore-after-intent",
        "restore-entry-written:1",
        "restore-entry-written:20",
        "restore-before-commit",
        "catalog-before-commit",
    ],
)
def test_kill_during_restore_then_reopen_finishes_it(
    tmp_path: os.PathLike[str], point: str
) -> None:
    root = os.path.join(os.fspath(tmp_path), "layer")
    store = os.path.join(os.fspath(tmp_path), "store")
    a, b = _two_states(root, store)
    assert _run(root, store, "restore", "v0", point) == -signal.SIGKILL
    with Engine(root, store) as e:  # opening finishes an interrupted restore first
        assert e.pending_restore() is None
        if point == "catalog-before-commit":  # killed while taking the undo checkpoint
            trees.assert_trees_equal(b, root)
            assert e.active() == "v1"
        else:
            trees.assert_trees_equal(a, root)
            assert e.active() == "v0"
            undo = [c for c in e.checkpoints(include_auto=True) if c.is_auto]
            assert len(undo) == 1
            e.restore(undo[0].id)  # and the undo checkpoint really holds state b
            trees.assert_trees_equal(b, root)
        assert verify_store(e.store, read_data=True).ok


@pytest.mark.parametrize(
    "point", ["catalog-before-commit", "catalog-mid-commit", "pack-after-rename"]
)
def test_kill_during_create_leaves_no_checkpoint(tmp_path: os.PathLike[str], point: str) -> None:
    root = os.path.join(os.fspath(tmp_path), "layer")
    store = os.path.join(os.fspath(tmp_path), "store")
    _two_states(root, store)
    with open(os.path.join(root, "more"), "wb") as f:
        f.write(os.urandom(100_000))
    assert _run(root, store, "create", "third", point) == -signal.SIGKILL
    with Engine(root, store) as e:
        assert [c.id for c in e.checkpoints(include_auto=True)] == ["v1", "v0"]
        report = verify_store(e.store, read_data=True)
        assert report.ok
        assert not report.warnings
        assert e.create().id == "v2"


@pytest.mark.parametrize(
    "point", ["delete-after-row", "prune-after-write", "prune-mid-commit", "prune-after-commit"]
)
def test_kill_during_delete_is_finished_on_reopen(tmp_path: os.PathLike[str], point: str) -> None:
    root = os.path.join(os.fspath(tmp_path), "layer")
    store = os.path.join(os.fspath(tmp_path), "store")
    a, _ = _two_states(root, store)
    code = _run(root, store, "delete", "v0", point)
    assert code in (-signal.SIGKILL, 0)  # a point the plan never reaches lets it finish
    with Engine(root, store) as e:
        assert [c.id for c in e.checkpoints()] == ["v1"]
        assert e.store.catalog.meta("gc_pending") is None
        report = verify_store(e.store, read_data=True)
        assert report.ok
        assert not report.warnings
        dest = os.path.join(os.fspath(tmp_path), "out")
        os.mkdir(dest)
        e.export("v1", dest)


def test_kill_while_patching_a_big_file_in_place(tmp_path: os.PathLike[str]) -> None:
    root = os.path.join(os.fspath(tmp_path), "layer")
    store = os.path.join(os.fspath(tmp_path), "store")
    os.mkdir(root)
    big = os.path.join(root, "db")
    with open(big, "wb") as f:
        f.write(os.urandom(8 << 20))
    a = trees.snapshot_tree(root)
    with Engine(root, store) as e:
        e.create("a")
        with open(big, "r+b") as f:
            for i in range(50):
                f.seek(i * 150_000)
                f.write(os.urandom(4096))
        e.create("b")
    # the undo checkpoint is taken, the intent recorded, then the patch is cut short
    assert _run(root, store, "restore", "v0", "restore-entry-written:1") == -signal.SIGKILL
    with Engine(root, store) as e:
        trees.assert_trees_equal(a, root)
        assert e.active() == "v0"
        assert verify_store(e.store, read_data=True).ok
