"""The daemon at work: API latency, restore in the sprite shape, and the writers' pause.

Usage::

    python benchmarks/bench_daemon.py [--size small|medium] [--rounds 3]
                                      [--parts api,restore,pause] [--work DIR] [--keep]
                                      [--no-freeze] [--out FILE]

Three measurements in one run, on the realistic layer of ``layer.py`` (``--size`` is its
profile), each with a daemon started as a subprocess and talked to over its Unix socket:

1. **API latency** (``api``). A daemon on a ``cp -a`` copy of the layer (``--root``),
   holding ``LIST_SIZE`` checkpoints. ``THREADS`` client threads send GET /v1/checkpoints
   and GET /v1/checkpoints/{id} back to back, each request on a new connection (stdlib
   ``http.client``): (a) idle, for ``IDLE_S`` seconds; (b) while the checkpoint after one
   agent session (``layer.mutate``) is created; and once, (c) while the first checkpoint
   of the whole layer is created (the list only: no id exists yet). Every round first
   puts the layer back (``layer.reset_tree``) and mutates it again, and deletes its
   checkpoint afterwards (untimed), so each round's create stores the session anew. Then
   ``sprite-env checkpoints list`` (a subprocess, idle) against ``ls -l`` of a small
   directory (the floor: starting a process) and ``restic snapshots --json`` on a
   repository with as many snapshots of the same layer.
2. **Restore in the sprite shape** (``restore``). The cached layer is LOWER (the base
   image, used in place: overlayfs never writes to it); UPPER starts empty. Three such
   overlays, one per tool, each brought to the same states the same way: a service
   definition (``etc/sprite/services/web.toml``, a sleep loop) and one agent session
   (``layer.mutate``) written through MERGED, then the state to bring back (sprite-env:
   checkpoint A through the daemon; restic: ``restic backup`` of UPPER; rsync: ``cp -a``
   of UPPER). Each round, per tool (rotating the first): another change through MERGED
   (:func:`other_change`, new data every round), then, timed, bringing back A:

   - sprite-env: POST /v1/checkpoints/A/restore until its ``complete`` event, with the
     ``web`` service running and one process started by hand in MERGED; the time of each
     NDJSON step comes from the events' ``time`` fields;
   - restic: ``umount MERGED``, empty UPPER, ``restic restore`` into it, empty WORK, mount;
   - rsync: ``umount MERGED``, ``rsync -aX --delete SAVED/ UPPER/``, empty WORK, mount
     (``-X``: an opaque directory is an xattr; without it the layer would be wrong).

   Every restore is verified: UPPER is walked and compared, entry by entry, with UPPER as
   it was at A (type, content hash, mode, owner, mtime, device number (whiteouts), xattrs
   (opaque directories)); a digest of the whole tree is recorded. sprite-env's restore
   ends with one ``syncfs``; the peers' do not, so a ``sync`` right after them is timed
   apart.
3. **The writers' pause** (``pause``). In the same overlay daemon: a writer in MERGED (as
   in ``tests/overlay/test_consistency.py``: a log append and a 10-row SQLite WAL
   transaction per iteration, each iteration's end time recorded), while
   ``PAUSED_CREATES`` checkpoints are taken one second apart: the daemon's reported pause
   (the ``pause`` of each ``complete`` event) against the writer's worst gap between two
   iterations during each create, and its median gap outside the creates.

Before every timed run: ``sync`` (warm cache: no drop). sprite-env is run from a copy of
``sprite_env/`` as committed at HEAD (as ``bench_checkpoints.py`` does); ``--no-freeze``
runs the installed one. Mounts, daemons and processes are cleaned up on any exit. Output:
markdown tables on stdout, JSON in ``benchmarks/results/daemon-<size>.json`` (paths
relative to the repository). A failed part is reported, and the run goes on.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import hashlib
import http.client
import json
import math
import os
import random
import resource
import shlex
import shutil
import signal
import socket
import sqlite3
import stat
import statistics
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_checkpoints as bc  # noqa: E402  (freezing sprite-env the same way)
import layer  # noqa: E402
from _peers import RESULTS_DIR, markdown_table, run_measured, shell, write_results  # noqa: E402

SPRITE, RESTIC, RSYNC = "sprite-env", "restic", "rsync"
#: Client threads of the latency load, and how long the idle measurement lasts.
THREADS = 20
IDLE_S = 3.0
#: Checkpoints the latency daemon holds (and snapshots restic's repository holds).
LIST_SIZE = 5
#: CLI runs per round, per command.
CLI_RUNS = 5
#: Checkpoints taken while the writer runs.
PAUSED_CREATES = 5
SERVICE_TOML = 'command = "while true; do sleep 1; done"\nworkdir = "/srv"\nrestart = "always"\n'
RESTIC_PASSWORD = "bench"

# The writer: one log record and one 10-row WAL transaction per iteration, until SIGTERM;
# then it writes the monotonic end time of every iteration (float64s) to OUT.
WRITER = r"""
import array, os, signal, sqlite3, sys, time
merged, out = sys.argv[1], sys.argv[2]
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
d = os.path.join(merged, "home", "dev", "data")
fd = os.open(os.path.join(d, "writer.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
db = sqlite3.connect(os.path.join(d, "writer.db"), isolation_level=None)
db.execute("PRAGMA journal_mode=WAL")
db.execute("CREATE TABLE IF NOT EXISTS t (batch INTEGER, i INTEGER, pad BLOB)")
times = array.array("d", [time.monotonic()])
seq = 0
while not stop:
    os.write(fd, f"{seq:010d} ".encode().ljust(511, b"x") + b"\n")
    db.execute("BEGIN")
    for i in range(10):
        db.execute("INSERT INTO t VALUES (?, ?, randomblob(300))", (seq, i))
    db.execute("COMMIT")
    seq += 1
    times.append(time.monotonic())
    if seq == 50:
        open(out + ".ready", "w").close()
with open(out, "wb") as f:
    f.write(times.tobytes())
"""


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


# -- load ---------------------------------------------------------------------------------


@dataclass
class Req:
    endpoint: str
    start: float  # perf_counter
    ms: float
    status: int  # 0: no answer
    error: str | None = None


class Load:
    """``threads`` clients sending GETs back to back (a new connection each), cycling
    through ``paths``, from ``__enter__`` to ``__exit__``."""

    def __init__(self, sock: str, paths: dict[str, str], threads: int = THREADS) -> None:
        self.sock = sock
        self.paths = paths
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(threads)]
        self.reqs: list[Req] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self.threads:
            t.join(120)

    def _run(self, i: int) -> None:
        names = list(self.paths)
        out: list[Req] = []
        k = i
        while not self._stop.is_set():
            name = names[k % len(names)]
            k += 1
            t0 = time.perf_counter()
            err = None
            try:
                status, _body = call(self.sock, "GET", self.paths[name], timeout=60)
            except (OSError, http.client.HTTPException) as e:
                status, err = 0, f"{type(e).__name__}: {e}"
            out.append(Req(name, t0, (time.perf_counter() - t0) * 1000, status, err))
        with self._lock:
            self.reqs.extend(out)

    def between(self, a: float, b: float) -> list[Req]:
        return [r for r in self.reqs if a <= r.start < b]


def latency(reqs: list[Req], seconds: float) -> dict[str, Any]:
    ms = [r.ms for r in reqs if r.status == 200]
    out: dict[str, Any] = {
        "count": len(reqs),
        "failed": len(reqs) - len(ms),
        "seconds": round(seconds, 3),
        "per_s": round(len(reqs) / seconds, 1) if seconds else None,
        "errors": sorted({r.error or f"HTTP {r.status}" for r in reqs if r.status != 200})[:3],
    }
    if ms:
        out.update(
            median_ms=statistics.median(ms),
            p90_ms=pct(ms, 90),
            p99_ms=pct(ms, 99),
            max_ms=max(ms),
        )
    return out


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
    found = []
    prefix = path.rstrip("/") + "/"
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            mp = fields[4].encode().decode("unicode_escape")
            if mp == path or mp.startswith(prefix):
                found.append((mp, fields[fields.index("-") + 1]))
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


# -- trees --------------------------------------------------------------------------------

#: kind, mode, uid, gid, size, content digest (symlink: target), mtime ns, rdev, xattrs
Entry = tuple[str, int, int, int, int, str, int, int, str]
FIELDS = ["kind", "mode", "uid", "gid", "size", "content", "mtime", "rdev", "xattrs"]


def _xattrs(path: str) -> str:
    try:
        names = sorted(os.listxattr(path, follow_symlinks=False))
        if not names:
            return ""
        h = hashlib.blake2b(digest_size=8)
        for n in names:
            h.update(n.encode() + b"\0" + os.getxattr(path, n, follow_symlinks=False) + b"\0")
    except OSError as e:
        return f"error {e.errno}"
    return ",".join(names) + "=" + h.hexdigest()


def manifest(root: str) -> dict[str, Entry]:
    """Every entry under root (root itself left out). Directory sizes and link counts are
    not compared (overlayfs links whiteouts to one inode in WORK)."""
    out: dict[str, Entry] = {}
    for rel, st in layer.walk(root):
        full = os.path.join(root, rel)
        mode = st.st_mode
        size, digest, rdev = 0, "", 0
        if stat.S_ISREG(mode):
            h = hashlib.blake2b()
            with open(full, "rb", buffering=0) as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            kind, size, digest = "file", st.st_size, h.hexdigest()
        elif stat.S_ISDIR(mode):
            kind = "dir"
        elif stat.S_ISLNK(mode):
            kind, digest = "symlink", os.readlink(full)
        else:
            kind, rdev = f"special:{stat.S_IFMT(mode):o}", st.st_rdev
        out[rel] = (
            kind,
            stat.S_IMODE(mode),
            st.st_uid,
            st.st_gid,
            size,
            digest,
            st.st_mtime_ns,
            rdev,
            _xattrs(full),
        )
    return out


def tree_digest(m: dict[str, Entry]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for rel in sorted(m):
        h.update(json.dumps([rel, *m[rel]]).encode() + b"\n")
    return h.hexdigest()


def compare(expected: dict[str, Entry], actual: dict[str, Entry]) -> dict[str, Any]:
    """Entry by entry: ``{"ok", "digest", "counts", "examples"}``."""
    counts: dict[str, int] = {}
    examples: dict[str, list[str]] = {}

    def bad(what: str, path: str) -> None:
        counts[what] = counts.get(what, 0) + 1
        if len(examples.setdefault(what, [])) < 5:
            examples[what].append(path)

    for path, e in expected.items():
        a = actual.get(path)
        if a is None:
            bad("missing", path)
        elif a[0] != e[0]:
            bad("kind", path)
        else:
            for i, name in enumerate(FIELDS[1:], 1):
                if a[i] != e[i]:
                    bad(name, path)
    for path in actual.keys() - expected.keys():
        bad("extra", path)
    return {
        "ok": not counts,
        "digest": tree_digest(actual),
        "expected_digest": tree_digest(expected),
        "entries": len(actual),
        "counts": counts,
        "examples": examples,
    }


def verdict(v: dict[str, Any] | None) -> str:
    if v is None:
        return "-"
    if v["ok"]:
        return f"ok ({v['entries']:,} entries, digest {v['digest'][:12]})"
    return "**MISMATCH** " + " ".join(f"{k}={n}" for k, n in v["counts"].items())


def du(path: str) -> int:
    out = subprocess.run(["du", "-sb", path], check=True, capture_output=True, text=True)
    return int(out.stdout.split()[0])


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


# -- the peers' state ---------------------------------------------------------------------


class ResticRepo:
    def __init__(self, d: str) -> None:
        self.repo = os.path.join(d, "restic-repo")
        self.env = {
            **os.environ,
            "RESTIC_PASSWORD": RESTIC_PASSWORD,
            "RESTIC_CACHE_DIR": os.path.join(d, "restic-cache"),
        }

    def run(self, *args: str, cwd: str | None = None) -> str:
        p = subprocess.run(
            ["restic", "-r", self.repo, *args],
            cwd=cwd,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if p.returncode != 0:
            raise RuntimeError(f"restic {' '.join(args)}: exit {p.returncode}: {p.stderr[-500:]}")
        return p.stdout

    def init(self) -> None:
        self.run("init", "-q")

    def backup(self, src: str) -> str:
        out = self.run("backup", "--json", "--quiet", ".", cwd=src)
        for line in reversed(out.splitlines()):
            if '"snapshot_id"' in line:
                return str(json.loads(line)["snapshot_id"])
        raise RuntimeError(f"no snapshot_id in restic's output: {out[-300:]!r}")

    def version(self) -> str:
        p = subprocess.run(["restic", "version"], capture_output=True, text=True, check=False)
        return p.stdout.split(" compiled")[0].strip()


@dataclass
class Ov:
    """One overlay: LOWER shared, UPPER, WORK, MERGED (and whatever else) under ``dir``."""

    lower: str
    dir: str

    @property
    def upper(self) -> str:
        return os.path.join(self.dir, "upper")

    @property
    def work(self) -> str:
        return os.path.join(self.dir, "work")

    @property
    def merged(self) -> str:
        return os.path.join(self.dir, "merged")

    def make(self) -> None:
        for d in (self.upper, self.work, self.merged):
            os.makedirs(d)

    def spec(self) -> str:
        return f"{self.lower}:{self.upper}:{self.work}:{self.merged}"

    def mount_cmd(self) -> str:
        # the daemon's options (sprite_env/overlay/mount.py): every file in UPPER whole
        opts = (
            f"lowerdir={self.lower},upperdir={self.upper},workdir={self.work},"
            "index=off,redirect_dir=off,metacopy=off"
        )
        return f"mount -t overlay sprite-bench -o {q(opts)} {q(self.merged)}"


# -- the changes --------------------------------------------------------------------------

LETTERS = "etaoinshrdlucmfwypvbgk"
#: What :func:`other_change` deletes from the base image (a whiteout in UPPER).
GONE_FROM_BASE = f"{layer.WEBAPP}/node_modules/moment/locale"


def other_change(root: str, n: int) -> dict[str, Any]:
    """A second, smaller session after checkpoint A, through MERGED; its data differ from
    round to round (seeded by ``n``), so an undo checkpoint always has new bytes to store.

    Appends a line to 100 Django sources (copied up from the base image), writes 200 new
    files (~4 KB of text each), deletes the session's ``newfeature/`` (pure UPPER) and a
    directory of the base image (a whiteout), adds 3,000 events and updates 500 users in
    the SQLite database (copied up by the session)."""
    rng = random.Random(9000 + n)
    project = os.path.join(root, layer.PROJECT)
    sources = [
        rel
        for rel, st in layer.walk(os.path.join(project, "django"))
        if stat.S_ISREG(st.st_mode) and rel.endswith(".py")
    ]
    sources.sort(key=lambda f: hashlib.sha1(f"other-{n}:{f}".encode()).hexdigest())
    for rel in sources[:100]:
        with open(os.path.join(project, "django", rel), "a") as f:
            f.write(f"# second session, round {n}\n")
    new = os.path.join(project, "scratch", f"round_{n}")
    os.makedirs(new)
    for i in range(200):
        words = ("".join(rng.choices(LETTERS, k=rng.randrange(2, 10))) for _ in range(600))
        text = " ".join(words)
        with open(os.path.join(new, f"note_{i:03d}.txt"), "w") as f:
            f.write(text + "\n")
    subprocess.run(["rm", "-rf", os.path.join(project, "newfeature")], check=True)
    gone = os.path.join(root, GONE_FROM_BASE)
    if os.path.isdir(gone):
        subprocess.run(["rm", "-rf", gone], check=True)
    db = sqlite3.connect(os.path.join(root, layer.DB))
    try:
        with db:
            (top,) = db.execute("SELECT max(id) FROM events").fetchone()
            db.execute(
                "INSERT INTO events SELECT id + ?, user_id, ts + 1, kind, path, payload || ?, "
                "digest FROM events WHERE id % 100 = ? LIMIT 3000",
                (top, f" round {n}", n % 100),
            )
            ids = rng.sample(range(1, layer.N_USERS + 1), 500)
            db.executemany(
                "UPDATE users SET bio = bio || ? WHERE id = ?", [(f" r{n}", i) for i in ids]
            )
    finally:
        db.close()
    return {"edited": min(100, len(sources)), "new_files": 200, "events": 3000, "users": 500}


def write_service(merged: str) -> None:
    os.makedirs(os.path.join(merged, "srv"), exist_ok=True)
    d = os.path.join(merged, "etc", "sprite", "services")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "web.toml"), "w") as f:
        f.write(SERVICE_TOML)


# -- part 1: API latency ------------------------------------------------------------------


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def create_timed(daemon: Daemon, comment: str) -> tuple[Streamed, dict[str, float]]:
    """POST /v1/checkpoint; its wall time, and the CPU the daemon and this process (the
    client threads, when a load runs) used meanwhile."""
    assert daemon.proc is not None
    c0, r0 = proc_cpu(daemon.proc.pid), resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    s = job(daemon.socket, "POST", "/v1/checkpoint", {"comment": comment})
    t1 = time.perf_counter()
    c1, r1 = proc_cpu(daemon.proc.pid), resource.getrusage(resource.RUSAGE_SELF)
    cp = s.last.get("checkpoint") or {}
    return s, {
        "t0": t0,
        "t1": t1,
        "create_s": s.wall,
        "daemon_cpu_s": c1 - c0,
        "client_cpu_s": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime,
        "bytes_added": cp.get("bytes_added"),
    }


def back_to(sock: str, base: str, cid: str) -> None:
    """Untimed: restores ``base``, then deletes ``cid`` and the restore's undo checkpoint,
    so that the next create stores the session's data anew (the active checkpoint cannot
    be deleted, hence the restore first)."""
    s = job(sock, "POST", f"/v1/checkpoints/{base}/restore")
    for x in (cid, s.last.get("undo")):
        if x:
            status, body = call(sock, "DELETE", f"/v1/checkpoints/{x}")
            if status != 200:
                raise RuntimeError(f"DELETE {x}: HTTP {status}: {body[:300]!r}")


def part_api(
    args: argparse.Namespace, pristine: str, work: str, cleanup: Cleanup, peers: list[str]
) -> dict[str, Any]:
    d = os.path.join(work, "plain")
    live = os.path.join(d, "live")
    os.makedirs(d)
    log("api: copying the layer for a --root daemon")
    layer.copy_layer(pristine, live)
    res: dict[str, Any] = {"threads": THREADS, "idle_s": IDLE_S, "list_size": LIST_SIZE}

    # (c) the first checkpoint of the whole layer under load, in a store thrown away after
    log("api: the first checkpoint of the whole layer, under load (list only)")
    first = Daemon(
        os.path.join(d, "state-first"), ["--root", live, "--store", os.path.join(d, "store-first")]
    )
    cleanup.daemons.append(first)
    first.start()
    os.sync()
    with Load(first.socket, {"list": "/v1/checkpoints"}) as load:
        time.sleep(0.2)
        s, w = create_timed(first, "base, under load")
    res["first_loaded"] = {**w, "list": latency(load.between(w["t0"], w["t1"]), w["t1"] - w["t0"])}
    first.stop()
    bc.rmtree(os.path.join(d, "store-first"))
    log(f"api: first checkpoint under load in {s.wall:.2f} s")

    daemon = Daemon(os.path.join(d, "state"), ["--root", live])
    cleanup.daemons.append(daemon)
    daemon.start()
    sock = daemon.socket
    os.sync()
    s, w = create_timed(daemon, "base")
    res["first_unloaded"] = w
    base = str(s.last["id"])
    log(f"api: first checkpoint without load {base} in {s.wall:.2f} s")
    for i in range(1, LIST_SIZE):
        job(sock, "POST", "/v1/checkpoint", {"comment": f"no change {i}"})
    restic = ResticRepo(d) if RESTIC in peers else None
    if restic is not None:
        restic.init()
        for _ in range(LIST_SIZE):
            restic.backup(live)
    log(f"api: {LIST_SIZE} checkpoints (and as many restic snapshots) of the layer")

    paths = {"list": "/v1/checkpoints", "info": f"/v1/checkpoints/{base}"}
    idle: dict[str, list[Req]] = {k: [] for k in paths}
    busy: dict[str, list[Req]] = {k: [] for k in paths}
    idle_s = busy_s = idle_cpu = 0.0
    rounds = []
    for r in range(args.rounds):
        mutation = layer.mutate(live)
        os.sync()
        assert daemon.proc is not None
        with Load(sock, paths) as load:
            c0 = proc_cpu(daemon.proc.pid)
            t0 = time.perf_counter()
            time.sleep(IDLE_S)
            t1 = time.perf_counter()
            idle_cpu += proc_cpu(daemon.proc.pid) - c0
        for k in paths:
            idle[k] += [x for x in load.between(t0, t1) if x.endpoint == k]
        idle_s += t1 - t0
        os.sync()
        with Load(sock, paths) as load:
            time.sleep(0.2)
            s, loaded = create_timed(daemon, f"session {r}")
        for k in paths:
            busy[k] += [x for x in load.between(loaded["t0"], loaded["t1"]) if x.endpoint == k]
        busy_s += loaded["t1"] - loaded["t0"]
        back_to(sock, base, str(s.last["id"]))
        layer.mutate(live)  # the same session again, for a create without load
        os.sync()
        s, unloaded = create_timed(daemon, f"session {r}, no load")
        back_to(sock, base, str(s.last["id"]))
        rounds.append({"loaded": loaded, "unloaded": unloaded, "mutation": mutation})
        log(
            f"api: round {r + 1}/{args.rounds}: create after the session {loaded['create_s']:.2f}"
            f" s under load, {unloaded['create_s']:.2f} s without"
        )
    res["rounds"] = rounds
    res["idle"] = {k: latency(v, idle_s) for k, v in idle.items()}
    n_idle = sum(len(v) for v in idle.values())
    res["idle_daemon_cpu"] = {
        "seconds": idle_s,
        "cpu_s": idle_cpu,
        "cores": idle_cpu / idle_s if idle_s else None,
        "ms_per_request": idle_cpu * 1000 / n_idle if n_idle else None,
    }
    res["busy"] = {k: latency(v, busy_s) for k, v in busy.items()}
    res["paths"] = paths

    log("api: CLI wall times, idle")
    cmds = {
        "sprite-env checkpoints list": ([*bc.SPRITE_CMD, "checkpoints", "list"], daemon.env()),
        "ls -l DIR (the floor)": (["ls", "-l", d], dict(os.environ)),
    }
    if restic is not None:
        cmds["restic snapshots --json"] = (
            ["restic", "-r", restic.repo, "snapshots", "--json"],
            restic.env,
        )
    names = list(cmds)
    walls: dict[str, list[float]] = {n: [] for n in names}
    cpus: dict[str, list[float]] = {n: [] for n in names}
    failures: list[str] = []
    for i in range(CLI_RUNS * args.rounds):
        k = i % len(names)
        for n in names[k:] + names[:k]:
            argv, env = cmds[n]
            m = run_measured(argv, env=env, cwd=REPO)
            if not m.ok:
                failures.append(f"{n}: exit {m.returncode}: {m.stderr.strip()[-300:]}")
                continue
            walls[n].append(m.wall)
            cpus[n].append(m.cpu)
    res["cli"] = {
        n: {
            "runs": len(walls[n]),
            "median_ms": statistics.median(walls[n]) * 1000 if walls[n] else None,
            "p90_ms": pct(walls[n], 90) * 1000 if walls[n] else None,
            "max_ms": max(walls[n]) * 1000 if walls[n] else None,
            "cpu_median_ms": statistics.median(cpus[n]) * 1000 if cpus[n] else None,
            "walls_s": walls[n],
        }
        for n in names
    }
    res["cli_failures"] = failures[:5]
    rc = daemon.stop()
    res["daemon_exit"] = rc
    if rc != 0 or "Traceback" in daemon.log():
        res["daemon_log_tail"] = daemon.log()[-3000:]
    return res


# -- part 2: restore in the sprite shape --------------------------------------------------


@dataclass
class OverlaySetup:
    daemon: Daemon
    ovs: dict[str, Ov]
    checkpoint_a: str
    restic: ResticRepo | None
    snapshot: str | None
    saved: str | None
    expected: dict[str, dict[str, Entry]] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)


def overlay_setup(pristine: str, work: str, cleanup: Cleanup, peers: list[str]) -> OverlaySetup:
    base = os.path.join(work, "overlay")
    ovs = {name: Ov(pristine, os.path.join(base, name)) for name in (SPRITE, *peers)}
    for o in ovs.values():
        o.make()
    ours = ovs[SPRITE]
    daemon = Daemon(os.path.join(ours.dir, "state"), ["--overlay", ours.spec()])
    cleanup.daemons.append(daemon)
    daemon.start()
    if not is_overlay(ours.merged):
        raise RuntimeError("the daemon did not mount the overlay")
    for name in peers:
        subprocess.run(shell(ovs[name].mount_cmd()), check=True)
    facts: dict[str, Any] = {"mutation": {}}
    for name, o in ovs.items():
        write_service(o.merged)
        log(f"overlay: the agent session through {name}'s MERGED")
        facts["mutation"][name] = layer.mutate(o.merged)
    sock = daemon.socket
    status, body = call(sock, "POST", "/v1/services/web/start")
    if status != 200:
        raise RuntimeError(f"starting the web service: HTTP {status}: {body[:300]!r}")
    wait_service(sock)

    os.sync()
    a = job(sock, "POST", "/v1/checkpoint", {"comment": "A: after the session"})
    cid = str(a.last["id"])
    facts["checkpoint_a"] = {
        "id": cid,
        "create_s": a.wall,
        "pause": a.last.get("pause"),
        "bytes_added": (a.last.get("checkpoint") or {}).get("bytes_added"),
    }
    restic = snap = saved = None
    if RESTIC in ovs:
        restic = ResticRepo(ovs[RESTIC].dir)
        restic.init()
        snap = restic.backup(ovs[RESTIC].upper)
    if RSYNC in ovs:
        saved = os.path.join(ovs[RSYNC].dir, "saved")
        subprocess.run(["cp", "-a", ovs[RSYNC].upper, saved], check=True)
    setup = OverlaySetup(daemon, ovs, cid, restic, snap, saved, facts=facts)
    for name, o in ovs.items():
        setup.expected[name] = manifest(o.upper)
    if saved is not None:
        v = compare(setup.expected[RSYNC], manifest(saved))
        if not v["ok"]:
            raise RuntimeError(f"cp -a of UPPER differs from it: {v['counts']} {v['examples']}")
    m = setup.expected[SPRITE]
    facts["upper_at_a"] = {
        "entries": len(m),
        "bytes": du(ours.upper),
        "whiteouts": sum(1 for e in m.values() if e[0].startswith("special:")),
        "digest": tree_digest(m),
    }
    log(
        f"overlay: checkpoint {cid} in {a.wall:.2f} s; UPPER {len(m):,} entries, "
        f"{facts['upper_at_a']['bytes'] / 1e6:.1f} MB"
    )
    return setup


def wait_service(sock: str, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _status, body = call(sock, "GET", "/v1/services")
        svc = next((s for s in json.loads(body)["services"] if s["name"] == "web"), None)
        if svc is not None and svc["state"] == "running":
            return dict(svc)
        time.sleep(0.05)
    raise RuntimeError("the web service is not running")


def restore_steps(s: Streamed) -> dict[str, float]:
    """Seconds per NDJSON step of a restore, from the events' server-side ``time``."""
    t = [event_time(e) for e in s.events]
    infos = {e["data"]: i for i, e in reversed(list(enumerate(s.events))) if e["type"] == "info"}
    i_stop = infos.get("Stopping services...")
    i_fs = infos.get("Restoring filesystem...")
    i_up = infos.get("Services started")
    out = {"request -> first event": s.arrived[0] if s.arrived else float("nan")}
    if i_stop is not None:
        out["Restoring from checkpoint... -> Stopping services..."] = t[i_stop] - t[0]
    if i_stop is not None and i_fs is not None:
        out["Stopping services... -> Restoring filesystem..."] = t[i_fs] - t[i_stop]
    if i_fs is not None and i_up is not None:
        out["Restoring filesystem... -> Services started"] = t[i_up] - t[i_fs]
        first_restore = next(
            (
                i
                for i, e in enumerate(s.events)
                if i > i_fs and e["type"] == "progress" and e.get("phase") == "restore"
            ),
            None,
        )
        if first_restore is not None:
            out["  of which the undo checkpoint (to the 1st restore progress, ±0.1 s)"] = (
                t[first_restore] - t[i_fs]
            )
    if i_up is not None:
        out["Services started -> complete"] = t[-1] - t[i_up]
    return out


def part_restore(args: argparse.Namespace, setup: OverlaySetup, cleanup: Cleanup) -> dict[str, Any]:
    sock = setup.daemon.socket
    ovs = setup.ovs
    scripts: dict[str, str] = {}
    env = dict(os.environ)
    if setup.restic is not None:
        o = ovs[RESTIC]
        env = setup.restic.env
        scripts[RESTIC] = "\n".join(
            [
                f"umount {q(o.merged)}",
                f"find {q(o.upper)} -mindepth 1 -delete",
                f"restic -r {q(setup.restic.repo)} restore {setup.snapshot} "
                f"--target {q(o.upper)} > /dev/null",
                f"find {q(o.work)} -mindepth 1 -delete",
                o.mount_cmd(),
            ]
        )
    if setup.saved is not None:
        o = ovs[RSYNC]
        scripts[RSYNC] = "\n".join(
            [
                f"umount {q(o.merged)}",
                f"rsync -aX --delete {q(setup.saved)}/ {q(o.upper)}/",
                f"find {q(o.work)} -mindepth 1 -delete",
                o.mount_cmd(),
            ]
        )
    tools = [SPRITE, *scripts]
    runs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        k = r % len(tools)
        for name in tools[k:] + tools[:k]:
            o = ovs[name]
            run: dict[str, Any] = {"tool": name, "round": r, "change": other_change(o.merged, r)}
            runs.append(run)
            if name == SPRITE:
                hand = subprocess.Popen(["sleep", "1000"], cwd=os.path.join(o.merged, "srv"))
                cleanup.procs.append(hand)
                reaper = threading.Thread(target=hand.wait, daemon=True)  # as a shell would
                reaper.start()
                before = wait_service(sock)
                os.sync()
                s = stream(sock, "POST", f"/v1/checkpoints/{setup.checkpoint_a}/restore")
                run["wall_s"] = s.wall
                reaper.join(30)
                run["hand_process_exit"] = hand.returncode
                if not s.ok:
                    run["error"] = f"HTTP {s.status}: {s.last}"
                    continue
                run["steps_s"] = restore_steps(s)
                run["infos"] = [e["data"] for e in s.events if e["type"] == "info"]
                run["stats"] = s.last.get("stats")
                after = wait_service(sock)
                run["service_restarted"] = after.get("pid") != before.get("pid")
            else:
                os.sync()
                m = run_measured(shell(scripts[name]), env=env)
                run["wall_s"] = m.wall
                run["cpu_s"] = m.cpu
                if not m.ok:
                    run["error"] = f"exit {m.returncode}: {m.stderr.strip()[-500:]}"
                    continue
                t0 = time.perf_counter()
                os.sync()
                run["sync_after_s"] = time.perf_counter() - t0
            run["remounted"] = is_overlay(o.merged)
            v = compare(setup.expected[name], manifest(o.upper))
            run["verify"] = v
            log(
                f"restore: round {r + 1}/{args.rounds} {name:<10} {run['wall_s']:6.2f} s  "
                f"{verdict(v)}" + ("" if run["remounted"] else "  NOT REMOUNTED")
            )
    return {"runs": runs, "scripts": scripts}


# -- part 3: the writers' pause -----------------------------------------------------------


def part_pause(setup: OverlaySetup, work: str, cleanup: Cleanup) -> dict[str, Any]:
    sock = setup.daemon.socket
    merged = setup.ovs[SPRITE].merged
    out = os.path.join(work, "writer.times")
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, merged, out], cwd=merged, stdin=subprocess.DEVNULL
    )
    cleanup.procs.append(writer)
    deadline = time.monotonic() + 60
    while not os.path.exists(out + ".ready"):
        if writer.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the writer did not start (exit {writer.returncode})")
        time.sleep(0.05)
    time.sleep(2.0)  # a baseline before the first checkpoint
    windows: list[tuple[float, float]] = []
    creates: list[dict[str, Any]] = []
    for n in range(PAUSED_CREATES):
        t0 = time.monotonic()
        s = job(sock, "POST", "/v1/checkpoint", {"comment": f"under writes {n}"})
        t1 = time.monotonic()
        windows.append((t0, t1))
        cp = s.last.get("checkpoint") or {}
        creates.append(
            {
                "id": s.last.get("id"),
                "wall_s": s.wall,
                "pause": s.last.get("pause"),
                "bytes_added": cp.get("bytes_added"),
            }
        )
        log(f"pause: checkpoint {n + 1}/{PAUSED_CREATES} in {s.wall:.2f} s, {s.last.get('pause')}")
        time.sleep(1.0)
    writer.send_signal(signal.SIGTERM)
    writer.wait(60)
    times = array.array("d")
    with open(out, "rb") as f:
        times.frombytes(f.read())
    gaps = [(times[i - 1], times[i]) for i in range(1, len(times))]

    def overlaps(g: tuple[float, float], w: tuple[float, float]) -> bool:
        return g[0] < w[1] and g[1] > w[0]

    for c, w in zip(creates, windows, strict=True):
        inside = [b - a for a, b in gaps if overlaps((a, b), w)]
        c["writer_worst_gap_ms"] = max(inside) * 1000 if inside else None
        c["writer_iterations"] = sum(1 for _a, b in gaps if w[0] <= b < w[1])
    outside = [b - a for a, b in gaps if not any(overlaps((a, b), w) for w in windows)]
    during = [b - a for a, b in gaps if any(overlaps((a, b), w) for w in windows)]
    return {
        "creates": creates,
        "iterations": len(gaps),
        "writer_exit": writer.returncode,
        "gap_outside_ms": {
            "count": len(outside),
            "median": statistics.median(outside) * 1000 if outside else None,
            "p99": pct(outside, 99) * 1000 if outside else None,
            "max": max(outside) * 1000 if outside else None,
        },
        "gap_during_ms": {
            "count": len(during),
            "median": statistics.median(during) * 1000 if during else None,
        },
    }


# -- report -------------------------------------------------------------------------------


def f1(x: float | None, scale: float = 1.0, nd: int = 1) -> str:
    return "-" if x is None else f"{x * scale:,.{nd}f}"


def report_api(api: dict[str, Any]) -> list[str]:
    out = ["### 1. API latency", ""]
    conds = [
        ("idle", api["idle"]),
        ("during the create after the session", api["busy"]),
    ]
    rows = []
    for key in ("list", "info"):
        for label, d in conds:
            rows.append(_lat_row(f"GET {api['paths'][key]}", label, d[key]))
    rows.append(
        _lat_row(
            "GET /v1/checkpoints",
            "during the first checkpoint (whole layer)",
            api["first_loaded"]["list"],
        )
    )
    out.append(
        markdown_table(
            ["endpoint", "condition", "requests", "req/s", "median ms", "p90 ms", "p99 ms"]
            + ["max ms", "failed"],
            rows,
            align="llrrrrrrr",
        )
    )
    ic = api["idle_daemon_cpu"]
    out += [
        "",
        f"{api['threads']} client threads, a new connection per request; idle: "
        f"{api['idle_s']:.0f} s per round; the daemon holds {api['list_size']} checkpoints. "
        f"Idle, the daemon used {ic['cores']:.2f} cores serving them: "
        f"{ic['ms_per_request']:.2f} ms of CPU per request.",
        "",
    ]

    def med(ws: list[dict[str, Any]], k: str) -> str:
        return f"{statistics.median(w[k] for w in ws):.2f}" if ws else "-"

    loaded = [r["loaded"] for r in api["rounds"]]
    unloaded = [r["unloaded"] for r in api["rounds"]]
    fl, fu = [api["first_loaded"]], [api["first_unloaded"]]
    rows = [
        [
            label,
            med(a, "create_s"),
            med(b, "create_s"),
            f"{med(a, 'daemon_cpu_s')} / {med(b, 'daemon_cpu_s')}",
            med(a, "client_cpu_s"),
        ]
        for label, a, b in (
            (f"after the session (median of {len(loaded)})", loaded, unloaded),
            ("first checkpoint of the whole layer", fl, fu),
        )
    ]
    out.append(
        markdown_table(
            ["create", "s under load", "s without load", "daemon CPU s (load / none)"]
            + ["client threads' CPU s"],
            rows,
        )
    )
    out.append("")
    rows = [
        [
            n,
            str(c["runs"]),
            f1(c["median_ms"]),
            f1(c["p90_ms"]),
            f1(c["max_ms"]),
            f1(c["cpu_median_ms"]),
        ]
        for n, c in api["cli"].items()
    ]
    out.append(
        markdown_table(["command (idle)", "runs", "median ms", "p90 ms", "max ms", "CPU ms"], rows)
    )
    return out


def _lat_row(endpoint: str, cond: str, d: dict[str, Any]) -> list[str]:
    return [
        endpoint,
        cond,
        f"{d['count']:,}",
        f1(d["per_s"], nd=0),
        f1(d.get("median_ms")),
        f1(d.get("p90_ms")),
        f1(d.get("p99_ms")),
        f1(d.get("max_ms")),
        str(d["failed"]),
    ]


HOW = {
    SPRITE: "POST /v1/checkpoints/A/restore (web service + 1 hand-started process)",
    RESTIC: "umount; empty UPPER; restic restore into it; empty WORK; mount",
    RSYNC: "umount; rsync -aX --delete SAVED/ UPPER/; empty WORK; mount",
}


def report_restore(setup_facts: dict[str, Any], res: dict[str, Any]) -> list[str]:
    out = ["### 2. Restore in the sprite shape", ""]
    by: dict[str, list[dict[str, Any]]] = {}
    for r in res["runs"]:
        by.setdefault(r["tool"], []).append(r)
    med: dict[str, float | None] = {}
    rows = []
    names = [n for n in (SPRITE, RESTIC, RSYNC) if n in by]
    for name in names:
        runs = by.get(name, [])
        walls = [r["wall_s"] for r in runs if "error" not in r]
        med[name] = statistics.median(walls) if walls else None
        fails = sum(1 for r in runs if "error" in r)
        syncs = [r["sync_after_s"] for r in runs if "sync_after_s" in r]
        verdicts = [verdict(r.get("verify")) for r in runs if "error" not in r]
        uniq = sorted(set(v.split(" (")[0] for v in verdicts))
        rows.append(
            [
                name,
                HOW[name],
                (
                    f"{med[name]:.2f} ({min(walls):.2f}-{max(walls):.2f}) n={len(walls)}"
                    if walls
                    else "FAILED"
                )
                + (f" +{fails} FAILED" if fails and walls else ""),
                f"{statistics.median(syncs):.2f}" if syncs else "-",
                ", ".join(f"{u} x{sum(1 for v in verdicts if v.startswith(u))}" for u in uniq),
            ]
        )
    for row, name in zip(rows, names, strict=True):
        s, p = med[SPRITE], med[name]
        row.append(f"{p / s:.2f}x" if s and p else "-")
    out.append(
        markdown_table(
            [
                "tool",
                "what is timed",
                "wall s, median (min-max)",
                "then sync s",
                "verify",
                "time / sprite-env",
            ],
            rows,
            align="lllrlr",
        )
    )
    steps: dict[str, list[float]] = {}
    for r in by.get(SPRITE, []):
        for k, v in r.get("steps_s", {}).items():
            steps.setdefault(k, []).append(v)
    if steps:
        out += ["", "sprite-env's restore, step by step (from the NDJSON events' times):", ""]
        rows = [
            [k, f"{statistics.median(v) * 1000:,.0f}", f"{min(v) * 1000:,.0f}-{max(v) * 1000:,.0f}"]
            for k, v in steps.items()
        ]
        out.append(markdown_table(["step", "median ms", "min-max ms"], rows))
    a = setup_facts.get("checkpoint_a", {})
    u = setup_facts.get("upper_at_a", {})
    st = next((r.get("stats") for r in by.get(SPRITE, []) if r.get("stats")), None) or {}
    out += [
        "",
        f"UPPER at A: {u.get('entries', 0):,} entries, {u.get('bytes', 0) / 1e6:.1f} MB "
        f"({u.get('whiteouts', 0)} whiteouts); checkpoint A took {a.get('create_s', 0):.2f} s "
        f"(writers paused {f1((a.get('pause') or {}).get('seconds'), 1000)} ms). "
        f"sprite-env's restore: created {st.get('created')}, modified {st.get('modified')}, "
        f"removed {st.get('removed')}, {f1(st.get('bytes_written'), 1e-6)} MB written.",
    ]
    return out


def report_pause(p: dict[str, Any]) -> list[str]:
    out = ["### 3. The writers' pause", ""]
    rows = []
    for i, c in enumerate(p["creates"], 1):
        pause = c.get("pause") or {}
        rows.append(
            [
                str(i),
                f1(c["wall_s"], 1000, 0),
                f1(pause.get("seconds"), 1000),
                str(pause.get("processes", "-")),
                f1(c.get("writer_worst_gap_ms")),
                str(c.get("writer_iterations")),
            ]
        )
    out.append(
        markdown_table(
            [
                "checkpoint",
                "create ms",
                "daemon's pause ms",
                "frozen processes",
                "writer's worst gap ms",
                "writer iterations",
            ],
            rows,
        )
    )
    g, d = p["gap_outside_ms"], p["gap_during_ms"]
    out += [
        "",
        "The writer's gap between iterations outside the creates: "
        f"median {f1(g['median'], nd=2)} ms, "
        f"p99 {f1(g['p99'], nd=2)} ms, max {f1(g['max'])} ms ({g['count']:,} iterations); "
        f"during the creates: median {f1(d['median'], nd=2)} ms ({d['count']:,}).",
    ]
    return out


def relative(o: Any) -> Any:
    """The payload with every path under the repository made relative to it."""
    if isinstance(o, str):
        return o.replace(REPO + "/", "").replace(REPO, ".")
    if isinstance(o, dict):
        return {relative(k): relative(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [relative(v) for v in o]
    return o


# -- main ---------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size", choices=sorted(layer.PROFILES), default="small")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each part (default 3)")
    parser.add_argument(
        "--parts", default="api,restore,pause", help="comma-separated subset of api,restore,pause"
    )
    parser.add_argument(
        "--work",
        default=os.path.join(layer.DATA, "scratch-daemon"),
        help="scratch directory (emptied first; default benchmarks/.data/scratch-daemon)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument(
        "--no-freeze", action="store_true", help="run the installed sprite-env, not HEAD's copy"
    )
    parser.add_argument("--out", help="JSON path (default benchmarks/results/daemon-<size>.json)")
    args = parser.parse_args()
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if args.rounds < 1 or not parts or parts - {"api", "restore", "pause"}:
        parser.error("--rounds must be >= 1; --parts a subset of api,restore,pause")
    if os.geteuid() != 0:
        parser.error("needs root: it mounts overlayfs and freezes processes")
    t_start = time.monotonic()
    load0 = os.getloadavg()
    src0 = bc.source_state()
    pristine, info = layer.pristine(args.size, log)
    st = info["stats"]
    work = os.path.abspath(args.work)
    for mp, _t in mounts_under(work):  # a previous run's, before anything is deleted
        subprocess.run(["umount", "-l", mp], check=False)
    bc.rmtree(work)
    os.makedirs(work)
    cleanup = Cleanup(work)
    results: dict[str, Any] = {}
    anomalies: list[str] = []
    peers = [t for t in (RESTIC, RSYNC) if shutil.which(t)]
    anomalies += [
        f"{t} is not installed: that peer is left out" for t in (RESTIC, RSYNC) if t not in peers
    ]
    # a SIGTERM unwinds like Ctrl-C, so the finally below unmounts and ends what we started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    setup: OverlaySetup | None = None
    try:
        measured = bc.setup_sprite(work, freeze=not args.no_freeze)
        if not args.no_freeze:
            complete_frozen_copy(work)
        log(f"sprite-env: {measured}; layer {args.size}: {st['files']:,} files")
        if "api" in parts:
            try:
                results["api"] = part_api(args, pristine, work, cleanup, peers)
            except Exception as e:
                anomalies.append(f"api: FAILED: {type(e).__name__}: {e}")
                traceback.print_exc()
        if parts & {"restore", "pause"}:
            try:
                setup = overlay_setup(pristine, work, cleanup, peers)
                results["overlay_setup"] = setup.facts
            except Exception as e:
                anomalies.append(f"overlay setup: FAILED: {type(e).__name__}: {e}")
                traceback.print_exc()
        if setup is not None and "restore" in parts:
            try:
                results["restore"] = part_restore(args, setup, cleanup)
            except Exception as e:
                anomalies.append(f"restore: FAILED: {type(e).__name__}: {e}")
                traceback.print_exc()
        if setup is not None and "pause" in parts:
            try:
                results["pause"] = part_pause(setup, work, cleanup)
            except Exception as e:
                anomalies.append(f"pause: FAILED: {type(e).__name__}: {e}")
                traceback.print_exc()
        if setup is not None:
            rc = setup.daemon.stop()
            if rc != 0 or "Traceback" in setup.daemon.log():
                anomalies.append(f"overlay daemon exited {rc}: {setup.daemon.log()[-1500:]}")
    finally:
        notes = cleanup.run()
        anomalies += notes
        left = mounts_under(work)
        if left:
            anomalies.append(f"mounts left behind: {left}")
        if not args.keep and not left:
            bc.rmtree(work)

    for r in results.get("restore", {}).get("runs", []):
        if "error" in r:
            anomalies.append(f"restore {r['tool']} round {r['round'] + 1}: {r['error']}")
        elif not r["verify"]["ok"]:
            v = r["verify"]
            where = f"restore {r['tool']} round {r['round'] + 1}"
            anomalies.append(f"{where}: MISMATCH {v['counts']} {v['examples']}")
        elif not r["remounted"]:
            anomalies.append(f"restore {r['tool']} round {r['round'] + 1}: MERGED not remounted")
    if "api" in results:
        if results["api"].get("cli_failures"):
            anomalies.append(f"CLI failures: {results['api']['cli_failures']}")
        if results["api"].get("daemon_exit") != 0:
            anomalies.append(f"api daemon exited {results['api'].get('daemon_exit')}")

    loadavg = os.getloadavg()
    versions = {"restic": ResticRepo(work).version()} if RESTIC in peers else {}
    with contextlib.suppress(OSError, IndexError):
        versions["rsync"] = subprocess.run(
            ["rsync", "--version"], capture_output=True, text=True, check=False
        ).stdout.splitlines()[0]
    out = [
        f"## Daemon, {datetime.now().date().isoformat()}: layer `{args.size}`, "
        f"{st['files']:,} files, {st['bytes'] / 1e6:,.1f} MB; rounds {args.rounds}, "
        f"{os.cpu_count()} CPUs, load average {load0[0]:.1f} before / {loadavg[0]:.1f} after",
        "",
    ]
    for skipped in info.get("skipped") or []:
        out += [f"The cached layer was built without {skipped.split(' (')[0]}.", ""]
    if "api" in results:
        out += report_api(results["api"]) + [""]
    if "restore" in results:
        out += report_restore(results.get("overlay_setup", {}), results["restore"]) + [""]
    if "pause" in results:
        out += report_pause(results["pause"]) + [""]
    if anomalies:
        out += ["Anomalies:", *[f"- {a}" for a in anomalies], ""]
    elapsed = time.monotonic() - t_start
    out.append(
        f"Versions: {versions}; sprite-env {src0['commit']} "
        f"({'frozen copy of HEAD' if not args.no_freeze else 'installed'}). "
        f"Elapsed {elapsed / 60:.1f} min."
    )
    text = "\n".join(out)
    print(text)
    payload = relative(
        {
            "benchmark": "daemon",
            "size": args.size,
            "layer": info,
            "rounds": args.rounds,
            "parts": sorted(parts),
            "versions": versions,
            "sprite_env_source": {
                "start": src0,
                "end": bc.source_state(),
                "frozen": not args.no_freeze,
            },
            "loadavg_at_start": load0,
            "elapsed_s": elapsed,
            **results,
            "anomalies": anomalies,
            "markdown": text,
        }
    )
    path = args.out or os.path.join(RESULTS_DIR, f"daemon-{args.size}.json")
    path = write_results("daemon", payload, path)
    print(f"\nresults: {os.path.relpath(path)}")
    return 1 if anomalies else 0


if __name__ == "__main__":
    sys.exit(main())
