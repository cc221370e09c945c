"""A daemon never stays down because of a restore that could not finish (issue 15,
point 2): it starts, serves list, info, restore and delete, reports the interrupted
restore (``/v1/status``, the activity log, the CLI's list) and finishes or rolls it back
on request."""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING, Any

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.daemon import write_file
from tests.helpers.trees import assert_trees_equal, snapshot_tree

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.integration
MiB = 1 << 20


@pytest.fixture
def small_fs(tmp_path: Any) -> Iterator[str]:
    """A real 4 MiB file system (tmpfs) for the layer: a disk that fills up."""
    mnt = os.path.join(os.fspath(tmp_path), "small")
    os.mkdir(mnt)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mnt], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", mnt], check=False)


def _layer_v0(root: str) -> None:
    write_file(os.path.join(root, "big.bin"), os.urandom(MiB + MiB // 2))
    for i in range(6):
        write_file(os.path.join(root, "src", f"m{i}.py"), b"# v0 %d\n" % i)


def _change(root: str) -> None:
    os.unlink(os.path.join(root, "big.bin"))
    for i in range(6):
        write_file(os.path.join(root, "src", f"m{i}.py"), b"# later %d\n" % i)


def test_a_job_failing_part_way_is_reported_then_finished(daemon_factory: Any) -> None:
    d = daemon_factory("--no-view", env={"SPRITE_ENV_CRASH_AT": "restore-entry-written:2:ENOSPC"})
    _layer_v0(d.root)
    d.create("v0")
    target = snapshot_tree(d.root)
    _change(d.root)

    status, evs = d.stream("POST", "/v1/checkpoints/v0/restore")
    assert status == 202
    err = evs[-1]
    assert (err["type"], err["code"]) == ("error", "no_space"), evs
    assert "partly restored" in err["error"]
    assert "nothing was kept" not in err["error"]

    status, st = d.json("GET", "/v1/status")
    info = st["interrupted_restore"]
    assert info["target"] == "v0"
    assert info["undo"].startswith("auto-")
    assert "No space left" in info["error"]
    assert info["finish"] == "sprite-env restore v0 --yes"
    assert info["roll_back"] == f"sprite-env restore {info['undo']} --yes"
    # Reads go on: list, info; and the CLI's list says what state the layer is in.
    assert d.json("GET", "/v1/checkpoints/v0")[0] == 200
    r = run_cli("--socket", d.socket, "checkpoints", "list")
    assert r.returncode == 0, r
    assert "v0" in r.stdout
    assert "did not finish" in r.stderr
    assert "finish it with: sprite-env restore v0 --yes" in r.stderr
    status, log = d.json("GET", "/v1/activity?limit=5")
    assert (log[0]["action"], log[0]["ok"]) == ("restore", False)

    # The cause is gone (the fault fires once): asking again finishes it.
    status, evs = d.stream("POST", "/v1/checkpoints/v0/restore")
    assert evs[-1]["type"] == "complete", evs
    assert_trees_equal(target, d.root)
    assert d.json("GET", "/v1/status")[1]["interrupted_restore"] is None


def test_a_killed_restore_that_cannot_be_finished_at_start_does_not_stop_the_daemon(
    daemon_factory: Any, small_fs: str, tmp_path: Any
) -> None:
    state = os.path.join(os.fspath(tmp_path), "state")
    d = daemon_factory(
        "--no-view",
        root=small_fs,
        state=state,
        env={"SPRITE_ENV_CRASH_AT": "restore-entry-written:2"},
    )
    _layer_v0(small_fs)
    d.create("v0")
    target = snapshot_tree(small_fs)
    _change(small_fs)
    d.request("POST", "/v1/checkpoints/v0/restore")  # killed part-way
    assert d.proc.wait(timeout=60) == -9
    os.unlink(d.socket)
    # Now the disk fills up: the restore cannot be finished at the next start.
    # One page left: the restore's writers finish entries in no fixed order, so the two
    # written before the kill may include big.bin; what is left must not fit either way
    # (half a MiB did, at times, under load).
    st = os.statvfs(small_fs)
    write_file(os.path.join(small_fs, "filler"), os.urandom(st.f_bavail * st.f_frsize - 4096))

    d2 = daemon_factory("--no-view", root=small_fs, state=state)  # starts all the same
    status, st2 = d2.json("GET", "/v1/status")
    info = st2["interrupted_restore"]
    assert info["target"] == "v0"
    assert "nothing was changed" in info["error"]
    assert "free" in info["error"]
    status, cps = d2.json("GET", "/v1/checkpoints?include_auto=true")
    assert {c["id"] for c in cps} >= {"v0", info["undo"]}
    status, log = d2.json("GET", "/v1/activity?limit=5")
    assert (log[0]["action"], log[0]["actor"], log[0]["ok"]) == ("restore", "daemon", False)
    assert "finishing an interrupted restore" in d2.log()

    os.unlink(os.path.join(small_fs, "filler"))
    status, evs = d2.stream("POST", "/v1/checkpoints/v0/restore")
    assert evs[-1]["type"] == "complete", evs
    assert_trees_equal(target, small_fs, ignore=["filler"])
    assert d2.json("GET", "/v1/status")[1]["interrupted_restore"] is None
