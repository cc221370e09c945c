"""Entry point of the ``sprite-env`` command.

Exit codes (this is the one place they are defined; README and llm.txt copy this table):

====  ==========================================================================
0     success
1     unexpected internal error (a bug: printed with a traceback)
2     bad usage or input (unknown command, bad option, bad id)
3     store error: damaged, not a store, wrong format; ``store check`` found problems
4     busy: the store is locked by another process
130   interrupted (Ctrl-C)
====  ==========================================================================
"""

from __future__ import annotations

import argparse
import sys
import traceback
from typing import TYPE_CHECKING

from sprite_env import __version__
from sprite_env.cli import cmd_checkpoints, cmd_daemon, cmd_demo, cmd_mount, cmd_store
from sprite_env.cli.options import add_common_options
from sprite_env.errors import SpriteError

if TYPE_CHECKING:
    from collections.abc import Sequence

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sprite-env",
        description="Checkpoints of a sandbox VM's writable filesystem layer.",
    )
    parser.add_argument("--version", action="version", version=f"sprite-env {__version__}")
    add_common_options(parser, top=True)
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    cmd_checkpoints.add_parser(sub)
    cmd_mount.add_parser(sub)
    cmd_checkpoints.add_restore_parser(sub)
    cmd_store.add_parser(sub)
    cmd_demo.add_parser(sub)
    cmd_daemon.add_parser(sub)
    return parser


def exit_code_for(error: BaseException) -> int:
    """Maps an exception to the process exit code (see the module docstring)."""
    if isinstance(error, SpriteError):
        return error.exit_code
    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return EXIT_INTERNAL


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except SpriteError as e:
        print(f"sprite-env: {e}", file=sys.stderr)
        return exit_code_for(e)
    except KeyboardInterrupt as e:
        print("sprite-env: interrupted", file=sys.stderr)
        return exit_code_for(e)
    except Exception as e:  # a bug: show everything
        traceback.print_exc()
        return exit_code_for(e)


if __name__ == "__main__":
    sys.exit(main())
