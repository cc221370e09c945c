"""``sprite-env demo``: the built-in end-to-end demonstration (see ``sprite_env/demo.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sprite_env.demo import run_demo

if TYPE_CHECKING:
    import argparse


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="store, change, read back and check a sample tree")
    p.add_argument("--dir", metavar="DIR", help="work here instead of a temporary directory")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    return 0 if run_demo(args.dir) else 1
