"""``sprite-env curl PATH``: one raw request to the daemon's API socket, curl-style.

Prints the body as it arrives (an event stream line by line), so
``sprite-env curl /v1/jobs/7/events`` follows a job to its end. Like curl, the exit status
is 0 whatever the HTTP status unless ``--fail``/``-f`` (then 22 on a status of 400 or
more, the body going to stderr); a daemon that does not answer exits 5.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from sprite_env.cli.options import add_common_options
from sprite_env.errors import UserError

if TYPE_CHECKING:
    import argparse

#: curl's own exit status for "HTTP error with --fail" (``CURLE_HTTP_RETURNED_ERROR``).
EXIT_HTTP_ERROR = 22


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "curl",
        help="send one request to the daemon's API socket and print the answer",
        description="Send one request to the daemon's API socket and print the answer as "
        "it arrives, e.g.: sprite-env curl /v1/checkpoints; "
        'sprite-env curl -X POST -d \'{"comment": "x"}\' /v1/checkpoint',
    )
    p.add_argument("path", help="the request path, e.g. /v1/status (a leading / may be left out)")
    p.add_argument(
        "-X", "--request", dest="method", metavar="METHOD", help="default: GET, POST with -d"
    )
    p.add_argument(
        "-d", "--data", metavar="DATA", help="the body (JSON); @FILE reads FILE, @- stdin"
    )
    p.add_argument(
        "-H",
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="add or replace a header (repeatable)",
    )
    p.add_argument("-i", "--include", action="store_true", help="print the status and headers too")
    p.add_argument(
        "-f", "--fail", action="store_true", help="exit 22 when the status is 400 or more"
    )
    add_common_options(p, offline=False)
    p.set_defaults(func=cmd_curl)


def _headers(lines: list[str]) -> list[tuple[str, str]]:
    out = []
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            raise UserError(f"bad header {line!r}: expected 'NAME: VALUE'")
        out.append((name.strip(), value.strip()))
    return out


def _body(data: str | None) -> bytes | None:
    if data is None:
        return None
    if data == "@-":
        return sys.stdin.buffer.read()
    if data.startswith("@"):
        try:
            with open(data[1:], "rb") as f:
                return f.read()
        except OSError as e:
            raise UserError(f"cannot read {data[1:]}: {e.strerror}") from None
    return data.encode()


def cmd_curl(args: argparse.Namespace) -> int:
    from sprite_env.cli.online import client

    path = args.path if args.path.startswith("/") else "/" + args.path
    body = _body(args.data)
    method = (args.method or ("POST" if body is not None else "GET")).upper()
    headers = _headers(args.header)
    out = sys.stdout.buffer
    with client(args).open_reply(method, path, body, headers) as reply:
        failed = args.fail and reply.status >= 400
        if args.include:
            out.write(f"HTTP/1.1 {reply.status} {reply.reason}\r\n".encode())
            for name, value in reply.headers.items():
                out.write(f"{name}: {value}\r\n".encode())
            out.write(b"\r\n")
            out.flush()
        dest = sys.stderr.buffer if failed else out
        for chunk in reply.chunks():
            dest.write(chunk)
            dest.flush()
    if failed:
        print(f"sprite-env: HTTP {reply.status} {reply.reason}", file=sys.stderr)
        return EXIT_HTTP_ERROR
    return 0
