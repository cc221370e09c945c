"""The checkpoint of one agent step, in process, two versions of sprite-env side by side (issue 11).

Usage::

    python benchmarks/bench_capture_step.py [--profile medium] [--rounds 4]
        [--base REV] [--new REV] [--only PATHS] [--base-native DIR] [--work DIR] [--fresh]
        [--pyspy | --pyspy-gil] [--out FILE]

Each version is extracted with ``git archive`` into ``--work``
(``benchmarks/.data/scratch-capture-step``) and run from there, in a worker process of its
own with the extension built in the working tree (or, for the base, the one found in
``--base-native``: a copy of the build before a change to native/): ``--new``
(default ``HEAD``), and the base: ``--new`` with the files of ``--only`` (default the
capture and the page digests) as at ``--base`` (default the commit before that work), or,
with ``--only ''``, all of ``--base``. Each worker holds an ``Engine`` and a ``Journal``
(fanotify, polled every 10 ms) on its own copy of the layer (``cp -a`` of
``$BENCH_DATA/<profile>``, kept between runs; ``--fresh`` copies again) and its own store
(new each run, so its first checkpoint v0 is a full walk that reads everything). A kept copy
that no longer has the layer's entries (the tree oracle's ``_tree.manifest`` without the
files' content: names, kinds, modes, owners, sizes, ns mtimes, symlink targets, devices,
xattrs; a run killed mid-round leaves its copy changed, and the undo of every round sets
all of them back) is copied again: two copies that drifted apart compare different work
(once, 1,326 files read by one version against 4,888 by the other, and a 0.66x that was
no speedup). Content is not hashed: 28 s a copy of medium.

Each round: ``../shared/bench/mutate.sh`` on both copies (the same change: 1% of the files
edited, ``rich`` installed in the venv, 2% more rows in the 215 MB SQLite database, a
directory deleted, a commit), ``sync``, then, timed and alternating which version goes
first, ``Engine.create`` on each: the whole checkpoint and its capture (``capture()``),
with the walk it took and how many files it read. Then, untimed, each worker restores v0
(the undo of the step; its undo checkpoint and the round's checkpoints are deleted, so the
next round's data are new to the store). Round 0 follows the first checkpoint; every
later round follows an undo, as in ``bench_step.py``.

``--base-no-journal`` runs the base without the change journal (every capture a full walk,
as ``--no-journal``): with ``--base`` and ``--new`` the same, the journal against the walk
it replaces. ``--pyspy`` records each timed checkpoint with ``py-spy record --idle`` (raw stacks in
``--work``) and prints the share of the worker's main thread in the functions that matter;
``--pyspy-gil`` records only the thread that holds the GIL (``py-spy --gil``) and prints
the seconds it was held in each function and by each thread: the profile of a capture whose
threads wait for the GIL more than for anything else.

Wall times move with the load of this shared machine (``os.getloadavg`` is printed with
each row): compare the two versions within a round, and their medians within one run.
Output: a markdown table on stdout, JSON in ``benchmarks/results/capture-step-<date>.json``.
"""

from __future__ import annotations

import argparse
import collections
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
sys.path.insert(0, HERE)
from _tree import manifest, tree_digest  # noqa: E402

#: The commit before the capture work of issue 11's helper B1 (sig_diff for lost
#: directories, page digests kept across an undo, big files read early).
BASE = "daeb656"
#: What the base takes from ``--base`` by default (the rest is ``--new``'s): the files of
#: that work, so that the comparison is of it alone while others change the tree.
ONLY = ("sprite_env/snapshot/capture.py", "sprite_env/snapshot/pagesums.py")
MUTATE = os.path.join(REPO, "..", "shared", "bench", "mutate.sh")
#: Functions whose share of the main thread ``--pyspy`` prints.
FRAMES = (
    "Capturer.run",
    "Capturer._dir_walk",
    "Future.result",
    "_Batches.results",
    "Capturer._start_group",
    "Capturer._prefetch",
    "Journal.begin",
    "StoreWriter.commit",
)


def _shape(root: str) -> str:
    """The tree oracle's digest of every entry under ``root`` but the files' content."""
    return tree_digest(manifest(root, content=False))


def _same_as(layer: str, source: str, digests: dict[str, str]) -> bool:
    """Whether the kept copy ``layer`` is whole and has ``source``'s entries (``_shape``;
    ``digests`` keeps the source's, computed once)."""
    if not os.path.exists(layer + ".complete"):
        return False
    if source not in digests:
        digests[source] = _shape(source)
    if _shape(layer) == digests[source]:
        return True
    log(f"{layer} differs from {source} (a run stopped mid-round?): copied again")
    return False


# -- the worker (runs the frozen sprite-env) ------------------------------------------------


def worker(layer: str, store: str, journal_on: bool = True) -> None:
    """Serves ``create`` / ``undo`` / ``quit`` lines on stdin, one JSON line each on stdout;
    without ``journal_on``, every capture is a full walk (``--no-journal``'s)."""
    from sprite_env.checkpoints import Engine
    from sprite_env.checkpoints import engine as engine_mod
    from sprite_env.journal import Journal
    from sprite_env.snapshot import capture as capture_mod

    out = sys.stdout
    sys.stdout = sys.stderr  # nothing else may write to the protocol
    times: list[float] = []
    made: list[Any] = []
    real_capture = engine_mod.capture

    def timed(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return real_capture(*a, **k)
        finally:
            times.append(time.perf_counter() - t)

    class Recorded(capture_mod.Capturer):  # type: ignore[misc,valid-type]
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            made.append(self)

    from sprite_env.store import writer as writer_mod

    writers: list[Any] = []
    real_init = writer_mod.StoreWriter.__init__

    def recorded_writer(self: Any, *a: Any, **k: Any) -> None:
        real_init(self, *a, **k)
        writers.append(self)

    writer_mod.StoreWriter.__init__ = recorded_writer  # type: ignore[method-assign]
    engine_mod.capture = timed
    capture_mod.Capturer = Recorded
    journal = Journal(layer) if journal_on else None
    stop = threading.Event()

    def poll() -> None:
        while journal is not None and not stop.wait(0.01):
            journal.poll()

    threading.Thread(target=poll, daemon=True).start()

    def reply(**kw: Any) -> None:
        out.write(json.dumps(kw) + "\n")
        out.flush()

    with Engine(layer, store) as e:
        e.journal = journal
        t = time.perf_counter()
        v0 = e.create("v0")
        first = time.perf_counter() - t
        e.create("base")  # the journal's first walk (full); what follows is journal-driven
        reply(ready=True, first_s=first, files=v0.files, pid=os.getpid())
        for line in sys.stdin:
            op = line.strip()
            if op == "create":
                times.clear()
                made.clear()
                writers.clear()
                load = os.getloadavg()[0]
                t = time.perf_counter()
                cp = e.create("step")
                total = time.perf_counter() - t
                c = made[-1]
                reply(
                    create_s=total,
                    capture_s=times[-1],
                    walk=cp.walk,
                    walk_reason=cp.walk_reason,
                    files_read=c.stats.files_read,
                    bytes_read=c.stats.bytes_read,
                    bytes_added=cp.bytes_added,
                    bytes_new=sum(w.stats.bytes_new for w in writers),
                    objects_new=sum(w.stats.objects_new for w in writers),
                    early=getattr(c, "early_taken", None),
                    load=load,
                )
            elif op == "undo":
                t = time.perf_counter()
                e.restore("v0")
                extra = [c.id for c in e.checkpoints(include_auto=True) if c.id != "v0"]
                e.delete_many(extra)
                reply(undo_s=time.perf_counter() - t)
            else:
                break
    stop.set()
    if journal is not None:
        journal.close()


# -- the driver ---------------------------------------------------------------------------


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _short(rev: str) -> str:
    return subprocess.run(
        ["git", "-C", REPO, "rev-parse", "--short", rev], capture_output=True, text=True, check=True
    ).stdout.strip()


def freeze(
    rev: str, dest: str, paths: tuple[str, ...] = (), paths_rev: str = "", native: str = ""
) -> str:
    """``sprite_env/`` as committed at ``rev`` (with ``paths`` as at ``paths_rev``) plus
    the extension built in ``native`` (default: the working tree's); returns what it is."""
    what = _short(rev)
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    archive = subprocess.run(
        ["git", "-C", REPO, "archive", rev, "sprite_env"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    for path in paths:
        old = subprocess.run(
            ["git", "-C", REPO, "show", f"{paths_rev}:{path}"], capture_output=True, check=True
        ).stdout
        with open(os.path.join(dest, path), "wb") as f:
            f.write(old)
    if paths:
        what += f" with {', '.join(os.path.basename(p) for p in paths)} of {_short(paths_rev)}"
    built = native or os.path.join(REPO, "sprite_env")
    for name in os.listdir(built):
        if name.endswith(".so"):
            shutil.copy2(os.path.join(built, name), os.path.join(dest, "sprite_env"))
    if native:
        what += f" (extension of {native})"
    return what


def mutate(root: str, data: str) -> float:
    t = time.perf_counter()
    p = subprocess.run(
        ["bash", MUTATE, root],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "BENCH_DATA": data},
    )
    if p.returncode != 0:
        raise RuntimeError(f"mutate.sh {root}: exit {p.returncode}: {p.stderr[-800:]}")
    return time.perf_counter() - t


class Worker:
    def __init__(self, name: str, src: str, layer: str, store: str, journal: bool = True) -> None:
        self.name = name
        shutil.rmtree(store, ignore_errors=True)
        env = {**os.environ, "PYTHONPATH": src}
        argv = [sys.executable, "-P", os.path.abspath(__file__), "--worker", layer, store]
        self.proc = subprocess.Popen(
            [*argv, *([] if journal else ["--worker-no-journal"])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.ready = self.ask(None)

    def ask(self, op: str | None) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        if op is not None:
            self.proc.stdin.write(op + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.name} exited ({self.proc.wait()})")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def pyspy_start(pid: int, path: str, gil: bool = False) -> subprocess.Popen[bytes] | None:
    exe = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(exe):
        return None
    argv = [exe, "record", "--pid", str(pid), "--rate", "500", "--nonblocking"]
    # --gil: only the thread holding the GIL, whichever it is (a capture bound by the GIL
    # spends its wall time in the sum of every thread's Python); else every thread, idle too
    argv.append("--gil" if gil else "--idle")
    p = subprocess.Popen(
        [*argv, "--format", "raw", "-o", path, "--threads"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # attached before the timed run starts
    return p


def pyspy_stop(p: subprocess.Popen[bytes] | None) -> None:
    if p is not None:
        time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        p.wait(timeout=60)


def _samples(path: str) -> list[tuple[str, float]]:
    """The stacks (frames joined by ``;``) of a raw py-spy recording at 500 Hz, each with
    its seconds."""
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            out.append((stack, int(n) / 500))
    return out


def gil_breakdown(path: str, top: int = 25) -> dict[str, float]:
    """Seconds the GIL was held in each function (self time, any thread) and by each
    thread, from a ``--gil`` recording: the ``top`` largest."""
    seconds: collections.Counter[str] = collections.Counter()
    for stack, t in _samples(path):
        frames = stack.split(";")
        # "thread (0x7f..): MainThread": its name (py-spy numbers threads by their id)
        seconds["thread " + frames[0].rpartition(": ")[2]] += t
        seconds[frames[-1]] += t
        seconds["total"] += t
    return {k: round(v, 3) for k, v in seconds.most_common(top)}


def breakdown(path: str) -> dict[str, float]:
    """Seconds of the worker's main thread spent in each of ``FRAMES`` (inclusive)."""
    seconds: collections.Counter[str] = collections.Counter()
    for stack, t in _samples(path):
        if "MainThread" not in stack.split(";", 1)[0] or "Engine.create" not in stack:
            continue
        seconds["Engine.create"] += t
        for frame in FRAMES:
            if f";{frame} (" in stack:
                seconds[frame] += t
    return {k: round(v, 3) for k, v in seconds.items()}


def table(rows: list[list[str]], head: list[str]) -> str:
    out = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="medium")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--base", default=BASE, help=f"the version compared with (default {BASE})")
    ap.add_argument("--new", default="HEAD")
    ap.add_argument(
        "--only",
        default=",".join(ONLY),
        help="the base is --new with only these files as at --base ('' for all of --base)",
    )
    ap.add_argument(
        "--base-native",
        default="",
        help="a directory holding the base's built extension (default: the working tree's)",
    )
    ap.add_argument("--work", default=os.path.join(HERE, ".data", "scratch-capture-step"))
    ap.add_argument("--fresh", action="store_true", help="copy the layers again")
    spy = ap.add_mutually_exclusive_group()
    spy.add_argument("--pyspy", action="store_true", help="record each timed checkpoint")
    spy.add_argument(
        "--pyspy-gil",
        action="store_true",
        help="record only the thread holding the GIL; print where it was held",
    )
    ap.add_argument("--out", help="JSON results file")
    ap.add_argument(
        "--base-no-journal",
        action="store_true",
        help="the base runs without the change journal (every capture a full walk)",
    )
    ap.add_argument("--worker", nargs=2, metavar=("LAYER", "STORE"), help=argparse.SUPPRESS)
    ap.add_argument("--worker-no-journal", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(*args.worker, journal_on=not args.worker_no_journal)
        return 0
    if os.geteuid() != 0:
        ap.error("needs root (fanotify)")
    data = os.environ.get("BENCH_DATA", os.path.join(HERE, ".data", "bench-data"))
    source = os.path.join(data, args.profile)
    os.makedirs(args.work, exist_ok=True)
    versions = {"base": args.base, "new": args.new}
    workers: dict[str, Worker] = {}
    commits: dict[str, str] = {}
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in versions}
    digests: dict[str, str] = {}
    try:
        for v, rev in versions.items():
            src = os.path.join(args.work, f"src-{v}")
            native = args.base_native if v == "base" else ""
            if v == "base" and args.only:
                commits[v] = freeze(args.new, src, tuple(args.only.split(",")), rev, native)
            else:
                commits[v] = freeze(rev, src, native=native)
            layer = os.path.join(args.work, f"layer-{v}")
            if args.fresh or not _same_as(layer, source, digests):
                shutil.rmtree(layer, ignore_errors=True)
                log(f"copying {source} to {layer} ...")
                subprocess.run(["cp", "-a", source, layer], check=True)
                open(layer + ".complete", "w").close()
            log(f"{v} ({commits[v]}): first checkpoint of {layer} ...")
            w = Worker(
                v,
                os.path.join(args.work, f"src-{v}"),
                layer,
                os.path.join(args.work, f"store-{v}"),
                journal=not (v == "base" and args.base_no_journal),
            )
            if v == "base" and args.base_no_journal:
                commits[v] += " --no-journal"
            workers[v] = w
            log(f"  {w.ready['files']} files, {w.ready['first_s']:.1f} s")
        for r in range(args.rounds):
            for v in versions:
                took = mutate(os.path.join(args.work, f"layer-{v}"), data)
                log(f"round {r}: mutate.sh on {v}: {took:.1f} s")
            os.sync()
            time.sleep(0.2)  # out of the racy window, as after an agent's step
            order = list(versions) if r % 2 == 0 else list(reversed(versions))
            for v in order:
                w = workers[v]
                prof = os.path.join(args.work, f"pyspy-{v}-{r}.txt")
                spy = (
                    pyspy_start(w.ready["pid"], prof, args.pyspy_gil)
                    if args.pyspy or args.pyspy_gil
                    else None
                )
                res = w.ask("create")
                pyspy_stop(spy)
                if args.pyspy_gil:
                    res["pyspy"] = gil_breakdown(prof)
                elif args.pyspy:
                    res["pyspy"] = breakdown(prof)
                results[v].append(res)
                log(
                    f"  {v}: create {res['create_s']:.3f} s, capture {res['capture_s']:.3f} s, "
                    f"walk {res['walk']} {res['walk_reason']!r}, {res['files_read']} files read, "
                    f"{res['objects_new']} objects of {res['bytes_new'] / 1e6:.1f} MB new, "
                    f"{res['bytes_added'] / 1e6:.1f} MB stored, "
                    f"load {res['load']:.1f}" + (f" {res.get('pyspy', '')}")
                )
            for v in versions:
                workers[v].ask("undo")
    finally:
        for w in workers.values():
            w.close()

    def med(v: str, key: str, rounds: slice) -> float | None:
        xs = [r[key] for r in results[v][rounds]]
        return statistics.median(xs) if xs else None

    rows = []
    for label, sl in (
        ("round 0 (after the first checkpoint)", slice(0, 1)),
        ("after an undo (rounds 1-)", slice(1, None)),
    ):
        for key in ("create_s", "capture_s"):
            b, n = med("base", key, sl), med("new", key, sl)
            if b is None or n is None:
                continue
            rows.append([f"{label}: {key[:-2]}", f"{b:.3f}", f"{n:.3f}", f"{n / b:.2f}x"])
    print(
        table(
            rows,
            [
                "the checkpoint of one step (s, median)",
                f"base {commits['base']}",
                f"new {commits['new']}",
                "new / base",
            ],
        )
    )
    sys.path.insert(0, HERE)
    from _peers import write_results

    path = write_results(
        "capture-step",
        {"profile": args.profile, "commits": commits, "rounds": args.rounds, "runs": results},
        args.out,
    )
    log(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
