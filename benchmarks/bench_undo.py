"""The undo of one agent step, in process: sprite-env before and after a change, one run.

Usage::

    python benchmarks/bench_undo.py [--profile small|medium] [--rounds 3] [--before REV]
                                    [--after REV] [--work DIR] [--py-spy] [--no-verify]
                                    [--keep] [--out FILE]

Two versions of sprite-env (``--before``, default ``c17f9dc^``: the commit before issue
11.6's restore work, and ``--after``, default HEAD) are each copied with ``git archive``
(plus the built extension of the working tree) and run in a worker process of their own, on
a ``cp -a`` copy of the layer (``$BENCH_DATA/<profile>``, default
``benchmarks/.data/bench-data``) with their own store, an ``Engine`` and the change journal
(``Journal``, read every 50 ms as the daemon reads it). Each worker takes the first
checkpoint c0 (untimed); then, round after round, the two alternate (before, after, before,
...): ``mutate.sh`` on the layer (untimed), ``sync``, then, timed, what the daemon does for
``POST /v1/checkpoints/c0/restore`` on a ``--root`` layer: the check (``check_restore``:
a journal-driven capture that stores the step, and the plan: room, data verified) and the
restore (``restore``: the undo checkpoint, journal-driven, then the writes; what a daemon
holds its services down for), then, timed apart, the wait for the inodes the restore
removed to be freed (``snapshot/frees.py``: in the background, the services up). Untimed
after each round: the restored layer compared entry by entry with the layer as it was at
c0 (``_tree``), and the undo checkpoint deleted, so the next round stores the step anew.

``--py-spy``: every timed round of both workers is recorded by ``py-spy record --threads``
into ``WORK/spy-<version>-<round>.txt`` (raw), and the busiest functions of each one's last
round are printed per phase (the sampling costs both alike; compare without it). Output:
a markdown table on stdout, JSON in ``benchmarks/results/undo-<profile>.json``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BENCH = os.path.realpath(os.path.join(REPO, "..", "shared", "bench"))
MUTATE = os.path.join(BENCH, "mutate.sh")
DATA = os.environ.get("BENCH_DATA", os.path.join(HERE, ".data", "bench-data"))
GOAL_UNDO, GOAL_DOWN = 1.0, 0.5


# -- the worker (runs one version of sprite-env) ------------------------------------------


def worker(layer: str, store: str, spy: str | None) -> None:
    """Reads commands from stdin (``setup``, ``round N``, ``quit``), answers one JSON line
    each on stdout."""
    from sprite_env.checkpoints.engine import Engine
    from sprite_env.journal import Journal

    journal = Journal(layer)
    stop = threading.Event()

    def poll() -> None:  # as the daemon does, so that the kernel's queue never overflows
        while not stop.wait(0.05):
            journal.poll()

    threading.Thread(target=poll, daemon=True).start()
    e = Engine(layer, store)
    e.journal = journal
    out = sys.stdout
    sys.stdout = sys.stderr  # nothing else may write on the answer channel
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "quit":
            break
        if cmd[0] == "setup":
            t = time.perf_counter()
            c0 = e.create("c0")
            e.prewarm()  # the journal now holds a base: every later capture may use it
            answer: dict[str, Any] = {"c0": c0.id, "first_s": time.perf_counter() - t}
        else:
            answer = one_round(e, c0.id, f"{spy}-{cmd[1]}.txt" if spy else None)
        out.write(json.dumps(answer) + "\n")
        out.flush()
    stop.set()
    time.sleep(0.1)
    journal.close()
    e.close()


def one_round(e: Any, c0: str, spy: str | None) -> dict[str, Any]:
    phases: dict[str, list[float]] = {}

    def progress(phase: str, _stats: object) -> None:
        now = time.perf_counter()
        phases.setdefault(phase, [now, now])[1] = now

    rec = None
    if spy:
        rec = subprocess.Popen(
            ["py-spy", "record", "--pid", str(os.getpid()), "--threads", "--nonblocking",
             "-r", "200", "-f", "raw", "-o", spy],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(1.0)  # attached
    t0 = time.perf_counter()
    e.check_restore(c0, progress)
    t1 = time.perf_counter()
    rep = e.restore(c0, progress=progress)
    t2 = time.perf_counter()
    try:  # the inodes the restore removed, freed after it (snapshot/frees.py), timed apart
        from sprite_env.snapshot.frees import wait_released
    except ImportError:
        pass
    else:
        wait_released()
    t3 = time.perf_counter()
    if rec is not None:
        rec.send_signal(signal.SIGINT)
        rec.wait()
    undo = e.registry.get(rep.undo)
    e.delete_many([rep.undo])
    return {
        "check_s": t1 - t0,
        "restore_s": t2 - t1,
        "total_s": t2 - t0,
        "freed_after_s": t3 - t2,
        "phases": {k: [a - t0, b - t0] for k, (a, b) in phases.items()},
        "stats": rep.to_json(),
        "undo_walk": [undo.walk, undo.walk_reason],
    }


# -- the driver ---------------------------------------------------------------------------


def freeze(rev: str, dest: str) -> str:
    """sprite_env/ as of ``rev`` (plus the working tree's built extension) under ``dest``."""
    os.makedirs(dest)
    archive = subprocess.run(
        ["git", "-C", REPO, "archive", rev, "sprite_env"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    for name in os.listdir(os.path.join(REPO, "sprite_env")):
        if name.endswith(".so"):
            shutil.copy2(os.path.join(REPO, "sprite_env", name), os.path.join(dest, "sprite_env"))
    return subprocess.run(
        ["git", "-C", REPO, "rev-parse", "--short", rev], capture_output=True, text=True,
        check=True,
    ).stdout.strip()  # fmt: skip


class Worker:
    def __init__(self, name: str, src: str, layer: str, store: str, spy: str | None) -> None:
        self.name, self.layer = name, layer
        argv = [sys.executable, "-P", os.path.abspath(__file__), "_worker", layer, store]
        env = {**os.environ, "PYTHONPATH": src}
        if spy:
            argv.append(spy)
            env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )

    def ask(self, cmd: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.name} died (exit {self.proc.wait()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, BrokenPipeError, ValueError):
            self.ask("quit")
        self.proc.wait(timeout=60)


def mutate(root: str) -> None:
    env = {**os.environ, "BENCH_DATA": os.path.dirname(os.path.realpath(DATA_DIR))}
    subprocess.run(["bash", MUTATE, root], check=True, capture_output=True, env=env)


def top_functions(path: str, phase_frame: str, n: int = 8) -> list[tuple[int, str]]:
    """The functions most often on the stack (self time) of samples under ``phase_frame``,
    over all threads."""
    own: collections.Counter[str] = collections.Counter()
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            if phase_frame in stack:
                own[stack.split(";")[-1]] += int(count)
    return [(c, fn) for fn, c in own.most_common(n)]


DATA_DIR = ""


def main() -> int:
    global DATA_DIR
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="medium")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", default="c17f9dc^")
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--work", default=os.path.join(HERE, ".data", "scratch-undo"))
    ap.add_argument("--py-spy", action="store_true", help="record every timed round")
    ap.add_argument("--no-verify", action="store_true", help="skip the tree oracle")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sys.path.insert(0, HERE)
    from _peers import markdown_table, write_results
    from _tree import compare, manifest, verdict

    DATA_DIR = os.path.join(DATA, args.profile)
    if not os.path.isdir(DATA_DIR):
        print(f"no data set at {DATA_DIR} (../shared/bench/make_dataset.sh)", file=sys.stderr)
        return 2
    if os.path.exists(args.work):
        shutil.rmtree(args.work)
    os.makedirs(args.work)
    workers: list[Worker] = []
    results: dict[str, Any] = {"profile": args.profile, "rounds": {}, "versions": {}}
    try:
        for name, rev in (("before", args.before), ("after", args.after)):
            src = os.path.join(args.work, f"src-{name}")
            results["versions"][name] = freeze(rev, src)
            layer = os.path.join(args.work, f"layer-{name}")
            print(f"copying the layer for {name} ({results['versions'][name]})...", flush=True)
            subprocess.run(["cp", "-a", DATA_DIR, layer], check=True)
            spy = os.path.join(args.work, f"spy-{name}") if args.py_spy else None  # both alike
            workers.append(Worker(name, src, layer, os.path.join(args.work, f"store-{name}"), spy))
        expected = None if args.no_verify else manifest(workers[0].layer)
        for w in workers:
            got = w.ask("setup")
            print(f"{w.name}: c0 in {got['first_s']:.1f} s", flush=True)
        for r in range(args.rounds):
            for w in workers if r % 2 == 0 else workers[::-1]:
                mutate(w.layer)
                os.sync()
                got = w.ask(f"round {r}")
                if expected is not None:
                    got["verify"] = compare(expected, manifest(w.layer))
                results["rounds"].setdefault(w.name, []).append(got)
                print(
                    f"round {r} {w.name}: check {got['check_s']:.2f} s, restore (down) "
                    f"{got['restore_s']:.2f} s, total {got['total_s']:.2f} s, then frees "
                    f"{got['freed_after_s']:.2f} s; undo walk "
                    f"{got['undo_walk'][0]} {verdict(got.get('verify'))}",
                    flush=True,
                )
    finally:
        for w in workers:
            w.close()
    rows = []
    for what, key, goal in (
        ("check (before anything stops)", "check_s", None),
        ("restore: undo checkpoint + writes (down)", "restore_s", GOAL_DOWN),
        ("undo of one step, total", "total_s", GOAL_UNDO),
        ("then: the removed inodes freed (services up)", "freed_after_s", None),
    ):
        med = {
            n: statistics.median(x.get(key, 0.0) for x in rs) for n, rs in results["rounds"].items()
        }
        ratio = f"{med['after'] / med['before']:.2f}x" if med["before"] else ""
        rows.append([what, f"{med['before']:.2f}", f"{med['after']:.2f}", ratio,
                     f"<= {goal}" if goal else ""])  # fmt: skip
    v = results["versions"]
    print()
    print(markdown_table(
        ["seconds (median)", f"before ({v['before']})", f"after ({v['after']})", "after/before",
         "goal"], rows, "lrrrr",
    ))  # fmt: skip
    if args.py_spy:
        for name in ("before", "after"):
            last = os.path.join(args.work, f"spy-{name}-{args.rounds - 1}.txt")
            for frame in ("Engine.check_restore", "Engine.restore"):
                print(f"\n{name}: busiest functions (200 Hz, all threads) under {frame}:")
                for c, fn in top_functions(last, frame):
                    print(f"  {c:5d}  {fn}")
    path = write_results("undo", results, args.out or os.path.join(
        HERE, "results", f"undo-{args.profile}.json"))  # fmt: skip
    print(f"\nresults: {path}")
    if not args.keep:
        shutil.rmtree(args.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
    else:
        sys.exit(main())
