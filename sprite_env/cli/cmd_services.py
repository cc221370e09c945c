"""``sprite-env services list|start|stop|logs NAME``: the environment's services.

Services are defined inside the layer (``etc/sprite/services/NAME.toml``, see
``sprite_env/services/definitions.py``), so a checkpoint carries them; the daemon's
supervisor runs them, restarts them by their policy, and keeps their logs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sprite_env.cli import online, render
from sprite_env.cli.options import add_common_options

if TYPE_CHECKING:
    import argparse


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("services", help="the environment's services: list, start, stop, logs")
    ssub = p.add_subparsers(dest="services_cmd", required=True, metavar="COMMAND")
    q = ssub.add_parser("list", aliases=["ls"], help="every defined service and its state")
    add_common_options(q, offline=False)
    q.set_defaults(func=cmd_list)
    for name, fn, text in (
        ("start", cmd_start, "start a service"),
        ("stop", cmd_stop, "stop a service (its whole process group)"),
    ):
        q = ssub.add_parser(name, help=text)
        q.add_argument("name", help="the service (etc/sprite/services/NAME.toml)")
        add_common_options(q, offline=False)
        q.set_defaults(func=fn)
    q = ssub.add_parser("logs", help="the last lines a service wrote")
    q.add_argument("name", help="the service (etc/sprite/services/NAME.toml)")
    q.add_argument("-n", "--lines", type=int, default=100, help="how many (default 100)")
    add_common_options(q, offline=False)
    q.set_defaults(func=cmd_logs)


def _row(s: dict[str, Any]) -> list[str]:
    exit_ = "" if s.get("last_exit") is None else str(s["last_exit"])
    return [
        s["name"],
        s["state"],
        str(s.get("pid") or ""),
        str(s.get("restarts", 0)),
        exit_,
        render.one_line(s.get("reason") or s.get("command") or ""),
    ]


def cmd_list(args: argparse.Namespace) -> int:
    got = online.client(args).services()
    if args.json:
        render.print_json(got)
        return 0
    rows = [_row(s) for s in got["services"]]
    if rows:
        print(render.table(["NAME", "STATE", "PID", "RESTARTS", "EXIT", "COMMAND"], rows))
    else:
        print("no services defined (add etc/sprite/services/NAME.toml to the layer)")
    for e in got.get("errors", []):
        render.warn(f"skipped: {e}")
    return 0


def _one(args: argparse.Namespace, status: dict[str, Any], verb: str) -> int:
    if args.json:
        render.print_json(status)
    else:
        pid = f" (pid {status['pid']})" if status.get("pid") else ""
        print(f"{verb} {status['name']}: {status['state']}{pid}")
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    return _one(args, online.client(args).service_start(args.name), "started")


def cmd_stop(args: argparse.Namespace) -> int:
    return _one(args, online.client(args).service_stop(args.name), "stopped")


def cmd_logs(args: argparse.Namespace) -> int:
    lines = online.client(args).service_logs(args.name, args.lines)
    if args.json:
        render.print_json(lines)
    else:
        for line in lines:
            print(line)
    return 0
