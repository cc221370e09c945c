"""Checkpoints in object storage against restic's S3 backend, on one local Swift (issue 14).

Usage::

    python benchmarks/bench_remote.py [--profile small|medium] [--reps 1] [--work DIR]
                                      [--no-freeze] [--keep] [--out FILE]

The layer is ``$BENCH_DATA/<profile>`` (default ``benchmarks/.data/bench-data``), built by
``../shared/bench/make_dataset.sh``; it is only read. The server is OpenStack Swift with
s3api, started for the run by ``.ci/s3-server`` on its own port and directory, over HTTPS
(``S3_SERVER_TLS=1``): restic 0.14's client sends aws-chunked bodies over plain HTTP, which
Swift's s3api refuses, and both tools get the same TLS proxy. Every step is cold (``sync``
and ``drop_caches`` before it), each tool in a bucket prefix of its own, made anew for each
rep:

- **first checkpoint, local**: ``sprite-env --root L --store s3://B/P checkpoints create``
  (L a ``cp -a`` copy of the layer: offline, the store's local copy goes to L/.sprite/store):
  committed locally, nothing uploaded yet (what a user waits for; the daemon uploads in the
  background). restic has no local step: its row is its backup to the bucket.
- **first checkpoint, durable in the bucket**: the same with ``--wait-remote`` (from an empty
  store, so the create and the whole upload), against ``restic backup`` to the bucket.
- **restore on a fresh machine**: an empty root and state (no local copy, no pack cache):
  ``sprite-env --root FRESH --store s3://B/P checkpoints export v0 OUT``, against
  ``restic restore latest --target OUT`` with a new, empty cache directory (restic
  fills it as it goes; with ``--no-cache`` it fetched tree packs again and again: 172 s
  against 8.5 s on the small layer). Every
  restore is compared with the layer by the tree oracle (``_tree``): content, modes,
  owners, ns mtimes, xattrs.
- **one small file on a fresh machine**: an empty root and state again, ``sprite-env
  --root FRESH --store s3://B/P checkpoints cat v0 PATH`` (what the view does for a
  remote-only checkpoint with an empty cache), against ``restic dump latest PATH`` with a
  new, empty cache; PATH is the middle one, by name, of the layer's files of 1-16 KiB. Each
  output is compared with the layer's file; the bytes each tool left in its local store or
  cache are recorded (sprite-env fetches whole packs; restic reads blobs by range).

MB/s is the layer's bytes over the wall time. sprite-env runs from a frozen copy of HEAD
(``--no-freeze``: the working tree). Output: a markdown table on stdout, JSON in
``benchmarks/results/remote-<profile>.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_checkpoints as bc  # noqa: E402  (freezing sprite-env the same way)
from _peers import (  # noqa: E402
    drop_caches,
    machine_info,
    markdown_table,
    ratio,
    rel,
    run_measured,
    write_results,
)
from _tree import compare, manifest, verdict  # noqa: E402

DATA = os.environ.get("BENCH_DATA", os.path.join(HERE, ".data", "bench-data"))
PORT = int(os.environ.get("BENCH_S3_PORT", "18380"))
SPRITE, RESTIC = "sprite-env", "restic"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Server:
    """A Swift of this run's own (its port, its directory), over HTTPS."""

    def __init__(self, work: str) -> None:
        self.dir = os.path.join(work, "s3")
        self.env: dict[str, str] = {}

    def start(self) -> None:
        out = subprocess.run(
            ["sh", os.path.join(REPO, ".ci", "s3-server"), "start", self.dir],
            env={**os.environ, "S3_SERVER_PORT": str(PORT), "S3_SERVER_TLS": "1"},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for line in out.splitlines():
            k, sep, v = line.partition("=")
            if sep and not k.startswith("export"):
                self.env[k] = v
        self.run_aws("s3", "mb", "s3://bench")

    def stop(self) -> None:
        subprocess.run(
            ["sh", os.path.join(REPO, ".ci", "s3-server"), "stop", self.dir],
            env={**os.environ, "S3_SERVER_PORT": str(PORT)},
            check=False,
        )

    def run_aws(self, *args: str) -> None:
        subprocess.run(
            ["aws", "--endpoint-url", self.env["AWS_ENDPOINT_URL"], *args],
            env={**os.environ, **self.env},
            check=True,
            capture_output=True,
        )

    def bucket_bytes(self, prefix: str) -> int:
        out = subprocess.run(
            [
                "aws",
                "--endpoint-url",
                self.env["AWS_ENDPOINT_URL"],
                "s3",
                "ls",
                "--recursive",
                f"s3://bench/{prefix}/",
            ],
            env={**os.environ, **self.env},
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return sum(int(line.split()[2]) for line in out.splitlines() if len(line.split()) >= 4)


def timed(name: str, argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    drop_caches()
    m = run_measured(argv, env=env)
    if not m.ok:
        raise RuntimeError(f"{name}: exit {m.returncode}: {m.stderr[-2000:]}")
    return {"wall_s": m.wall, "cpu_s": m.cpu, "max_rss_kib": m.max_rss_kib}


def small_file(expected: dict[str, Any]) -> str:
    """The layer's file of 1-16 KiB in the middle by name (else its smallest non-empty)."""
    small = sorted(p for p, e in expected.items() if e[0] == "file" and 1024 <= e[4] <= 16384)
    if small:
        return small[len(small) // 2]
    return min((e[4], p) for p, e in expected.items() if e[0] == "file" and e[4] > 0)[1]


def dir_bytes(path: str) -> int:
    out = subprocess.run(["du", "-sb", path], check=True, stdout=subprocess.PIPE, text=True)
    return int(out.stdout.split()[0])


def timed_to(name: str, argv: list[str], env: dict[str, str], dest: str) -> dict[str, Any]:
    """:func:`timed` with the command's stdout into ``dest`` (bytes, as they are)."""
    return timed(name, ["sh", "-c", 'exec "$@" > "$0"', dest, *argv], env)


def blake2b_of(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.blake2b(f.read()).hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="small", choices=["small", "medium"])
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--work", default=None)
    ap.add_argument("--no-freeze", action="store_true")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    layer = os.path.join(DATA, args.profile)
    if not os.path.isdir(layer):
        sys.exit(
            f"no layer at {layer}: bash ../shared/bench/make_dataset.sh {layer} {args.profile}"
        )
    scratch = os.path.join(HERE, ".data")  # git-ignored, as the other benchmarks' scratch
    os.makedirs(scratch, exist_ok=True)
    work = args.work or tempfile.mkdtemp(prefix="scratch-remote-", dir=scratch)
    os.makedirs(work, exist_ok=True)
    measured = bc.setup_sprite(work, freeze=not args.no_freeze)
    expected = manifest(layer)
    size = sum(e[4] for e in expected.values() if e[0] == "file")
    one = small_file(expected)
    # the layer's copy: the offline CLI writes the local copy of the store into it
    copy = os.path.join(work, "layer")
    log(f"copying {layer}")
    subprocess.run(["cp", "-a", layer, copy], check=True)
    server = Server(work)
    server.start()
    env = {**os.environ, **server.env, **bc.SPRITE_ENV, "RESTIC_PASSWORD": "bench"}
    sprite = bc.sprite_argv()
    endpoint = server.env["AWS_ENDPOINT_URL"]
    ca = server.env["AWS_CA_BUNDLE"]
    reps: list[dict[str, Any]] = []
    try:
        for rep in range(args.reps):
            r: dict[str, Any] = {}
            # sprite-env: a local commit, then a whole first checkpoint to the bucket
            for step, extra in (("local", []), ("durable", ["--wait-remote"])):
                # offline, a store in the bucket keeps its local copy in ROOT/.sprite/store
                shutil.rmtree(os.path.join(copy, ".sprite"), ignore_errors=True)
                url = f"s3://bench/sp-{rep}-{step}"
                subprocess.run(  # untimed: an empty store (only `store init` makes one)
                    [*sprite, "--root", copy, "--store", url, "store", "init"],
                    env=env,
                    check=True,
                    capture_output=True,
                )
                r[f"{SPRITE} {step}"] = timed(
                    f"sprite-env create {step}",
                    [
                        *sprite,
                        "--root",
                        copy,
                        "--store",
                        f"s3://bench/sp-{rep}-{step}",
                        "checkpoints",
                        "create",
                        "--comment",
                        "first",
                        *extra,
                    ],
                    env,
                )
                log(
                    f"rep {rep}: sprite-env first checkpoint, {step}: "
                    f"{r[f'{SPRITE} {step}']['wall_s']:.2f} s"
                )
            shutil.rmtree(os.path.join(copy, ".sprite"), ignore_errors=True)
            repo = f"s3:{endpoint}/bench/restic-{rep}"
            rargs = ["restic", "--cacert", ca, "-r", repo]
            subprocess.run([*rargs, "init"], env=env, check=True, capture_output=True)
            r[f"{RESTIC} backup"] = timed(
                "restic backup",
                [*rargs, "--cache-dir", os.path.join(work, f"rcache-{rep}-backup"), "backup", copy],
                env,
            )
            log(f"rep {rep}: restic backup: {r[f'{RESTIC} backup']['wall_s']:.2f} s")
            r["bucket_bytes"] = {
                SPRITE: server.bucket_bytes(f"sp-{rep}-durable"),
                RESTIC: server.bucket_bytes(f"restic-{rep}"),
            }
            # a fresh machine: empty root, empty local copy and cache
            fresh = os.path.join(work, f"fresh-{rep}")
            out = os.path.join(work, f"out-{rep}-sprite")
            os.makedirs(fresh)
            r[f"{SPRITE} restore"] = timed(
                "sprite-env export",
                [
                    *sprite,
                    "--root",
                    fresh,
                    "--store",
                    f"s3://bench/sp-{rep}-durable",
                    "checkpoints",
                    "export",
                    "v0",
                    out,
                ],
                env,
            )
            r[f"{SPRITE} restore"]["verify"] = compare(expected, manifest(out))
            rout = os.path.join(work, f"out-{rep}-restic")
            r[f"{RESTIC} restore"] = timed(
                "restic restore",
                [
                    *rargs,
                    "--cache-dir",
                    os.path.join(work, f"rcache-{rep}-fresh"),
                    "restore",
                    "latest",
                    "--target",
                    rout,
                ],
                env,
            )
            r[f"{RESTIC} restore"]["verify"] = compare(expected, manifest(rout + copy))
            for k in (f"{SPRITE} restore", f"{RESTIC} restore"):
                log(f"rep {rep}: {k}: {r[k]['wall_s']:.2f} s  {verdict(r[k]['verify'])}")
            # one small file of the checkpoint, on another fresh machine
            cfresh = os.path.join(work, f"fresh-cat-{rep}")
            os.makedirs(cfresh)
            scat, rcat = os.path.join(work, f"cat-{rep}-sprite"), os.path.join(work, f"cat-{rep}-r")
            r[f"{SPRITE} cat"] = timed_to(
                "sprite-env cat",
                [
                    *sprite,
                    "--root",
                    cfresh,
                    "--store",
                    f"s3://bench/sp-{rep}-durable",
                    "checkpoints",
                    "cat",
                    "v0",
                    "/" + one,
                ],
                env,
                scat,
            )
            r[f"{SPRITE} cat"]["local_bytes"] = dir_bytes(os.path.join(cfresh, ".sprite"))
            rcache = os.path.join(work, f"rcache-{rep}-cat")
            r[f"{RESTIC} cat"] = timed_to(
                "restic dump",
                [*rargs, "--cache-dir", rcache, "dump", "latest", os.path.join(copy, one)],
                env,
                rcat,
            )
            r[f"{RESTIC} cat"]["local_bytes"] = dir_bytes(rcache)
            for k, got in ((f"{SPRITE} cat", scat), (f"{RESTIC} cat", rcat)):
                r[k]["same"] = blake2b_of(got) == expected[one][5]
                log(
                    f"rep {rep}: {k} {one}: {r[k]['wall_s']:.2f} s, "
                    f"{r[k]['local_bytes']} bytes fetched, {'same' if r[k]['same'] else 'DIFFERS'}"
                )
            reps.append(r)
            if not args.keep:
                for p in (out, rout, fresh, cfresh):
                    shutil.rmtree(p, ignore_errors=True)
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    def best(key: str) -> float:
        return min(x[key]["wall_s"] for x in reps)

    rows = [
        [
            "first checkpoint, committed locally",
            f"{best(f'{SPRITE} local'):.2f} s",
            f"{size / best(f'{SPRITE} local') / 1e6:.0f}",
            f"{best(f'{RESTIC} backup'):.2f} s",
            ratio(best(f"{SPRITE} local"), best(f"{RESTIC} backup")),
        ],
        [
            "first checkpoint, durable in the bucket",
            f"{best(f'{SPRITE} durable'):.2f} s",
            f"{size / best(f'{SPRITE} durable') / 1e6:.0f}",
            f"{best(f'{RESTIC} backup'):.2f} s",
            ratio(best(f"{SPRITE} durable"), best(f"{RESTIC} backup")),
        ],
        [
            "restore on a fresh machine (empty cache)",
            f"{best(f'{SPRITE} restore'):.2f} s",
            f"{size / best(f'{SPRITE} restore') / 1e6:.0f}",
            f"{best(f'{RESTIC} restore'):.2f} s",
            ratio(best(f"{SPRITE} restore"), best(f"{RESTIC} restore")),
        ],
        [
            f"one {expected[one][4]} B file on a fresh machine (empty cache; bytes fetched)",
            f"{best(f'{SPRITE} cat'):.2f} s "
            f"({min(x[f'{SPRITE} cat']['local_bytes'] for x in reps) / 1e6:.1f} MB)",
            "-",
            f"{best(f'{RESTIC} cat'):.2f} s "
            f"({min(x[f'{RESTIC} cat']['local_bytes'] for x in reps) / 1e6:.1f} MB)",
            ratio(best(f"{SPRITE} cat"), best(f"{RESTIC} cat")),
        ],
    ]
    print(markdown_table(["step (cold)", "sprite-env", "MB/s", "restic (S3)", "ratio"], rows))
    path = write_results(
        "remote",
        {
            "benchmark": "remote",
            "profile": args.profile,
            "layer": rel(layer),
            "layer_bytes": size,
            "small_file": one,
            "entries": len(expected),
            "server": "OpenStack Swift (Debian 12) with s3api over HTTPS, 127.0.0.1",
            "sprite_env": measured,
            "restic": subprocess.run(
                ["restic", "version"], capture_output=True, text=True
            ).stdout.strip(),
            "reps": reps,
            "machine_end": machine_info(),
        },
        path=args.out or os.path.join(HERE, "results", f"remote-{args.profile}.json"),
    )
    log(f"results in {rel(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
