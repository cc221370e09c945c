"""A checkpoint after a small change, with and without the change journal (issue 11).

Builds (once) a generated layer of about 100k files in 17.6k directories on an ext4 file
system of its own (a loop device, so the journal's file-system-wide mark sees only this
layer's writes and the store, beside the image, is elsewhere), then per mode:

- a first checkpoint (full walk, cold files cache),
- ``REPS`` times: a small agent-like change (edit 20 files in 5 directories, create 10,
  delete 5, rename one directory of 6 files), then a checkpoint;
- ``REPS`` checkpoints with no change;
- ``REPS`` times: a hard link made to a layer file from outside the layer (a package
  manager's store, a cache elsewhere on the disk: ``mnt/outside``), a write through that
  name only, the link of the rep before removed, then a checkpoint. No event names the
  layer's name of that file: the journal gives its inode and the walk names where the
  files cache saw it (before, each such link made the walk full).

Run as root: ``python benchmarks/bench_journal.py [--reps 5] [--dir DIR]`` (default
``benchmarks/.data/scratch-journal``). Prints
one line per measurement and the medians; the layer and its loop image are kept for the
next run (``--fresh`` rebuilds them).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time

from sprite_env.checkpoints import Engine
from sprite_env.journal import Journal

FANOUT = (26, 26, 26)  # 17,576 leaf directories (plus 702 above them)
FILES_PER_LEAF = 6  # 105,456 files


def build(layer: str) -> None:
    t = time.perf_counter()
    n = 0
    for a in range(FANOUT[0]):
        for b in range(FANOUT[1]):
            for c in range(FANOUT[2]):
                d = os.path.join(layer, f"p{a}", f"q{b}", f"r{c}")
                os.makedirs(d)
                for i in range(FILES_PER_LEAF):
                    with open(os.path.join(d, f"f{i}.txt"), "wb") as f:
                        f.write(b"%d %d %d %d\n" % (a, b, c, i) * (20 + (a * 7 + i * 13) % 300))
                    n += 1
    print(f"built {n} files in {time.perf_counter() - t:.1f} s")


def mount_layer(base: str, fresh: bool) -> str:
    img, mnt = os.path.join(base, "ext4.img"), os.path.join(base, "mnt")
    os.makedirs(mnt, exist_ok=True)
    if fresh and os.path.ismount(mnt):
        subprocess.run(["umount", mnt], check=True)
    if fresh and os.path.exists(img):
        os.unlink(img)
    if not os.path.ismount(mnt):
        new = not os.path.exists(img)
        if new:
            with open(img, "wb") as f:
                f.truncate(3 << 30)
            subprocess.run(["mkfs.ext4", "-q", "-F", img], check=True)
        subprocess.run(["mount", "-o", "loop", img, mnt], check=True)
        if new:
            os.makedirs(os.path.join(mnt, "layer"))
            build(os.path.join(mnt, "layer"))
    return os.path.join(mnt, "layer")


def change(layer: str, rep: int) -> None:
    """About what one agent step does: edits, new files, deletions, one renamed dir."""
    for k in range(20):
        p = os.path.join(layer, f"p{k % 5}", "q1", f"r{k % 4}", f"f{k % 6}.txt")
        with open(p, "ab") as f:
            f.write(b"edit %d %d\n" % (rep, k))
    for k in range(10):
        with open(os.path.join(layer, "p7", "q2", "r3", f"new{rep}-{k}.py"), "wb") as f:
            f.write(b"print(%d)\n" % k * 50)
    for k in range(5):
        p = os.path.join(layer, "p9", f"q{rep % 26}", "r5", f"f{k}.txt")
        if os.path.exists(p):
            os.unlink(p)
    src = os.path.join(layer, "p11", "q4", f"r{rep % 26}")
    if os.path.exists(src):
        os.rename(src, os.path.join(layer, "p11", "q4", f"moved{rep}"))


def link_outside(layer: str, rep: int) -> None:
    """A link to a layer file from outside the layer, written through; the last one gone."""
    outside = os.path.join(os.path.dirname(layer), "outside")
    os.makedirs(outside, exist_ok=True)
    for name in os.listdir(outside):
        os.unlink(os.path.join(outside, name))
    link = os.path.join(outside, f"l{rep}")
    os.link(os.path.join(layer, f"p{rep % 26}", "q3", "r3", "f0.txt"), link)
    with open(link, "ab") as f:
        f.write(b"through the outside name %d\n" % rep)


def run(layer: str, journal: bool, reps: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"first": [], "change": [], "nochange": [], "link": []}
    store = tempfile.mkdtemp(prefix="jbench-store-")
    j = Journal(layer) if journal else None
    try:
        with Engine(layer, store) as e:
            e.journal = j
            t = time.perf_counter()
            cp = e.create("first")
            out["first"].append(time.perf_counter() - t)
            print(f"  first: {out['first'][0]:.2f} s ({cp.files} files, walk {cp.walk})")
            for rep in range(reps):
                change(layer, rep + (100 if journal else 0))
                time.sleep(0.1)  # out of the racy window, as after an agent's step
                t = time.perf_counter()
                cp = e.create(f"after change {rep}")
                dt = time.perf_counter() - t
                out["change"].append(dt)
                print(f"  change {rep}: {dt * 1000:.0f} ms (walk {cp.walk} {cp.walk_reason})")
            for rep in range(reps):
                t = time.perf_counter()
                cp = e.create(f"no change {rep}")
                dt = time.perf_counter() - t
                out["nochange"].append(dt)
                print(f"  no change {rep}: {dt * 1000:.0f} ms (walk {cp.walk})")
            for rep in range(reps):
                link_outside(layer, rep)
                time.sleep(0.1)
                t = time.perf_counter()
                cp = e.create(f"link outside {rep}")
                dt = time.perf_counter() - t
                out["link"].append(dt)
                print(f"  link outside {rep}: {dt * 1000:.0f} ms (walk {cp.walk} {cp.walk_reason})")
    finally:
        if j is not None:
            j.close()
        shutil.rmtree(store)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--dir",
        default=os.path.join(
            os.path.dirname(os.path.abspath(__file__)), ".data", "scratch-journal"
        ),
    )
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--fresh", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    layer = mount_layer(args.dir, args.fresh)
    results = {}
    for journal in (False, True):
        print(f"journal {'on' if journal else 'off'}:")
        results[journal] = run(layer, journal, args.reps)
    print("\nmedians (s):        journal off   journal on")
    for k in ("first", "change", "nochange", "link"):
        off, on = statistics.median(results[False][k]), statistics.median(results[True][k])
        print(f"  {k:<18} {off:>10.3f}   {on:>10.3f}")


if __name__ == "__main__":
    main()
