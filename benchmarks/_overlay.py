"""The sprite shape: a layer as UPPER of an overlay, restored by sprite-env and its peers.

Shared by ``bench_daemon.py`` and ``bench_step.py``: overlays with one LOWER (the base
image, used in place: overlayfs never writes to it) and an UPPER per tool, brought to the
same state A by the same session through MERGED (:func:`overlay_setup`); each round
another change through MERGED, then A brought back, timed, by each tool and verified with
the tree oracle (:func:`part_restore`); and the writers' pause during creates
(:func:`part_pause`).
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _daemon import (  # noqa: E402
    Cleanup,
    Daemon,
    Streamed,
    call,
    event_time,
    is_overlay,
    job,
    log,
    pct,
    q,
    stream,
)
from _peers import markdown_table, run_measured, shell  # noqa: E402
from _tree import Entry, compare, du, manifest, tree_digest, verdict  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Callable

SPRITE, RESTIC, RSYNC = "sprite-env", "restic", "rsync"
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


def peer_versions(peers: list[str]) -> dict[str, str]:
    """The version lines of the peers (restic, rsync) among ``peers``."""
    out: dict[str, str] = {}
    if RESTIC in peers:
        out["restic"] = ResticRepo("/nonexistent").version()
    if RSYNC in peers:
        with contextlib.suppress(OSError, IndexError):
            out["rsync"] = subprocess.run(
                ["rsync", "--version"], capture_output=True, text=True, check=False
            ).stdout.splitlines()[0]
    return out


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


def write_service(merged: str) -> None:
    os.makedirs(os.path.join(merged, "srv"), exist_ok=True)
    d = os.path.join(merged, "etc", "sprite", "services")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "web.toml"), "w") as f:
        f.write(SERVICE_TOML)


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


def overlay_setup(
    pristine: str,
    work: str,
    cleanup: Cleanup,
    peers: list[str],
    session: Callable[[str], dict[str, Any]],
) -> OverlaySetup:
    """Three overlays on LOWER ``pristine`` brought to A: the web service and ``session``
    through each MERGED; A is sprite-env's checkpoint, a restic snapshot, a ``cp -a``."""
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
        facts["mutation"][name] = session(o.merged)
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


def down_s(s: Streamed) -> float | None:
    """How long the environment was down during a restore: from ``Stopping services...`` to
    ``Services started`` (the events' server-side times); None if it never went down."""
    infos = {e["data"]: event_time(e) for e in s.events if e["type"] == "info"}
    if "Stopping services..." not in infos or "Services started" not in infos:
        return None
    return infos["Services started"] - infos["Stopping services..."]


def restore_sprite(sock: str, merged: str, cid: str, cleanup: Cleanup) -> dict[str, Any]:
    """POST /v1/checkpoints/CID/restore, timed, with the ``web`` service running and one
    process started by hand in MERGED (the restore must end it): the run's facts, with
    ``error`` if it did not complete."""
    run: dict[str, Any] = {}
    hand = subprocess.Popen(["sleep", "1000"], cwd=os.path.join(merged, "srv"))
    cleanup.procs.append(hand)
    reaper = threading.Thread(target=hand.wait, daemon=True)  # as a shell would
    reaper.start()
    before = wait_service(sock)
    s = stream(sock, "POST", f"/v1/checkpoints/{cid}/restore")
    run["wall_s"] = s.wall
    reaper.join(30)
    run["hand_process_exit"] = hand.returncode
    if not s.ok:
        run["error"] = f"HTTP {s.status}: {s.last}"
        return run
    run["steps_s"] = restore_steps(s)
    run["down_s"] = down_s(s)
    run["infos"] = [e["data"] for e in s.events if e["type"] == "info"]
    run["stats"] = s.last.get("stats")
    run["undo"] = s.last.get("undo")
    after = wait_service(sock)
    run["service_restarted"] = after.get("pid") != before.get("pid")
    return run


def part_restore(
    rounds: int,
    setup: OverlaySetup,
    cleanup: Cleanup,
    change: Callable[[str, int], dict[str, Any]],
    after_sprite: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """``rounds`` times, per tool (the first rotating): ``change(MERGED, round)``, then A
    brought back, timed, and UPPER verified against UPPER at A; ``after_sprite`` is called
    with each verified sprite-env run (untimed: e.g. to delete its undo checkpoint)."""
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
    for r in range(rounds):
        k = r % len(tools)
        for name in tools[k:] + tools[:k]:
            o = ovs[name]
            run: dict[str, Any] = {"tool": name, "round": r, "change": change(o.merged, r)}
            runs.append(run)
            if name == SPRITE:
                os.sync()
                run.update(restore_sprite(sock, o.merged, setup.checkpoint_a, cleanup))
                if "error" in run:
                    continue
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
            if name == SPRITE and after_sprite is not None:
                after_sprite(run)
            log(
                f"restore: round {r + 1}/{rounds} {name:<10} {run['wall_s']:6.2f} s  "
                f"{verdict(v)}" + ("" if run["remounted"] else "  NOT REMOUNTED")
            )
    return {"runs": runs, "scripts": scripts}


# -- part 3: the writers' pause -----------------------------------------------------------


def part_pause(sock: str, merged: str, work: str, cleanup: Cleanup) -> dict[str, Any]:
    """The writer (:data:`WRITER`) in ``merged`` while :data:`PAUSED_CREATES` checkpoints are
    taken a second apart through ``sock``: each create's reported pause against the
    writer's worst gap during it, and its gaps outside the creates."""
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


def f1(x: float | None, scale: float = 1.0, nd: int = 1) -> str:
    return "-" if x is None else f"{x * scale:,.{nd}f}"


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
