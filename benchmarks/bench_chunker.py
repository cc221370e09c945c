"""Throughput of the FastCDC chunker: C kernel vs Python reference, with BLAKE3 for scale.

Usage::

    python benchmarks/bench_chunker.py [--mib 256] [--repeat 3]

Prints MB/s (10**6 bytes per second), best of ``--repeat`` runs, with the default
chunk sizes (16/64/256 KiB).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import TYPE_CHECKING

from blake3 import blake3

from sprite_env.store import _chunker_ref
from sprite_env.store.chunker import DEFAULT_AVG, DEFAULT_MAX, DEFAULT_MIN, NATIVE, Chunker

if TYPE_CHECKING:
    from collections.abc import Callable

PARAMS = (DEFAULT_MIN, DEFAULT_AVG, DEFAULT_MAX)


def best_seconds(fn: Callable[[], object], repeat: int) -> float:
    """Returns the shortest wall time of ``repeat`` calls of ``fn``."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def report(name: str, nbytes: int, seconds: float, note: str = "") -> None:
    print(f"{name:<34} {nbytes / seconds / 1e6:10.1f} MB/s  {note}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="size of the random buffer")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement")
    args = parser.parse_args()
    if not NATIVE:
        print("sprite_env._native is not built: nothing to benchmark", file=sys.stderr)
        return 1
    from sprite_env import _native

    size = args.mib * 1024 * 1024
    data = os.urandom(size)
    zeros = bytes(size)
    chunker = Chunker()

    cuts = chunker.cut_points(data, True)
    seconds = best_seconds(lambda: _native.cut_points(data, *PARAMS, True), args.repeat)
    report(
        f"native cut_points, random {args.mib} MiB",
        size,
        seconds,
        f"{len(cuts)} chunks, mean {size // len(cuts)} B",
    )
    seconds = best_seconds(lambda: _native.cut_points(zeros, *PARAMS, True), args.repeat)
    report(f"native cut_points, zeros {args.mib} MiB", size, seconds, "(worst case: cuts at max)")
    seconds = best_seconds(lambda: sum(map(len, chunker.chunks_of_bytes(data))), args.repeat)
    report("Chunker.chunks_of_bytes (views)", size, seconds)

    with tempfile.TemporaryFile() as f:
        f.write(data)

        def read_fd() -> int:
            os.lseek(f.fileno(), 0, os.SEEK_SET)
            return sum(map(len, chunker.chunks_of_fd(f.fileno())))

        seconds = best_seconds(read_fd, args.repeat)
    report("Chunker.chunks_of_fd (page cache)", size, seconds)

    small = data[: 2 * 1024 * 1024]
    seconds = best_seconds(lambda: _chunker_ref.cut_points(small, *PARAMS, True), 1)
    report("reference cut_points, random 2 MiB", len(small), seconds)

    seconds = best_seconds(lambda: blake3(data).digest(), args.repeat)
    report("blake3, 1 thread", size, seconds)
    seconds = best_seconds(lambda: blake3(data, max_threads=blake3.AUTO).digest(), args.repeat)
    report(f"blake3, {os.cpu_count()} CPUs (AUTO)", size, seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
