"""The daemon as the benchmarks drive it: a subprocess, its Unix socket, and cleanup.

:class:`Daemon` starts ``sprite-env daemon`` the way ``bench_checkpoints.setup_sprite``
chose (the working tree, or a frozen copy of HEAD); :func:`call`, :func:`stream` and
:func:`job` speak HTTP on its socket (a new connection per request, NDJSON events with the
time each arrived); :class:`Cleanup` ends what a run started and unmounts what it mounted.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_checkpoints as bc  # noqa: E402  (SPRITE_CMD, SPRITE_ENV: how sprite-env runs)
from _peers import write_results  # noqa: E402

from sprite_env.mountinfo import mounts  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def q(s: str) -> str:
    return shlex.quote(s)


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


# -- HTTP over the socket -----------------------------------------------------------------


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 60.0) -> None:
        super().__init__("sprite", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def _send(conn: http.client.HTTPConnection, method: str, path: str, body: Any) -> None:
    data = None if body is None else json.dumps(body).encode()
    headers = {} if data is None else {"content-type": "application/json"}
    conn.request(method, path, body=data, headers=headers)


def call(sock: str, method: str, path: str, body: Any = None, timeout: float = 120.0) -> Any:
    """One request on a new connection; returns ``(status, body bytes)``."""
    conn = UnixHTTPConnection(sock, timeout)
    try:
        _send(conn, method, path, body)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


@dataclass
class Streamed:
    """An NDJSON answer: every event, and when each arrived (seconds after sending)."""

    status: int
    wall: float
    events: list[dict[str, Any]]
    arrived: list[float]

    @property
    def last(self) -> dict[str, Any]:
        return self.events[-1] if self.events else {}

    @property
    def ok(self) -> bool:
        return self.last.get("type") == "complete"


def stream(sock: str, method: str, path: str, body: Any = None) -> Streamed:
    conn = UnixHTTPConnection(sock, 1800.0)
    try:
        t0 = time.perf_counter()
        _send(conn, method, path, body)
        r = conn.getresponse()
        events: list[dict[str, Any]] = []
        arrived: list[float] = []
        while line := r.readline():
            if line.strip():
                arrived.append(time.perf_counter() - t0)
                events.append(json.loads(line))
        return Streamed(r.status, time.perf_counter() - t0, events, arrived)
    finally:
        conn.close()


def job(sock: str, method: str, path: str, body: Any = None) -> Streamed:
    """A job's stream; raises unless it ends with ``complete``."""
    s = stream(sock, method, path, body)
    if not s.ok:
        raise RuntimeError(f"{method} {path}: HTTP {s.status}, last event {s.last}")
    return s


def event_time(e: dict[str, Any]) -> float:
    return datetime.strptime(e["time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


# -- processes and mounts -----------------------------------------------------------------


class Daemon:
    """``sprite-env daemon`` as a subprocess (no timer), its log next to its state dir."""

    def __init__(self, state: str, args: list[str]) -> None:
        self.state = state
        self.socket = os.path.join(state, "api.sock")
        self.log_path = state + ".log"
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 180.0) -> Daemon:
        argv = [*bc.SPRITE_CMD, "daemon", "--state", self.state, "--auto-interval", "0"]
        with open(self.log_path, "ab") as f:
            self.proc = subprocess.Popen(
                [*argv, *self.args],
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env={**os.environ, **bc.SPRITE_ENV},
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}: {self.log()[-2000:]}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                if call(self.socket, "GET", "/v1/status", timeout=5)[0] == 200:
                    return self
            time.sleep(0.05)
        raise RuntimeError(f"daemon not ready after {timeout} s: {self.log()[-2000:]}")

    def stop(self, timeout: float = 120.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def env(self) -> dict[str, str]:
        return {**os.environ, **bc.SPRITE_ENV, "SPRITE_API_SOCK": self.socket}


def mounts_under(path: str) -> list[tuple[str, str]]:
    """(mount point, fs type) of every mount at or below ``path``, deepest first."""
    prefix = path.rstrip("/") + "/"
    found = [(m.mountpoint, m.fstype) for m in mounts()]
    found = [(mp, t) for mp, t in found if mp == path or mp.startswith(prefix)]
    return sorted(found, key=lambda m: -len(m[0]))


def is_overlay(merged: str) -> bool:
    return any(mp == merged and t == "overlay" for mp, t in mounts_under(merged))


def pids_using(path: str) -> list[int]:
    """Processes (not this one) whose working directory or an open file is under path."""
    prefix = path.rstrip("/") + "/"
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        links = [f"/proc/{name}/cwd"]
        with contextlib.suppress(OSError):
            links += [f"/proc/{name}/fd/{fd}" for fd in os.listdir(f"/proc/{name}/fd")]
        for link in links:
            with contextlib.suppress(OSError):
                if os.readlink(link).startswith(prefix):
                    out.append(int(name))
                    break
    return out


class Cleanup:
    """Everything this run started, ended on any exit: processes (by their Popen), daemons,
    what still runs in the scratch directory (a killed daemon's services), the mounts
    under it (lazily)."""

    def __init__(self, work: str) -> None:
        self.work = work
        self.procs: list[subprocess.Popen[bytes]] = []
        self.daemons: list[Daemon] = []

    def run(self) -> list[str]:
        notes = []
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for d in reversed(self.daemons):
            rc = d.stop()
            if rc not in (0, None):
                notes.append(f"daemon {os.path.basename(d.state)} exited {rc}")
        for pid in pids_using(self.work):
            notes.append(f"killed leftover process {pid}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for mp, _t in mounts_under(self.work):
            subprocess.run(["umount", "-l", mp], check=False, capture_output=True)
        return notes


def complete_frozen_copy(work: str) -> list[str]:
    """Extracts from HEAD what the frozen copy's symlinks point to outside ``sprite_env/``
    (``sprite_env/llm.txt`` is a link to the repository's ``llm.txt``, which the daemon
    installs at start); returns those paths."""
    dest = os.path.join(work, "sprite-env-src")
    added = []
    for dirpath, _dirs, files in os.walk(os.path.join(dest, "sprite_env")):
        for name in files:
            path = os.path.join(dirpath, name)
            if os.path.islink(path) and not os.path.exists(path):
                target = os.path.relpath(os.path.realpath(path), dest)
                archive = subprocess.run(
                    ["git", "-C", REPO, "archive", "HEAD", target], capture_output=True, check=True
                ).stdout
                subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
                added.append(target)
    return added


def relative(o: Any) -> Any:
    """The payload with every path under the repository made relative to it."""
    if isinstance(o, str):
        return o.replace(REPO + "/", "").replace(REPO, ".")
    if isinstance(o, dict):
        return {relative(k): relative(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [relative(v) for v in o]
    return o


def save_run(
    benchmark: str,
    path: str,
    facts: dict[str, Any],
    results: dict[str, Any],
    *,
    versions: dict[str, str],
    src0: dict[str, Any],
    frozen: bool,
    load0: tuple[float, float, float],
    elapsed: float,
    anomalies: list[str],
    text: str,
) -> str:
    """Writes a run's JSON to ``path`` (paths under the repository made relative): its
    ``facts`` and ``results``, the versions, the sprite-env source measured (at the start
    and at the end: the shared tree may move meanwhile), the load, the anomalies and the
    markdown; prints and returns the path."""
    payload = relative(
        {
            "benchmark": benchmark,
            **facts,
            "versions": versions,
            "sprite_env_source": {"start": src0, "end": bc.source_state(), "frozen": frozen},
            "loadavg_at_start": load0,
            "elapsed_s": elapsed,
            **results,
            "anomalies": anomalies,
            "markdown": text,
        }
    )
    path = write_results(benchmark, payload, path)
    print(f"\nresults: {os.path.relpath(path)}")
    return path
