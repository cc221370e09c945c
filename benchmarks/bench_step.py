"""One agent step: its checkpoint and its undo, side by side with restic and rsync (issue 11).

Usage::

    python benchmarks/bench_step.py [--profile small|medium] [--rounds 3] [--cold-rounds 1]
                                    [--parts root,overlay-empty,overlay-base]
                                    [--work DIR] [--keep] [--no-freeze] [--out FILE]

The layer is ``benchmarks/.data/bench-data/<profile>`` (``$BENCH_DATA``), built by
``../shared/bench/make_dataset.sh DIR PROFILE``, never modified (only ``cp -a`` copies are, and the
real-LOWER overlay reads it in place: overlayfs never writes to LOWER); the typical change
is one run of ``../shared/bench/mutate.sh`` (edits 1% of the files, adds ~4.4 MB, installs
``rich`` in the venv, appends 2% rows to the 200 MiB SQLite database, deletes a directory,
commits). Three parts, each with daemons started as subprocesses (``_daemon.Daemon``) and
talked to over their Unix sockets:

1. **root** (``--root``): one copy L of the layer, two daemons on it: journal on, and
   ``--no-journal`` (its store a copy of the first one's after the first checkpoint c0, so
   both hold the same c0), and a restic repository with snapshot b0 of L. Each round:

   - before each timed sprite-env step, untimed, the daemon checkpoints L (``fresh_epoch``;
     deleted with the round's checkpoints), so that its timed one covers that step alone;
   - the undo of one step: ``mutate.sh`` on L, then, timed, POST
     /v1/checkpoints/c0/restore (its undo checkpoint stores the change, new to the store:
     every round deletes what the previous one stored, and the delete collects it); the
     same for the other daemon; and on a second copy of the layer (so that a wipe does not
     flood the journal's queue): ``mutate.sh``, then restic's best exact method (wipe, then
     ``restic restore b0``: restic 0.14 has no delta restore), and ``mutate.sh``, then
     ``rsync -aX --delete DATA/ COPY/`` (DATA is the saved state);
   - the checkpoint after the typical change: ``mutate.sh`` on L, then, timed, POST
     /v1/checkpoint to each daemon and ``restic backup`` of L (the same tree, the same
     change); then the checkpoint with no change, each tool again;
   - untimed: L back to c0 (both daemons), the round's checkpoints deleted (and
     collected), restic's repository rolled back to b0, so the next round's data are new
     to every store.

   A peer's restore that took more than ``CHEAP_S`` in the first warm round (restic's
   wipe and full restore of the medium layer) is not repeated in the later warm ones.

   The first ``--rounds`` rounds are warm (``sync`` before each timed run), the last
   ``--cold-rounds`` cold (``sync`` and ``drop_caches`` before each timed run).
2. **overlay-empty**: L as UPPER of an overlay whose LOWER is an empty directory (the whole
   layer in UPPER), the daemon mounting it (``--overlay``), the ``web`` service running;
   the daemons of part 1 go on with their stores (journal on, then off, one at a time).
   Each round: ``mutate.sh`` through MERGED, then, timed, the restore of the checkpoint
   before it (with one hand-started process in MERGED that it must end); the time the
   environment is down comes from the events (``Stopping services...`` to ``Services
   started``). Then, journal on, the writers' pause (``_overlay.part_pause``).
3. **overlay-base**: ``bench_daemon.py``'s restore in the sprite shape with this layer as
   LOWER (UPPER empty, one overlay per tool) and ``mutate.sh`` as the session and as the
   step (its second run on a tree: 1% of the files edited again, 2% more rows); then the
   writers' pause.

Every restore is verified with the tree oracle (``_tree``): the restored tree against the
tree as it was at the checkpoint, entry by entry. Every sprite-env checkpoint's ``walk``
and ``walk_reason`` are recorded (the undo checkpoints' too). sprite-env is run from a copy
of ``sprite_env/`` as committed at HEAD (``--no-freeze``: the working tree, live). Output:
markdown tables on stdout, JSON in ``benchmarks/results/step-<profile>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
from datetime import datetime
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_checkpoints as bc  # noqa: E402  (freezing sprite-env the same way)
from _daemon import (  # noqa: E402
    Cleanup,
    Daemon,
    Streamed,
    call,
    complete_frozen_copy,
    event_time,
    is_overlay,
    job,
    log,
    mounts_under,
    q,
    save_run,
    stream,
)
from _overlay import (  # noqa: E402
    RESTIC,
    RSYNC,
    SPRITE,
    Ov,
    ResticRepo,
    f1,
    overlay_setup,
    part_pause,
    part_restore,
    peer_versions,
    restore_sprite,
    wait_service,
    write_service,
)
from _peers import (  # noqa: E402
    RESULTS_DIR,
    drop_caches,
    markdown_table,
    run_measured,
    shell,  # noqa: E402
)
from _tree import compare, manifest, verdict  # noqa: E402

BENCH = os.path.realpath(os.path.join(REPO, "..", "shared", "bench"))
MUTATE = os.path.join(BENCH, "mutate.sh")
#: The data sets of ../shared/bench (git-ignored here; a symlink to a shared build will do).
DATA = os.environ.get("BENCH_DATA", os.path.join(HERE, ".data", "bench-data"))


def data_label(data: str) -> str:
    """The data set as results record it: relative to the repository, or
    ``$BENCH_DATA/<profile>`` when it is elsewhere (never one machine's absolute path)."""
    rel = os.path.relpath(data, REPO)
    return os.path.join("$BENCH_DATA", os.path.basename(data)) if rel.startswith("..") else rel


ON, OFF = "sprite-env", "sprite-env --no-journal"
PARTS = ("root", "overlay-empty", "overlay-base")
#: A peer's warm restore that took longer than this (restic's wipe + full restore of the
#: medium layer: ~60 s) is not repeated in the later warm rounds, as ../shared/bench's
#: CHEAP_S; that keeps a medium run near 15 minutes.
CHEAP_S = 20.0
#: Issue 11's goals (seconds).
GOAL_CHANGE, GOAL_NOCHANGE, GOAL_UNDO, GOAL_DOWN, GOAL_PAUSE = 0.30, 0.05, 1.0, 0.5, 0.050


def mutate(root: str) -> dict[str, Any]:
    """One typical agent step on ``root`` (untimed by the benchmark, its duration kept)."""
    t0 = time.perf_counter()
    p = subprocess.run(
        ["bash", MUTATE, root],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "BENCH_DATA": DATA},
    )
    if p.returncode != 0:
        raise RuntimeError(f"mutate.sh {root}: exit {p.returncode}: {p.stderr[-800:]}")
    line = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    facts: dict[str, Any] = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
    facts["seconds"] = round(time.perf_counter() - t0, 2)
    return facts


def settle(cold: bool) -> None:
    """Before a timed run: dirty pages written back; with ``cold`` the page cache dropped."""
    os.sync()
    if cold and not drop_caches():
        raise RuntimeError("cannot drop the page cache (needs root)")


# -- sprite-env ---------------------------------------------------------------------------


def create(d: Daemon, comment: str, cold: bool = False) -> dict[str, Any]:
    """POST /v1/checkpoint, timed; the checkpoint's facts (walk, walk_reason, ...)."""
    settle(cold)
    s = job(d.socket, "POST", "/v1/checkpoint", {"comment": comment})
    cp = s.last.get("checkpoint") or {}
    return {
        "id": str(s.last["id"]),
        "wall_s": s.wall,
        "walk": cp.get("walk"),
        "walk_reason": cp.get("walk_reason"),
        "files": cp.get("files"),
        "bytes_added": cp.get("bytes_added"),
    }


def info(d: Daemon, cid: str) -> dict[str, Any]:
    status, body = call(d.socket, "GET", f"/v1/checkpoints/{cid}")
    if status != 200:
        raise RuntimeError(f"GET {cid}: HTTP {status}: {body[:300]!r}")
    out: dict[str, Any] = json.loads(body)
    return out


def delete(d: Daemon, *cids: str | None) -> float:
    """Untimed bookkeeping: deletes checkpoints (their unique data are collected)."""
    t0 = time.perf_counter()
    for cid in cids:
        if cid:
            status, body = call(d.socket, "DELETE", f"/v1/checkpoints/{cid}", timeout=600)
            if status != 200:
                raise RuntimeError(f"DELETE {cid}: HTTP {status}: {body[:300]!r}")
    return time.perf_counter() - t0


def _count(n: int | None) -> str:
    return "?" if n is None else f"{n:,}"


def fresh_epoch(d: Daemon) -> str:
    """Untimed: a checkpoint of the layer as it is now (deleted with the round's others), so
    that the daemon's next timed checkpoint covers only what follows. The two daemons share
    the layer: without it, the journal daemon's epoch also held the other daemon's restore
    and earlier runs of ``mutate.sh`` (three steps' worth in a round's checkpoint), while a
    full walk costs the same whatever came before. Returns its id."""
    return create(d, "bench: a fresh epoch")["id"]


def restore_root(d: Daemon, cid: str, cold: bool) -> dict[str, Any]:
    """POST /v1/checkpoints/CID/restore on a --root daemon, timed; with the undo
    checkpoint's walk."""
    settle(cold)
    s = stream(d.socket, "POST", f"/v1/checkpoints/{cid}/restore")
    run: dict[str, Any] = {"wall_s": s.wall}
    if not s.ok:
        run["error"] = f"HTTP {s.status}: {s.last}"
        return run
    run.update(undo=s.last.get("undo"), stats=s.last.get("stats"), steps=event_steps(s))
    return run


def event_steps(s: Streamed) -> list[list[Any]]:
    """(seconds since the first event, type, what) of every event but progress."""
    t0 = event_time(s.events[0]) if s.events else 0.0
    return [
        [round(event_time(e) - t0, 4), e["type"], e.get("data") or e.get("phase") or ""]
        for e in s.events
        if e["type"] != "progress"
    ]


def forget_undo(d: Daemon, run: dict[str, Any]) -> None:
    """Adds the restore's undo checkpoint's walk to ``run``, then deletes that checkpoint
    (untimed), so that the next round's undo stores the step anew, as this one did."""
    if run.get("undo"):
        u = info(d, run["undo"])
        run["undo_walk"], run["undo_walk_reason"] = u.get("walk"), u.get("walk_reason")
        run["undo_bytes_added"] = u.get("bytes_added")
        delete(d, run["undo"])


def undo_line(run: dict[str, Any]) -> str:
    """The log's end of a sprite-env undo: the oracle's verdict, the undo checkpoint's walk."""
    walk = f"{run.get('undo_walk')} {run.get('undo_walk_reason') or ''}"
    return f"{verdict(run.get('verify'))}  undo walk {walk}"


# -- restic -------------------------------------------------------------------------------


def restic_backup(r: ResticRepo, src: str, cold: bool) -> dict[str, Any]:
    settle(cold)
    m = run_measured(
        ["restic", "-r", r.repo, "backup", "--json", "--quiet", "."], cwd=src, env=r.env
    )
    if not m.ok:
        raise RuntimeError(f"restic backup: exit {m.returncode}: {m.stderr[-500:]}")
    lines = [ln for ln in m.stdout.splitlines() if '"snapshot_id"' in ln]
    summary: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    return {
        "id": summary.get("snapshot_id"),
        "wall_s": m.wall,
        "cpu_s": m.cpu,
        "data_added": summary.get("data_added"),
    }


def listing(*dirs: str) -> set[str]:
    """Every file under ``dirs``."""
    return {os.path.join(p, n) for d in dirs for p, _ds, names in os.walk(d) for n in names}


def roll_back(saved: set[str], *dirs: str) -> None:
    """A restic repository and its cache back to an earlier :func:`listing`: restic only
    ever adds files (packs, indexes, snapshots) and never rewrites one, so removing what
    was added since gives the earlier repository exactly; much faster than ``forget
    --prune`` (~30 s on the medium layer) and the next backup stores the change anew."""
    for path in listing(*dirs) - saved:
        os.unlink(path)


def timed_script(script: str, env: dict[str, str], cold: bool) -> dict[str, Any]:
    settle(cold)
    m = run_measured(shell(script), env=env)
    run: dict[str, Any] = {"wall_s": m.wall, "cpu_s": m.cpu}
    if not m.ok:
        run["error"] = f"exit {m.returncode}: {m.stderr.strip()[-500:]}"
        return run
    t0 = time.perf_counter()
    os.sync()  # sprite-env's restore ends with a syncfs; the peers' do not
    run["sync_after_s"] = time.perf_counter() - t0
    return run


# -- part 1: --root -----------------------------------------------------------------------


def part_root(
    args: argparse.Namespace, data: str, work: str, cleanup: Cleanup
) -> tuple[dict[str, Any], dict[str, Daemon]]:
    d = os.path.join(work, "root")
    live, peer = os.path.join(d, "live"), os.path.join(d, "peer")
    os.makedirs(d)
    log("root: two copies of the layer")
    subprocess.run(["cp", "-a", data, live], check=True)
    subprocess.run(["cp", "-a", data, peer], check=True)
    expected = manifest(live)
    res: dict[str, Any] = {"entries": len(expected)}

    states = {ON: os.path.join(d, "state-on"), OFF: os.path.join(d, "state-off")}
    on = Daemon(states[ON], ["--root", live])
    cleanup.daemons.append(on)
    on.start()
    c0 = create(on, "c0: the layer", cold=True)
    log(f"root: first checkpoint {c0['id']} in {c0['wall_s']:.2f} s (cold)")
    restic = ResticRepo(d)
    restic.init()
    b0 = restic_backup(restic, live, cold=True)
    restic_at_b0 = listing(restic.repo, restic.env["RESTIC_CACHE_DIR"])
    log(f"root: restic's first backup in {b0['wall_s']:.2f} s (cold)")
    res["first"] = {ON: c0, RESTIC: b0}
    on.stop()
    os.makedirs(states[OFF])
    subprocess.run(["cp", "-a", os.path.join(states[ON], "store"), states[OFF]], check=True)
    daemons = {ON: on, OFF: Daemon(states[OFF], ["--root", live, "--no-journal"])}
    cleanup.daemons.append(daemons[OFF])
    arm: dict[str, Any] = {}
    for name, dm in daemons.items():
        dm.start()
        # after a (re)start the first capture walks everything: this one, untimed
        arm[name] = create(dm, "after the daemon started")
    res["after_start"] = arm

    rounds: list[dict[str, Any]] = []
    temps = [False] * args.rounds + [True] * args.cold_rounds
    for r, cold in enumerate(temps):
        rnd: dict[str, Any] = {"round": r, "cold": cold, "undo": {}, "change": {}, "nochange": {}}
        rounds.append(rnd)
        tag = f"root: round {r + 1}/{len(temps)} ({'cold' if cold else 'warm'})"
        # the undo of one step
        sprites = [ON, OFF] if r % 2 == 0 else [OFF, ON]
        fresh: dict[str, list[str]] = {ON: [], OFF: []}
        for name in sprites:
            dm = daemons[name]
            fresh[name].append(fresh_epoch(dm))
            rnd.setdefault("mutations", []).append(mutate(live))
            run = restore_root(dm, c0["id"], cold)
            rnd["undo"][name] = run
            if "error" not in run:
                run["verify"] = compare(expected, manifest(live))
                forget_undo(dm, run)
            log(f"{tag}: undo {name:<24} {run['wall_s']:6.2f} s  {undo_line(run)}")
        scripts = {
            RESTIC: f"find {q(peer)} -mindepth 1 -delete\n"
            f"restic -r {q(restic.repo)} restore {b0['id']} --target {q(peer)} > /dev/null",
            RSYNC: f"rsync -aX --delete {q(data)}/ {q(peer)}/",
        }
        for name in [RESTIC, RSYNC] if r % 2 == 0 else [RSYNC, RESTIC]:
            if not cold and r > 0 and rounds[0]["undo"][name]["wall_s"] > CHEAP_S:
                continue  # not cheap: its first warm run stands for the warm rounds
            rnd.setdefault("mutations", []).append(mutate(peer))
            run = timed_script(scripts[name], restic.env, cold)
            rnd["undo"][name] = run
            if "error" not in run:
                run["verify"] = compare(expected, manifest(peer))
            log(f"{tag}: undo {name:<24} {run['wall_s']:6.2f} s  {verdict(run.get('verify'))}")

        # the checkpoint after the change, then with no change
        for name in (ON, OFF):
            fresh[name].append(fresh_epoch(daemons[name]))
        rnd["mutations"].append(mutate(live))
        order = [ON, OFF, RESTIC]
        order = order[r % 3 :] + order[: r % 3]
        for kind in ("change", "nochange"):
            for name in order:
                if name == RESTIC:
                    rnd[kind][name] = restic_backup(restic, live, cold)
                else:
                    rnd[kind][name] = create(daemons[name], f"round {r} {kind}", cold)
                x = rnd[kind][name]
                log(
                    f"{tag}: {kind:<8} {name:<24} {x['wall_s']:6.2f} s"
                    + (f"  walk {x['walk']} {x['walk_reason'] or ''}" if name != RESTIC else "")
                )
        # untimed: back to c0, the round's data gone from every store
        t0 = time.perf_counter()
        for name in (ON, OFF):
            dm = daemons[name]
            s = job(dm.socket, "POST", f"/v1/checkpoints/{c0['id']}/restore")
            delete(
                dm,
                rnd["change"][name]["id"],
                rnd["nochange"][name]["id"],
                s.last.get("undo"),
                *fresh[name],
            )
        roll_back(restic_at_b0, restic.repo, restic.env["RESTIC_CACHE_DIR"])
        rnd["bookkeeping_s"] = time.perf_counter() - t0
    res["rounds"] = rounds
    res["c0"] = c0["id"]
    v = compare(expected, manifest(live))
    if not v["ok"]:
        raise RuntimeError(f"root: L is not back at c0 after the rounds: {v['counts']}")
    bc.rmtree(peer)
    return res, daemons


# -- part 2: the layer as UPPER, LOWER empty ----------------------------------------------


def part_overlay_empty(
    args: argparse.Namespace, live: str, daemons: dict[str, Daemon], work: str, cleanup: Cleanup
) -> dict[str, Any]:
    d = os.path.join(work, "overlay-empty")
    ov = Ov(os.path.join(d, "lower"), d)
    os.makedirs(ov.lower)
    os.makedirs(ov.work)
    os.makedirs(ov.merged)
    res: dict[str, Any] = {}
    for name in (ON, OFF):
        old = daemons[name]
        old.stop()
        flags = ["--overlay", f"{ov.lower}:{live}:{ov.work}:{ov.merged}"]
        dm = Daemon(old.state, flags + (["--no-journal"] if name == OFF else []))
        cleanup.daemons.append(dm)
        dm.start()
        if not is_overlay(ov.merged):
            raise RuntimeError("the daemon did not mount the overlay")
        write_service(ov.merged)  # already there for the second daemon: rewritten alike
        status, body = call(dm.socket, "POST", "/v1/services/web/start")
        if status != 200:
            raise RuntimeError(f"starting the web service: HTTP {status}: {body[:300]!r}")
        wait_service(dm.socket)
        a = create(dm, "A: before the step")  # after the (re)start: a full walk
        expected = manifest(live)
        runs: list[dict[str, Any]] = []
        for r in range(args.rounds):
            run: dict[str, Any] = {"round": r, "mutation": mutate(ov.merged)}
            os.sync()
            run.update(restore_sprite(dm.socket, ov.merged, a["id"], cleanup))
            runs.append(run)
            if "error" not in run:
                run["remounted"] = is_overlay(ov.merged)
                run["verify"] = compare(expected, manifest(live))
                forget_undo(dm, run)
            log(
                f"overlay-empty: {name:<24} round {r + 1}/{args.rounds} {run['wall_s']:6.2f} s, "
                f"down {f1(run.get('down_s'), 1000, 0)} ms  {undo_line(run)}"
            )
        res[name] = {"a": a, "runs": runs}
        if name == ON:
            res["pause"] = part_pause(dm.socket, ov.merged, d, cleanup)
            s = job(dm.socket, "POST", f"/v1/checkpoints/{a['id']}/restore")  # the writer's out
            forget_undo(dm, {"undo": s.last.get("undo")})
        rc = dm.stop()
        if rc != 0:
            raise RuntimeError(f"overlay daemon {name} exited {rc}: {dm.log()[-1500:]}")
        for mp, _t in mounts_under(ov.merged):
            subprocess.run(["umount", mp], check=True)
    return res


# -- part 3: the layer as LOWER -----------------------------------------------------------


def part_overlay_base(
    args: argparse.Namespace, data: str, work: str, cleanup: Cleanup, peers: list[str]
) -> dict[str, Any]:
    d = os.path.join(work, "overlay-base")
    os.makedirs(d)
    setup = overlay_setup(data, d, cleanup, peers, mutate)
    res: dict[str, Any] = {"setup": setup.facts}
    res["restore"] = part_restore(
        args.rounds,
        setup,
        cleanup,
        lambda merged, _r: mutate(merged),
        lambda run: forget_undo(setup.daemon, run),
    )
    res["pause"] = part_pause(setup.daemon.socket, setup.ovs[SPRITE].merged, d, cleanup)
    rc = setup.daemon.stop()
    if rc != 0:
        raise RuntimeError(f"overlay daemon exited {rc}: {setup.daemon.log()[-1500:]}")
    return res


# -- report -------------------------------------------------------------------------------


def med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def cell(xs: list[float], scale: float = 1.0, nd: int | None = None) -> str:
    """``median (min-max)`` of seconds (3 decimals below one second, else 2), or ``-``."""
    if not xs:
        return "-"
    m = statistics.median(xs) * scale
    d = nd if nd is not None else (3 if m < 1 else 2)
    if len(xs) == 1:
        return f"{m:,.{d}f}"
    return f"{m:,.{d}f} ({min(xs) * scale:,.{d}f}-{max(xs) * scale:,.{d}f})"


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def walks(runs: list[dict[str, Any]], undo: bool = False) -> str:
    """``journal x3`` or ``full (daemon restart) x1``: how the checkpoints walked (with
    ``undo``: the restores' undo checkpoints)."""
    key = "undo_walk" if undo else "walk"
    seen: dict[str, int] = {}
    for x in runs:
        w = str(x.get(key))
        if x.get(key + "_reason"):
            w += f" ({x[key + '_reason']})"
        seen[w] = seen.get(w, 0) + 1
    return ", ".join(f"{w} x{n}" for w, n in seen.items()) or "-"


def goal(m: float | None, limit: float, ms: bool = False) -> str:
    """The goal, and whether the median ``m`` meets it."""
    text = f"<= {limit * 1000:.0f} ms" if ms else f"<= {limit:.2f}"
    return text + (" met" if m is not None and m <= limit else " **not met**")


Rows = list[list[str]]


def row(label: str, cells: list[str], limit: str) -> list[str]:
    """A row of the main table: ``cells`` for ON, OFF, restic, rsync, then the ratios."""
    return [label, *cells, limit]


def rows_root(root: dict[str, Any], rows: Rows, walk_rows: Rows) -> None:
    first = root["first"]
    rows.append(
        row(
            "first checkpoint, cold (issue 12; context)",
            [cell([first[ON]["wall_s"]]), "-", cell([first[RESTIC]["wall_s"]]), "-"]
            + [ratio(first[ON]["wall_s"], first[RESTIC]["wall_s"]), "-"],
            "-",
        )
    )
    for kind, label, limit in (
        ("change", "checkpoint after the typical change", GOAL_CHANGE),
        ("nochange", "checkpoint with no change", GOAL_NOCHANGE),
        ("undo", "undo of one step (--root): restore of c0 onto the changed layer", GOAL_UNDO),
    ):
        for cold in (False, True):
            rs = [r for r in root["rounds"] if r["cold"] == cold]
            if not rs:
                continue
            temp = "cold" if cold else "warm"
            tools = [ON, OFF, RESTIC] + ([RSYNC] if kind == "undo" else [])
            # a tool may be missing from a round (not cheap, see CHEAP_S) or have failed
            done = {t: [r[kind][t] for r in rs if t in r[kind]] for t in tools}
            w = {t: [x["wall_s"] for x in xs if "error" not in x] for t, xs in done.items()}
            m = {t: med(w[t]) for t in tools}
            cells = [cell(w[ON]), cell(w[OFF]), cell(w[RESTIC]), cell(w.get(RSYNC, []))]
            cells += [ratio(m[ON], m[RESTIC]), ratio(m[ON], m.get(RSYNC))]
            rows.append(row(f"{label}, {temp} (n={len(rs)})", cells, goal(m[ON], limit)))
            xs = {t: [r[kind][t] for r in rs if t in r[kind]] for t in (ON, OFF)}
            walk_rows.append([f"{label}, {temp}"] + [walks(xs[t], kind == "undo") for t in xs])


def rows_overlay_empty(oe: dict[str, Any], rows: Rows, walk_rows: Rows) -> None:
    for what, key, limit in (
        ("undo under an overlay, LOWER empty (UPPER = the layer)", "wall_s", GOAL_UNDO),
        ("  of which the environment is down", "down_s", GOAL_DOWN),
    ):
        w = {t: [x[key] for x in oe[t]["runs"] if x.get(key) is not None] for t in (ON, OFF)}
        cells = [cell(w[ON]), cell(w[OFF]), "-", "-", "-", "-"]
        rows.append(row(f"{what} (n={len(w[ON])})", cells, goal(med(w[ON]), limit)))
    walk_rows.append(
        ["undo under an overlay, LOWER empty"] + [walks(oe[t]["runs"], True) for t in (ON, OFF)]
    )


def rows_overlay_base(ob: dict[str, Any], rows: Rows, walk_rows: Rows) -> None:
    by: dict[str, list[dict[str, Any]]] = {}
    for x in ob["restore"]["runs"]:
        if "error" not in x:
            by.setdefault(x["tool"], []).append(x)
    w = {t: [x["wall_s"] for x in by.get(t, [])] for t in (SPRITE, RESTIC, RSYNC)}
    m = {t: med(v) for t, v in w.items()}
    cells = [cell(w[SPRITE]), "-", cell(w[RESTIC]), cell(w[RSYNC])]
    cells += [ratio(m[SPRITE], m[RESTIC]), ratio(m[SPRITE], m[RSYNC])]
    label = f"undo under an overlay, LOWER = the layer (n={len(w[SPRITE])}; peers: umount, "
    rows.append(row(label + "restore UPPER, mount)", cells, goal(m[SPRITE], GOAL_UNDO)))
    down = [x["down_s"] for x in by.get(SPRITE, []) if x.get("down_s") is not None]
    cells = [cell(down), "-", "-", "-", "-", "-"]
    rows.append(
        row(
            f"  of which the environment is down (n={len(down)})", cells, goal(med(down), GOAL_DOWN)
        )
    )
    walk_rows.append(
        ["undo under an overlay, LOWER = the layer", walks(by.get(SPRITE, []), True), "-"]
    )


def rows_pause(name: str, p: dict[str, Any], rows: Rows) -> None:
    gaps = [c["writer_worst_gap_ms"] / 1000 for c in p["creates"] if c.get("writer_worst_gap_ms")]
    reported = [c["pause"]["seconds"] for c in p["creates"] if c.get("pause")]
    label = f"writers' pause during a create, {name}: worst writer gap / daemon's pause, ms"
    cells = [f"{cell(gaps, 1000, 0)} / {cell(reported, 1000, 0)}", "-", "-", "-", "-", "-"]
    rows.append(
        row(f"{label} (n={len(gaps)})", cells, goal(max(gaps, default=None), GOAL_PAUSE, ms=True))
    )


def report(res: dict[str, Any]) -> list[str]:
    rows: Rows = []
    walk_rows: Rows = []
    if "root" in res:
        rows_root(res["root"], rows, walk_rows)
    if "overlay-empty" in res:
        rows_overlay_empty(res["overlay-empty"], rows, walk_rows)
    if "overlay-base" in res:
        rows_overlay_base(res["overlay-base"], rows, walk_rows)
    for name, part in (("LOWER empty", "overlay-empty"), ("LOWER = the layer", "overlay-base")):
        if res.get(part, {}).get("pause"):
            rows_pause(name, res[part]["pause"], rows)
    head = ["step (seconds: median (min-max))", ON, OFF, RESTIC, RSYNC, "/ restic", "/ rsync"]
    out = [markdown_table([*head, "goal"], rows, align="lrrrrrrl")]
    if walk_rows:
        out += ["", "How sprite-env's checkpoints walked (`walk`, `walk_reason` of each):", ""]
        out.append(markdown_table(["checkpoint", ON, OFF], walk_rows, align="lll"))
    return out


# -- main ---------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--profile", choices=["small", "medium"], default="small")
    parser.add_argument("--rounds", type=int, default=3, help="warm rounds (default 3)")
    parser.add_argument("--cold-rounds", type=int, default=1, help="cold rounds of part root")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"a subset of {','.join(PARTS)}")
    parser.add_argument(
        "--work",
        default=os.path.join(HERE, ".data", "scratch-step"),
        help="scratch directory (emptied first; default benchmarks/.data/scratch-step)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument(
        "--no-freeze", action="store_true", help="run the working tree's sprite-env, not HEAD's"
    )
    parser.add_argument("--out", help="JSON path (default benchmarks/results/step-<profile>.json)")
    args = parser.parse_args()
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if args.rounds < 1 or args.cold_rounds < 0 or not parts or parts - set(PARTS):
        parser.error(f"--rounds >= 1, --cold-rounds >= 0, --parts a subset of {','.join(PARTS)}")
    if "overlay-empty" in parts and "root" not in parts:
        parser.error("overlay-empty goes on with part root's layer and daemons: add root")
    if os.geteuid() != 0:
        parser.error("needs root: it mounts overlayfs, freezes processes, drops caches")
    data = os.path.join(DATA, args.profile)
    if not os.path.exists(data + ".done"):
        parser.error(
            f"{data} is not built (no {data}.done): run {BENCH}/make_dataset.sh {data} "
            f"{args.profile}, or set BENCH_DATA to where it is"
        )
    missing = [t for t in ("restic", "rsync", "sqlite3", "git") if not shutil.which(t)]
    if missing:
        parser.error(f"not installed: {', '.join(missing)}")
    t_start = time.monotonic()
    load0 = os.getloadavg()
    src0 = bc.source_state()
    work = os.path.abspath(args.work)
    for mp, _t in mounts_under(work):  # a previous run's, before anything is deleted
        subprocess.run(["umount", "-l", mp], check=False)
    bc.rmtree(work)
    os.makedirs(work)
    cleanup = Cleanup(work)
    results: dict[str, Any] = {}
    anomalies: list[str] = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        measured = bc.setup_sprite(work, freeze=not args.no_freeze)
        if not args.no_freeze:
            complete_frozen_copy(work)
        log(f"sprite-env: {measured}; layer {data}")
        daemons: dict[str, Daemon] = {}
        if "root" in parts:
            try:
                results["root"], daemons = part_root(args, data, work, cleanup)
            except Exception as e:
                anomalies.append(f"root: FAILED: {type(e).__name__}: {e}")
                traceback.print_exc()
        if "overlay-empty" in parts and daemons:
            try:
                live = os.path.join(work, "root", "live")
                results["overlay-empty"] = part_overlay_empty(args, live, daemons, work, cleanup)
            except Exception as e:
                anomalies.append(f"overlay-empty: FAILED: {type(e).__name__}: {e}")
                traceback.print_exc()
        for dm in daemons.values():
            dm.stop()
        if "overlay-base" in parts:
            try:
                results["overlay-base"] = part_overlay_base(
                    args, data, work, cleanup, [RESTIC, RSYNC]
                )
            except Exception as e:
                anomalies.append(f"overlay-base: FAILED: {type(e).__name__}: {e}")
                traceback.print_exc()
    finally:
        anomalies += cleanup.run()
        left = mounts_under(work)
        if left:
            anomalies.append(f"mounts left behind: {left}")
        if not args.keep and not left:
            bc.rmtree(work)
    anomalies += check(results)
    for dm in cleanup.daemons:
        if "Traceback" in dm.log():
            anomalies.append(f"daemon {os.path.basename(dm.state)}: a traceback in its log")

    loadavg = os.getloadavg()
    versions = peer_versions([RESTIC, RSYNC])
    elapsed = time.monotonic() - t_start
    out = [
        f"## One step, {datetime.now().strftime('%Y-%m-%d %H:%M')}: layer `{args.profile}` "
        f"({_count(results.get('root', {}).get('entries'))} entries); warm rounds {args.rounds}, "
        f"cold rounds {args.cold_rounds}; {os.cpu_count()} CPUs, load average "
        f"{load0[0]:.1f} before / {loadavg[0]:.1f} after",
        "",
        *report(results),
        "",
    ]
    if anomalies:
        out += ["Anomalies:", *[f"- {a}" for a in anomalies], ""]
    out.append(
        f"Versions: {versions}; sprite-env {src0['commit']} "
        f"({'frozen copy of HEAD' if not args.no_freeze else 'the working tree, live'}). "
        f"Elapsed {elapsed / 60:.1f} min."
    )
    text = "\n".join(out)
    print(text)
    facts = {
        "profile": args.profile,
        "data": data_label(data),
        "rounds": args.rounds,
        "cold_rounds": args.cold_rounds,
        "parts": sorted(parts),
    }
    save_run(
        "step",
        args.out or os.path.join(RESULTS_DIR, f"step-{args.profile}.json"),
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


def check(results: dict[str, Any]) -> list[str]:
    """Every failed or unverified restore, as an anomaly."""
    out = []
    runs: list[tuple[str, dict[str, Any]]] = []
    for r in results.get("root", {}).get("rounds", []):
        runs += [(f"root round {r['round'] + 1} {t}", x) for t, x in r["undo"].items()]
    for t in (ON, OFF):
        for x in results.get("overlay-empty", {}).get(t, {}).get("runs", []):
            runs.append((f"overlay-empty round {x['round'] + 1} {t}", x))
    for x in results.get("overlay-base", {}).get("restore", {}).get("runs", []):
        runs.append((f"overlay-base round {x['round'] + 1} {x['tool']}", x))
    for where, x in runs:
        if "error" in x:
            out.append(f"{where}: {x['error']}")
        elif not x.get("verify", {}).get("ok"):
            v = x.get("verify") or {}
            out.append(f"{where}: MISMATCH {v.get('counts')} {v.get('examples')}")
        elif x.get("remounted") is False:
            out.append(f"{where}: MERGED not remounted")
    return out


if __name__ == "__main__":
    sys.exit(main())
