"""The sprite shape with a real overlayfs: the daemon captures UPPER, a restore takes the
environment down and brings it back, services return and hand-started processes do not."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from typing import Any

import pytest

from sprite_env.mountinfo import fstype_at
from sprite_env.services import processes_using
from tests.helpers import trees
from tests.helpers.cli import run_cli
from tests.helpers.daemon import start_daemon, write_file

pytestmark = pytest.mark.integration

SERVICE = """\
command = "echo started >> {log}; exec sleep 1000"
workdir = "/srv"
restart = "always"
"""


def _upper(path: str) -> trees.Snapshot:
    """UPPER's facts, with whiteouts' link counts left out: overlayfs makes every whiteout
    a hard link of one inode in WORK, an artifact that means nothing to the layer."""
    snap = trees.snapshot_tree(path)
    return {
        p: dataclasses.replace(f, nlink=None) if f.rdev == (0, 0) else f for p, f in snap.items()
    }


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _restore(d: Any, cid: str) -> list[dict[str, Any]]:
    status, evs = d.stream("POST", f"/v1/checkpoints/{cid}/restore")
    assert status == 202
    assert evs[-1]["type"] == "complete", evs
    return evs  # type: ignore[no-any-return]


def _service_state(d: Any, name: str) -> dict[str, Any]:
    status, got = d.json("GET", "/v1/services")
    return next(s for s in got["services"] if s["name"] == name)  # type: ignore[no-any-return]


def _wait_running(d: Any, name: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        s = _service_state(d, name)
        if s["state"] == "running":
            return s
        time.sleep(0.05)
    raise AssertionError(f"service {name} not running: {s}")


def test_whiteouts_and_opaque_dirs_round_trip(overlay_daemon: Any) -> None:
    d, o = overlay_daemon, overlay_daemon.overlay
    assert fstype_at(o.merged) == "overlay"
    merged = o.merged
    os.unlink(os.path.join(merged, "etc", "hosts"))  # a whiteout in UPPER
    subprocess.run(["rm", "-rf", os.path.join(merged, "usr", "lib", "pkg")], check=True)
    os.makedirs(os.path.join(merged, "usr", "lib", "pkg"))  # an opaque directory
    write_file(os.path.join(merged, "usr", "lib", "pkg", "new.py"), b"# new\n")
    write_file(os.path.join(merged, "app", "main.py"), b"print('v0')\n")
    upper_st = os.lstat(os.path.join(o.upper, "etc", "hosts"))
    assert (os.major(upper_st.st_rdev), os.minor(upper_st.st_rdev)) == (0, 0)
    assert os.getxattr(os.path.join(o.upper, "usr", "lib", "pkg"), "trusted.overlay.opaque") == b"y"
    merged_v0 = trees.snapshot_tree(merged)
    upper_v0 = _upper(o.upper)
    d.create("v0")

    # Undo all of it through MERGED: the whiteout goes, the opaque dir's files come back.
    subprocess.run(["rm", "-rf", os.path.join(o.upper, "x")], check=True)
    write_file(os.path.join(merged, "etc", "hosts"), b"10.0.0.1 other\n")
    subprocess.run(
        ["rm", "-rf", os.path.join(merged, "usr"), os.path.join(merged, "app")], check=True
    )
    write_file(os.path.join(merged, "app", "other.py"), b"x")
    evs = _restore(d, "v0")
    infos = [e["data"] for e in evs if e["type"] == "info"]
    undo = [e for e in evs if e.get("ends_sessions")]  # said before anything stops
    assert len(undo) == 1
    assert undo[0]["undo"] == evs[-1]["undo"]
    assert infos[:4] == [
        "Restoring from checkpoint v0...",
        f"Undo checkpoint: {undo[0]['undo']}; the sessions using {merged} end now",
        "Stopping services...",
        "Restoring filesystem...",
    ]
    assert infos[-1] == "Services started"
    assert fstype_at(o.merged) == "overlay"
    trees.assert_trees_equal(upper_v0, _upper(o.upper), check_root_meta=False)
    trees.assert_trees_equal(merged_v0, merged, check_root_meta=False)
    assert sorted(os.listdir(os.path.join(merged, "usr", "lib", "pkg"))) == ["new.py"]
    assert not os.path.exists(os.path.join(merged, "etc", "hosts"))
    assert os.listdir(o.work) in ([], ["work"], ["index"], ["index", "work"])


def test_restore_ends_sessions_and_restarts_services(overlay_daemon: Any, tmp_path: Any) -> None:
    d, o = overlay_daemon, overlay_daemon.overlay
    log = tmp_path / "service-starts.log"
    os.makedirs(os.path.join(o.merged, "srv"))
    write_file(
        os.path.join(o.merged, "etc", "sprite", "services", "web.toml"),
        SERVICE.format(log=log).encode(),
    )
    p = run_cli("services", "start", "web", env=d.env())
    assert p.returncode == 0, p.stderr
    first = _wait_running(d, "web")
    assert os.readlink(f"/proc/{first['pid']}/cwd") == os.path.join(o.merged, "srv")
    d.create("with web")
    write_file(os.path.join(o.merged, "srv", "since"), b"x")  # something to restore

    # A session: a shell whose working directory is in MERGED, started by hand.
    hand = subprocess.Popen(["sleep", "1000"], cwd=os.path.join(o.merged, "srv"))
    holder = subprocess.Popen(
        [
            "python3",
            "-c",
            "import time,sys; f=open(sys.argv[1]); time.sleep(1000)",
            os.path.join(o.merged, "etc", "sprite", "services", "web.toml"),
        ],
        cwd="/",
    )
    deadline = time.monotonic() + 20  # until both hold MERGED (python starts slowly)
    while not {hand.pid, holder.pid} <= {p.pid for p in processes_using(o.merged)}:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    try:
        evs = _restore(d, "v0")
        infos = [e["data"] for e in evs if e["type"] == "info"]
        assert f"Ending 2 processes using {o.merged}..." in infos, infos
        assert hand.wait(10) == -signal.SIGTERM
        assert holder.wait(10) == -signal.SIGTERM
    finally:
        for proc in (hand, holder):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    again = _wait_running(d, "web")
    assert again["pid"] != first["pid"]
    assert log.read_text().splitlines() == ["started", "started"]

    p = run_cli("services", "list", env=d.env())
    assert p.returncode == 0
    assert "web" in p.stdout
    assert "running" in p.stdout
    p = run_cli("services", "stop", "web", env=d.env())
    assert p.returncode == 0
    assert "stopped web" in p.stdout
    assert _service_state(d, "web")["state"] == "stopped"
    p = run_cli("services", "logs", "web", env=d.env())
    assert p.returncode == 0
    p = run_cli("services", "start", "nope", env=d.env())
    assert p.returncode == 2
    assert "nope" in p.stderr


def test_a_service_removed_by_the_restore_does_not_come_back(
    overlay_daemon: Any, tmp_path: Any
) -> None:
    d, o = overlay_daemon, overlay_daemon.overlay
    write_file(os.path.join(o.merged, "a.txt"), b"a")
    d.create("no services")
    os.makedirs(os.path.join(o.merged, "srv"))
    write_file(
        os.path.join(o.merged, "etc", "sprite", "services", "web.toml"),
        SERVICE.format(log=tmp_path / "log").encode(),
    )
    run_cli("services", "start", "web", env=d.env())
    pid = _wait_running(d, "web")["pid"]
    _restore(d, "v0")
    assert not _alive(pid)
    status, got = d.json("GET", "/v1/services")
    assert all(s["state"] != "running" for s in got["services"])


def test_the_view_shows_the_layer_and_reset_returns_to_the_base(overlay_daemon: Any) -> None:
    d, o = overlay_daemon, overlay_daemon.overlay
    write_file(os.path.join(o.merged, "app", "main.py"), b"print(1)\n")
    d.create("app")
    assert os.path.exists(os.path.join(d.state, "checkpoints", "v0", "app", "main.py"))
    status, evs = d.stream("POST", "/v1/reset")
    assert evs[-1]["type"] == "complete", evs
    assert os.listdir(o.upper) == []
    assert sorted(os.listdir(o.merged)) == ["etc", "usr"]  # the base image only
    _restore(d, evs[-1]["undo"])
    with open(os.path.join(o.merged, "app", "main.py"), "rb") as f:
        assert f.read() == b"print(1)\n"


def test_state_inside_merged_is_refused(overlay: Any, tmp_path: Any) -> None:
    spec = f"{overlay.lower}:{overlay.upper}:{overlay.work}:{overlay.merged}"
    p = run_cli("daemon", "--overlay", spec)
    assert p.returncode == 2
    assert "must be outside MERGED" in p.stderr
    p = run_cli("daemon", "--overlay", "a:b")
    assert p.returncode == 2
    assert "LOWER:UPPER:WORK:MERGED" in p.stderr


def test_the_view_shows_each_checkpoint_merged_over_the_base(overlay_daemon: Any) -> None:
    d, o = overlay_daemon, overlay_daemon.overlay
    merged = o.merged
    with open(os.path.join(o.lower, "big.bin"), "wb") as f:  # a base file over many spans
        f.write(os.urandom(5 << 20))
    os.unlink(os.path.join(merged, "etc", "hosts"))  # whiteout
    subprocess.run(["rm", "-rf", os.path.join(merged, "usr", "lib", "pkg")], check=True)
    os.makedirs(os.path.join(merged, "usr", "lib", "pkg"))  # opaque
    write_file(os.path.join(merged, "usr", "lib", "pkg", "new.py"), b"# new\n")
    write_file(os.path.join(merged, "app", "main.py"), b"print('v0')\n")
    os.symlink("app/main.py", os.path.join(merged, "link"))
    d.create("v0")
    view = os.path.join(d.state, "checkpoints", "v0")
    # The checkpoint, browsed, is MERGED as it was: same names, bytes and metadata.
    trees.assert_trees_equal(merged, view, check_root_meta=False)
    assert not os.path.exists(os.path.join(view, "etc", "hosts"))
    assert os.listdir(os.path.join(view, "usr", "lib", "pkg")) == ["new.py"]
    assert b"trusted.overlay.opaque" not in os.listxattr(os.path.join(view, "usr", "lib", "pkg"))
    p = subprocess.run(["diff", "-r", merged, view], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    # After more changes the view still shows v0, and v1 shows the new state.
    write_file(os.path.join(merged, "app", "main.py"), b"print('v1')\n")
    write_file(os.path.join(merged, "etc", "hosts"), b"10.0.0.1 back\n")
    d.create("v1")
    with open(os.path.join(view, "app", "main.py"), "rb") as f:
        assert f.read() == b"print('v0')\n"
    trees.assert_trees_equal(
        merged, os.path.join(d.state, "checkpoints", "v1"), check_root_meta=False
    )


def test_kill_mid_restore_on_an_overlay(overlay: Any, daemon_factory: Any, tmp_path: Any) -> None:
    spec = f"{overlay.lower}:{overlay.upper}:{overlay.work}:{overlay.merged}"
    state = str(tmp_path / "state")
    d = daemon_factory(
        "--overlay",
        spec,
        root=overlay.merged,
        state=state,
        env={"SPRITE_ENV_CRASH_AT": "restore-entry-written:20"},
    )
    for i in range(60):
        write_file(os.path.join(overlay.merged, "many", f"f{i:02}"), os.urandom(2000))
    d.create("target")
    merged_v0 = trees.snapshot_tree(overlay.merged)
    subprocess.run(["rm", "-rf", os.path.join(overlay.merged, "many")], check=True)
    write_file(os.path.join(overlay.merged, "junk"), b"x")
    d.stream("POST", "/v1/checkpoints/v0/restore")  # killed half-way, MERGED unmounted
    d.proc.wait(60)
    assert d.proc.returncode == -signal.SIGKILL
    d.sweep_mount()
    assert fstype_at(overlay.merged) is None
    d2 = start_daemon(overlay.merged, state, "--overlay", spec)
    try:
        assert fstype_at(overlay.merged) == "overlay"
        trees.assert_trees_equal(merged_v0, overlay.merged, check_root_meta=False)
        status, log = d2.json("GET", "/v1/activity")
        assert log[0]["actor"] == "daemon"
        assert log[0]["detail"] == "finished after a crash"
    finally:
        assert d2.stop() == 0
