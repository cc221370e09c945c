"""Reading a checkpoint through the FUSE view, side by side with restic mount and borg mount.

Usage::

    python benchmarks/bench_fuse.py [--reps 3] [--mib 256] [--layer DIR] [--work DIR]
                                    [--tools sprite-env,restic,borg,disk]
                                    [--workloads seq,random,diff,diffwarm] [--reuse]
                                    [--baseline REV] [--freeze] [--out FILE]

The same data is put in each tool once (untimed): a 256 MiB file (half random bytes, half
text lines; ``--mib``) and a realistic developer layer: the small layer of
``../shared/bench/make_dataset.sh`` (``$BENCH_DATA/small``, default
``benchmarks/.data/bench-data/small``: 27,026 files, 5,577 directories) when it is built,
as the other benchmarks use it, else ``benchmarks/layer.py``'s profile ``small`` (a venv,
node_modules, a git project, a SQLite database); ``--layer DIR`` for another tree. Then,
for each workload, the tools take turns (ABC ABC ABC), each run starting cold: the tool's
mount is started afresh (untimed, so no in-process cache survives) and the page cache is
dropped (as root). Workloads:

- **seq**: ``cat FILE > /dev/null`` of the 256 MiB file.
- **random**: 2,000 ``pread`` of 64 KiB at random offsets of that file (one seed, so every
  tool reads the same ranges), by a child Python process.
- **diff -r**: ``diff -r --no-dereference SNAPSHOT/layer LIVE/layer`` (the live copy is on
  disk, dropped from the cache too): what ``diff -r /.sprite/checkpoints/v3/etc /etc``
  does, over a whole layer.
- **diff -r warm** (``diffwarm``): the same ``diff -r`` run twice in a row on a fresh mount,
  the second one timed, nothing dropped: what the kernel's caches save (the disk's row is
  two warm disk copies). A warm sample is only warm if nothing dropped the caches between
  the two: on a shared machine another process's ``echo 3 > /proc/sys/vm/drop_caches`` (a
  cold benchmark) empties the kernel's dentries, inodes and pages of every mount, and the
  "warm" ``diff -r`` is a cold one. Such a drop shows in ``/proc/vmstat``
  (``drop_pagecache``, ``drop_slab``): the pair is run again (up to ``WARM_TRIES`` times),
  and each sample says how many drops it met (``cache_drops``, 0 for a clean one) and its
  ``attempts``.

Tools: **sprite-env**, the standalone ``sprite-env checkpoints mount`` (read-only store,
its own process, as a user runs it); **restic mount** and **borg mount -f** (repository on
the same disk; borg with ``zstd,3`` and no encryption, restic with its defaults: zstd
"auto" and AES encryption); **disk**: the files themselves, cold (for
``diff -r``, a second on-disk copy against the live one). Wall time is around the reader
process; "server CPU" is the mount process's user+sys time during the run (from
``/proc/PID/stat``), which ``RUSAGE_CHILDREN`` of the reader does not see.

``--baseline REV`` also times sprite-env as committed at REV (``git archive`` into the work
directory), as a tool of its own, so a change is measured against its parent in one run;
``--freeze`` times a copy of the working tree taken at the start rather than the working
tree itself (others may be editing it). ``--reuse`` keeps the data and repositories of the
previous run when they hold the same data and every tool asked for.

Output: markdown tables on stdout; JSON in ``benchmarks/results/fuse-<date>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from _peers import Sample

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DATA = os.path.join(HERE, ".data")
sys.path.insert(0, HERE)
from _peers import (  # noqa: E402
    Tool,
    machine_info,
    markdown_table,
    ratio,
    run_rounds,
    run_timed,
    shell,
    summarize,
    tree_bytes,
    write_results,
)

BIG = "big.bin"
LAYER = "layer"
RANDOM_READS = 2000
RANDOM_SIZE = 64 << 10
#: Times a warm pair (fill, timed) is run when the caches were dropped meanwhile.
WARM_TRIES = 4
CLK_TCK = os.sysconf("SC_CLK_TCK")


def q(s: str) -> str:
    return shlex.quote(s)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None) -> str:
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


# -- the data -------------------------------------------------------------------------------


def make_big_file(path: str, mib: int) -> None:
    """Half random bytes (incompressible: stored raw), half text lines (zstd ~2.2x)."""
    rng = random.Random(256)
    words = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randrange(2, 11)))
        for _ in range(20_000)
    ]
    half = (mib << 20) // 2
    with open(path, "wb") as f:
        for _ in range(half >> 20):
            f.write(rng.randbytes(1 << 20))
        written = 0
        while written < half:
            lines = []
            for n in range(2000):
                line = f"{n:6d} " + " ".join(rng.choice(words) for _ in range(10)) + "\n"
                lines.append(line)
            block = "".join(lines).encode()[: half - written]
            f.write(block)
            written += len(block)


def pick_layer(given: str | None) -> str:
    if given:
        return os.path.abspath(given)
    # the small layer of ../shared/bench (make_dataset.sh), as the other benchmarks use:
    # $BENCH_DATA/small, else benchmarks/.data/bench-data/small
    shared = os.path.join(os.environ.get("BENCH_DATA", os.path.join(DATA, "bench-data")), "small")
    if os.path.isdir(shared):
        return os.path.abspath(shared)
    try:
        import layer  # benchmarks/layer.py: the realistic layer, cached under .data/

        path, _info = layer.pristine("small", log)
        return path
    except Exception as e:  # no network for the first build: a tree that is here anyway
        import sysconfig

        stdlib = sysconfig.get_paths()["stdlib"]
        log(f"cannot build the benchmark layer ({e}); using {stdlib}")
        return stdlib


# -- the mounts -----------------------------------------------------------------------------


def cache_drops() -> int:
    """How many times anyone dropped the kernel's caches since boot (``/proc/vmstat``)."""
    with open("/proc/vmstat") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith("drop_"))


def proc_cpu(pid: int) -> float:
    """User + system seconds of a process (all its threads) so far."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def is_mountpoint(path: str) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def find_root(top: str, marker: str) -> str:
    """The directory under ``top`` that holds ``marker`` (restic keeps absolute paths)."""
    for depth in range(8):
        hits = glob.glob(os.path.join(top, *["*"] * depth, marker))
        if hits:
            return os.path.dirname(hits[0])
    raise RuntimeError(f"no {marker} under {top}")


@dataclass
class Mount:
    """A tool's view of the data: (re)started before each timed run."""

    name: str
    mountpoint: str
    root: str = ""  # where BIG and LAYER are, once mounted
    pid: int = 0
    cpu_before: float = 0.0
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        if is_mountpoint(self.mountpoint):
            subprocess.run(["fusermount3", "-u", self.mountpoint], check=False)
            with contextlib.suppress(subprocess.SubprocessError):
                wait_for(lambda: not is_mountpoint(self.mountpoint), "unmount", 30)
        if self.pid:
            with contextlib.suppress(ChildProcessError, ProcessLookupError):
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    done, _status = os.waitpid(self.pid, os.WNOHANG)
                    if done:
                        break
                    time.sleep(0.05)
                else:
                    os.kill(self.pid, 9)
            self.pid = 0

    def restart(self) -> None:
        self.stop()
        self.start()
        self.cpu_before = proc_cpu(self.pid)

    def server_cpu(self) -> float:
        return proc_cpu(self.pid) - self.cpu_before if self.pid else 0.0

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel)


class SpriteMount(Mount):
    def __init__(
        self, mountpoint: str, data: str, store: str, name: str = "sprite-env", src: str = ""
    ) -> None:
        super().__init__(name, mountpoint)
        self.data, self.store = data, store
        self.argv = [sys.executable, "-m", "sprite_env"]
        # src: the copy of the package there (see --baseline), not the working tree's; run
        # from there, as the command starts its server with "python -m sprite_env" too
        self.cwd = src or REPO
        if src:
            self.env["PYTHONPATH"] = src

    def start(self) -> None:
        out = run(
            [
                *self.argv,
                "--root",
                self.data,
                "--store",
                self.store,
                "--json",
                "checkpoints",
                "mount",
                self.mountpoint,
            ],
            cwd=self.cwd,
            env=self.env,
        )
        info = json.loads(out)
        self.pid = int(info["pid"])
        self.root = os.path.join(self.mountpoint, info["shown"][0])

    def stop(self) -> None:
        if is_mountpoint(self.mountpoint):
            run([*self.argv, "checkpoints", "unmount", self.mountpoint], cwd=self.cwd, env=self.env)
        if self.pid:  # not our child (it runs in its own session): wait for it to exit
            with contextlib.suppress(RuntimeError):
                wait_for(lambda: not os.path.exists(f"/proc/{self.pid}"), "exit", 30)
            self.pid = 0


class PopenMount(Mount):
    """A peer's mount command that stays in the foreground until unmounted."""

    argv: list[str]

    def start(self) -> None:
        proc = subprocess.Popen(
            self.argv, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.pid = proc.pid
        wait_for(lambda: is_mountpoint(self.mountpoint), f"{self.name} to mount")
        self.root = find_root(self.top(), BIG)

    def top(self) -> str:
        return self.mountpoint


class ResticMount(PopenMount):
    def __init__(self, mountpoint: str, repo: str, cache: str) -> None:
        super().__init__("restic mount", mountpoint)
        self.env.update(RESTIC_PASSWORD="bench", RESTIC_CACHE_DIR=cache)
        self.argv = ["restic", "-r", repo, "mount", mountpoint]

    def top(self) -> str:
        latest = os.path.join(self.mountpoint, "snapshots", "latest")
        wait_for(lambda: os.path.isdir(latest), "restic's snapshots/latest")
        return latest


class BorgMount(PopenMount):
    def __init__(self, mountpoint: str, repo: str, base: str) -> None:
        super().__init__("borg mount", mountpoint)
        self.env.update(BORG_BASE_DIR=base, BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK="yes")
        self.argv = ["borg", "mount", "-f", f"{repo}::snap", mountpoint]


class Disk(Mount):
    def __init__(self, data: str) -> None:
        super().__init__("disk (cold)", data, root=data)

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


# -- the workloads --------------------------------------------------------------------------


def random_reads(path: str, count: int, size: int, seed: int) -> int:
    """``count`` preads of ``size`` bytes at random offsets; returns the bytes read."""
    rng = random.Random(seed)
    fd = os.open(path, os.O_RDONLY)
    try:
        end = os.fstat(fd).st_size - size
        return sum(len(os.pread(fd, size, rng.randrange(0, end))) for _ in range(count))
    finally:
        os.close(fd)


def run_warm_rounds(
    tools: list[Tool], reps: int, log: Callable[[str], None]
) -> dict[str, list[Sample]]:
    """:func:`run_rounds` for the warm workload: each tool's pair (``prepare``: restart and
    the filling run; then the timed one) is run again while someone dropped the caches
    during it (see the module docstring), up to :data:`WARM_TRIES` times."""
    samples: dict[str, list[Sample]] = {t.name: [] for t in tools}
    for rnd in range(reps):
        for tool in tools:
            for attempt in range(1, WARM_TRIES + 1):
                before = cache_drops()
                assert tool.prepare is not None
                tool.prepare()
                sample, out = run_timed(tool.argv())
                drops = cache_drops() - before
                if drops == 0 or attempt == WARM_TRIES:
                    break
                log(f"{tool.name}: the caches were dropped during the warm pair; again")
            sample.extra = {
                **(tool.parse(out) if tool.parse else {}),
                "cache_drops": drops,
                "attempts": attempt,
            }
            samples[tool.name].append(sample)
            log(
                f"round {rnd + 1}/{reps}  {tool.name:<28} {sample.wall:8.2f} s wall"
                f"  {sample.cpu:8.2f} s CPU  (warm; {drops} cache drops)"
            )
    return samples


def timed_tools(workload: str, mounts: list[Mount], live_layer: str, disk_copy: str) -> list[Tool]:
    tools = []
    warm = workload == "diffwarm"
    for m in mounts:

        def argv(m: Mount = m) -> list[str]:
            if workload == "seq":
                return shell(f"cat {q(m.path(BIG))} > /dev/null")
            if workload == "random":
                return [
                    sys.executable,
                    __file__,
                    "_random",
                    m.path(BIG),
                    str(RANDOM_READS),
                    str(RANDOM_SIZE),
                ]
            snapshot = os.path.join(disk_copy, LAYER) if isinstance(m, Disk) else m.path(LAYER)
            # prints how many lines diff wrote: 0 unless the tool shows other bytes
            return shell(
                f"{{ diff -r --no-dereference {q(snapshot)} {q(live_layer)} || [ $? -eq 1 ]; }}"
                " | wc -l"
            )

        def parse(out: str, m: Mount = m) -> dict[str, Any]:
            extra: dict[str, Any] = {"server_cpu": m.server_cpu()}
            if workload in ("diff", "diffwarm"):
                extra["diff_lines"] = int(out.strip() or 0)
            return extra

        def prepare(m: Mount = m, argv: Callable[[], list[str]] = argv) -> None:
            m.restart()
            if warm:  # the first diff -r, untimed: it fills the caches the timed one uses
                subprocess.run(argv(), stdout=subprocess.DEVNULL, check=True)
                m.cpu_before = proc_cpu(m.pid)

        name = "disk (warm)" if warm and isinstance(m, Disk) else m.name
        tools.append(Tool(name, argv, prepare=prepare, parse=parse))
    return tools


# -- main ---------------------------------------------------------------------------------


def frozen_copy(rev: str | None, dest: str) -> str:
    """``sprite_env/`` as committed at ``rev`` (``git archive``), or as it is in the working
    tree (``rev`` None), plus the extension built in the working tree, copied to ``dest``;
    returns the directory to put on ``PYTHONPATH``. The working tree is shared: a copy is
    not changed half-way through the run by someone's edit."""
    subprocess.run(["rm", "-rf", dest], check=True)
    os.makedirs(dest)
    here = os.path.join(REPO, "sprite_env")
    if rev is None:
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(here, os.path.join(dest, "sprite_env"), ignore=ignore)
        return dest
    archive = subprocess.run(
        ["git", "-C", REPO, "archive", rev, "sprite_env"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    for name in os.listdir(here):
        if name.endswith(".so"):  # the built chunker (not in git)
            shutil.copy2(os.path.join(here, name), os.path.join(dest, "sprite_env"))
    return dest


def prepare_tools(
    work: str,
    data: str,
    wanted: set[str],
    setup: dict[str, float],
    reuse: bool,
    baseline: str | None = None,
    freeze: bool = False,
) -> list[Mount]:
    """Puts ``data`` in each tool (unless ``reuse``) and returns their mounts."""
    mounts: list[Mount] = []
    if "sprite-env" in wanted:
        store = os.path.join(work, "sprite-store")
        if not reuse:
            t = time.perf_counter()
            where = ["--root", data, "--store", store]
            if not os.path.exists(store):  # offline, only store init creates one (issue 10)
                run([sys.executable, "-m", "sprite_env", *where, "store", "init"], cwd=REPO)
            run([sys.executable, "-m", "sprite_env", *where, "checkpoints", "create"], cwd=REPO)
            setup["sprite-env checkpoint"] = time.perf_counter() - t
        src = frozen_copy(None, os.path.join(work, "frozen")) if freeze else ""
        mounts.append(SpriteMount(os.path.join(work, "mnt-sprite"), data, store, src=src))
        if baseline:
            src = frozen_copy(baseline, os.path.join(work, "baseline"))
            mnt = os.path.join(work, "mnt-sprite-baseline")
            mounts.append(SpriteMount(mnt, data, store, f"sprite-env {baseline}", src))
    if "restic" in wanted and shutil.which("restic"):
        repo, cache = os.path.join(work, "restic-repo"), os.path.join(work, "restic-cache")
        if not reuse:
            env = dict(os.environ, RESTIC_PASSWORD="bench", RESTIC_CACHE_DIR=cache)
            run(["restic", "-r", repo, "init", "-q"], env=env)
            t = time.perf_counter()
            run(["restic", "-r", repo, "backup", "-q", "."], cwd=data, env=env)
            setup["restic backup"] = time.perf_counter() - t
        mounts.append(ResticMount(os.path.join(work, "mnt-restic"), repo, cache))
    if "borg" in wanted and shutil.which("borg"):
        repo, base = os.path.join(work, "borg-repo"), os.path.join(work, "borg-base")
        if not reuse:
            env = dict(
                os.environ, BORG_BASE_DIR=base, BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK="yes"
            )
            run(["borg", "init", "-e", "none", repo], env=env)
            t = time.perf_counter()
            argv = ["borg", "create", "--compression", "zstd,3", f"{repo}::snap", "."]
            run(argv, cwd=data, env=env)
            setup["borg create"] = time.perf_counter() - t
        mounts.append(BorgMount(os.path.join(work, "mnt-borg"), repo, base))
    if "disk" in wanted:
        mounts.append(Disk(data))
    for m in mounts:
        os.makedirs(m.mountpoint, exist_ok=True)
    return mounts


def _shown_path(path: str) -> str:
    """Relative to the repository when inside it: results must not name this machine."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    full = os.path.abspath(path)
    return os.path.relpath(full, repo) if full.startswith(repo + os.sep) else full


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--mib", type=int, default=256, help="size of the big file (256)")
    parser.add_argument(
        "--layer", help="tree for diff -r (default: $BENCH_DATA/small if built, else layer.py's)"
    )
    parser.add_argument("--work", default=os.path.join(DATA, "scratch-fuse"))
    parser.add_argument("--tools", default="sprite-env,restic,borg,disk")
    parser.add_argument("--workloads", default="seq,random,diff,diffwarm")
    parser.add_argument(
        "--reuse", action="store_true", help="keep the data and repositories of the last run"
    )
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="also time sprite-env as committed at REV (a git revision), as its own tool",
    )
    parser.add_argument(
        "--freeze",
        action="store_true",
        help="time a copy of the working tree's sprite_env taken at the start",
    )
    parser.add_argument("--out", help="JSON path (default benchmarks/results/fuse-<date>.json)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        log("warning: not root: the page cache is not dropped, runs are warm")
    work = os.path.abspath(args.work)
    data = os.path.join(work, "data")
    disk_copy = os.path.join(work, "disk-copy")
    source_layer = pick_layer(args.layer)
    marker = os.path.join(work, "setup.json")
    want = {"mib": args.mib, "layer": source_layer, "tools": args.tools}
    setup: dict[str, float] = {}
    reuse = False
    if args.reuse and os.path.exists(marker):
        with open(marker) as f:
            done = json.load(f)
        # the same data, and every tool asked for was set up (a subset may be timed)
        had = done["want"]
        reuse = (had["mib"], had["layer"]) == (want["mib"], want["layer"]) and set(
            args.tools.split(",")
        ) <= set(had["tools"].split(","))
        setup = done["setup"]
    if not reuse:
        subprocess.run(["rm", "-rf", work], check=True)
        os.makedirs(data)
        os.makedirs(disk_copy)
        log(f"data: {args.mib} MiB file + a copy of {source_layer}")
        make_big_file(os.path.join(data, BIG), args.mib)
        run(["cp", "-a", source_layer, os.path.join(data, LAYER)])
        run(["cp", "-a", source_layer, os.path.join(disk_copy, LAYER)])
    mounts = prepare_tools(
        work,
        data,
        set(args.tools.split(",")),
        setup,
        reuse,
        baseline=args.baseline,
        freeze=args.freeze,
    )
    if not reuse:
        with open(marker, "w") as f:
            json.dump({"want": want, "setup": setup}, f)
    log("setup: " + ", ".join(f"{k} {v:.1f} s" for k, v in setup.items()))
    live_layer = os.path.join(data, LAYER)
    layer_bytes = tree_bytes(live_layer)
    big_bytes = os.path.getsize(os.path.join(data, BIG))

    results: dict[str, Any] = {}
    tables = []
    try:
        for workload in args.workloads.split(","):
            tools = timed_tools(workload, mounts, live_layer, disk_copy)
            if workload == "diffwarm":
                samples = run_warm_rounds(tools, args.reps, log)
            else:
                samples = run_rounds(tools, args.reps, cold=True, log=log)
            nbytes = {"seq": big_bytes, "random": RANDOM_READS * RANDOM_SIZE}.get(
                workload, 2 * layer_bytes
            )
            summaries = {name: summarize(name, s, nbytes) for name, s in samples.items()}
            results[workload] = {
                "bytes": nbytes,
                "samples": samples,
                "summaries": summaries,
            }
            tables.append((workload, nbytes, summaries, samples))
    finally:
        for m in mounts:
            m.stop()

    print(
        f"\n{args.reps} cold runs each; {machine_info()['cpus']} CPUs; load average at end "
        f"{os.getloadavg()[0]:.1f}\n"
    )
    headers = [
        "workload",
        "tool",
        "wall s (median)",
        "min-max",
        "MB/s",
        "server CPU s",
        "vs restic",
        "vs disk",
    ]
    rows = []
    for workload, nbytes, summaries, samples in tables:
        restic = summaries.get("restic mount")
        disk = summaries.get("disk (cold)") or summaries.get("disk (warm)")
        for name, s in summaries.items():
            cpu = sorted(x.extra.get("server_cpu", 0.0) for x in samples[name])
            rows.append(
                [
                    {
                        "seq": f"seq read {nbytes >> 20} MiB",
                        "random": f"random {RANDOM_READS} x {RANDOM_SIZE >> 10} KiB",
                        "diffwarm": "diff -r layer, warm",
                    }.get(workload, "diff -r layer"),
                    name,
                    f"{s.wall_median:.2f}",
                    f"{s.wall_min:.2f}-{s.wall_max:.2f}",
                    f"{s.mb_per_s:,.0f}",
                    f"{cpu[len(cpu) // 2]:.2f}" if not name.startswith("disk") else "-",
                    ratio(restic.wall_median, s.wall_median) if restic else "-",
                    ratio(disk.wall_median, s.wall_median) if disk else "-",
                ]
            )
    print(markdown_table(headers, rows))
    print("\n(vs X: X's median wall time / this one's: above 1 is faster than X)")
    for name, got in results.get("diffwarm", {}).get("samples", {}).items():
        hit = sum(1 for x in got if x.extra.get("cache_drops"))
        if hit:  # every attempt met a drop: those samples are not warm
            print(f"note: {hit} of {name}'s warm samples met a cache drop by another process")
    goals = {}
    seq = results.get("seq", {}).get("summaries", {})
    if "sprite-env" in seq and "restic mount" in seq:
        goals["seq >= 3x restic mount"] = (
            seq["restic mount"].wall_median / seq["sprite-env"].wall_median
        )
    if "sprite-env" in seq and "disk (cold)" in seq:
        goals["seq >= 0.5x cold disk"] = (
            seq["disk (cold)"].wall_median / seq["sprite-env"].wall_median
        )
    for workload, label in (("diff", "diff -r cold"), ("diffwarm", "diff -r warm")):
        got = results.get(workload, {}).get("summaries", {})
        disk_s = got.get("disk (cold)") or got.get("disk (warm)")
        if "sprite-env" in got and disk_s is not None:  # the goal: at most 1.5x the disk's time
            goals[f"{label} <= 1.5x the disk's time"] = (
                got["sprite-env"].wall_median / disk_s.wall_median
            )
    for goal, value in goals.items():
        print(f"goal {goal}: {value:.2f}x")
    head = subprocess.run(
        ["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    payload = {
        "sprite_env": {"head": head, "frozen": args.freeze, "baseline": args.baseline},
        "setup_s": setup,
        "layer": {"path": _shown_path(source_layer), "bytes": layer_bytes},
        "big_file_bytes": big_bytes,
        "results": results,
        "goals": goals,
    }
    path = write_results("fuse", payload, args.out)
    log(f"results in {path}")
    return 0


def _random_main(argv: list[str]) -> int:
    path, count, size = argv[0], int(argv[1]), int(argv[2])
    print(random_reads(path, count, size, seed=1))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_random":
        sys.exit(_random_main(sys.argv[2:]))
    sys.exit(main())
