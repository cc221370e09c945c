"""``sprite_env.client`` without a daemon: resolution, waiting, error mapping, streams.

The replies come from a canned h11 server (``tests/helpers/canned_http.py``) that only
checks the client's parsing; the end-to-end tests run against the real daemon
(``tests/cli/test_online_cli.py``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from sprite_env import statelock
from sprite_env.client import (
    DEFAULT_SOCKET,
    NO_DAEMON_GRACE,
    ApiError,
    Client,
    DaemonUnavailable,
)
from sprite_env.errors import UserError
from tests.helpers.canned_http import Canned, CannedServer

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def sock_path() -> Iterator[str]:
    # tmp_path can be longer than the 107 bytes an AF_UNIX path may have
    d = tempfile.mkdtemp(prefix="se-client-", dir="/tmp")
    yield os.path.join(d, "api.sock")
    shutil.rmtree(d)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SPRITE_API_SOCK", "SPRITE_ACTOR", "SPRITE_API_WAIT"):
        monkeypatch.delenv(name, raising=False)


def _event(type_: str, job: int = 7, **fields: Any) -> dict[str, Any]:
    return {"type": type_, "time": "2025-01-01T00:00:00.000000Z", "job": job, **fields}


# -- where and who ---------------------------------------------------------------------------


def test_socket_resolution_order(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Client().socket_path == DEFAULT_SOCKET == "/.sprite/api.sock"
    monkeypatch.setenv("SPRITE_API_SOCK", "/env.sock")
    assert Client().socket_path == "/env.sock"
    assert Client("/arg.sock").socket_path == "/arg.sock"


def test_actor_resolution_order(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Client().actor == "user"
    monkeypatch.setenv("SPRITE_ACTOR", "agent-7")
    assert Client().actor == "agent-7"
    assert Client(actor="me").actor == "me"


def test_wait_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Client().wait == 30.0
    monkeypatch.setenv("SPRITE_API_WAIT", "2.5")
    assert Client().wait == 2.5
    assert Client(wait=0).wait == 0
    monkeypatch.setenv("SPRITE_API_WAIT", "soon")
    with pytest.raises(UserError, match="SPRITE_API_WAIT"):
        Client()


def test_actor_and_host_are_sent(sock_path: str) -> None:
    with CannedServer(sock_path, [Canned.json({"version": "x"})]) as server:
        assert Client(sock_path, actor="bob").status() == {"version": "x"}
    (seen,) = server.requests
    assert (seen.method, seen.target) == ("GET", "/v1/status")
    assert seen.headers["x-sprite-actor"] == "bob"
    assert seen.headers["host"] == "sprite"


# -- reaching the daemon ---------------------------------------------------------------------


def test_missing_socket_fails_at_once_without_wait(
    sock_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPRITE_API_WAIT", "0")
    start = time.monotonic()
    with pytest.raises(DaemonUnavailable) as info:
        Client(sock_path).list()
    assert time.monotonic() - start < 1
    assert info.value.exit_code == 5
    assert str(info.value) == (
        f"no sprite-env daemon runs for {sock_path}; start one with: sprite-env daemon "
        "--overlay LOWER:UPPER:WORK:MERGED (a sprite) or --root DIR"
    )


def test_socket_nobody_listens_on_fails_at_once(
    sock_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPRITE_API_WAIT", "0")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(sock_path)  # a socket file, but nothing listens: connections are refused
        start = time.monotonic()
        with pytest.raises(DaemonUnavailable, match="no sprite-env daemon runs"):
            Client(sock_path).status()
        assert time.monotonic() - start < 1


@pytest.fixture
def holder(sock_path: str) -> Iterator[subprocess.Popen[bytes]]:
    """A live process that holds STATE/daemon.lock as a starting daemon does (its pid in
    the file, "sprite_env" in its command line) before its socket exists."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "sprite_env"])
    with open(os.path.join(os.path.dirname(sock_path), "daemon.lock"), "w") as f:
        f.write(f"{p.pid}\nstarting\n")
    yield p
    p.kill()
    p.wait()


def test_no_daemon_fails_in_under_a_second_without_waiting_the_whole_wait(
    sock_path: str,
) -> None:
    # Issue 10: every command waited 30 s with no daemon, and blamed a restore.
    said: list[str] = []
    start = time.monotonic()
    with pytest.raises(DaemonUnavailable, match="no sprite-env daemon runs for"):
        Client(sock_path, wait=30, notice=said.append).status()
    assert time.monotonic() - start < 1.5
    assert said == []


def test_a_stale_socket_names_the_dead_daemon(sock_path: str) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass", "sprite_env"])
    dead.wait()
    with open(os.path.join(os.path.dirname(sock_path), "daemon.lock"), "w") as f:
        f.write(f"{dead.pid}\nserving\n")  # what a kill -9 leaves
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(sock_path)
        start = time.monotonic()
        with pytest.raises(DaemonUnavailable) as info:
            Client(sock_path, wait=30).status()
        assert time.monotonic() - start < 1.5
    assert f"the last one, pid {dead.pid}, is gone" in str(info.value)


def test_waits_the_bounded_time_and_says_so_once(sock_path: str, holder: Any) -> None:
    said: list[str] = []
    start = time.monotonic()
    with pytest.raises(DaemonUnavailable, match="after 1.2 s"):
        Client(sock_path, wait=1.2, notice=said.append).status()
    assert 1.2 <= time.monotonic() - start < 3
    assert said == [f"waiting for the sprite-env daemon at {sock_path} (is starting)..."]


def test_waits_for_a_daemon_that_comes_up(sock_path: str, holder: Any) -> None:
    said: list[str] = []
    assert _status_served_after(0.3, sock_path, said) == {"version": "x"}
    assert len(said) == 1


def _status_served_after(delay: float, sock_path: str, said: list[str]) -> Any:
    """A client's status where a daemon's socket appears ``delay`` s after it is asked."""
    servers: list[CannedServer] = []

    def start_later() -> None:
        time.sleep(delay)
        servers.append(CannedServer(sock_path, [Canned.json({"version": "x"})]).__enter__())

    t = threading.Thread(target=start_later)
    t.start()
    try:
        return Client(sock_path, wait=10, notice=said.append).status()
    finally:
        t.join()
        for s in servers:
            s.__exit__(None, None, None)


def test_a_daemon_that_looked_absent_once_is_waited_for(
    sock_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No lock yet, and the first look at /proc finds no starting daemon (as right after
    its spawn), the next ones find it: the client waits for it past the grace for "none
    runs" (the grace was kept from the first look: it gave up after 0.8 s, saying it had
    waited the whole wait; a CI run's flaky test)."""
    looks: list[float] = []

    def starting_daemon(state: str, young_s: float = 30.0) -> int | None:
        looks.append(time.monotonic())
        return None if len(looks) == 1 else 4242

    monkeypatch.setattr(statelock, "starting_daemon", starting_daemon)
    said: list[str] = []
    start = time.monotonic()
    assert _status_served_after(NO_DAEMON_GRACE + 0.5, sock_path, said) == {"version": "x"}
    assert time.monotonic() - start > NO_DAEMON_GRACE
    assert len(looks) > 2
    assert said == [f"waiting for the sprite-env daemon at {sock_path} (pid 4242 is starting)..."]


def test_wait_zero_does_not_wait_even_the_grace(sock_path: str) -> None:
    start = time.monotonic()
    with pytest.raises(DaemonUnavailable, match="no sprite-env daemon runs for"):
        Client(sock_path, wait=0).status()
    assert time.monotonic() - start < NO_DAEMON_GRACE


def test_starting_daemon_is_retried(sock_path: str) -> None:
    said: list[str] = []
    replies = [Canned.problem("starting", 503), Canned.json([])]
    with CannedServer(sock_path, replies) as server:
        assert Client(sock_path, wait=5, notice=said.append).list() == []
    assert len(server.requests) == 2
    assert len(said) == 1


def test_busy_is_not_retried(sock_path: str) -> None:
    with (
        CannedServer(sock_path, [Canned.problem("busy", 503, "queue full")]),
        pytest.raises(ApiError) as info,
    ):
        Client(sock_path, wait=5).create("x")
    assert (info.value.code, info.value.status, info.value.exit_code) == ("busy", 503, 4)
    assert str(info.value) == "queue full"


# -- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "status", "exit_code"),
    [
        ("not_found", 404, 2),
        ("invalid_id", 400, 2),
        ("invalid_comment", 400, 2),
        ("active_checkpoint", 409, 2),
        ("quota_exceeded", 409, 2),
        ("unknown_path", 404, 2),
        ("method_not_allowed", 405, 2),
        ("body_too_large", 413, 2),
        ("unsupported_media_type", 415, 2),
        ("store_error", 500, 3),
        ("internal", 500, 1),
        ("something_new", 418, 1),
    ],
)
def test_error_json_maps_to_exit_codes(
    sock_path: str, code: str, status: int, exit_code: int
) -> None:
    with (
        CannedServer(sock_path, [Canned.problem(code, status, f"it is {code}")]),
        pytest.raises(ApiError) as info,
    ):
        Client(sock_path).info("v1")
    assert info.value.code == code
    assert info.value.status == status
    assert info.value.exit_code == exit_code
    assert info.value.message == f"it is {code}"


def test_error_that_is_not_json(sock_path: str) -> None:
    with (
        CannedServer(sock_path, [Canned(502, [b"<html>bad gateway</html>"], "text/html")]),
        pytest.raises(ApiError) as info,
    ):
        Client(sock_path).status()
    assert info.value.code == "http_error"
    assert info.value.exit_code == 1
    assert "HTTP 502" in str(info.value)


def test_ids_stay_one_path_segment(sock_path: str) -> None:
    replies = [Canned.json({}), Canned.json({}), Canned.json([])]
    with CannedServer(sock_path, replies) as server:
        c = Client(sock_path)
        c.info("../etc")
        c.diff("v1", "v 2")
        c.list(include_auto=True, history="v3")
    assert [r.target for r in server.requests] == [
        "/v1/checkpoints/..%2Fetc",
        "/v1/checkpoints/v1/diff?against=v+2",
        "/v1/checkpoints?include_auto=true&history=v3",
    ]


def test_request_returns_any_status(sock_path: str) -> None:
    with CannedServer(sock_path, [Canned.problem("not_found", 404)]):
        status, headers, body = Client(sock_path).request("GET", "/v1/nothing")
    assert status == 404
    assert headers["content-type"] == "application/json"
    assert b'"not_found"' in body


# -- streams ---------------------------------------------------------------------------------


def test_create_streams_events_and_returns_complete(sock_path: str) -> None:
    done = _event("complete", data="Checkpoint v3 created successfully", id="v3")
    stream = Canned.events(
        _event("info", data="Creating checkpoint..."),
        _event("progress", phase="capture", files=10, bytes=100),
        done,
    )
    seen: list[dict[str, Any]] = []
    with CannedServer(sock_path, [stream]) as server:
        got = Client(sock_path).create("a comment", created_by="agent", on_event=seen.append)
    assert got == done
    assert [e["type"] for e in seen] == ["info", "progress", "complete"]
    (req,) = server.requests
    assert (req.method, req.target) == ("POST", "/v1/checkpoint")
    assert req.headers["content-type"] == "application/json"
    assert req.body == b'{"comment": "a comment", "created_by": "agent"}'


def test_lines_split_across_chunks(sock_path: str) -> None:
    line = b'{"type":"complete","time":"t","job":1,"id":"v0","data":"ok"}\n'
    stream = Canned(200, [line[:10], line[10:30], line[30:]], "application/x-ndjson", True)
    with CannedServer(sock_path, [stream]):
        assert Client(sock_path).create()["id"] == "v0"


def test_error_event_raises(sock_path: str) -> None:
    stream = Canned.events(
        _event("info", data="Creating checkpoint..."),
        _event("error", error="pack 3 is damaged", code="store_error"),
    )
    with CannedServer(sock_path, [stream]), pytest.raises(ApiError) as info:
        Client(sock_path).create()
    assert (info.value.code, info.value.status, info.value.exit_code) == ("store_error", None, 3)
    assert str(info.value) == "pack 3 is damaged"


def test_validation_error_comes_before_the_stream(sock_path: str) -> None:
    with (
        CannedServer(sock_path, [Canned.problem("invalid_comment", 400, "comment too long")]),
        pytest.raises(ApiError, match="comment too long") as info,
    ):
        Client(sock_path).create("x" * 5000)
    assert info.value.exit_code == 2


def test_a_dropped_stream_is_followed_to_its_end(sock_path: str) -> None:
    first = [_event("info", data="Restoring v1..."), _event("progress", phase="restore")]
    done = _event("complete", data="Restore from v1 complete", id="v1", undo="auto-x")
    replies = [
        Canned.events(*first, drop=True, status=202),
        Canned.events(*first, done),  # a re-attach replays the job's events from its start
    ]
    seen: list[dict[str, Any]] = []
    with CannedServer(sock_path, replies) as server:
        assert Client(sock_path).restore("v1", on_event=seen.append) == done
    assert [e["type"] for e in seen] == ["info", "progress", "complete"]
    assert [(r.method, r.target) for r in server.requests] == [
        ("POST", "/v1/checkpoints/v1/restore"),
        ("GET", "/v1/jobs/7/events"),
    ]


def test_a_job_the_daemon_forgot(sock_path: str) -> None:
    replies = [
        Canned.events(_event("info", data="Restoring v1..."), drop=True, status=202),
        Canned.problem("not_found", 404, "no job 7"),
    ]
    with CannedServer(sock_path, replies), pytest.raises(DaemonUnavailable, match="lost job 7"):
        Client(sock_path).restore("v1")


def test_a_stream_that_never_names_its_job(sock_path: str) -> None:
    with (
        CannedServer(sock_path, [Canned.events(drop=True)]),
        pytest.raises(DaemonUnavailable, match="before naming its job"),
    ):
        Client(sock_path).reset()


def test_detach_returns_the_first_event(sock_path: str) -> None:
    first = _event("info", job=12, data="Waiting for job 11 (restore v2)...")
    stream = Canned.events(first, _event("complete", job=12, id="v1"), status=202)
    with CannedServer(sock_path, [stream]):
        assert Client(sock_path).restore("v1", detach=True) == first


def test_follow(sock_path: str) -> None:
    done = _event("complete", job=3, id="v3")
    with CannedServer(sock_path, [Canned.events(_event("info", job=3, data="x"), done)]) as s:
        assert Client(sock_path).follow(3) == done
    assert s.requests[0].target == "/v1/jobs/3/events"


def test_open_reply_streams_chunks(sock_path: str) -> None:
    stream = Canned.events(_event("info", data="a"), _event("complete", id="v0"))
    with CannedServer(sock_path, [stream]), Client(sock_path).open_reply("GET", "/x") as r:
        assert r.status == 200
        body = b"".join(r.chunks())
    assert body.count(b"\n") == 2
