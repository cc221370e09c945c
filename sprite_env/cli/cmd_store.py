"""``sprite-env store ...``: check, rebuild-catalog, stats, init (always offline: these
open the store directory themselves; the store modules load only when a command runs)."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING

from sprite_env.cli.options import add_common_options, remote, store_dir
from sprite_env.cli.progress import progress_bar
from sprite_env.errors import StoreError

if TYPE_CHECKING:
    import argparse


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("store", help="inspect and repair the object store")
    ssub = p.add_subparsers(dest="store_cmd", required=True, metavar="COMMAND")

    def common(q: argparse.ArgumentParser) -> None:
        add_common_options(q)

    q = ssub.add_parser(
        "init", help="create an empty store (an existing one: upgrade its catalog's schema)"
    )
    common(q)
    q.set_defaults(func=cmd_init)
    q = ssub.add_parser(
        "check",
        help="verify every object the catalog lists, and that the store is private to its "
        "owner (exit 3 if not)",
    )
    common(q)
    q.add_argument(
        "--read-data",
        action="store_true",
        help="also re-read and re-hash every object (with --store s3://...: every pack "
        "downloaded from the bucket, not only the cached ones)",
    )
    q.set_defaults(func=cmd_check)
    q = ssub.add_parser("rebuild-catalog", help="rebuild the catalog from the packs alone")
    common(q)
    q.set_defaults(func=cmd_rebuild)
    q = ssub.add_parser("stats", help="objects, packs, bytes, dedup and compression ratios")
    common(q)
    q.set_defaults(func=cmd_stats)


def cmd_init(args: argparse.Namespace) -> int:
    from sprite_env.store.backend import open_backed_store

    with open_backed_store(store_dir(args), remote(args), create=True):
        pass
    print(
        json.dumps({"store": store_dir(args)}) if args.json else f"store ready at {store_dir(args)}"
    )
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from sprite_env.checkpoints.verify import verify_store
    from sprite_env.store.backend import open_backed_store

    with (
        open_backed_store(store_dir(args), remote(args), writable=False) as s,
        progress_bar("checking packs", enabled=not args.json) as update,
    ):
        v = verify_store(s, read_data=args.read_data, progress=update)
        advice = v.advice(s.path)
    if args.json:
        print(json.dumps({**v.to_json(), "advice": advice}))
    else:
        for w in v.warnings:
            print(f"warning: {w}", file=sys.stderr)
        for e in v.errors:
            print(f"error: {e}", file=sys.stderr)
        for a in advice:
            print(f"advice: {a}", file=sys.stderr)
        r = v.report
        what = "objects read and hashed" if args.read_data else "objects located"
        verdict = "ok" if v.ok else f"{len(v.errors)} problem(s)"
        print(f"{r.packs} packs, {r.objects} {what}: {verdict}")
    return 0 if v.ok else StoreError.exit_code


def cmd_rebuild(args: argparse.Namespace) -> int:
    from sprite_env.checkpoints.registry import recover as recover_checkpoints
    from sprite_env.store import open_store, rebuild

    with open_store(store_dir(args), repair=True) as s:
        r = rebuild(s)
        recovered = recover_checkpoints(s)
        aside = s.catalog_set_aside
    if args.json:
        print(
            json.dumps({**r.__dict__, "checkpoints_recovered": recovered, "damaged_catalog": aside})
        )
    else:
        if aside:
            print(f"warning: the damaged catalog was renamed to {aside}", file=sys.stderr)
        print(
            f"catalog rebuilt: {r.packs} packs, {r.objects} objects, "
            f"{recovered} checkpoints recovered"
        )
        for name in r.damaged_packs:
            print(f"warning: pack {name} is damaged; kept what verified", file=sys.stderr)
    return 0


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError


def cmd_stats(args: argparse.Namespace) -> int:
    from sprite_env.errors import StoreLocked
    from sprite_env.store import open_store, stats

    try:
        with open_store(store_dir(args), writable=False) as s:
            d = stats(s).to_json()
    except StoreLocked:
        # A daemon holds the store: it answers with the same figures (GET /v1/status).
        from sprite_env.client import Client

        sock = args.socket or os.path.join(os.path.dirname(store_dir(args)), "api.sock")
        d = Client(sock, wait=0).status()["store_usage"]
    if args.json:
        print(json.dumps(d))
        return 0
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(d["objects_by_kind"].items()))
    print(f"objects:      {d['objects']} ({kinds or 'none'})")
    print(f"packs:        {d['packs']} ({_size(d['pack_bytes'])} on disk)")
    print(f"raw bytes:    {_size(d['raw_bytes'])} unique, {_size(d['ingested_bytes'])} ingested")
    print(f"stored bytes: {_size(d['stored_bytes'])}")
    print(f"dedup:        {d['dedup_ratio']:.2f}x   compression: {d['compression_ratio']:.2f}x")
    free, total = _size(d["fs_free_bytes"]), _size(d["fs_total_bytes"])
    print(f"file system:  {free} free of {total}")
    return 0
