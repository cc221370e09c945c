"""Ingest throughput of sprite-env on a real tree, side by side with tar|zstd and b3sum.

Usage::

    python benchmarks/bench_ingest.py [--tree DIR] [--reps 3] [--warm] [--second]
                                      [--profile] [--no-breakdown] [--scratch DIR] [--out FILE]

What is timed, each as a child process measured the same way (wall, and user+sys CPU from
``RUSAGE_CHILDREN``; see ``_peers.py``), alternating the tools within each round:

- **sprite-env ingest**: ``python benchmarks/bench_ingest.py _ingest TREE STORE``: walk
  the tree, ``store_file`` every regular file (chunk with ``Chunker()``, BLAKE3, zstd-3,
  pack) into a fresh store (``open_store(create=True)``), then ``writer.commit()``. The
  wall time includes starting Python and importing sprite-env (the child reports its
  in-process time too); packs and the catalog are fsync'd, as in real use.
- **sprite-env 2nd ingest** (``--second``): the same into the store the first ingest just
  filled: every file is read, chunked and hashed again, every chunk is found in the
  catalog, nothing is written.
- **tar | zstd -3 -T0**: ``tar -C TREE -cf - . | zstd -3 -T0 -q -o OUT`` (not fsync'd).
- **b3sum**: ``find TREE -type f -print0 | xargs -0 b3sum > /dev/null`` (if there is no
  b3sum binary: BLAKE3 from the python ``blake3`` package, ``max_threads=AUTO``).

Before each timed run the page cache is dropped when running as root (``--warm``: don't);
each first ingest writes into an empty store. Then, in-process and for information, the
single-threaded stages on the tree's bytes held in memory (chunker, BLAKE3 per chunk,
zstd per chunk) show where the time goes. The table goes to stdout and, as JSON, to
``benchmarks/results/ingest-<date>[-warm].json``.

Default tree: a real virtual environment (numpy, pandas, requests, rich, Django from
PyPI) built once under ``benchmarks/.data/``; without network, the running
interpreter's standard library directory, used in place.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, ".data")
VENV = os.path.join(DATA, "venv")
VENV_OK = os.path.join(DATA, "venv.ok")
PACKAGES = ["numpy", "pandas", "requests", "rich", "Django"]

sys.path.insert(0, HERE)
from _peers import (  # noqa: E402
    SUMMARY_HEADERS,
    Summary,
    Tool,
    drop_caches,
    markdown_table,
    path_bytes,
    ratio,
    run_rounds,
    shell,
    summarize,
    summary_cells,
    today,
    write_results,
)

# -- the tree -----------------------------------------------------------------------------


def walk_files(tree: str) -> list[str]:
    """Paths of the regular files under ``tree`` (symlinks not followed), in walk order."""
    out: list[str] = []
    stack = [tree]
    while stack:
        d = stack.pop()
        with os.scandir(d) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    out.append(e.path)
    return out


def describe_tree(tree: str) -> dict[str, int]:
    files = dirs = links = other = nbytes = 0
    for root, dnames, fnames in os.walk(tree):
        dlinks = [d for d in dnames if os.path.islink(os.path.join(root, d))]
        dirs += len(dnames) - len(dlinks)
        for name in fnames + dlinks:
            st = os.lstat(os.path.join(root, name))
            kind = st.st_mode & 0o170000
            if kind == 0o100000:
                files += 1
                nbytes += st.st_size
            elif kind == 0o120000:
                links += 1
            else:
                other += 1
    return {"files": files, "bytes": nbytes, "dirs": dirs, "symlinks": links, "other": other}


def default_tree() -> tuple[str, str]:
    """Returns (path, description) of the default tree, building the venv if needed."""
    if not os.path.exists(VENV_OK):
        os.makedirs(DATA, exist_ok=True)
        shutil.rmtree(VENV, ignore_errors=True)
        python = shutil.which("python3") or sys.executable
        pip = os.path.join(VENV, "bin", "pip")
        print(
            f"building the default tree: {python} -m venv {VENV} && pip install "
            + " ".join(PACKAGES),
            file=sys.stderr,
        )
        try:
            subprocess.run([python, "-m", "venv", VENV], check=True)
            subprocess.run(
                [pip, "install", "-q", "--disable-pip-version-check", *PACKAGES], check=True
            )
            freeze = subprocess.run(
                [pip, "freeze", "--disable-pip-version-check"],
                check=True,
                stdout=subprocess.PIPE,
                text=True,
            ).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            shutil.rmtree(VENV, ignore_errors=True)
            stdlib = sysconfig.get_paths()["stdlib"]
            print(
                f"building the venv failed ({e}); no network? FALLING BACK to the standard "
                f"library directory, used in place: {stdlib}",
                file=sys.stderr,
            )
            version = sys.version.split()[0]
            return stdlib, f"fallback: stdlib of Python {version} (pip install failed)"
        with open(VENV_OK, "w") as f:
            f.write(freeze)
    with open(VENV_OK) as f:
        frozen = " ".join(f.read().split())
    return VENV, f"venv: {frozen}"


# -- child processes ----------------------------------------------------------------------


def ingest(tree: str, store_dir: str) -> dict[str, Any]:
    """The sprite-env ingest: every regular file of ``tree`` into the store at ``store_dir``."""
    t0 = time.perf_counter()
    from sprite_env.snapshot.filedata import store_file
    from sprite_env.store import open_store
    from sprite_env.store.chunker import NATIVE, Chunker

    t1 = time.perf_counter()
    main_cpu0 = time.thread_time()
    chunker = Chunker()
    files = nbytes = chunks = holes = 0
    with open_store(store_dir, create=True) as store, store.writer() as writer:
        for path in walk_files(tree):
            refs = store_file(path, writer, chunker)
            files += 1
            chunks += len(refs)
            holes += sum(1 for r in refs if r.oid is None)
            nbytes += sum(r.length for r in refs)
        t2 = time.perf_counter()
        writer.commit()
        st = writer.stats
    t3 = time.perf_counter()
    main_cpu = time.thread_time() - main_cpu0
    return {
        "native_chunker": NATIVE,
        "files": files,
        "bytes": nbytes,
        "chunks": chunks,
        "holes": holes,
        "objects_new": st.objects_new,
        "bytes_new": st.bytes_new,
        "bytes_stored": st.bytes_stored,
        "packs_written": st.packs_written,
        "import_s": t1 - t0,
        "walk_put_s": t2 - t1,
        "commit_s": t3 - t2,
        "in_process_s": t3 - t1,
        "main_thread_cpu_s": main_cpu,  # the rest of the process's CPU is the encode workers
    }


def b3py(tree: str) -> dict[str, Any]:
    """BLAKE3 of every regular file with the python package (fallback for b3sum)."""
    from blake3 import blake3

    n = 0
    for path in walk_files(tree):
        h = blake3(max_threads=blake3.AUTO)
        if os.path.getsize(path):
            h.update_mmap(path)
        h.digest()
        n += 1
    return {"files": n}


CHILD_MODES: dict[str, Callable[..., dict[str, Any]]] = {"_ingest": ingest, "_b3py": b3py}


def child_main(mode: str, args: list[str]) -> int:
    json.dump(CHILD_MODES[mode](*args), sys.stdout)
    return 0


# -- in-process breakdown -----------------------------------------------------------------


def _timed(fn: Callable[[], T], reps: int) -> tuple[float, float, T]:
    """Median wall and CPU (this process) seconds of ``reps`` calls; and the last result."""
    walls: list[float] = []
    cpus: list[float] = []
    for _ in range(reps):
        c0, w0 = time.process_time(), time.perf_counter()
        result = fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus), result


def breakdown(tree: str, reps: int, cold: bool) -> list[dict[str, Any]]:
    """Times each single-threaded stage of the ingest on the tree's bytes, in memory."""
    from blake3 import blake3

    from sprite_env.snapshot.filedata import is_zero
    from sprite_env.store import codec
    from sprite_env.store.chunker import Chunker

    chunker = Chunker()
    paths = walk_files(tree)
    if cold:
        drop_caches()

    def read_all() -> list[bytes]:
        out = []
        for p in paths:
            with open(p, "rb", buffering=0) as f:
                out.append(f.read())
        return out

    c0, w0 = time.process_time(), time.perf_counter()
    blobs = read_all()
    read_wall, read_cpu = time.perf_counter() - w0, time.process_time() - c0
    total = sum(map(len, blobs))

    def chunk_per_file() -> list[memoryview]:
        out: list[memoryview] = []
        for b in blobs:
            out.extend(chunker.chunks_of_bytes(b))
        return out

    rows: list[dict[str, Any]] = []

    def row(stage: str, wall: float, cpu: float, note: str = "") -> None:
        rows.append(
            {
                "stage": stage,
                "wall_s": wall,
                "cpu_s": cpu,
                "mb_per_s": total / wall / 1e6 if wall else float("inf"),
                "note": note,
            }
        )

    row(
        "read every file (cold)" if cold else "read every file (warm)",
        read_wall,
        read_cpu,
        f"{len(blobs)} files, one read() each",
    )
    wall, cpu, chunks = _timed(chunk_per_file, reps)
    row("chunker (native FastCDC), per file", wall, cpu, f"{len(chunks)} chunks")
    joined = b"".join(blobs)
    wall, cpu, cuts = _timed(lambda: chunker.cut_points(joined, True), reps)
    row("chunker, files concatenated", wall, cpu, f"{len(cuts)} chunks")
    joined = b""
    wall, cpu, _ = _timed(lambda: [is_zero(c) or bytes(c) for c in chunks], reps)
    row("is_zero + bytes() copy per chunk", wall, cpu, "store_fd's per-chunk Python work")
    wall, cpu, _ = _timed(lambda: [blake3(c).digest() for c in chunks], reps)
    row("BLAKE3 per chunk, 1 thread", wall, cpu, "codec.object_id, on the caller's thread")
    wall, cpu, enc = _timed(lambda: [codec.encode(c)[1] for c in chunks], reps)
    stored = sum(map(len, enc))
    row(
        "zstd -3 per chunk, 1 thread",
        wall,
        cpu,
        f"codec.encode -> {stored / 1e6:,.1f} MB (the writer runs it on every core)",
    )
    return rows


def profile(tree: str, scratch: str, cold: bool, top: int = 25) -> list[dict[str, Any]]:
    """Runs one ingest under cProfile (main thread only) and prints the top functions."""
    import cProfile
    import pstats

    store = os.path.join(scratch, "profile-store")
    shutil.rmtree(store, ignore_errors=True)
    if cold:
        drop_caches()
    prof = cProfile.Profile()
    prof.enable()
    ingest(tree, store)
    prof.disable()
    shutil.rmtree(store, ignore_errors=True)
    st = pstats.Stats(prof)
    print("\n## cProfile of one ingest (main thread; compression runs on worker threads)\n")
    print("```")
    st.sort_stats("cumulative").print_stats(top)
    st.sort_stats("tottime").print_stats(top)
    print("```")
    rows = []
    for (fname, line, func), (_cc, ncalls, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        rows.append(
            {
                "function": f"{os.path.basename(fname)}:{line}({func})",
                "ncalls": ncalls,
                "tottime": tt,
                "cumtime": ct,
            }
        )
    rows.sort(key=lambda r: r["tottime"], reverse=True)
    return rows[:top]


# -- main ---------------------------------------------------------------------------------


def _shown_path(path: str) -> str:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    full = os.path.abspath(path)
    return os.path.relpath(full, repo) if full.startswith(repo + os.sep) else full


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in CHILD_MODES:
        return child_main(sys.argv[1], sys.argv[2:])
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tree", help="tree to ingest (default: the benchmark venv)")
    parser.add_argument("--reps", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--warm", action="store_true", help="do not drop the page cache")
    parser.add_argument(
        "--second",
        action="store_true",
        help="also time a no-change second ingest into the same store",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile one ingest")
    parser.add_argument(
        "--no-breakdown", action="store_true", help="skip the in-process stage breakdown"
    )
    parser.add_argument(
        "--scratch",
        default=os.path.join(DATA, "scratch"),
        help="where stores and archives are written (default benchmarks/.data/"
        "scratch; emptied first)",
    )
    parser.add_argument("--out", help="JSON path (default benchmarks/results/ingest-<date>.json)")
    args = parser.parse_args()
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    cold = not args.warm
    if cold and os.geteuid() != 0:
        print("warning: not root, cannot drop the page cache: all runs are warm", file=sys.stderr)
        cold = False

    if args.tree:
        tree, tree_note = os.path.abspath(args.tree), "given with --tree"
    else:
        tree, tree_note = default_tree()
    info = describe_tree(tree)
    nbytes = info["bytes"]
    print(f"tree: {tree} ({tree_note})")
    print(
        f"      {info['files']:,} regular files, {nbytes / 1e6:,.1f} MB "
        f"({nbytes / 2**20:,.1f} MiB), {info['dirs']:,} dirs, {info['symlinks']:,} symlinks"
    )

    scratch = os.path.abspath(args.scratch)
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    store = os.path.join(scratch, "store")
    tarzst = os.path.join(scratch, "tree.tar.zst")
    me = os.path.abspath(__file__)
    py = sys.executable

    def fresh_store() -> None:
        shutil.rmtree(store, ignore_errors=True)

    def parse_json(out: str) -> dict[str, Any]:
        return dict(json.loads(out))

    tools = [
        Tool(
            "sprite-env ingest",
            lambda: [py, me, "_ingest", tree, store],
            prepare=fresh_store,
            output_bytes=lambda: path_bytes(store),
            parse=parse_json,
        ),
    ]
    if args.second:
        before: list[int] = [0]

        def filled_store() -> None:
            if not os.path.exists(os.path.join(store, "sprite-store.json")):
                subprocess.run(
                    [py, me, "_ingest", tree, store], check=True, stdout=subprocess.DEVNULL
                )
            before[0] = path_bytes(store)

        tools.append(
            Tool(
                "sprite-env 2nd ingest",
                lambda: [py, me, "_ingest", tree, store],
                prepare=filled_store,
                output_bytes=lambda: path_bytes(store) - before[0],
                parse=parse_json,
            )
        )
    tools.append(
        Tool(
            "tar | zstd -3 -T0",
            lambda: shell(
                f"tar -C {shlex.quote(tree)} -cf - . | zstd -3 -T0 -q -o {shlex.quote(tarzst)}"
            ),
            prepare=lambda: _unlink(tarzst),
            output_bytes=lambda: path_bytes(tarzst),
        )
    )
    b3sum = shutil.which("b3sum")
    if b3sum:
        tools.append(
            Tool(
                "b3sum (all files)",
                lambda: shell(
                    f"find {shlex.quote(tree)} -type f -print0 | xargs -0 {shlex.quote(b3sum)} "
                    "> /dev/null"
                ),
            )
        )
    else:
        tools.append(Tool("blake3-py AUTO (no b3sum)", lambda: [py, me, "_b3py", tree]))

    load0 = os.getloadavg()
    print(
        f"\n{args.reps} rounds of {len(tools)} tools, "
        f"{'cold (page cache dropped before each run)' if cold else 'warm'}; "
        f"scratch {scratch}",
        file=sys.stderr,
    )
    samples = run_rounds(
        tools, args.reps, cold=cold, log=lambda s: print("  " + s, file=sys.stderr)
    )
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)

    sums = [summarize(t.name, samples[t.name], nbytes) for t in tools]
    by = {s.name: s for s in sums}
    sprite = by["sprite-env ingest"]
    date = today()
    print(
        f"\n## Ingest, {date}: {info['files']:,} files, {nbytes / 1e6:,.1f} MB, "
        f"{'cold' if cold else 'warm'} cache, {args.reps} runs, "
        f"{os.cpu_count()} CPUs, load average {load0[0]:.1f} before / "
        f"{os.getloadavg()[0]:.1f} after\n"
    )
    print(markdown_table(SUMMARY_HEADERS, [summary_cells(s) for s in sums]))

    ratio_rows = []
    for s in sums:
        if s.name.startswith("sprite-env"):
            continue
        size = ratio(sprite.output_bytes, s.output_bytes) if s.output_bytes else "-"
        ratio_rows.append(
            [
                s.name,
                ratio(sprite.mb_per_s, s.mb_per_s),
                ratio(sprite.cpu_median, s.cpu_median),
                size,
            ]
        )
    print(
        "\nsprite-env ingest relative to each (throughput > 1: sprite-env faster; "
        "CPU and size < 1: sprite-env uses less):\n"
    )
    print(markdown_table(["vs", "throughput", "CPU s", "output size"], ratio_rows))

    child = samples["sprite-env ingest"][-1].extra
    ins = statistics.median(s.extra["in_process_s"] for s in samples["sprite-env ingest"])
    print(
        f"\nsprite-env ingest detail (last run): {child['chunks']:,} chunks "
        f"({child['holes']} holes), {child['objects_new']:,} new objects, "
        f"{child['bytes_stored'] / 1e6:,.1f} MB payload in {child['packs_written']} packs, "
        f"store on disk {sprite.output_bytes / 1e6 if sprite.output_bytes else 0:,.1f} MB; "
        f"in-process time {ins:.2f} s median ({nbytes / ins / 1e6:,.1f} MB/s; the rest is "
        f"interpreter start + imports ~{child['import_s']:.2f} s), commit "
        f"{child['commit_s']:.2f} s; main thread CPU {child['main_thread_cpu_s']:.2f} s "
        "(walk, read, chunk, hash, lookups), the rest of the CPU on the zstd workers"
    )

    stages: list[dict[str, Any]] = []
    if not args.no_breakdown:
        stages = breakdown(tree, args.reps, cold)
        print(
            "\n## Where the time goes: single-threaded stages, in process, on the same "
            "bytes in memory\n"
        )
        print(
            markdown_table(
                ["stage", "wall s", "MB/s", "CPU s", "note"],
                [
                    [
                        r["stage"],
                        f"{r['wall_s']:.2f}",
                        f"{r['mb_per_s']:,.0f}",
                        f"{r['cpu_s']:.2f}",
                        r["note"],
                    ]
                    for r in stages
                ],
                align="lrrrl",
            )
        )

    prof: list[dict[str, Any]] = []
    if args.profile:
        prof = profile(tree, scratch, cold)
    shutil.rmtree(scratch, ignore_errors=True)

    payload = {
        "benchmark": "ingest",
        # relative to the repository when inside it: results must not name this machine
        "tree": {"path": _shown_path(tree), "note": tree_note, **info},
        "cold": cold,
        "reps": args.reps,
        "loadavg_at_start": load0,
        "tools": [{**_summary_dict(s), "samples": samples[s.name]} for s in sums],
        "ratios_sprite_env_over_peer": {
            s.name: {
                "throughput": sprite.mb_per_s / s.mb_per_s,
                "cpu": sprite.cpu_median / s.cpu_median if s.cpu_median else None,
                "size": (
                    sprite.output_bytes / s.output_bytes
                    if sprite.output_bytes and s.output_bytes
                    else None
                ),
            }
            for s in sums
            if not s.name.startswith("sprite-env")
        },
        "breakdown": stages,
        "profile_top_tottime": prof,
    }
    path = write_results("ingest", payload, args.out, suffix="" if cold else "-warm")
    print(f"\nresults: {os.path.relpath(path)}")
    return 0


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _summary_dict(s: Summary) -> dict[str, Any]:
    return {
        "name": s.name,
        "runs": s.runs,
        "wall_median_s": s.wall_median,
        "wall_min_s": s.wall_min,
        "wall_max_s": s.wall_max,
        "mb_per_s": s.mb_per_s,
        "cpu_median_s": s.cpu_median,
        "cores": s.cores,
        "output_bytes": s.output_bytes,
        "input_bytes": s.input_bytes,
    }


if __name__ == "__main__":
    sys.exit(main())
