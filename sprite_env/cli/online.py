"""The checkpoint commands as clients of the daemon's API (the default way they run).

Each command is one or two calls of :class:`sprite_env.client.Client`; jobs (create,
restore, reset) show their event stream as it comes (``progress.EventDisplay``) and print
the result; ``--json`` prints the API's JSON as is (a stream as NDJSON lines). This module
must not import the engine or the store: start-up time is what a client costs.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import TYPE_CHECKING, cast

from sprite_env.cli import options, render
from sprite_env.cli.progress import EventDisplay
from sprite_env.client import Client, file_chunks
from sprite_env.errors import UserError

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    from sprite_env.api import shapes
    from sprite_env.client import Event, OnEvent


def client(args: argparse.Namespace) -> Client:
    """The client the options ask for; says on stderr when it waits for the daemon."""
    return Client(args.socket, actor=options.actor(args), notice=render.warn)


def follow_hint(job: int) -> str:
    return f"follow it with: sprite-env curl /v1/jobs/{job}/events"


def run_job(args: argparse.Namespace, start: Callable[[OnEvent], Event]) -> Event:
    """Runs ``start(on_event)`` while showing the job's events; returns its last event.

    Ctrl-C stops following, not the job: the daemon carries on, and this says how to
    follow it again.
    """
    with EventDisplay(as_json=args.json) as display:
        try:
            return start(display)
        except KeyboardInterrupt:
            display.close()
            if display.job is not None:
                render.warn(f"job {display.job} goes on in the daemon; {follow_hint(display.job)}")
            raise


def create(args: argparse.Namespace) -> int:
    c = client(args)
    done = run_job(
        args,
        lambda on_event: c.create(
            args.comment,
            auto=args.auto,
            reason=args.reason,
            created_by=args.created_by,
            wait_remote=args.wait_remote,
            on_event=on_event,
        ),
    )
    if args.json:
        return 0
    cp = done.get("checkpoint")
    if done.get("skipped") or not isinstance(cp, dict):
        print(done.get("data") or f"Checkpoint {done.get('id')}")
        return 0
    for w in cp.get("warnings") or []:
        render.warn(f"warning: {w['path']}: {w['message']}")
    print(render.created_line(cast("shapes.Checkpoint", cp)))
    return 0


def list_(args: argparse.Namespace) -> int:
    c = client(args)
    rows = c.list(include_auto=True, history=args.history)
    render.show_checkpoints(render.listed(rows, args.include_auto), as_json=args.json)
    interrupted = c.status().get("interrupted_restore")
    render.warn_interrupted(interrupted if isinstance(interrupted, dict) else None)
    return 0


def info(args: argparse.Namespace) -> int:
    render.show_checkpoint(client(args).info(args.id), as_json=args.json)
    return 0


def delete(args: argparse.Namespace) -> int:
    render.show_deleted(client(args).delete(args.id, dry_run=args.dry_run), as_json=args.json)
    return 0


def diff(args: argparse.Namespace) -> int:
    d = client(args).diff(args.a, args.b)
    if args.json:
        render.print_json(d)
    else:
        for line in render.diff_lines(args.a, args.b, d.get("changes") or []):
            print(line)
    return 0


def restore(args: argparse.Namespace) -> int:
    c = client(args)
    if args.preview:
        pv = c.preview(args.id, paths=args.path)
        if args.json:
            render.print_json(pv)
        else:
            changes = pv.get("changes") or []
            print("\n".join(render.preview_lines(args.id, pv["counts"], changes, limit=None)))
        return 0
    if render.should_ask(args.yes):  # a person at a terminal: show the preview, ask
        pv = c.preview(args.id, paths=args.path)
        lines = render.preview_lines(
            args.id, pv["counts"], pv.get("changes") or [], limit=render.PREVIEW_LINES
        )
        if not render.confirm(f"Restore {_restored(args)}?", lines, what="restore", flag="--yes"):
            return render.EXIT_DECLINED

    def start(on_event: OnEvent) -> Event:
        def seen(event: Event) -> None:
            on_event(event)
            if event.get("ends_sessions"):
                raise _SessionsEnd(event)

        return c.restore(args.id, on_event=seen, detach=args.detach, paths=args.path)

    if c.status().get("base_image") is not None:
        # Under an overlay the restore ends the sessions using MERGED, maybe this one,
        # with SIGTERM (SIGKILL 5 s later) and a hang-up: this process must live long
        # enough to print the undo id, and it exits right after.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        done = run_job(args, start)
    except _SessionsEnd as end:
        return _sessions_end(args, end.event)
    return _finish(args, done, _restored(args))


def _restored(args: argparse.Namespace) -> str:
    """What a restore restores, for its last line: ``v3``, or ``/a, /b from v3``."""
    return f"{', '.join(args.path)} from {args.id}" if args.path else str(args.id)


def cat(args: argparse.Namespace) -> int:
    """A file of any checkpoint, byte for byte on stdout; ``--json`` also shows any other
    entry (a directory with its entries) as JSON."""
    with client(args).open_file(args.id, os.fsencode(args.path)) as reply:
        if not (reply.headers.get("content-type") or "").startswith("application/octet-stream"):
            entry = json.loads(reply.read())
            if args.json:
                render.print_json(entry)
                return 0
            raise UserError(render.not_a_file(args.id, entry))
        out = sys.stdout.buffer
        for chunk in file_chunks(reply):
            out.write(chunk)
        out.flush()
    return 0


def export(args: argparse.Namespace) -> int:
    """The daemon writes the checkpoint into DEST (made absolute here: same machine)."""
    dest = os.path.abspath(args.dest)
    c = client(args)
    done = run_job(
        args, lambda on_event: c.export(args.id, dest, paths=args.path, on_event=on_event)
    )
    if not args.json:
        print(render.exported_line(args.id, dest, done.get("stats") or {}))
    return 0


class _SessionsEnd(Exception):
    """The restore is about to end this command's own session (an overlay)."""

    def __init__(self, event: Event) -> None:
        super().__init__("sessions end")
        self.event = event


def _sessions_end(args: argparse.Namespace, event: Event) -> int:
    """Says what a script needs (the job, the undo id, how to check) and returns while
    the daemon takes the environment down: it would end this process too (issue 10)."""
    job, undo = event.get("job"), event.get("undo")
    try:
        if args.json:
            render.print_json(event)
        else:
            print(
                f"Restore of {args.id} accepted as job {job}: it ends the sessions using the layer."
            )
            print(f"Undo with: sprite-env restore {undo} --yes")
            print(f"Afterwards check it with: sprite-env curl /v1/jobs/{job}/events")
        sys.stdout.flush()
    except OSError:  # the terminal went away with its session: nothing left to tell
        pass
    return 0


def reset(args: argparse.Namespace) -> int:
    c = client(args)
    # Without a base image the daemon refuses a reset (it would empty the root): ask it
    # at once rather than prompt for something that cannot happen.
    refused = c.status().get("base_image") is None
    if (
        not args.yes
        and not refused
        and not render.confirm(
            "Reset the layer to its base image?", render.reset_lines(), what="reset", flag="--yes"
        )
    ):
        return render.EXIT_DECLINED
    done = run_job(args, lambda on_event: c.reset(on_event=on_event, detach=args.detach))
    return _finish(args, done, None)


def _finish(args: argparse.Namespace, done: Event, cid: str | None) -> int:
    """Prints the end of a restore (of ``cid``) or a reset (``cid`` None), or, detached,
    where to follow it."""
    if args.json:
        return 0
    if args.detach and done.get("type") != "complete":
        what = f"Restore of {cid}" if cid is not None else "Reset"
        job = done.get("job")
        print(f"{what} runs as job {job}; {follow_hint(job) if isinstance(job, int) else ''}")
        return 0
    if done.get("noop"):
        print(done.get("data"))
        return 0
    for w in done.get("warnings") or []:
        render.warn(f"warning: {w}")
    print(render.restored_line(cid, done.get("stats") or {}, done.get("undo")))
    return 0


def activity(args: argparse.Namespace) -> int:
    entries = client(args).activity(limit=args.limit)
    if args.json:
        render.print_json(entries)
    elif entries:
        print(render.activity_table(entries))
    else:
        print("no activity yet")
    return 0
