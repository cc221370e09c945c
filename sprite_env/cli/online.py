"""The checkpoint commands as clients of the daemon's API (the default way they run).

Each command is one or two calls of :class:`sprite_env.client.Client`; jobs (create,
restore, reset) show their event stream as it comes (``progress.EventDisplay``) and print
the result; ``--json`` prints the API's JSON as is (a stream as NDJSON lines). This module
must not import the engine or the store: start-up time is what a client costs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sprite_env.cli import options, render
from sprite_env.cli.progress import EventDisplay
from sprite_env.client import Client

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

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
    print(render.created_line(cp))
    return 0


def list_(args: argparse.Namespace) -> int:
    rows = client(args).list(include_auto=args.include_auto, history=args.history)
    render.show_checkpoints(rows, as_json=args.json)
    return 0


def info(args: argparse.Namespace) -> int:
    render.show_checkpoint(client(args).info(args.id), as_json=args.json)
    return 0


def delete(args: argparse.Namespace) -> int:
    render.show_deleted(client(args).delete(args.id), as_json=args.json)
    return 0


def diff(args: argparse.Namespace) -> int:
    d = client(args).diff(args.a, args.b)
    if args.json:
        render.print_json(d)
    else:
        for line in render.change_lines(d.get("changes") or []):
            print(line)
    return 0


def restore(args: argparse.Namespace) -> int:
    c = client(args)
    if args.preview:
        pv = c.preview(args.id)
        if args.json:
            render.print_json(pv)
        else:
            changes = pv.get("changes") or []
            print("\n".join(render.preview_lines(args.id, pv["counts"], changes, limit=None)))
        return 0
    if not args.yes:
        render.need_terminal(what="restore", flag="--yes")
        pv = c.preview(args.id)
        lines = render.preview_lines(
            args.id, pv["counts"], pv.get("changes") or [], limit=render.PREVIEW_LINES
        )
        if not render.confirm(f"Restore {args.id}?", lines, what="restore", flag="--yes"):
            return 1
    done = run_job(args, lambda on_event: c.restore(args.id, on_event=on_event, detach=args.detach))
    return _finish(args, done, args.id)


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
        return 1
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
