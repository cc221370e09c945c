"""The checkpoint commands run offline: the engine in this process, on ``--root``/``--store``.

This is how every command worked before the daemon, and still how they work when
``--root`` or ``--store`` is given: the command opens the store itself, taking its lock, so
it refuses ("locked", exit 4) while a daemon (or a mount) holds that store. Output matches
the online path (``render.py``), ``--json`` included: the API's shapes (``api/shapes.py``),
and for a job (create, restore, export) the ``complete`` event its stream would end with
(offline there is no job, so no ``job`` number and no earlier events).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import TYPE_CHECKING, Any, cast

from sprite_env.api import events, shapes
from sprite_env.checkpoints import Engine
from sprite_env.checkpoints.engine import CHECK_HINT
from sprite_env.cli import render
from sprite_env.cli.options import actor, remote, root_dir, store_dir, store_given
from sprite_env.cli.progress import EventDisplay
from sprite_env.errors import NotAStore, StoreError, UserError
from sprite_env.snapshot.paths import entry_json
from sprite_env.snapshot.tree import Kind
from sprite_env.store.repository import MARKER

if TYPE_CHECKING:
    import argparse

    from sprite_env.api.events import Event
    from sprite_env.checkpoints.engine import Progress, RestoreReport
    from sprite_env.snapshot.tree import TreeEntry


def _engine(args: argparse.Namespace) -> Engine:
    """The engine on ``--root``/``--store``. It never creates a store (issue 10: a list or
    an export made ``DIR/.sprite/store`` inside the layer, or ``/.sprite/store`` on the
    host): only ``store init`` does."""
    store = store_dir(args)
    bucket = remote(args)
    try:
        # ROOT/.sprite holds the default store (and mount point): like the daemon's state
        # directory it is not part of the layer, so no checkpoint shows it (issue 10).
        private = [] if store_given(args) else [os.path.join(root_dir(args), ".sprite")]
        return Engine(
            root_dir(args),
            store,
            excludes=args.exclude,
            exclude_dirs=private,
            create=False,
            remote=bucket,
        )
    except NotAStore:
        if bucket is not None or os.path.lexists(os.path.join(store, MARKER)):
            raise  # a store, but unreadable or of a newer format (or none in the bucket)
        where = f"--store {args.store}" if args.store else f"--root {root_dir(args)}"
        raise NotAStore(
            f"no sprite-env store at {store} (nothing was created). Create one with: "
            f"sprite-env {where} store init; or, to use the daemon's store, leave out "
            "--root and --store"
        ) from None


def _created_by(args: argparse.Namespace) -> str:
    return actor(args, getattr(args, "created_by", None))


class _Progress:
    """The engine's progress callback, shown as the online path shows a job's events
    (nothing with ``--json``: the result is the only output)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.display = None if args.json else EventDisplay(as_json=False)

    def __enter__(self) -> Progress | None:
        display = self.display
        if display is None:
            return None
        display.__enter__()

        def show(phase: str, counters: Any) -> None:
            if dataclasses.is_dataclass(counters) and not isinstance(counters, type):
                fields = dataclasses.asdict(counters)
            elif isinstance(counters, tuple):  # prune: (bytes done, bytes to copy)
                fields = {"done": counters[0], "total": counters[1]}
            else:
                fields = {}
            display({"type": "progress", "phase": phase, **fields})

        return show

    def __exit__(self, *exc: object) -> None:
        if self.display is not None:
            self.display.close()


def create(args: argparse.Namespace) -> int:
    who = _created_by(args)  # a bad --as is refused before the store is even opened
    bucket = remote(args)
    if args.wait_remote and bucket is None:
        from sprite_env.daemon.uploader import NoRemote

        raise NoRemote("this store", "give")
    with _Progress(args) as progress, _engine(args) as e:
        cp = e.create(
            args.comment or args.reason or "",
            created_by=who,
            auto=args.auto,
            progress=progress,
        )
        active = e.active()
        where = "local"
        if args.wait_remote and bucket is not None:  # no daemon: this process uploads
            from sprite_env.daemon.uploader import UPLOAD_PHASE, push_checkpoints

            show = (lambda p: progress(UPLOAD_PHASE, p)) if progress else None
            push_checkpoints(e, bucket.storage(), show)
            where = "remote"
    shown = {**cp.to_json(active=active), "storage": where}
    if args.json:
        done = f"Checkpoint {cp.id} created successfully"
        render.print_json(events.complete(None, done, id=cp.id, checkpoint=shown))
    else:
        for w in cp.warnings:
            render.warn(f"warning: {w['path']}: {w['message']}")
        print(render.created_line(cast("shapes.Checkpoint", shown)))
    return 0


def list_(args: argparse.Namespace) -> int:
    with _engine(args) as e:
        # The engine's JSON is the API's (shapes.Checkpoint): the daemon answers with it.
        rows = cast("list[shapes.Checkpoint]", e.listing(include_auto=True, history=args.history))
        interrupted = e.interrupted_restore()
    render.show_checkpoints(render.listed(rows, args.include_auto), as_json=args.json)
    render.warn_interrupted(interrupted)
    return 0


def info(args: argparse.Namespace) -> int:
    with _engine(args) as e:
        c = cast("shapes.Checkpoint", e.info_json(args.id))
    render.show_checkpoint(c, as_json=args.json)
    return 0


def delete(args: argparse.Namespace) -> int:
    with _engine(args) as e:
        done = e.plan_delete([args.id]) if args.dry_run else e.delete(args.id)
        rep = cast("shapes.DeleteReport", done.to_json())
    render.show_deleted(rep, as_json=args.json)
    return 0


def diff(args: argparse.Namespace) -> int:
    with _engine(args) as e:
        changes = [cast("shapes.DiffEntry", d.to_json()) for d in e.diff(args.a, args.b)]
    if args.json:
        render.print_json(shapes.diff(args.a, args.b, changes))
    else:
        for line in render.diff_lines(args.a, args.b, changes):
            print(line)
    return 0


def export(args: argparse.Namespace) -> int:
    with _engine(args) as e:  # first: a user who may not open the store is told so
        try:
            os.makedirs(args.dest, exist_ok=True)
        except OSError as err:
            raise UserError(f"cannot create {args.dest}: {err.strerror}") from None
        st = e.export(args.id, args.dest, paths=args.path)
    if args.json:
        done = f"Exported {args.id} to {args.dest}"
        paths = args.path or []
        render.print_json(
            events.complete(None, done, id=args.id, dest=args.dest, paths=paths, stats=st.__dict__)
        )
    else:
        print(render.exported_line(args.id, args.dest, st.__dict__))
    return 0


def cat(args: argparse.Namespace) -> int:
    with _engine(args) as e:
        entry, read = e.find(args.id, os.fsencode(args.path))
        if entry.kind is not Kind.FILE:
            shown = _entry_json(args.id, os.fsencode(args.path), entry, e)
            if args.json:
                render.print_json(shown)
                return 0
            raise UserError(render.not_a_file(args.id, shown))
        out = sys.stdout.buffer
        try:
            for block in e.read_file(entry, read):
                out.write(block)
        except StoreError as err:  # what was written is a prefix: say so, exit 3
            raise StoreError(
                f"checkpoint {args.id} is damaged at {args.path}: {err} (see: {CHECK_HINT})"
            ) from None
        out.flush()
    return 0


def _entry_json(cid: str, path: bytes, entry: TreeEntry, e: Engine) -> shapes.Entry:
    """The API's JSON of a non-file entry (``GET /v1/checkpoints/{id}/files/{path}``)."""
    children = e.entries(entry) if entry.kind is Kind.DIR else None
    return cast("shapes.Entry", entry_json(cid, path, entry, children))


def restore(args: argparse.Namespace) -> int:
    with _engine(args) as e:
        if args.preview or render.should_ask(args.yes):
            pv = e.preview_paths(args.id, args.path) if args.path else e.preview(args.id)
            counts = pv.counts()
            changes = pv.to_json()["changes"]
            if args.preview:
                if args.json:  # the API's shape
                    render.print_json(pv.to_json())
                else:
                    print("\n".join(render.preview_lines(args.id, counts, changes, limit=None)))
                return 0
            lines = render.preview_lines(args.id, counts, changes, limit=render.PREVIEW_LINES)
            what = f"{', '.join(args.path)} from {args.id}" if args.path else args.id
            if not render.confirm(f"Restore {what}?", lines, what="restore", flag="--yes"):
                return render.EXIT_DECLINED
        with _Progress(args) as progress:
            if args.path:  # those paths only (issue 10, point 5)
                rep = e.restore_paths(
                    args.id, args.path, created_by=_created_by(args), progress=progress
                )
            else:
                rep = e.restore(args.id, created_by=_created_by(args), progress=progress)
    if args.json:
        render.print_json(_restored_event(args, rep))
    elif rep.noop and args.path:
        print(f"{', '.join(args.path)} already as in {rep.id}: nothing to restore")
    elif rep.noop:
        print(f"The layer already is {rep.id}: nothing to restore")
    else:
        _print_warnings(rep.warnings)
        done = f"{', '.join(args.path)} from {rep.id}" if args.path else rep.id
        print(render.restored_line(done, rep.stats.__dict__, rep.undo))
    return 0


def _restored_event(args: argparse.Namespace, rep: RestoreReport) -> Event:
    """The ``complete`` event the daemon's restore job ends with, for this restore."""
    shown = ", ".join(args.path or [])
    paths = {"paths": args.path} if args.path else {}
    if rep.noop:
        said = f"{shown} already as in {rep.id}" if args.path else f"The layer already is {rep.id}"
        return events.complete(
            None, f"{said}: nothing to restore", id=rep.id, undo=None, noop=True, **paths
        )
    said = f"Restore of {shown} from {rep.id}" if args.path else f"Restore from {rep.id}"
    return events.complete(
        None, f"{said} complete", id=rep.id, undo=rep.undo, **paths, stats=rep.to_json()
    )


def reset(args: argparse.Namespace) -> int:
    # Offline there is no base image to go back to (only the daemon's --overlay has one):
    # a reset here would empty the layer itself, the root of a machine included (issue 10).
    raise UserError(
        "reset needs a base image below the layer, which only a daemon started with "
        "--overlay has; offline, nothing was changed. To go back to a checkpoint, use: "
        "sprite-env --root DIR restore ID"
    )


def _print_warnings(warnings: list[Any]) -> None:
    for w in warnings:
        render.warn(f"warning: {w}")


def activity(args: argparse.Namespace) -> int:
    raise UserError("the activity log is the daemon's: run without --root and --store")
