"""``sprite-env checkpoints mount`` and ``unmount``: the read-only view, standalone.

Until the daemon hosts the view, this command serves it from a process of its own. That
process opens the store **read-only** (a shared lock): ``store check`` and ``store stats``
keep working while it runs, but every command that opens the store for writing (``create``,
``delete``, ``restore``, even ``list``, which opens it through the engine) is refused with
"locked" (exit 4) until it is unmounted. So the listing it shows is fixed for its life; a
host that owns the engine (the daemon) shows checkpoints as they come and go.

Without ``--foreground`` the command starts the server in the background, waits until the
mount is ready (or failed) and returns; ``checkpoints unmount`` (or ``fusermount3 -u``)
stops it. With ``--foreground`` it serves until SIGINT, SIGTERM or SIGHUP, then unmounts.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import resource
import sys
from typing import TYPE_CHECKING

from sprite_env.cli.options import add_common_options, remote, root_dir, store_dir
from sprite_env.errors import SpriteError

if TYPE_CHECKING:
    from sprite_env.fuse import ViewOperations


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``mount`` and ``unmount`` under the ``checkpoints`` command (added before)."""
    csub = _subcommands(sub.choices["checkpoints"])

    q = csub.add_parser("mount", help="browse the newest checkpoints read-only (FUSE)")
    q.add_argument(
        "mountpoint", nargs="?", help="where (default: ROOT/.sprite/checkpoints, created)"
    )
    q.add_argument("--count", type=_positive, default=5, help="how many, newest first (5)")
    q.add_argument("--include-auto", action="store_true", help="automatic ones count too")
    q.add_argument("--foreground", "-f", action="store_true", help="serve until a signal")
    q.add_argument("--log", metavar="FILE", help="in the background, log here")
    q.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)  # background handshake
    add_common_options(q)
    q.set_defaults(func=cmd_mount)

    q = csub.add_parser("unmount", aliases=["umount"], help="unmount the checkpoint view")
    q.add_argument("mountpoint", nargs="?", help="default: ROOT/.sprite/checkpoints")
    add_common_options(q)
    q.set_defaults(func=cmd_unmount)


def _subcommands(
    parser: argparse.ArgumentParser,
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise AssertionError("the checkpoints command has no subcommands")


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return n


def _mountpoint(args: argparse.Namespace) -> str:
    if args.mountpoint:
        return os.path.abspath(str(args.mountpoint))
    default = os.path.join(os.path.abspath(root_dir(args)), ".sprite", "checkpoints")
    os.makedirs(default, exist_ok=True)
    return default


def cmd_mount(args: argparse.Namespace) -> int:
    mountpoint = _mountpoint(args)
    if not args.foreground:
        return _start_in_background(args, mountpoint)
    import logging  # here, not at the top: every other command starts faster without them

    import trio

    from sprite_env.fuse import StoreSource, ViewConfig, serve_until_signal
    from sprite_env.store.backend import open_backed_store

    config = ViewConfig(count=args.count, include_auto=args.include_auto)
    _raise_open_files_limit()
    logging.basicConfig(level=logging.INFO, format="sprite-env mount: %(levelname)s %(message)s")
    ready_fd: int | None = args.ready_fd

    def ready(ops: ViewOperations) -> None:
        ids = [r.id for r in ops.listing]
        if ready_fd is not None:
            _tell(ready_fd, "ready " + json.dumps({"mountpoint": mountpoint, "shown": ids}))
        elif args.json:
            print(json.dumps({"mountpoint": mountpoint, "shown": ids, "pid": os.getpid()}))
        else:
            print(
                f"{', '.join(ids) or 'no checkpoints'} mounted at {mountpoint} (Ctrl-C to unmount)",
                file=sys.stderr,
            )
        sys.stdout.flush()

    try:
        with open_backed_store(store_dir(args), remote(args), writable=False) as store:
            source = StoreSource(store)
            trio.run(
                functools.partial(serve_until_signal, source, mountpoint, config, on_ready=ready)
            )
    except SpriteError as e:
        if ready_fd is not None:
            _tell(ready_fd, f"error {e}")
        raise
    return 0


def _raise_open_files_limit() -> None:
    """Open files keep descriptors of their packs (see ``fuse/source.py``): a server may
    need more than the usual soft limit of 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _tell(fd: int, message: str) -> None:
    try:
        os.write(fd, message.encode() + b"\n")
        os.close(fd)
    except OSError:  # the parent gave up waiting
        pass


def _start_in_background(args: argparse.Namespace, mountpoint: str) -> int:
    """Runs this command again with ``--foreground`` in a new session, and waits until
    it says ready (or failed) on a pipe."""
    argv = [
        sys.executable,
        "-m",
        "sprite_env",
        "--root",
        os.path.abspath(root_dir(args)),
        "--store",
        store_dir(args) if remote(args) is None else args.store,
        *(["--cache-size", args.cache_size] if args.cache_size is not None else []),
        "checkpoints",
        "mount",
        mountpoint,
        "--foreground",
        "--count",
        str(args.count),
        *(["--include-auto"] if args.include_auto else []),
    ]
    import subprocess

    r, w = os.pipe()
    with contextlib.ExitStack() as stack:
        stack.callback(os.close, w)
        log = stack.enter_context(open(args.log, "ab")) if args.log else subprocess.DEVNULL
        proc = subprocess.Popen(
            [*argv, "--ready-fd", str(w)],
            pass_fds=[w],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )
    with os.fdopen(r, "rb") as f:  # EOF without "ready": it failed
        answer = f.read().decode(errors="replace").strip()
    if answer.startswith("ready "):
        info = json.loads(answer[len("ready ") :])
        if args.json:
            print(json.dumps({**info, "pid": proc.pid}))
        else:
            shown = ", ".join(info["shown"]) or "no checkpoints"
            print(
                f"{shown} mounted at {mountpoint} (pid {proc.pid}; unmount with: "
                f"sprite-env checkpoints unmount {mountpoint})"
            )
        return 0
    code = proc.wait()
    message = answer[len("error ") :] if answer.startswith("error ") else answer
    print(f"sprite-env: {message or f'mount failed (exit {code})'}", file=sys.stderr)
    return code or 1


def cmd_unmount(args: argparse.Namespace) -> int:
    from sprite_env.fuse import unmount

    mountpoint = (
        os.path.abspath(args.mountpoint)
        if args.mountpoint
        else os.path.join(os.path.abspath(root_dir(args)), ".sprite", "checkpoints")
    )
    unmount(mountpoint)
    if args.json:
        print(json.dumps({"unmounted": mountpoint}))
    return 0
