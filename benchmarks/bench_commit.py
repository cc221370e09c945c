"""The commit of one agent step's checkpoint, phase by phase, in process (issue 11).

Usage::

    python benchmarks/bench_commit.py [--profile small,medium] [--src DIR ...] [--work DIR]
                                      [--out FILE]

Per profile and per source tree (``--src``: a copy of ``sprite_env/`` to import instead
of this checkout's, e.g. ``git archive REV sprite_env | tar -x -C DIR`` with the built
``_native*.so`` copied in; repeat it to compare revisions in one run), in a subprocess of
its own:

1. a fresh ``cp -a`` of ``$BENCH_DATA/<profile>`` (``benchmarks/.data/bench-data``) to
   ``WORK/layer`` (the files cache knows inodes, so a copy of a captured layer would be
   read again), an :class:`~sprite_env.checkpoints.Engine` with a change journal on it
   (polled by a thread, as the daemon does), the first checkpoint, and ``unique_bytes``
   (the daemon's listing figure; its decoded trees are then warm);
2. ``../shared/bench/mutate.sh`` on the layer (the typical step), then, timed, the step's
   checkpoint, then ``unique_bytes`` again (what the daemon's listing costs after it);
   twice (``step``, ``step2``: the script's second run edits 1% of the files again and
   adds 2% more rows; the first step's ``unique_bytes`` also shares every subtree of the
   first checkpoint, once);
3. a checkpoint with no change.

Each checkpoint's phases come from timers around the functions that do them: the walk
(``capture``), the packs' completion (``StoreWriter.flush``: the last encodings, and the
fsyncs and renames where a revision makes them there rather than beside the transaction),
the catalog rows of the packs (``insert_pack``), the files cache and page digests
(``dircache.save``, ``pagesums.save``), the journal's ``begin``, and SQLite's ``COMMIT``.
"commit" is everything after the capture. Printed as a table; JSON to ``--out``
(default ``benchmarks/results/commit-<date>.json``). The layer lives on the file system
of ``WORK``: the journal watches that whole file system, so other activity on it (other
benchmarks, a test suite) costs ``begin`` time here that it would not cost on a layer of
its own.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MUTATE = os.path.join(os.path.dirname(REPO), "shared", "bench", "mutate.sh")


def _data_dir() -> str:
    return os.environ.get("BENCH_DATA") or os.path.join(HERE, ".data", "bench-data")


# -- the child: one profile with one source tree -------------------------------------------


def _timers(T: dict[str, float]) -> None:
    """Wraps the functions of each phase so their wall time adds up in ``T``."""
    import sprite_env.checkpoints.engine as engine
    import sprite_env.journal.journal as journal
    import sprite_env.snapshot.dircache as dircache
    import sprite_env.snapshot.pagesums as pagesums
    import sprite_env.store.catalog as catalog
    import sprite_env.store.writer as writer

    def wrap(owner: Any, name: str, label: str) -> None:
        f = getattr(owner, name)

        @functools.wraps(f)
        def timed(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                T[label] = T.get(label, 0.0) + time.perf_counter() - t

        setattr(owner, name, timed)

    wrap(engine, "capture", "capture")
    wrap(journal.Journal, "begin", "journal_begin")
    wrap(writer.StoreWriter, "flush", "packs_publish")
    wrap(writer.StoreWriter, "commit", "commit_call")
    wrap(writer, "insert_pack", "insert_pack")
    wrap(dircache, "save", "dircache_save")
    wrap(pagesums, "save", "pagesums_save")
    wrap(catalog._Transaction, "__exit__", "sqlite_commit")


def child(profile: str, work: str) -> dict[str, Any]:
    from sprite_env.checkpoints import Engine
    from sprite_env.journal import Journal

    T: dict[str, float] = {}
    _timers(T)
    layer, store = os.path.join(work, "layer"), os.path.join(work, "store")
    for d in (layer, store):
        shutil.rmtree(d, ignore_errors=True)
    t = time.perf_counter()
    subprocess.run(["cp", "-a", os.path.join(_data_dir(), profile), layer], check=True)
    out: dict[str, Any] = {"profile": profile, "copy_s": round(time.perf_counter() - t, 2)}
    journal = Journal(layer)
    stop = threading.Event()

    def poll() -> None:  # as the daemon's reader: the kernel's queue never overflows
        while not stop.is_set():
            journal.poll()
            time.sleep(0.01)

    def step(e: Engine, label: str) -> dict[str, Any]:
        T.clear()
        n0 = e.store.catalog.object_count()
        t, c = time.perf_counter(), time.process_time()
        cp = e.create(label)
        total, cpu = time.perf_counter() - t, time.process_time() - c
        res = {k: round(v * 1000, 1) for k, v in sorted(T.items())}
        res.update(
            total_ms=round(total * 1000, 1),
            total_cpu_ms=round(cpu * 1000, 1),  # every thread of the process
            commit_ms=round(
                (total - T.get("capture", 0.0) - T.get("journal_begin", 0.0)) * 1000, 1
            ),
            walk=cp.walk,
            walk_reason=cp.walk_reason,
            new_objects=e.store.catalog.object_count() - n0,
            bytes_added=cp.bytes_added,
        )
        t, c = time.perf_counter(), time.process_time()
        e.unique_bytes()
        res["unique_bytes_ms"] = round((time.perf_counter() - t) * 1000, 1)
        res["unique_bytes_cpu_ms"] = round((time.process_time() - c) * 1000, 1)
        kept = getattr(e, "_usage", None)  # the objects its walk visited, where it is kept
        if kept is not None:
            res["unique_bytes_visited"] = kept.visited
        return res

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        with Engine(layer, store) as e:
            e.journal = journal
            t = time.perf_counter()
            e.create("first")
            out["first_s"] = round(time.perf_counter() - t, 2)
            e.unique_bytes()
            out["objects_before"] = e.store.catalog.object_count()
            for which in ("step", "step2"):
                subprocess.run(["bash", MUTATE, layer], check=True, stdout=subprocess.DEVNULL)
                time.sleep(0.2)  # the poller drains what the step queued
                out[which] = step(e, which)
            out["nochange"] = step(e, "nochange")
    finally:
        stop.set()
        poller.join()
        journal.close()
        shutil.rmtree(layer, ignore_errors=True)
        shutil.rmtree(store, ignore_errors=True)
    return out


# -- the parent: one child per (profile, source) -------------------------------------------

PHASES = [
    ("total_ms", "checkpoint, total"),
    ("total_cpu_ms", "  its CPU (all threads)"),
    ("journal_begin", "journal begin"),
    ("capture", "walk (capture)"),
    ("commit_ms", "commit (after the walk)"),
    ("packs_publish", "  packs finished (StoreWriter.flush)"),
    ("insert_pack", "  pack and object rows"),
    ("dircache_save", "  files cache rows"),
    ("pagesums_save", "  page digests"),
    ("sqlite_commit", "  SQLite COMMIT"),
    ("unique_bytes_ms", "unique_bytes after it"),
    ("unique_bytes_cpu_ms", "  its CPU"),
    ("unique_bytes_visited", "  objects it visited"),
    ("new_objects", "new objects"),
]


def table(results: list[dict[str, Any]]) -> str:
    cols = [(r["profile"], r["src"]) for r in results]
    lines = [
        "| ms | "
        + " | ".join(f"{p} ({os.path.basename(s.rstrip('/')) or s})" for p, s in cols)
        + " |",
        "| --- |" + " --: |" * len(cols),
    ]
    for which in ("step", "step2", "nochange"):
        lines.append(f"| **{which}** |" + " |" * len(cols))
        for key, label in PHASES:
            vals = [r[which].get(key, "-") for r in results]
            lines.append(f"| {label} | " + " | ".join(str(v) for v in vals) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="small,medium", help="comma-separated data sets")
    ap.add_argument(
        "--src",
        action="append",
        default=[],
        help="a directory holding the sprite_env package to measure (repeatable; default: "
        "this checkout)",
    )
    ap.add_argument("--work", default=os.path.join(HERE, ".data", "scratch-commit"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", nargs=2, metavar=("PROFILE", "WORK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    if not os.path.exists(MUTATE):
        sys.exit(f"{MUTATE} is missing (the ../shared/bench harness)")
    srcs = args.src or [REPO]
    results = []
    for profile in args.profile.split(","):
        if not os.path.isdir(os.path.join(_data_dir(), profile)):
            sys.exit(f"no data set {profile} under {_data_dir()} (see benchmarks/README.md)")
        for src in srcs:
            work = os.path.join(args.work, profile)
            os.makedirs(work, exist_ok=True)
            env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
            p = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--child", profile, work],
                env=env,
                check=True,
                stdout=subprocess.PIPE,
                text=True,
            )
            r = json.loads(p.stdout.strip().splitlines()[-1])
            r["src"] = os.path.relpath(os.path.abspath(src), REPO)
            r["load_after"] = os.getloadavg()[0]
            print(json.dumps(r), file=sys.stderr)
            results.append(r)
    print(table(results))
    out = args.out or os.path.join(
        HERE, "results", f"commit-{time.strftime('%Y-%m-%d', time.gmtime())}.json"
    )
    with open(out, "w") as f:
        json.dump({"runs": results, "host_cpus": os.cpu_count()}, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.relpath(out)}")


if __name__ == "__main__":
    main()
