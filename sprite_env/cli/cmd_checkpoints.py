"""``sprite-env checkpoints ...`` and ``sprite-env restore``: run against a store directly.

These commands open the layer's store themselves (``--root``, ``--store``); they take the
store's lock, so they wait for nothing and refuse while another process holds it.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

from sprite_env.checkpoints import Engine
from sprite_env.cli.options import add_common_options
from sprite_env.errors import UserError
from sprite_env.snapshot.diff import Change, Difference

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    from sprite_env.checkpoints.registry import Checkpoint


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("checkpoints", aliases=["checkpoint"], help="create, list, restore ...")
    csub = p.add_subparsers(dest="checkpoints_cmd", required=True, metavar="COMMAND")

    q = csub.add_parser("create", help="checkpoint the layer now")
    q.add_argument("--comment", default="", help="what this checkpoint is for")
    q.add_argument("--auto", action="store_true", help="an automatic (hidden) checkpoint")
    q.add_argument("--created-by", default="user", help="who asks (user, an agent's name)")
    add_common_options(q)
    q.set_defaults(func=cmd_create)

    q = csub.add_parser("list", aliases=["ls"], help="checkpoints, newest first")
    q.add_argument("--include-auto", action="store_true", help="show automatic ones too")
    q.add_argument("--history", metavar="ID", help="only ID and those descending from it")
    add_common_options(q)
    q.set_defaults(func=cmd_list)

    q = csub.add_parser("info", aliases=["get"], help="one checkpoint's record")
    q.add_argument("id")
    add_common_options(q)
    q.set_defaults(func=cmd_info)

    q = csub.add_parser("delete", aliases=["rm"], help="delete a checkpoint, freeing its space")
    q.add_argument("id")
    add_common_options(q)
    q.set_defaults(func=cmd_delete)

    add_restore_parser(csub)

    q = csub.add_parser("diff", help="changes from checkpoint A to B (default: the live tree)")
    q.add_argument("a")
    q.add_argument("b", nargs="?")
    add_common_options(q)
    q.set_defaults(func=cmd_diff)

    q = csub.add_parser("export", help="write a checkpoint into an empty directory")
    q.add_argument("id")
    q.add_argument("dest")
    add_common_options(q)
    q.set_defaults(func=cmd_export)


def add_restore_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    q = sub.add_parser("restore", help="make the layer equal to a checkpoint (undoable)")
    q.add_argument("id")
    q.add_argument("--preview", action="store_true", help="show what would change; do nothing")
    q.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    add_common_options(q)
    q.set_defaults(func=cmd_restore)


def _engine(args: argparse.Namespace) -> Engine:
    store = args.store or os.path.join(args.root, ".sprite", "store")
    return Engine(args.root, store, excludes=args.exclude)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _progress(args: argparse.Namespace) -> Callable[[str, Any], None] | None:
    if args.json or not sys.stderr.isatty():
        return None
    from rich.console import Console  # imported only for a terminal: ~30 ms at start-up

    err = Console(stderr=True)
    status = err.status("starting")
    status.start()

    def show(phase: str, s: Any) -> None:
        if phase == "capture":
            status.update(
                f"capturing: {s.files} files, {_size(s.bytes_read)} read, "
                f"{s.dirs_reused}/{s.dirs} dirs unchanged"
            )
        elif phase == "restore":
            status.update(
                f"restoring: {s.created} created, {s.modified} changed, "
                f"{s.removed} removed, {_size(s.bytes_written)} written"
            )
        else:
            status.update(phase)

    show.stop = status.stop  # type: ignore[attr-defined]
    return show


def _stop(progress: Callable[[str, Any], None] | None) -> None:
    if progress is not None:
        progress.stop()  # type: ignore[attr-defined]


def cmd_create(args: argparse.Namespace) -> int:
    progress = _progress(args)
    try:
        with _engine(args) as e:
            cp = e.create(
                args.comment, created_by=args.created_by, auto=args.auto, progress=progress
            )
            active = e.active()
    finally:
        _stop(progress)
    if args.json:
        print(json.dumps(cp.to_json(active=active)))
    else:
        for w in cp.warnings:
            print(f"warning: {w['path']}: {w['message']}", file=sys.stderr)
        print(
            f"Checkpoint {cp.id} created: {cp.files} files, {_size(cp.bytes)}, "
            f"{_size(cp.bytes_added)} newly stored"
        )
    return 0


def _table(rows: list[Checkpoint], active: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(box=None, pad_edge=False)
    for col in ("ID", "CREATED", "FILES", "SIZE", "ADDED", "COMMENT"):
        t.add_column(
            col,
            justify="right" if col in ("FILES", "SIZE", "ADDED") else "left",
            no_wrap=col != "COMMENT",
        )
    for c in rows:
        ident = c.id + (" (auto)" if c.is_auto else "") + (" *" if c.id == active else "")
        t.add_row(
            ident,
            c.create_time[:19].replace("T", " "),
            str(c.files),
            _size(c.bytes),
            _size(c.bytes_added),
            c.comment,
        )
    # a pipe gets whole lines, not a table folded to 80 columns
    Console(width=None if sys.stdout.isatty() else 250).print(t)


def cmd_list(args: argparse.Namespace) -> int:
    with _engine(args) as e:
        rows = e.checkpoints(include_auto=args.include_auto, history=args.history)
        active = e.active()
    if args.json:
        print(json.dumps([c.to_json(active=active) for c in rows]))
    elif rows:
        _table(rows, active)
    else:
        print("no checkpoints yet (sprite-env checkpoints create --comment ...)")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    with _engine(args) as e:
        c = e.info(args.id)
        active = e.active()
    j = c.to_json(active=active)
    if args.json:
        print(json.dumps(j))
        return 0
    print(
        f"ID:       {c.id}{' (auto)' if c.is_auto else ''}{' (active)' if j['is_active'] else ''}"
    )
    print(f"Created:  {c.create_time} by {c.created_by}")
    print(f"Comment:  {c.comment}")
    print(f"History:  {' <- '.join(c.history) if c.history else '(none)'}")
    print(f"Files:    {c.files} files in {c.dirs} directories, {_size(c.bytes)}")
    print(f"Stored:   {_size(c.bytes_added)} new in this checkpoint")
    for w in c.warnings:
        print(f"Warning:  {w['path']}: {w['message']}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    with _engine(args) as e:
        rep = e.delete(args.id)
    if args.json:
        print(json.dumps(rep.to_json()))
    else:
        print(f"Deleted {rep.id}: {_size(rep.bytes_freed)} freed")
    return 0


def _print_diff(diffs: list[Difference], as_json: bool) -> None:
    if as_json:
        for d in diffs:
            print(json.dumps(d.to_json()))
        return
    mark = {Change.ADDED: "+", Change.REMOVED: "-", Change.MODIFIED: "M", Change.META: "m"}
    for d in diffs:
        print(f"{mark[d.change]} {d.path.decode(errors='backslashreplace')}")


def cmd_diff(args: argparse.Namespace) -> int:
    with _engine(args) as e:
        diffs = e.diff(args.a, args.b)
    _print_diff(diffs, args.json)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    os.makedirs(args.dest, exist_ok=True)
    with _engine(args) as e:
        st = e.export(args.id, args.dest)
    print(
        json.dumps(st.__dict__)
        if args.json
        else f"Exported {args.id} to {args.dest}: {st.created} entries, {_size(st.bytes_written)}"
    )
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    with _engine(args) as e:
        if args.preview or not args.yes:
            pv = e.preview(args.id)
            counts = pv.counts()
            if args.preview:
                if args.json:
                    print(
                        json.dumps(
                            {
                                "id": args.id,
                                **counts,
                                "changes": [d.to_json() for d in pv.differences],
                            }
                        )
                    )
                else:
                    print(
                        f"Restoring {args.id} would create {counts['create']}, change "
                        f"{counts['change']} and remove {counts['remove']} entries:"
                    )
                    _print_diff(pv.differences, False)
                return 0
            if not sys.stdin.isatty():
                raise UserError(
                    "restore replaces the live layer: confirm with --yes (no terminal to ask on)"
                )
            print(
                f"Restoring {args.id} will create {counts['create']}, change "
                f"{counts['change']} and remove {counts['remove']} entries "
                "(an automatic checkpoint of the current state is taken first)."
            )
            if input("Proceed? [y/N] ").strip().lower() not in ("y", "yes"):
                print("Aborted.")
                return 1
        progress = _progress(args)
        try:
            rep = e.restore(args.id, progress=progress)
        finally:
            _stop(progress)
    if args.json:
        print(json.dumps(rep.to_json()))
    else:
        s = rep.stats
        print(
            f"Restored {rep.id}: {s.created} created, {s.modified} changed, {s.removed} "
            f"removed, {s.meta} metadata fixed; undo with: sprite-env restore {rep.undo}"
        )
    return 0
