"""``sprite-env mcp``: the MCP server for coding agents (see ``sprite_env/mcp_server.py``).

Registered through ``_add_deferred`` in ``cli/main.py``: the SDK (pydantic, anyio,
starlette) loads only when this command runs, never for ``checkpoints list``.
"""

from __future__ import annotations

import argparse

from sprite_env.actor import clean_actor
from sprite_env.mcp_server import SCOPES, serve


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "mcp",
        help="serve checkpoints as MCP tools to a coding agent, over stdin/stdout",
        description="An MCP server on stdin/stdout for a coding agent (register the command "
        "line 'sprite-env mcp' with the agent's MCP client). It talks to the daemon's socket; "
        "when a session starts it takes an automatic checkpoint 'before <client> session' "
        "(skipped when nothing changed and the newest is under 10 minutes old).",
    )
    p.add_argument(
        "--scope",
        choices=SCOPES,
        default="create",
        help="read: list, get, diff, preview, read files; create: also checkpoint_create; "
        "full: also restore, restore paths, delete, reset (default: create)",
    )
    p.add_argument(
        "--as",
        dest="actor",
        metavar="NAME",
        default=argparse.SUPPRESS,
        help="who the activity log names (default: the MCP client's name/version)",
    )
    p.add_argument(
        "--socket",
        metavar="PATH",
        default=argparse.SUPPRESS,
        help="the daemon's API socket (default: $SPRITE_API_SOCK, else /.sprite/api.sock)",
    )
    p.add_argument(
        "--no-session-checkpoint",
        action="store_true",
        help="take no automatic checkpoint when a session starts",
    )
    p.set_defaults(func=cmd_mcp)


def cmd_mcp(args: argparse.Namespace) -> int:
    actor = getattr(args, "actor", None)
    serve(
        args.scope,
        actor=clean_actor(actor, "user") if actor is not None else None,
        socket_path=getattr(args, "socket", None),
        session_checkpoint=not args.no_session_checkpoint,
    )
    return 0
