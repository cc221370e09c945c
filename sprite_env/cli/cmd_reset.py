"""``sprite-env reset``: empty the layer back to the base image (undoable, like a restore)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sprite_env.cli.cmd_checkpoints import either
from sprite_env.cli.options import add_common_options, is_offline
from sprite_env.errors import UserError

if TYPE_CHECKING:
    import argparse


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "reset",
        help="empty the layer back to the base image (auto checkpoint first; only a "
        "daemon with --overlay has a base image)",
    )
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    p.add_argument(
        "--detach",
        action="store_true",
        help="return once the daemon took the job; print how to follow it",
    )
    add_common_options(p)
    p.set_defaults(func=cmd_reset)


def cmd_reset(args: argparse.Namespace) -> int:
    if args.detach and is_offline(args):
        raise UserError("--detach needs the daemon (offline, a reset runs in this process)")
    return either("reset")(args)
