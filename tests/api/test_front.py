"""The front process (``api/front.py``, issue 12 point 4): list and info repeated by a
process of their own, everything else the daemon's, with a real daemon.

The proof that an answer came from the front: the daemon's process is stopped
(SIGSTOP) and the answer still comes, byte for byte the daemon's own, while a request
only the daemon can answer waits until it is continued.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from typing import Any

import pytest

from tests.helpers.daemon import write_file

pytestmark = pytest.mark.integration


def _front_pid(daemon_pid: int) -> int:
    with open(f"/proc/{daemon_pid}/task/{daemon_pid}/children") as f:
        pids = [int(p) for p in f.read().split()]
    for pid in pids:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"sprite_env.api.front" in f.read():
                return pid
    raise AssertionError(f"no front process among {pids}")


def _raw(sock_path: str, data: bytes, *, timeout: float = 10.0, pause: float = 0.0) -> bytes:
    """Sends ``data`` (its first half, ``pause`` seconds, the rest) and reads to EOF."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(sock_path)
        if pause:
            s.sendall(data[: len(data) // 2])
            time.sleep(pause)
            data = data[len(data) // 2 :]
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_a_stopped_daemon_still_answers_list_and_info_from_its_front(daemon_factory: Any) -> None:
    d = daemon_factory("--no-view")
    write_file(os.path.join(d.root, "a"), b"one")
    d.create("v0")
    first = {p: d.request("GET", p) for p in ("/v1/checkpoints", "/v1/checkpoints/v0")}
    for p, (status, _, _) in first.items():
        assert status == 200, p
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        for p, (status, headers, body) in first.items():
            assert d.request("GET", p, timeout=10) == (status, headers, body)
            head = d.request("HEAD", p, timeout=10)
            assert head == (200, headers, b"")  # HEAD: the GET's head, no body
        with pytest.raises(TimeoutError):  # status is the daemon's own, and it is stopped
            d.request("GET", "/v1/status", timeout=1.5)
        # A spelling the daemon never answered is not the front's to guess
        with pytest.raises(TimeoutError):
            d.request("GET", "/v1/checkpoints?include_auto=1", timeout=1.5)
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    assert d.json("GET", "/v1/status")[0] == 200


def test_what_the_front_does_not_answer_is_the_daemons(daemon_factory: Any) -> None:
    d = daemon_factory("--no-view")
    d.create("v0")
    head = b"GET /v1/checkpoints HTTP/1.1\r\nhost: x\r\n"
    _, _, listed = d.request("GET", "/v1/checkpoints")
    d.request("GET", "/v1/checkpoints")  # shared with the front by now

    # two requests in one write: both answered, in order, the last closing
    two = _raw(d.socket, head + b"\r\n" + head + b"connection: close\r\n\r\n")
    assert two.count(b"HTTP/1.1 200 OK") == 2
    assert two.endswith(listed)
    # a body: the daemon reads it (and answers the list)
    withbody = _raw(d.socket, head + b"content-length: 2\r\nconnection: close\r\n\r\n{}")
    assert withbody.startswith(b"HTTP/1.1 200 OK")
    assert withbody.endswith(listed)
    # a header h11 refuses: the daemon's 400, as without a front
    bad = _raw(d.socket, head + b"bad header\r\nconnection: close\r\n\r\n")
    assert bad.startswith(b"HTTP/1.1 400 ")
    assert b"malformed request" in bad
    # half a request, then a pause past the front's grace: handed over with those bytes
    slow = _raw(d.socket, head + b"connection: close\r\n\r\n", pause=1.0)
    assert slow.startswith(b"HTTP/1.1 200 OK")
    assert slow.endswith(listed)
    # a method the front never answers
    post = _raw(d.socket, b"DELETE /v1/checkpoints/v9 HTTP/1.1\r\nhost: x\r\n\r\n")
    assert post.startswith(b"HTTP/1.1 404 ")


def test_a_daemon_whose_front_died_accepts_connections_itself(daemon_factory: Any) -> None:
    d = daemon_factory("--no-view")
    d.create("v0")
    assert d.json("GET", "/v1/checkpoints")[0] == 200
    os.kill(_front_pid(d.proc.pid), signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:  # connections the dead front held are lost; new ones are the daemon's
        try:
            status, cps = d.json("GET", "/v1/checkpoints", timeout=5)
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert status == 200
    assert [c["id"] for c in cps] == ["v0"]
    d.create("v1")
    assert [c["id"] for c in d.json("GET", "/v1/checkpoints")[1]] == ["v1", "v0"]
    assert "front: ended" in d.log()


def test_after_a_change_the_front_has_the_new_answers_before_anyone_asks(
    daemon_factory: Any,
) -> None:
    d = daemon_factory("--no-view")
    d.create("v0")
    assert d.json("GET", "/v1/checkpoints")[0] == 200  # the front repeats it from now on
    assert d.json("GET", "/v1/checkpoints/v0")[0] == 200
    d.create("v1")  # every answer dropped; the daemon answers them again on its own
    time.sleep(1.0)  # (it takes a few ms: two tiny checkpoints)
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:  # only the front can answer while the daemon is stopped; no client asked since
        status, cps = d.json("GET", "/v1/checkpoints", timeout=5)
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    assert status == 200
    assert [c["id"] for c in cps] == ["v1", "v0"]  # never the list from before the change
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        status, info = d.json("GET", "/v1/checkpoints/v0", timeout=5)
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    assert status == 200
    assert info["is_active"] is False  # v1 is
