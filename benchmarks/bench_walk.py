"""The full walk against ``find`` (issue 11.4): a capture that the change journal cannot
narrow (a daemon start, an overflow, no journal), warm, with a warm files cache and no
change, side by side with ``find`` on the same tree.

Per layer (the small and medium layers of ../shared/bench, ``make_dataset.sh``; each is
copied once with ``cp -a`` into the scratch directory, never touched where it lies):

- a first capture into a store of its own fills the files cache (not timed);
- with ``--cold`` (root), each layer again on a file system of its own whose caches are
  dropped before every timed run (``ColdLayer``: the same shape, no data);
- then ``--reps`` rounds, the tools alternating in each round (so noise hits all alike):
  ``find L > /dev/null`` (lists directories, stats only those: the bar of the goal),
  ``find L -printf '%i %s %T@ %C@ %m\\n' > /dev/null`` (a stat of every entry, as
  bench_checkpoints.py's stat walk), the capture with the native walk (``scan_tree``,
  then the hint-driven walk of what it could not vouch for), and the capture as it was
  before (``_scan_tree`` off: one ``scan_dir`` call per directory from Python).

The capture is ``capture()`` with a hash-only sink and the files cache already loaded
(``dircache.load``, timed apart); the checkpoint is ``Engine.create()`` with no journal,
as a daemon's first after its start: the files cache loaded, the walk, the commit. Prints
best-of and median times, and the ratios of the best times against ``find``. Run as any
user who can read the layers: ``.venv/bin/python benchmarks/bench_walk.py [--reps 9]
[--out FILE]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import stat
import statistics
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from sprite_env.checkpoints import Engine
from sprite_env.checkpoints.hashonly import HashOnlySink
from sprite_env.snapshot import capture as capture_mod
from sprite_env.snapshot import dircache
from sprite_env.snapshot.capture import capture
from sprite_env.store import open_store

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

#: The data sets of ../shared/bench, as bench_step.py finds them.
BENCH_DATA = os.environ.get(
    "BENCH_DATA", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".data", "bench-data")
)


def _layer(profile: str, scratch: str) -> str:
    dest = os.path.join(scratch, profile)
    if not os.path.isdir(dest):
        src = os.path.join(BENCH_DATA, profile)
        if not os.path.exists(src + ".done"):
            sys.exit(f"no {src}.done: build it with ../shared/bench/make_dataset.sh")
        subprocess.run(["cp", "-a", src, dest + ".tmp"], check=True)
        os.rename(dest + ".tmp", dest)
    return dest


@contextlib.contextmanager
def _walk(native: bool) -> Iterator[None]:
    """The capture's full walk with the native ``scan_tree``, or as it was before it."""
    saved = capture_mod._scan_tree
    if not native:
        capture_mod._scan_tree = None
    try:
        yield
    finally:
        capture_mod._scan_tree = saved


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _find(*args: str) -> Callable[[], object]:
    return lambda: subprocess.run(["find", *args], stdout=subprocess.DEVNULL, check=True)


class ColdLayer:
    """The layer's shape on a file system of its own whose caches can be dropped alone.

    An ext4 image on a loop device with direct I/O (its reads reach the disk, not the host's
    page cache), holding the layer's directories, symlinks and files with their names and
    sizes but no data (files are sparse: a walk reads metadata only). ``drop()`` unmounts
    and mounts it again, which empties its inode and dentry caches without touching the
    rest of the machine (``drop_caches`` would slow every other process's runs down).
    """

    def __init__(self, src: str, base: str) -> None:
        self.base = base
        self.mnt = os.path.join(base, "mnt")
        os.makedirs(self.mnt, exist_ok=True)
        img = os.path.join(base, "ext4.img")
        with open(img, "wb") as f:
            f.truncate(4 << 30)
        entries = sum(len(d) + len(f) for _, d, f in os.walk(src))
        subprocess.run(["mkfs.ext4", "-q", "-F", "-N", str(entries * 2 + 1000), img], check=True)
        self.dev = subprocess.run(
            ["losetup", "--direct-io=on", "-f", "--show", img],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        subprocess.run(["mount", self.dev, self.mnt], check=True)
        self.layer = os.path.join(self.mnt, "layer")
        _skeleton(src, self.layer)
        time.sleep(2 * dircache.RACY_NS / 1e9)  # else the files just made are read again

    def drop(self) -> None:
        subprocess.run(["umount", self.mnt], check=True)
        subprocess.run(["mount", self.dev, self.mnt], check=True)

    def close(self) -> None:
        subprocess.run(["umount", self.mnt], check=False)
        subprocess.run(["losetup", "-d", self.dev], check=False)
        os.unlink(os.path.join(self.base, "ext4.img"))


def _skeleton(src: str, dest: str) -> None:
    for top, dirs, files in os.walk(src):
        here = os.path.join(dest, os.path.relpath(top, src))
        os.makedirs(here, exist_ok=True)
        for name in [*dirs, *files]:
            p = os.path.join(top, name)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(p), os.path.join(here, name))
            elif stat.S_ISREG(st.st_mode):
                with open(os.path.join(here, name), "wb") as f:
                    f.truncate(st.st_size)


def bench(profile: str, scratch: str, reps: int, cold: bool = False) -> dict[str, object]:
    layer = _layer(profile, scratch)
    cold_layer = None
    if cold:
        cold_layer = ColdLayer(layer, os.path.join(scratch, f"cold-{profile}"))
        layer = cold_layer.layer
        profile += " cold"
    store_dir = os.path.join(scratch, f"store-{profile.replace(' ', '-')}")
    fresh = not os.path.isdir(store_dir)
    store = open_store(store_dir, create=fresh)
    # a checkpoint as the daemon takes one after its start (no journal yet): files cache
    # loaded, full walk, commit; in a store of its own
    engine = Engine(layer, os.path.join(scratch, f"engine-{profile.replace(' ', '-')}"))
    try:
        with store.writer() as w:  # fills (or refreshes) the files cache
            r = capture(layer, w, store.read, dircache.load(store.catalog))
            w.flush()
            w.commit(lambda db: dircache.save(db, r.cache_changed, r.cache_removed))
        t = time.perf_counter()
        cache = dircache.load(store.catalog)
        load_s = time.perf_counter() - t

        def walk(native: bool) -> Callable[[], object]:
            def run() -> object:
                with _walk(native):
                    sink = HashOnlySink(store)
                    res = capture(layer, sink, sink.read, cache)
                assert res.stats.files_read == 0, "the layer changed during the benchmark"
                return res

            return run

        def checkpoint(native: bool) -> Callable[[], object]:
            def run() -> object:
                with _walk(native):
                    cp = engine.create("bench_walk: no change")
                assert cp.walk == "full"
                return cp

            return run

        engine.create("bench_walk: fills the files cache")
        tools = {
            "find": _find(layer),
            "find -printf stat": _find(layer, "-printf", "%i %s %T@ %C@ %m\\n"),
            "capture, native walk": walk(True),
            "capture, per-directory walk": walk(False),
            "checkpoint, native walk": checkpoint(True),
            "checkpoint, per-directory walk": checkpoint(False),
        }
        for fn in tools.values():  # warm the page cache and the dentries
            fn()
        times: dict[str, list[float]] = {k: [] for k in tools}
        for _ in range(reps):
            for k, fn in tools.items():
                if cold_layer is not None:
                    cold_layer.drop()
                times[k].append(_timed(fn))
        stats = r.stats
    finally:
        store.close()
        engine.close()
        if cold_layer is not None:
            cold_layer.close()
    best = {k: min(v) for k, v in times.items()}
    return {
        "layer": profile,
        "files": stats.files,
        "dirs": stats.dirs,
        "load_files_cache_s": round(load_s, 4),
        "best_s": {k: round(v, 4) for k, v in best.items()},
        "median_s": {k: round(statistics.median(v), 4) for k, v in times.items()},
        "vs_find": {k: round(v / best["find"], 2) for k, v in best.items()},
        "vs_find_stat": {k: round(v / best["find -printf stat"], 2) for k, v in best.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument(
        "--scratch",
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".data", "scratch-walk"),
    )
    ap.add_argument("--profiles", default="small,medium")
    ap.add_argument("--cold", action="store_true", help="also cold (root: a loop device)")
    ap.add_argument("--out", help="also write the results as JSON here")
    args = ap.parse_args()
    os.makedirs(args.scratch, exist_ok=True)
    results = []
    print(f"cpus {os.cpu_count()}, load {os.getloadavg()[0]:.2f}, walkers {capture_mod.WALKERS}")
    runs = [(p, False) for p in args.profiles.split(",")]
    if args.cold:
        runs += [(p, True) for p in args.profiles.split(",")]
    for profile, cold in runs:
        res = bench(profile, args.scratch, args.reps, cold)
        results.append(res)
        print(
            f"\n{res['layer']}: {res['files']} files, {res['dirs']} dirs; files cache load "
            f"{res['load_files_cache_s']:.3f} s"
        )
        print(f"  {'':<31} {'best s':>8} {'median s':>9} {'x find':>7} {'x stat walk':>12}")
        for k, b in res["best_s"].items():  # type: ignore[attr-defined]
            print(
                f"  {k:<31} {b:>8.3f} {res['median_s'][k]:>9.3f}"  # type: ignore[index]
                f" {res['vs_find'][k]:>7.2f} {res['vs_find_stat'][k]:>12.2f}"  # type: ignore[index]
            )
    print(f"\nload after: {os.getloadavg()[0]:.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
