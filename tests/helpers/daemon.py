"""A real daemon for the tests: a subprocess on temporary directories, talked to over its
socket (with the standard library's HTTP client, the CLI, or curl)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from sprite_env.client import UnixHTTPConnection
from sprite_env.fuse.mount import unmount
from sprite_env.mountinfo import mounts
from tests.helpers.cli import REPO


class DaemonProcess:
    def __init__(
        self, root: str, state: str, args: list[str], env: dict[str, str] | None = None
    ) -> None:
        self.extra_env = env or {}
        self.root = root
        self.state = state
        self.socket = os.path.join(state, "api.sock")
        self.log_path = state.rstrip("/") + ".log"
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, *, wait: bool = True) -> DaemonProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "sprite_env",
                    "daemon",
                    *(["--root", self.root] if "--overlay" not in self.args else []),
                    "--state",
                    self.state,
                    *self.args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env={**os.environ, **self.extra_env},
            )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                if self.request("GET", "/v1/status")[0] == 200:
                    return
            time.sleep(0.05)
        raise AssertionError(f"daemon not ready after {timeout} s:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120.0) -> int:
        """Stops the daemon; returns its exit status. Leaves no mount behind."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"daemon did not stop in {timeout} s:\n{self.log()}") from None
        self.sweep_mount()
        return self.proc.returncode

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def sweep_mount(self) -> None:
        mp = os.path.join(self.state, "checkpoints")
        for m in mounts():
            if m.mountpoint == mp:
                with contextlib.suppress(Exception):
                    unmount(mp, lazy=True)

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    # -- talking ----------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        return {"SPRITE_API_SOCK": self.socket, "SPRITE_API_WAIT": "30"}

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float = 120.0,
    ) -> tuple[int, dict[str, str], bytes]:
        conn = UnixHTTPConnection(self.socket, timeout)
        try:
            data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers=headers or {})
            r = conn.getresponse()
            try:
                data = r.read()
            except http.client.IncompleteRead as e:  # the daemon died mid-stream
                data = e.partial
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            conn.close()

    def json(self, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        status, _, data = self.request(method, path, body, **kw)
        return status, json.loads(data)

    def create(self, comment: str = "", **body: Any) -> dict[str, Any]:
        """``POST /v1/checkpoint``; asserts it completed and returns its last event."""
        status, evs = self.stream("POST", "/v1/checkpoint", {"comment": comment, **body})
        assert status == 200, evs
        assert evs[-1]["type"] == "complete", evs
        return evs[-1]

    def stream(self, method: str, path: str, body: Any = None) -> tuple[int, list[dict[str, Any]]]:
        """Sends a request whose answer is NDJSON; returns the status and every event."""
        status, _, data = self.request(method, path, body)
        return status, [json.loads(line) for line in data.splitlines() if line.strip()]

    def curl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["curl", "-sS", "--unix-socket", self.socket, *args],
            capture_output=True,
            text=True,
            timeout=300,
        )


def write_file(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path``, making its parent directories."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def start_daemon(
    root: str, state: str, *args: str, wait: bool = True, env: dict[str, str] | None = None
) -> DaemonProcess:
    """Starts ``sprite-env daemon`` on ``root`` and ``state`` (no timer unless asked)."""
    extra = list(args)
    if not any(a.startswith("--auto-interval") for a in extra):
        extra += ["--auto-interval", "0"]
    return DaemonProcess(root, state, extra, env).start(wait=wait)
