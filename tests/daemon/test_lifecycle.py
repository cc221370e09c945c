"""The daemon as a process: start, refuse a second one, stop cleanly, survive kill -9,
host the checkpoint view, take automatic checkpoints on its own."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from typing import Any

import pytest

from sprite_env.mountinfo import mounts
from sprite_env.store import check, open_store
from tests.helpers import trees
from tests.helpers.cli import REPO
from tests.helpers.daemon import start_daemon, write_file

pytestmark = pytest.mark.integration


def test_start_installs_socket_0600_and_llm_txt(daemon: Any) -> None:
    st = os.stat(daemon.socket)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    with (
        open(os.path.join(daemon.state, "llm.txt"), "rb") as f,
        open(os.path.join(REPO, "llm.txt"), "rb") as g,
    ):
        assert f.read() == g.read()


def test_socket_group(daemon_factory: Any) -> None:
    d = daemon_factory("--socket-group", "daemon")
    st = os.stat(d.socket)
    import grp

    assert stat.S_IMODE(st.st_mode) == 0o660
    assert st.st_gid == grp.getgrnam("daemon").gr_gid


def test_a_second_daemon_is_refused(daemon: Any, tmp_path: Any) -> None:
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "sprite_env",
            "daemon",
            "--root",
            daemon.root,
            "--state",
            daemon.state,
            "--auto-interval",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert p.returncode == 4
    assert f"another sprite-env daemon (pid {daemon.proc.pid}) serves {daemon.state}" in p.stderr
    # Another state on the same store is refused by the store's lock.
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "sprite_env",
            "daemon",
            "--root",
            daemon.root,
            "--state",
            str(tmp_path / "other"),
            "--store",
            os.path.join(daemon.state, "store"),
            "--auto-interval",
            "0",
            "--no-view",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert p.returncode == 4
    assert "locked" in p.stderr
    assert daemon.request("GET", "/v1/status")[0] == 200


def test_sigterm_stops_cleanly_and_unmounts(daemon: Any) -> None:
    mp = os.path.join(daemon.state, "checkpoints")
    assert any(m.mountpoint == mp for m in mounts())
    assert daemon.stop(signal.SIGTERM) == 0
    assert not os.path.exists(daemon.socket)
    assert not any(m.mountpoint == mp for m in mounts())
    assert "Traceback" not in daemon.log()


def test_sigint_at_rest_and_shutdown_checkpoint(daemon_factory: Any) -> None:
    d = daemon_factory("--auto-interval", "60")
    write_file(os.path.join(d.root, "a"), b"1")
    d.create("v0")
    write_file(os.path.join(d.root, "a"), b"2")  # changed since: a clean shutdown keeps it
    assert d.stop(signal.SIGINT) == 0
    d2 = start_daemon(d.root, d.state)
    try:
        status, cps = d2.json("GET", "/v1/checkpoints?include_auto=true")
        assert [c["comment"] for c in cps] == ["at daemon shutdown", "v0"]
        assert cps[0]["created_by"] == "scheduler"
    finally:
        assert d2.stop() == 0


def test_the_view_follows_creates_and_deletes(daemon: Any) -> None:
    write_file(os.path.join(daemon.root, "etc/hosts"), b"127.0.0.1 localhost\n")
    daemon.create()
    mp = os.path.join(daemon.state, "checkpoints")
    with open(os.path.join(mp, "v0", "etc", "hosts"), "rb") as f:
        assert f.read() == b"127.0.0.1 localhost\n"
    write_file(os.path.join(daemon.root, "etc/hosts"), b"changed\n")
    daemon.create()
    assert sorted(os.listdir(mp)) == [".checkpoints.json", "v0", "v1"]
    p = subprocess.run(
        ["diff", os.path.join(mp, "v0/etc/hosts"), os.path.join(daemon.root, "etc/hosts")],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 1
    assert "< 127.0.0.1 localhost" in p.stdout
    daemon.request("DELETE", "/v1/checkpoints/v0")
    assert os.listdir(mp) == [".checkpoints.json", "v1"]
    trees.assert_trees_equal(daemon.root, os.path.join(mp, "v1"))


def test_state_inside_the_root_is_never_captured(daemon_factory: Any, tmp_path: Any) -> None:
    root = str(tmp_path / "layer")
    os.makedirs(root)
    trees.build_tree(root, trees.sample_spec())
    d = daemon_factory(root=root, state=os.path.join(root, ".sprite"))
    before = trees.snapshot_tree(root, ignore=[".sprite"])
    d.create("with state inside")
    status, cps = d.json("GET", "/v1/checkpoints")
    write_file(os.path.join(root, "junk"), b"x")
    status, evs = d.stream("POST", "/v1/checkpoints/v0/restore")
    assert evs[-1]["type"] == "complete", evs
    trees.assert_trees_equal(before, trees.snapshot_tree(root, ignore=[".sprite"]))
    assert os.path.exists(d.socket)  # the restore left the state alone
    assert ".sprite" not in os.listdir(os.path.join(d.state, "checkpoints", "v0"))


def test_kill_mid_restore_is_finished_at_the_next_start(daemon_factory: Any) -> None:
    d = daemon_factory(env={"SPRITE_ENV_CRASH_AT": "restore-entry-written:40"})
    spec = trees.sample_spec()
    for i in range(120):
        spec[f"many/f{i:03}".encode()] = trees.File(os.urandom(3000), mtime_ns=10**18 + i)
    trees.build_tree(d.root, spec)
    target = trees.snapshot_tree(d.root)
    d.create("target")
    for i in range(120):
        os.unlink(os.path.join(d.root, f"many/f{i:03}"))
    write_file(os.path.join(d.root, "junk/x"), b"x")
    status, evs = d.stream("POST", "/v1/checkpoints/v0/restore")  # killed in the middle
    assert all(e["type"] != "complete" for e in evs)
    d.proc.wait(60)
    assert d.proc.returncode == -signal.SIGKILL
    d.sweep_mount()
    d2 = start_daemon(d.root, d.state)
    try:
        trees.assert_trees_equal(target, d.root)  # finished before the socket answered
        status, st = d2.json("GET", "/v1/status")
        assert st["active"] == "v0"
        status, cps = d2.json("GET", "/v1/checkpoints?include_auto=true")
        assert {c["id"] for c in cps} >= {"v0"}
    finally:
        assert d2.stop() == 0
    with open_store(os.path.join(d.state, "store")) as s:
        assert check(s, read_data=True).ok


def test_scheduler_takes_auto_checkpoints_when_the_layer_changed(
    daemon_factory: Any, tmp_path: Any
) -> None:
    # Each state of the layer appears at once (the file is there before the daemon starts,
    # then replaced by a rename): a tick every 0.6 s must never see a half-made one (the
    # empty layer, an empty file), which would rightly be one more checkpoint.
    write_file(str(tmp_path / "root" / "a"), b"1")
    d = daemon_factory("--auto-interval", "0.01")  # 0.6 s
    deadline = time.monotonic() + 30
    autos: list[Any] = []
    while time.monotonic() < deadline and not autos:
        time.sleep(0.2)
        autos = d.json("GET", "/v1/checkpoints?include_auto=true")[1]
    assert len(autos) == 1
    assert autos[0]["created_by"] == "scheduler"
    time.sleep(2.0)  # unchanged: no more
    assert len(d.json("GET", "/v1/checkpoints?include_auto=true")[1]) == 1
    write_file(str(tmp_path / "a.new"), b"2")
    os.replace(tmp_path / "a.new", os.path.join(d.root, "a"))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(autos) < 2:
        time.sleep(0.2)
        autos = d.json("GET", "/v1/checkpoints?include_auto=true")[1]
    assert len(autos) == 2
    status, log = d.json("GET", "/v1/activity")
    assert [e["actor"] for e in log] == ["scheduler", "scheduler"]
    assert all(c["is_auto"] for c in autos)
    assert d.json("GET", "/v1/checkpoints")[1] == []


def test_a_stale_view_of_a_killed_daemon_is_cleaned_at_start(daemon_factory: Any) -> None:
    d = daemon_factory()
    write_file(os.path.join(d.root, "a"), b"a")
    d.create()
    mp = os.path.join(d.state, "checkpoints")
    d.kill()
    with pytest.raises(OSError, match="not connected"):  # the mount outlived its server
        os.listdir(mp)
    d2 = start_daemon(d.root, d.state)
    try:
        assert os.listdir(mp) == [".checkpoints.json", "v0"]
        with open(os.path.join(mp, "v0", "a"), "rb") as f:
            assert f.read() == b"a"
    finally:
        assert d2.stop() == 0
    assert "stale mount" in d2.log()


def test_a_full_disk_fails_the_create_and_loses_nothing(daemon_factory: Any, tmp_path: Any) -> None:
    store = str(tmp_path / "small-store")
    os.makedirs(store)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", store]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        d = daemon_factory("--store", store)
        write_file(os.path.join(d.root, "small.txt"), b"small")
        d.create("fits")
        write_file(os.path.join(d.root, "big.bin"), os.urandom(8 << 20))
        status, evs = d.stream("POST", "/v1/checkpoint", {"comment": "too big"})
        assert evs[-1]["type"] == "error", evs
        assert evs[-1]["code"] == "no_space"
        assert "No space left" in evs[-1]["error"]
        # The daemon goes on, nothing half-written is left, and the next create fits.
        status, cps = d.json("GET", "/v1/checkpoints")
        assert [c["id"] for c in cps] == ["v0"]
        os.unlink(os.path.join(d.root, "big.bin"))
        assert d.create("fits again")["id"] == "v1"
        assert d.stop() == 0
        with open_store(store) as s:
            assert check(s, read_data=True).ok
        log = [line for line in d.log().splitlines() if "ERROR" in line]
        assert log == []
    finally:
        subprocess.run(["umount", "-l", store], check=False)


def test_the_view_count_and_automatic_checkpoints(daemon_factory: Any) -> None:
    d = daemon_factory("--view-count", "2", "--view-auto")
    mp = os.path.join(d.state, "checkpoints")
    for i in range(3):
        write_file(os.path.join(d.root, "f"), str(i).encode())
        d.create(f"c{i}")
    assert sorted(os.listdir(mp)) == [".checkpoints.json", "v1", "v2"]
    status, evs = d.stream("POST", "/v1/checkpoints/v0/restore")
    undo = evs[-1]["undo"]
    assert sorted(os.listdir(mp)) == sorted([".checkpoints.json", undo, "v2"])
