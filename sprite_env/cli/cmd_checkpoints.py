"""``sprite-env checkpoints ...`` and ``sprite-env restore``: arguments and dispatch.

Each command runs one of two ways (``options.py``): as a client of the daemon
(``online.py``, the default) or, given ``--root`` or ``--store``, on the store directly
(``offline.py``). ``log`` (the daemon's activity log) is always online. The chosen module
loads when the command runs, so a client never loads the engine.
"""

from __future__ import annotations

import argparse
import importlib
from typing import TYPE_CHECKING

from sprite_env.cli.options import add_common_options, is_offline
from sprite_env.errors import UserError

if TYPE_CHECKING:
    from collections.abc import Callable


def either(name: str) -> Callable[[argparse.Namespace], int]:
    """The command ``name`` of ``offline.py`` or ``online.py``, as the options decide."""

    def run(args: argparse.Namespace) -> int:
        if args.exclude is not None and not is_offline(args):
            raise UserError("--exclude works offline only (with --root or --store)")
        where = "offline" if is_offline(args) else "online"
        module = importlib.import_module(f"sprite_env.cli.{where}")
        return int(getattr(module, name)(args))

    return run


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("checkpoints", aliases=["checkpoint"], help="create, list, restore ...")
    csub = p.add_subparsers(dest="checkpoints_cmd", required=True, metavar="COMMAND")

    q = csub.add_parser("create", help="checkpoint the layer now")
    q.add_argument("--comment", default="", help="what this checkpoint is for")
    q.add_argument("--auto", action="store_true", help="an automatic (hidden) checkpoint")
    q.add_argument(
        "--reason",
        metavar="TEXT",
        help="with --auto: why; skipped when an auto checkpoint is under 10 minutes old "
        "and the layer still equals the checkpoint it is on",
    )
    q.add_argument(
        "--created-by",
        metavar="NAME",
        help="record NAME as its creator (default: the --as name)",
    )
    q.add_argument(
        "--wait-remote",
        action="store_true",
        help="return only once the checkpoint is durable in the store's bucket (--store "
        "s3://...), showing the upload; fails (exit 3) if the upload fails past its retries",
    )
    add_common_options(q)
    q.set_defaults(func=_create)

    q = csub.add_parser("list", aliases=["ls"], help="checkpoints, newest first")
    q.add_argument("--include-auto", action="store_true", help="show automatic ones too")
    q.add_argument("--history", metavar="ID", help="only ID and those descending from it")
    add_common_options(q)
    q.set_defaults(func=either("list_"))

    q = csub.add_parser("info", aliases=["get"], help="one checkpoint's record")
    q.add_argument("id", help="a checkpoint id (v3, auto-...)")
    add_common_options(q)
    q.set_defaults(func=either("info"))

    q = csub.add_parser("delete", aliases=["rm"], help="delete a checkpoint, freeing its space")
    q.add_argument("id", help="the checkpoint to delete (not the active one)")
    q.add_argument(
        "--dry-run", action="store_true", help="say what the delete would free; delete nothing"
    )
    add_common_options(q)
    q.set_defaults(func=either("delete"))

    add_restore_parser(csub)

    q = csub.add_parser("diff", help="changes from checkpoint A to B (default: the live tree)")
    q.add_argument("a", help="the checkpoint to compare from")
    q.add_argument("b", nargs="?", help="the checkpoint to compare to (default: the live layer)")
    add_common_options(q)
    q.set_defaults(func=either("diff"))

    q = csub.add_parser("log", help="the daemon's activity log, newest first")
    q.add_argument("--limit", type=_positive, default=100, metavar="N", help="at most N (100)")
    add_common_options(q)
    q.set_defaults(func=either("activity"))

    q = csub.add_parser(
        "export", help="write a checkpoint (any, automatic ones too) into an empty directory"
    )
    q.add_argument("id", help="the checkpoint (vN or auto-...)")
    q.add_argument(
        "dest",
        help="a missing or empty directory; through the daemon, on this machine (made absolute)",
    )
    _add_path_option(q, "export only PATH (a file or a subtree, with the directories above it)")
    add_common_options(q)
    q.set_defaults(func=either("export"))

    q = csub.add_parser(
        "cat", help="write a file of any checkpoint (automatic ones too) to stdout, byte for byte"
    )
    q.add_argument("id", help="the checkpoint (vN or auto-...)")
    q.add_argument("path", help="the file, relative to the layer's root (/etc/hosts or etc/hosts)")
    add_common_options(q)
    q.set_defaults(func=either("cat"))


def add_restore_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    q = sub.add_parser("restore", help="make the layer equal to a checkpoint (undoable)")
    q.add_argument("id", help="the checkpoint to restore (v3, auto-...)")
    q.add_argument("--preview", action="store_true", help="show what would change; do nothing")
    q.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    q.add_argument(
        "--detach",
        action="store_true",
        help="return once the daemon took the job; print how to follow it",
    )
    _add_path_option(
        q, "restore only PATH (a file or a subtree), leaving the rest of the layer as it is"
    )
    add_common_options(q)
    q.set_defaults(func=_restore)


def _add_path_option(q: argparse.ArgumentParser, what: str) -> None:
    q.add_argument(
        "--path",
        action="append",
        metavar="PATH",
        help=f"{what}; relative to the layer's root whatever the current directory; "
        "repeat for more (default: the whole checkpoint)",
    )


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return n


def _create(args: argparse.Namespace) -> int:
    if args.reason is not None and not args.auto:
        raise UserError("--reason goes with --auto")
    return either("create")(args)


def _restore(args: argparse.Namespace) -> int:
    if args.detach and is_offline(args):
        raise UserError("--detach needs the daemon (offline, a restore runs in this process)")
    return either("restore")(args)
