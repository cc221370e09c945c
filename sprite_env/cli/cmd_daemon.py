"""``sprite-env daemon``: run the API server, the checkpoint view and the scheduler."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from sprite_env.cli.options import add_common_options

if TYPE_CHECKING:
    import argparse


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "daemon",
        help="serve the API socket, the checkpoint view, auto checkpoints",
        description="Run the daemon that owns the checkpoints of one layer. Name the layer: "
        "--overlay LOWER:UPPER:WORK:MERGED (a sprite: checkpoints hold UPPER; reset goes "
        "back to LOWER) or --root DIR (checkpoints hold DIR itself; no reset). There is no "
        "default: --root / must be asked for. @FILE reads flags from FILE, one or more a "
        "line, # for comments (what the systemd unit of `sprite-env install-unit` uses); "
        "flags after it override it.",
        fromfile_prefix_chars="@",
    )
    p.convert_arg_line_to_args = _config_line  # type: ignore[method-assign,assignment]
    p.add_argument("--state", metavar="DIR", help="state directory (default: ROOT/.sprite)")
    p.add_argument("--socket-group", metavar="GROUP", help="let GROUP use the socket (mode 0660)")
    p.add_argument(
        "--auto-interval",
        type=float,
        default=60.0,
        metavar="MIN",
        help="take an auto checkpoint every MIN minutes when the layer changed (0: never)",
    )
    p.add_argument(
        "--max-checkpoints",
        type=int,
        default=200,
        metavar="N",
        help="quota: at most N checkpoints; auto ones are pruned first, manual ones never",
    )
    p.add_argument(
        "--view-count", type=int, default=5, metavar="N", help="checkpoints shown in the view"
    )
    p.add_argument(
        "--view-auto", action="store_true", help="show automatic checkpoints in the view too"
    )
    p.add_argument("--no-view", action="store_true", help="do not mount STATE/checkpoints")
    p.add_argument(
        "--no-journal",
        action="store_true",
        help="no change journal: every checkpoint walks the whole layer (by default a "
        "fanotify journal narrows the walk to what changed, on kernels that support it)",
    )
    p.add_argument(
        "--overlay",
        metavar="LOWER:UPPER:WORK:MERGED",
        help="mount overlayfs: LOWER the base image, UPPER the layer checkpoints hold, "
        "MERGED the environment's root (restores unmount and remount it)",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds a client may take to send a whole request",
    )
    add_common_options(p)
    p.set_defaults(func=cmd_daemon)


def cmd_daemon(args: argparse.Namespace) -> int:
    from sprite_env.daemon.service import run_from_args

    return run_from_args(args)


def _config_line(line: str) -> list[str]:
    """A line of a daemon's @FILE: shell words (``--overlay /a:/b:/c:/d``), ``#`` comments."""
    return shlex.split(line, comments=True)
