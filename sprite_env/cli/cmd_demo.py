"""``sprite-env demo``: the built-in end-to-end demonstration (see ``sprite_env/demo.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sprite_env.demo import run_demo

if TYPE_CHECKING:
    import argparse


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="run a daemon on a sample layer and checkpoint, change, restore and check it",
        description="Build a sample layer in a temporary directory, start a sprite-env daemon "
        "on it, and run the checkpoint commands against it, showing each with its output. "
        "Exits 1 if any step fails.",
    )
    p.add_argument(
        "--dir", metavar="DIR", help="work in DIR (and keep the files) instead of a temporary one"
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument(
        "--no-view",
        action="store_true",
        help="run the daemon without its checkpoint view (as when /dev/fuse is missing)",
    )
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    ok = run_demo(args.dir, keep=args.keep, view=False if args.no_view else None)
    return 0 if ok else 1
