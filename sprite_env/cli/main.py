"""Entry point of the ``sprite-env`` command.

Exit codes (this is the one place they are defined; README and llm.txt copy this table):

====  ==========================================================================
0     success
1     unexpected internal error (a bug: printed with a traceback)
2     bad usage or input (unknown command, bad option, bad id, bad comment, cannot
      delete the active checkpoint, reset without --yes and no terminal, a question
      answered no); the API's
      400-class codes (``invalid_*``, ``bad_request``, ``not_found``,
      ``active_checkpoint``, ``quota_exceeded``, ...); a store or state directory this
      user may not open (private to its owner, root)
3     store error: damaged, not a store, wrong format; ``store check`` found problems
      (a store others may read among them); the API's ``store_error``, and
      ``upload_failed`` (a ``create --wait-remote`` whose upload failed)
4     busy: the store is locked by another process; the daemon's job queue is full
      (``busy``)
5     no daemon answers on the API socket (none running, or still starting after
      ``$SPRITE_API_WAIT`` seconds, default 30), or it lost the job being followed
6     a restore or reset failed part-way: the layer is partly restored, and the message
      says how to finish or roll it back (``restore_failed``; ``sprite-env checkpoints
      list`` and ``GET /v1/status`` report it until another restore replaces it)
22    ``curl --fail`` got an HTTP status of 400 or more (curl's own code)
130   interrupted (Ctrl-C); a job the daemon runs goes on
141   stdout closed early (the reader of a pipe left), as a shell reports SIGPIPE
====  ==========================================================================

Start-up: a command that talks to the daemon loads no engine, store, trio, pyfuse3 or rich
module (``python -X importtime -m sprite_env checkpoints list`` shows it). Modules that
import those at their top register through :func:`_add_deferred`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import traceback
from typing import TYPE_CHECKING

from sprite_env import __version__
from sprite_env.cli import (
    cmd_checkpoints,
    cmd_completion,
    cmd_curl,
    cmd_daemon,
    cmd_mount,
    cmd_reset,
    cmd_services,
    cmd_store,
    cmd_unit,
)
from sprite_env.cli.options import add_common_options
from sprite_env.errors import (
    DaemonUnavailable,
    SpriteError,
    StoreError,
    StoreLocked,
    UserError,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sprite-env",
        description="Checkpoints of a sandbox VM's writable filesystem layer. Commands talk "
        "to the daemon's API socket; given --root or --store they work on the store "
        "directly (offline).",
    )
    parser.add_argument("--version", action="version", version=f"sprite-env {__version__}")
    add_common_options(parser, top=True)
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    cmd_checkpoints.add_parser(sub)
    cmd_mount.add_parser(sub)
    cmd_checkpoints.add_restore_parser(sub)
    cmd_reset.add_parser(sub)
    cmd_curl.add_parser(sub)
    cmd_services.add_parser(sub)
    cmd_store.add_parser(sub)
    _add_deferred(
        sub,
        "demo",
        "sprite_env.cli.cmd_demo",
        "the whole loop against a real daemon, in a temporary directory",
    )
    _add_deferred(sub, "mcp", "sprite_env.cli.cmd_mcp", "serve checkpoints as MCP tools (stdio)")
    cmd_daemon.add_parser(sub)
    cmd_unit.add_parser(sub)
    cmd_completion.add_parser(sub)
    return parser


def _add_deferred(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, module: str, help: str
) -> None:
    """Registers command ``name`` without importing ``module`` (which imports the engine
    at its top): a placeholder takes the command's arguments as they are, and when the
    command runs, the module's real parser parses them again."""
    # No prefix character this side of NUL: every argument, "--dir" included, is kept.
    p = sub.add_parser(name, help=help, add_help=False, prefix_chars="\0")
    p.add_argument("deferred_args", nargs="*")
    p.set_defaults(func=lambda args: _run_deferred(args, name, module))


def _run_deferred(args: argparse.Namespace, name: str, module: str) -> int:
    real = argparse.ArgumentParser(prog="sprite-env")
    real_sub = real.add_subparsers(dest="cmd", required=True)
    importlib.import_module(module).add_parser(real_sub)
    rest = args.deferred_args
    del args.deferred_args
    args = real.parse_args([name, *rest], namespace=args)
    return int(args.func(args))


def error_code(error: SpriteError) -> str:
    """The stable code of an error, as the API names it (``--json`` prints it)."""
    code = getattr(error, "code", None)
    if isinstance(code, str):
        return code
    if isinstance(error, DaemonUnavailable):
        return "no_daemon"
    if isinstance(error, StoreLocked):
        return "busy"
    if isinstance(error, StoreError):
        return "store_error"
    if isinstance(error, UserError):
        return "bad_request"
    return "error"


def exit_code_for(error: BaseException) -> int:
    """Maps an exception to the process exit code (see the module docstring)."""
    if isinstance(error, SpriteError):
        return error.exit_code
    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(error, BrokenPipeError):
        return EXIT_BROKEN_PIPE
    return EXIT_INTERNAL


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except SpriteError as e:
        print(f"sprite-env: {e}", file=sys.stderr)
        if getattr(args, "json", False):  # the API's shape, so a script keeps the code
            print(json.dumps({"code": error_code(e), "message": str(e)}))
        return exit_code_for(e)
    except KeyboardInterrupt as e:
        print("sprite-env: interrupted", file=sys.stderr)
        return exit_code_for(e)
    except BrokenPipeError as e:
        # Nobody reads stdout any more: say nothing, and keep Python's exit-time flush
        # from failing again on it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return exit_code_for(e)
    except Exception as e:  # a bug: show everything
        traceback.print_exc()
        return exit_code_for(e)


if __name__ == "__main__":
    sys.exit(main())
