"""A big database changed in place: its part of a checkpoint, against b3sum and cmp.

Usage::

    python benchmarks/bench_inplace.py [--db PATH] [--mb 205] [--reps 5] [--out FILE]

The typical agent step of the benchmark layers (``../shared/bench/mutate.sh``) appends 2%
more rows to a 215 MB SQLite database and updates 1% of its users: scattered page writes
(3.4k of 52k pages, in 3.2k runs) and 650 pages of growth. Issue 11, point 5: that file's
part of the next checkpoint must cost at most 100 ms, warm.

The database: ``--db`` (copied, never written), else one generated with ``sqlite3`` like
``../shared/bench/lib/gen_sqlite.py`` (users, events with two indexes, a blob table) from a
fixed seed, cached in ``benchmarks/.data/inplace/``. Its changed version comes from running
mutate.sh's SQL on a copy, once; the pages that differ (and the growth) are then written in
place onto the live file before each timed checkpoint, and the old ones written back (and
checkpointed, untimed) after it, so every round measures the same change.

Timed, alternating within each round, warm page cache:

- ``digests``: ``Engine.create`` of a layer holding only the database, with the page
  digests the previous checkpoint saved (``snapshot/pagesums.py``);
- ``store``: the same with its digests deleted first: the comparison against the old
  version's objects read back from the store (the path before issue 11.5, and the fallback);
- ``b3sum --num-threads 2``: hashing the file once on both cores, the floor of any method
  that must look at every byte; ``cmp`` of two copies of the new version (read to the end:
  no byte differs); ``cat > /dev/null``: the read alone.

For sprite-env: the whole ``create`` and "the file's part": ``Capturer._file`` for the
database (its read, comparison, new objects and chunk list; not the catalog commit). Wall
time, and CPU time of the process (all threads, so the store's compression too). Peers:
wall and CPU of the child. Ratios are against b3sum in the same round: the machine is
shared, absolute times move with its load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)
from _peers import markdown_table, ratio, write_results  # noqa: E402

from sprite_env.checkpoints import Engine  # noqa: E402
from sprite_env.snapshot import capture as capture_mod  # noqa: E402

PAGE = 4096
DATA = os.path.join(HERE, ".data", "inplace")
REL = "home/dev/data/app.sqlite3"

_W1 = ["account", "active", "admin", "alert", "api", "app", "archive", "audit", "auth"]
_W2 = ["backend", "batch", "billing", "branch", "build", "cache", "call", "cancel", "card"]
_W3 = ["deploy", "device", "disk", "domain", "draft", "email", "endpoint", "error", "event"]
WORDS = _W1 + _W2 + _W3
KINDS = ["page_view", "api_call", "login", "logout", "purchase", "error", "deploy", "build"]

#: mutate.sh's SQL: 2% more events, 1% of the users updated.
MUTATE = """
BEGIN;
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {add})
INSERT INTO events(user_id, ts, kind, path, payload, digest)
SELECT 1 + (x * 7919) % 50000, 1800000000 + x * 17, 'agent_' || (x % 7),
       '/agent/session/' || x,
       json_object('msg', 'agent session row ' || x, 'status', 200 + (x % 3),
                   'tags', json_array('agent', 'bench', x % 13)),
       printf('%016x%016x', (x * 2654435761) % 9223372036854775807, (x * 40503) % 4294967291)
FROM c;
UPDATE users SET plan = 'pro' WHERE id % 97 = 0;
COMMIT;
"""


def generate(path: str, mb: int) -> None:
    """An app-like database of about ``mb`` MiB (see the module docstring)."""
    rng = random.Random(1234)
    tmp = path + ".tmp"
    if os.path.exists(tmp):
        os.unlink(tmp)
    db = sqlite3.connect(tmp)
    db.executescript("""
        PRAGMA page_size=4096;
        CREATE TABLE users(id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL,
            created_at INTEGER NOT NULL, plan TEXT, bio TEXT);
        CREATE TABLE events(id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL, ts INTEGER
            NOT NULL, kind TEXT NOT NULL, path TEXT, payload TEXT, digest TEXT);
        CREATE INDEX events_user_ts ON events(user_id, ts);
        CREATE INDEX events_kind_ts ON events(kind, ts);
        CREATE TABLE kv(key TEXT PRIMARY KEY, value BLOB) WITHOUT ROWID;
    """)

    def words(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    db.executemany(
        "INSERT INTO users VALUES (?,?,?,?,?,?)",
        (
            (
                i,
                f"user_{i}",
                f"user_{i}@example.test",
                1600000000 + rng.randrange(10**8),
                rng.choice(["free", "pro", "team"]),
                words(rng.randrange(5, 30)),
            )
            for i in range(1, 50001)
        ),
    )
    db.executemany(
        "INSERT INTO kv VALUES (?,?)",
        ((f"blob/{i:06d}", rng.randbytes(rng.randrange(512, 8192))) for i in range(2000)),
    )
    db.commit()
    ts = 1700000000
    while db.execute("PRAGMA page_count").fetchone()[0] * PAGE < mb << 20:
        rows = []
        for _ in range(20000):
            ts += rng.randrange(30)
            payload = json.dumps(
                {"msg": words(rng.randrange(4, 25)), "status": rng.choice([200, 201, 404])},
                separators=(",", ":"),
            )
            rows.append(
                (
                    rng.randrange(1, 50001),
                    ts,
                    rng.choice(KINDS),
                    f"/{words(2)}",
                    payload,
                    f"{rng.getrandbits(128):032x}",
                )
            )
        db.executemany(
            "INSERT INTO events(user_id, ts, kind, path, payload, digest) VALUES (?,?,?,?,?,?)",
            rows,
        )
        db.commit()
    db.commit()
    db.close()
    os.replace(tmp, path)


def mutate(path: str) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    rows = db.execute("SELECT count(*) FROM events").fetchone()[0]
    db.executescript(MUTATE.format(add=rows // 50))
    db.close()


def differing_pages(a: bytes, b: bytes) -> list[int]:
    n = min(len(a), len(b)) // PAGE
    return [i for i in range(n) if a[i * PAGE : (i + 1) * PAGE] != b[i * PAGE : (i + 1) * PAGE]]


def put_version(path: str, data: bytes, pages: list[int]) -> None:
    """Writes ``data``'s ``pages`` (and its tail past the other version) in place."""
    with open(path, "r+b") as f:
        for i in pages:
            f.seek(i * PAGE)
            f.write(data[i * PAGE : (i + 1) * PAGE])
        size = os.fstat(f.fileno()).st_size
        if len(data) > size:
            f.seek(size)
            f.write(data[size:])
        f.truncate(len(data))


def run_child(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of a child."""
    before = os.times()
    t = time.perf_counter()
    subprocess.run(argv, check=False, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = os.times()
    return wall, (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )


class FilePart:
    """Times ``Capturer._file`` for one path (wall, and process CPU over the same span)."""

    def __init__(self, name: bytes) -> None:
        self.name = name
        self.wall = self.cpu = 0.0
        original = capture_mod.Capturer._file

        def timed(cap: Any, dirfd: int, rel: bytes, name: bytes, *a: Any, **k: Any) -> Any:
            if rel != self.name:
                return original(cap, dirfd, rel, name, *a, **k)
            t, c = time.perf_counter(), time.process_time()
            try:
                return original(cap, dirfd, rel, name, *a, **k)
            finally:
                self.wall += time.perf_counter() - t
                self.cpu += time.process_time() - c

        capture_mod.Capturer._file = timed  # type: ignore[method-assign]

    def reset(self) -> None:
        self.wall = self.cpu = 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", help="a SQLite database to use (copied)")
    ap.add_argument("--mb", type=int, default=205, help="size of the generated one, MiB")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--work", default=os.path.join(DATA, "work"))
    ap.add_argument("--out", help="JSON results file")
    args = ap.parse_args()

    os.makedirs(DATA, exist_ok=True)
    src = args.db
    if src is None:
        src = os.path.join(DATA, f"app-{args.mb}.sqlite3")
        if not os.path.exists(src):
            print(f"generating {src} ...", file=sys.stderr)
            generate(src, args.mb)
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    old_path = os.path.join(args.work, "old.sqlite3")
    new_path = os.path.join(args.work, "new.sqlite3")
    shutil.copyfile(src, old_path)
    shutil.copyfile(src, new_path)
    mutate(new_path)
    with open(old_path, "rb") as f:
        old = f.read()
    with open(new_path, "rb") as f:
        new = f.read()
    pages = differing_pages(old, new)
    grown = max(0, len(new) - len(old)) // PAGE
    print(
        f"database {len(old) / 1e6:.0f} MB -> {len(new) / 1e6:.0f} MB: {len(pages)} of "
        f"{len(old) // PAGE} pages changed in place, {grown} pages of growth",
        file=sys.stderr,
    )
    layer = os.path.join(args.work, "layer")
    live = os.path.join(layer, REL)
    os.makedirs(os.path.dirname(live))
    shutil.copyfile(old_path, live)
    part = FilePart(REL.encode())
    results: dict[str, list[tuple[float, float, float]]] = {}  # name -> (wall, cpu, create)
    peers = {
        "b3sum --num-threads 2": ["b3sum", "--num-threads", "2", live],
        "cmp (two copies of the new version)": ["cmp", "-s", new_path, live],
        "cat > /dev/null": ["cat", live],
    }
    with Engine(layer, os.path.join(args.work, "store")) as engine:
        engine.create()
        modes = ["digests", "store"]
        for rep in range(args.reps):
            for mode in modes[rep % 2 :] + modes[: rep % 2]:
                if mode == "store":
                    with engine.store.catalog.transaction() as db:
                        db.execute("DELETE FROM pagesums")
                put_version(live, new, pages)
                time.sleep(0.06)  # past the files cache's racy window
                run_child(["cat", live])  # warm
                part.reset()
                t = time.perf_counter()
                engine.create()
                total = time.perf_counter() - t
                results.setdefault(mode, []).append((part.wall, part.cpu, total))
                put_version(live, old, pages)
                time.sleep(0.06)
                engine.create()  # back to the old version (and its digests), untimed
            put_version(live, new, pages)
            for name, argv in peers.items():
                wall, cpu = run_child(argv)
                results.setdefault(name, []).append((wall, cpu, 0.0))
            put_version(live, old, pages)

    def med(name: str, i: int) -> float:
        return statistics.median(r[i] for r in results[name])

    floor = med("b3sum --num-threads 2", 0)
    rows = []
    for name in ["digests", "store", *peers]:
        label = {"digests": "sprite-env, with page digests", "store": "sprite-env, from the store"}
        runs = results[name]
        rows.append(
            [
                label.get(name, name),
                f"{med(name, 0) * 1e3:.0f}",
                f"{min(r[0] for r in runs) * 1e3:.0f}",
                f"{med(name, 1) * 1e3:.0f}",
                f"{med(name, 2) * 1e3:.0f}" if name in label else "-",
                ratio(med(name, 0), floor),
            ]
        )
    print(
        markdown_table(
            ["the file's part", "wall ms (median)", "min", "CPU ms", "whole create ms", "vs b3sum"],
            rows,
        )
    )
    path = write_results(
        "inplace",
        {
            "database_bytes": [len(old), len(new)],
            "pages_changed": len(pages),
            "pages_grown": grown,
            "reps": args.reps,
            "runs": results,
        },
        args.out,
    )
    print(f"results: {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
