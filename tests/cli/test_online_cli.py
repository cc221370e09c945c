"""The CLI as a client of a real daemon (subprocesses both): output, JSON and exit codes."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
import time
from typing import TYPE_CHECKING, Any

import pytest

from tests.helpers.cli import run_cli

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable

    from tests.helpers.daemon import DaemonProcess

pytestmark = pytest.mark.integration


def _write(root: str, name: str, text: str) -> None:
    with open(os.path.join(root, name), "w") as f:
        f.write(text)


def _cli(d: DaemonProcess) -> Callable[..., subprocess.CompletedProcess[str]]:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        r = run_cli(*args, env=d.env())
        assert "Traceback" not in r.stderr, r.stderr
        return r

    return cli


def _ndjson(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_full_loop(daemon_factory: Any) -> None:
    d = daemon_factory("--no-view")
    cli = _cli(d)
    _write(d.root, "a", "one")

    r = cli("checkpoints", "create", "--comment", "first")
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(r"v0: 1 files, 3 B, \d+ B newly stored\nCheckpoint created: v0\n", r.stdout)
    _write(d.root, "b", "two")
    r = cli("checkpoints", "create", "--comment", "second", "--json")
    events = _ndjson(r.stdout)  # the stream, line by line
    assert all({"type", "time", "job"} <= e.keys() for e in events)
    assert events[-1]["type"] == "complete"
    assert events[-1]["id"] == "v1"
    assert events[-1]["checkpoint"]["comment"] == "second"

    r = cli("checkpoints", "list")
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["ID", "CREATED", "FILES", "SIZE", "ADDED", "COMMENT"]
    assert lines[1].startswith("v1 *")
    assert lines[1].endswith("second")
    assert lines[2].startswith("v0 ")
    r = cli("checkpoints", "list", "--json")
    assert [c["id"] for c in json.loads(r.stdout)] == ["v1", "v0"]

    r = cli("checkpoints", "info", "v0")
    assert "Comment:  first" in r.stdout
    assert "ID:       v0\n" in r.stdout
    r = cli("checkpoints", "get", "v1", "--json")
    assert json.loads(r.stdout)["is_active"] is True
    r = cli("checkpoints", "info", "v7")
    assert r.returncode == 2
    assert "not found" in r.stderr
    r = cli("checkpoints", "info", "../etc")  # sent as one segment, ..%2Fetc
    assert r.returncode == 2

    r = cli("checkpoints", "diff", "v0", "v1")
    assert "+ b" in r.stdout.splitlines()
    _write(d.root, "a", "changed")
    r = cli("checkpoints", "diff", "v1", "--json")
    diff = json.loads(r.stdout)
    assert diff["to"] == "live"
    assert {"path": "a", "change": "modified"}.items() <= diff["changes"][-1].items()

    r = cli("restore", "v0", "--preview")
    assert r.returncode == 0
    assert r.stdout.startswith(
        "Restoring v0 would delete 1, change 1, create 0 and fix the metadata of 0 entries"
    )
    assert "  delete    b" in r.stdout.splitlines()
    r = cli("restore", "v0", "--preview", "--json")
    assert json.loads(r.stdout)["counts"]["remove"] == 1

    # No terminal, no --yes: a script (Sprites' self-checkpointing pattern). Every restore
    # can be undone, so it goes ahead and prints the undo id (issue 10).
    r = cli("restore", "v0")
    assert r.returncode == 0, r.stderr
    assert re.search(r"undo with: sprite-env restore auto-\d{8}T\d{6}Z", r.stdout)
    assert not os.path.exists(os.path.join(d.root, "b"))
    undo = r.stdout.rsplit(" ", 1)[-1].strip()
    # Again: the layer already is v0, so nothing at all happens.
    autos = json.loads(cli("checkpoints", "list", "--include-auto", "--json").stdout)
    r = cli("restore", "v0", "--yes")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "The layer already is v0: nothing to restore\n"
    assert json.loads(cli("checkpoints", "list", "--include-auto", "--json").stdout) == autos
    r = cli("checkpoints", "restore", undo, "--yes", "--json")  # the undo, as NDJSON
    assert _ndjson(r.stdout)[-1]["id"] == undo
    with open(os.path.join(d.root, "a")) as f:
        assert f.read() == "changed"

    r = cli("checkpoints", "delete", undo)  # the active one
    assert r.returncode == 2
    assert "cannot delete active checkpoint" in r.stderr
    r = cli("checkpoints", "rm", "v1", "--json")
    assert r.returncode == 0
    assert json.loads(r.stdout)["bytes_freed"] >= 0

    r = cli("checkpoints", "log")
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["TIME", "ACTOR", "ACTION", "ID", "OK", "DETAIL"]
    assert "delete" in lines[1]
    assert "v1" in lines[1]
    assert any("FAILED" in line and "cannot delete active" in line for line in lines)
    r = cli("checkpoints", "log", "--limit", "2", "--json")
    entries = json.loads(r.stdout)
    assert len(entries) == 2
    assert entries[0]["action"] == "delete"


def test_actor_reset_and_curl(daemon_factory: Any) -> None:
    d = daemon_factory("--no-view")
    cli = _cli(d)
    _write(d.root, "a", "one")
    r = cli("--as", "agent-7", "checkpoints", "create", "--comment", "mine")
    assert r.returncode == 0, r.stderr
    r = cli("checkpoints", "info", "v0", "--json")
    assert json.loads(r.stdout)["created_by"] == "agent-7"

    # No --overlay, so no base image: reset is refused at once (no prompt for what cannot
    # happen), with and without --yes, and nothing is touched (issue 10).
    for args in (["reset"], ["reset", "--yes", "--as", "cleaner"]):
        r = cli(*args)
        assert r.returncode == 2, r
        assert "needs a base image" in r.stderr
        assert "nothing was changed" in r.stderr
        assert os.listdir(d.root) == ["a"]
    r = cli("checkpoints", "list", "--include-auto", "--json")
    assert [c["id"] for c in json.loads(r.stdout)] == ["v0"]

    r = cli("curl", "/v1/checkpoints")
    assert r.returncode == 0
    assert [c["id"] for c in json.loads(r.stdout)] == ["v0"]
    r = cli("curl", "-i", "v1/status")
    assert r.stdout.startswith("HTTP/1.1 200 OK\n")  # (text mode reads \r\n as \n)
    assert json.loads(r.stdout.split("\n\n", 1)[1])["root"] == d.root
    r = cli("curl", "-X", "POST", "-d", '{"comment": "by curl"}', "/v1/checkpoint")
    assert r.returncode == 0
    assert _ndjson(r.stdout)[-1]["id"] == "v1"
    r = cli("curl", "/v1/nothing")
    assert r.returncode == 0  # like curl: an HTTP error is still an answer
    assert json.loads(r.stdout)["code"] == "unknown_path"
    r = cli("curl", "-f", "/v1/nothing")
    assert r.returncode == 22
    assert r.stdout == ""


def test_detach_then_follow(daemon_factory: Any) -> None:
    d = daemon_factory("--no-view")
    cli = _cli(d)
    _write(d.root, "a", "one")
    assert cli("checkpoints", "create").returncode == 0
    _write(d.root, "b", "two")

    r = cli("restore", "v0", "--yes", "--detach")
    assert r.returncode == 0, r.stderr
    m = re.search(r"job (\d+); follow it with: sprite-env curl /v1/jobs/(\d+)/events", r.stdout)
    assert m is not None, r.stdout
    assert m[1] == m[2]
    r = cli("curl", f"/v1/jobs/{m[1]}/events")
    events = _ndjson(r.stdout)
    assert events[-1]["type"] == "complete"
    assert events[-1]["undo"].startswith("auto-")
    assert not os.path.exists(os.path.join(d.root, "b"))

    r = cli("restore", "v0", "--yes", "--detach", "--json")
    (first,) = _ndjson(r.stdout)
    assert isinstance(first["job"], int)
    assert _ndjson(cli("curl", f"/v1/jobs/{first['job']}/events").stdout)[-1]["type"] == "complete"


def test_socket_option_and_a_daemon_still_starting(daemon_factory: Any) -> None:
    d = daemon_factory("--no-view", wait=False)  # the CLI waits for it
    lock = os.path.join(d.state, "daemon.lock")
    deadline = time.monotonic() + 60
    while not os.path.exists(lock) and time.monotonic() < deadline:
        time.sleep(0.01)  # once it holds its lock, the daemon is starting: worth a wait
    env = {"SPRITE_API_SOCK": "/nonexistent/api.sock", "SPRITE_API_WAIT": "60"}
    r = run_cli("--socket", d.socket, "checkpoints", "list", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == []
    d.wait_ready()


def test_no_daemon_exits_5() -> None:
    d = tempfile.mkdtemp(prefix="se-cli-", dir="/tmp")
    try:
        missing = os.path.join(d, "api.sock")
        env = {"SPRITE_API_SOCK": missing, "SPRITE_API_WAIT": "0"}
        r = run_cli("checkpoints", "list", env=env)
        assert r.returncode == 5
        assert r.stderr.strip() == (
            f"sprite-env: no sprite-env daemon runs for {missing}; start one with: "
            "sprite-env daemon --overlay LOWER:UPPER:WORK:MERGED (a sprite) or --root DIR"
        )
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(missing)  # a socket file nobody listens on
            r = run_cli("restore", "v0", "--yes", env=env)
            assert r.returncode == 5
            r = run_cli("curl", "/v1/status", env=env)
            assert r.returncode == 5
        # No daemon holds the state's lock: no 30 s wait, and no word of a restore.
        r = run_cli("checkpoints", "list", env={**env, "SPRITE_API_WAIT": "30"})
        assert r.returncode == 5
        assert "no sprite-env daemon runs for" in r.stderr
        assert "waiting" not in r.stderr
    finally:
        shutil.rmtree(d)


def test_a_killed_daemon_is_named_at_once(daemon_factory: Any) -> None:
    """kill -9 leaves the socket file behind: the CLI says so at once, with the pid."""
    d = daemon_factory("--no-view")
    pid = d.proc.pid
    d.kill()
    assert os.path.exists(d.socket)
    start = time.monotonic()
    r = run_cli("--socket", d.socket, "checkpoints", "list", env={"SPRITE_API_WAIT": "30"})
    assert r.returncode == 5, r
    assert time.monotonic() - start < 10  # was 30 s; the interpreter's start-up is the rest
    assert f"the last one, pid {pid}, is gone" in r.stderr
    assert "restore" not in r.stderr
