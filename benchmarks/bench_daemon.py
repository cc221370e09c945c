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
import contextlib
import hashlib
import http.client
import os
import random
import resource
import shutil
import signal
import sqlite3
import stat
import statistics
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import datetime
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_checkpoints as bc  # noqa: E402  (freezing sprite-env the same way)
import layer  # noqa: E402
from _daemon import (  # noqa: E402
    Cleanup,
    Daemon,
    Streamed,
    call,
    complete_frozen_copy,
    job,
    log,
    mounts_under,
    pct,
    save_run,
)
from _overlay import (  # noqa: E402
    RESTIC,
    RSYNC,
    SPRITE,
    OverlaySetup,
    ResticRepo,
    f1,
    overlay_setup,
    part_pause,
    part_restore,
    peer_versions,
    report_pause,
    report_restore,
)
from _peers import RESULTS_DIR, markdown_table, run_measured  # noqa: E402

#: Client threads of the latency load, and how long the idle measurement lasts.
THREADS = 20
IDLE_S = 3.0
#: Checkpoints the latency daemon holds (and snapshots restic's repository holds).
LIST_SIZE = 5
#: CLI runs per round, per command.
CLI_RUNS = 5


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


# -- part 1: API latency ------------------------------------------------------------------


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu(pid: int) -> float:
    """CPU seconds of a process's children so far (the daemon's: its front, api/front.py)."""
    total = 0.0
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        for child in f.read().split():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # (it ended)
                total += proc_cpu(int(child))
    return total


def create_timed(daemon: Daemon, comment: str) -> tuple[Streamed, dict[str, float]]:
    """POST /v1/checkpoint; its wall time, and the CPU the daemon, its front process and
    this process (the client threads, when a load runs) used meanwhile."""
    assert daemon.proc is not None
    c0, r0 = proc_cpu(daemon.proc.pid), resource.getrusage(resource.RUSAGE_SELF)
    f0 = children_cpu(daemon.proc.pid)
    t0 = time.perf_counter()
    s = job(daemon.socket, "POST", "/v1/checkpoint", {"comment": comment})
    t1 = time.perf_counter()
    c1, r1 = proc_cpu(daemon.proc.pid), resource.getrusage(resource.RUSAGE_SELF)
    f1 = children_cpu(daemon.proc.pid)
    cp = s.last.get("checkpoint") or {}
    return s, {
        "t0": t0,
        "t1": t1,
        "create_s": s.wall,
        "daemon_cpu_s": c1 - c0,
        "front_cpu_s": f1 - f0,
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


# -- report ---------------------------------------------------------------------------------


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
            med(a, "front_cpu_s"),
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
            + ["its front's CPU s (load)", "client threads' CPU s"],
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
                setup = overlay_setup(pristine, work, cleanup, peers, layer.mutate)
                results["overlay_setup"] = setup.facts
            except Exception as e:
                anomalies.append(f"overlay setup: FAILED: {type(e).__name__}: {e}")
                traceback.print_exc()
        if setup is not None and "restore" in parts:
            try:
                results["restore"] = part_restore(args.rounds, setup, cleanup, other_change)
            except Exception as e:
                anomalies.append(f"restore: FAILED: {type(e).__name__}: {e}")
                traceback.print_exc()
        if setup is not None and "pause" in parts:
            try:
                results["pause"] = part_pause(
                    setup.daemon.socket, setup.ovs[SPRITE].merged, work, cleanup
                )
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
    versions = peer_versions(peers)
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
    facts = {"size": args.size, "layer": info, "rounds": args.rounds, "parts": sorted(parts)}
    save_run(
        "daemon",
        args.out or os.path.join(RESULTS_DIR, f"daemon-{args.size}.json"),
        facts,
        results,
        versions=versions,
        src0=src0,
        frozen=not args.no_freeze,
        load0=load0,
        elapsed=elapsed,
        anomalies=anomalies,
        text=text,
    )
    return 1 if anomalies else 0


if __name__ == "__main__":
    sys.exit(main())
