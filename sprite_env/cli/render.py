"""Human output shared by the online and offline paths: sizes, tables, records, changes,
and the one question commands ask (``confirm``).

Everything here takes the JSON shapes of the API (``api/shapes.py``: a checkpoint, a diff
entry, a preview step, an activity entry), which the offline path produces too, and returns
text; printing is the caller's.
Tables are plain text (no rich: this module is on the start-up path of every command) and
keep whole lines, so they read as well in a pipe as on a terminal.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from sprite_env.errors import UserError

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping, Sequence

    from sprite_env.api import shapes

#: Lines of paths a restore confirmation shows (grouped by directory to fit).
PREVIEW_LINES = 20

# A diff's changes, as its lines mark them.
_MARKS = {"added": "+", "removed": "-", "modified": "M", "meta": "m"}


def size(n: float) -> str:
    """``1.5 MiB``: binary units, one decimal (bytes as a whole number)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def print_json(value: Any) -> None:
    print(json.dumps(value), flush=True)


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], right: Iterable[str] = ()) -> str:
    """Columns two spaces apart; the last column is not padded (a comment may be long)."""
    rows = [list(r) for r in rows]
    right = set(right)
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    out = []
    for r in [list(headers), *rows]:
        cells = [
            c.rjust(w) if h in right else c.ljust(w)
            for c, w, h in zip(r[:-1], widths, headers, strict=False)
        ]
        out.append("  ".join([*cells, r[-1]]).rstrip())
    return "\n".join(out)


def timestamp(rfc3339: str) -> str:
    """``2025-11-29 11:32:07`` from an RFC 3339 time (UTC, as the store keeps it)."""
    return rfc3339[:19].replace("T", " ")


def checkpoint_table(rows: Sequence[shapes.Checkpoint]) -> str:
    """The ``checkpoints list`` table; ``*`` marks the active checkpoint. A STORAGE column
    (``local`` or ``remote``) once any checkpoint is in a bucket: a store with no remote,
    where every one is ``local``, is not told so on every line."""
    storage = any(c.get("storage") == "remote" for c in rows)
    return table(
        ("ID", "CREATED", "FILES", "SIZE", "ADDED", *(("STORAGE",) if storage else ()), "COMMENT"),
        (
            (
                c["id"]
                + (" (auto)" if c.get("is_auto") else "")
                + (" *" if c["is_active"] else ""),
                timestamp(c["create_time"]),
                str(c["files"]),
                size(c["bytes"]),
                size(c["bytes_added"]),
                *((c.get("storage", "local"),) if storage else ()),
                one_line(c["comment"]),
            )
            for c in rows
        ),
        right=("FILES", "SIZE", "ADDED"),
    )


def listed(rows: Sequence[shapes.Checkpoint], include_auto: bool) -> list[shapes.Checkpoint]:
    """The rows ``checkpoints list`` shows: automatic ones only with ``--include-auto``,
    but always the active one, so the ``*`` says where the layer is (issue 10). (The API's
    list stays Sprites' own: automatic ones only when asked for.)"""
    return [r for r in rows if include_auto or not r.get("is_auto") or r.get("is_active")]


def show_checkpoints(rows: Sequence[shapes.Checkpoint], *, as_json: bool) -> None:
    """What ``checkpoints list`` prints (online and offline alike)."""
    if as_json:
        print_json(list(rows))
    elif rows:
        print(checkpoint_table(rows))
    else:
        print("no checkpoints yet (sprite-env checkpoints create --comment ...)")


def show_checkpoint(c: shapes.Checkpoint, *, as_json: bool) -> None:
    """What ``checkpoints info`` prints."""
    if as_json:
        print_json(c)
    else:
        print("\n".join(checkpoint_info(c)))


def show_deleted(rep: shapes.DeleteReport, *, as_json: bool) -> None:
    """What ``checkpoints delete`` prints."""
    if as_json:
        print_json(rep)
    else:
        print(delete_line(rep))


def checkpoint_info(c: shapes.Checkpoint) -> Iterator[str]:
    """The ``checkpoints info`` lines."""
    flags = (" (auto)" if c.get("is_auto") else "") + (" (active)" if c["is_active"] else "")
    yield f"ID:       {c['id']}{flags}"
    yield f"Created:  {c['create_time']} by {c['created_by']}"
    yield f"Comment:  {one_line(c['comment'])}"
    history = c.get("history") or []
    yield f"History:  {' <- '.join(history) if history else '(none)'}"
    yield f"Files:    {c['files']} files in {c['dirs']} directories, {size(c['bytes'])}"
    yield f"Stored:   {size(c['bytes_added'])} new in this checkpoint"
    unique = c.get("unique_bytes")
    if unique is not None:
        yield f"Unique:   {size(unique)} held by no other checkpoint (a delete frees it)"
    where = c.get("storage")
    if where == "remote":
        yield "Storage:  remote (durable in the store's bucket too)"
    elif where == "local":
        yield "Storage:  local (on this machine only)"
    for w in c.get("warnings") or []:
        yield f"Warning:  {w['path']}: {w['message']}"


def created_line(c: shapes.Checkpoint) -> str:
    """What ``checkpoints create`` prints: the figures, then Sprites' own last line
    (``Checkpoint created: vN``), which scripts written for Sprites parse."""
    remote = ", durable in the store's bucket" if c.get("storage") == "remote" else ""
    return (
        f"{c['id']}: {c['files']} files, {size(c['bytes'])}, "
        f"{size(c['bytes_added'])} newly stored{remote}\nCheckpoint created: {c['id']}"
    )


def display_path(path: str) -> str:
    """A path from the API as a terminal can show it: bytes that are not UTF-8 (which
    travel as surrogate escapes) become ``\\xNN``."""
    try:
        return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a lone surrogate no file name can hold
        return path.encode("utf-8", "backslashreplace").decode("utf-8")


def one_line(text: str) -> str:
    """A comment in a table cell or after a label: tabs become spaces."""
    return text.replace("\t", " ")


def change_lines(changes: Iterable[shapes.DiffEntry]) -> Iterator[str]:
    """``+ etc/hosts`` per change from A to B: ``+`` added, ``-`` removed, ``M`` content
    modified, ``m`` metadata only (owner, mode, times, xattrs); a directory added or
    removed says how many entries that is, itself included."""
    for ch in changes:
        mark = _MARKS.get(ch["change"], ch["change"])
        n = ch.get("entries") or 1
        tail = f" ({n} entries)" if n > 1 else ""
        inner = ch.get("inner") or {}  # a type change: the directory's contents came or went
        tail += "".join(f" ({v} {k} inside)" for k, v in inner.items())
        yield f"{mark} {display_path(ch['path'])}{tail}"


def diff_lines(a: str, b: str | None, changes: Sequence[shapes.DiffEntry]) -> Iterator[str]:
    """``checkpoints diff A [B]``: what changed from A to B (None: the live layer)."""
    if not changes:
        yield f"no changes between {a} and {b or 'the live layer'}"
        return
    yield from change_lines(changes)


#: A restore's verbs, most consequential first (``snapshot.plan.ORDER``).
ACTIONS = ("delete", "change", "create", "metadata")


def restore_summary(cid: str, counts: Mapping[str, object], *, would: bool = True) -> str:
    verb = "would" if would else "will"
    return (
        f"Restoring {cid} {verb} delete {counts.get('delete', 0)}, change "
        f"{counts.get('change', 0)}, create {counts.get('create', 0)} and fix the metadata "
        f"of {counts.get('metadata', 0)} entries"
    )


def preview_lines(
    cid: str,
    counts: Mapping[str, object],
    changes: Sequence[shapes.PreviewStep],
    *,
    limit: int | None,
) -> Iterator[str]:
    """A restore preview in the restore's words: the counts, then per path what it will
    do (``delete``, ``change`` content, ``create`` = bring back, ``metadata``), deletions
    first. With a ``limit``, at most that many lines of paths grouped by directory with
    their counts, coarser until they fit, so no deletion hides behind "and N more"."""
    if not changes:
        yield f"Nothing to restore: the layer already equals {cid}."
        return
    yield f"{restore_summary(cid, counts)}:"
    steps = sorted(_steps(changes), key=lambda s: (ACTIONS.index(s[0]), s[1]))
    if limit is None:
        for action, path, n, is_dir, note in steps:
            yield f"  {action:<10}{_label(path, n, is_dir)}{note}"
        return
    groups = _groups(steps, limit)
    for action, key, members in groups:
        total = sum(m[2] for m in members)
        if len(members) == 1:  # the count is the column's: a directory's is all it holds
            _, path, n, is_dir, note = members[0]
            note = note or (" and everything in it" if is_dir and n > 1 else "")
            yield f"  {action:<10}{total:>6}  {_label(path, 1, is_dir)}{note}"
            continue
        names = [_label(m[1][len(key) + 1 :] if key else m[1], m[2], m[3]) for m in members]
        where = display_path(key + "/") if key else "./"
        yield f"  {action:<10}{total:>6}  in {where}: {_names(names)}"
    if any(len(g[2]) > 1 for g in groups):
        yield f"Every path: sprite-env restore {cid} --preview"


_Step = tuple[str, str, int, bool, str]  # action, path, entries, is a directory, note


def _steps(changes: Sequence[shapes.PreviewStep]) -> Iterator[_Step]:
    for ch in changes:
        action = ch["action"]
        path = str(ch["path"])
        n = int(ch.get("entries") or 1)
        is_dir = ch.get("type") == "dir"
        inner = ch.get("inner") or {}
        note = "".join(f" (and {k} the {v} entries inside)" for k, v in inner.items())
        yield action, path, n, is_dir, note
        for k, v in inner.items():  # a type change's contents count where they belong
            yield k, path, v, True, " (the entries inside)"


def _label(path: str, n: int, is_dir: bool) -> str:
    shown = display_path(path) + ("/" if is_dir else "")
    return f"{shown} ({n} entries)" if n > 1 else shown


def _names(names: list[str], width: int = 60) -> str:
    out: list[str] = []
    used = 0
    for i, name in enumerate(names):
        if out and used + len(name) > width:
            return ", ".join(out) + f", ... ({len(names) - i} more)"
        out.append(name)
        used += len(name) + 2
    return ", ".join(out)


def _groups(steps: list[_Step], limit: int) -> list[tuple[str, str, list[_Step]]]:
    """The steps by action and directory, at the deepest directory level that fits in
    ``limit`` lines (level 0 is one line per action)."""

    def parent(path: str, depth: int) -> str:
        parts = path.split("/")[:-1]
        return "/".join(parts[:depth])

    deepest = max((s[1].count("/") for s in steps), default=0)
    for depth in range(deepest, -1, -1):
        groups: dict[tuple[str, str], list[_Step]] = {}
        for s in steps:
            groups.setdefault((s[0], parent(s[1], depth)), []).append(s)
        if len(groups) <= limit or depth == 0:
            break
    return [(a, key, members) for (a, key), members in groups.items()]


def restored_line(cid: str | None, stats: dict[str, Any], undo: str | None) -> str:
    """After a restore (or a reset: ``cid`` None)."""
    what = f"Restored {cid}" if cid is not None else "Reset the layer to its base"
    # the preview's words and order (``restore_summary``), counted the same way
    counts = (
        f"{stats.get('removed', 0)} deleted, {stats.get('modified', 0)} changed, "
        f"{stats.get('created', 0)} created, {stats.get('meta', 0)} metadata fixed"
    )
    tail = f"; undo with: sprite-env restore {undo}" if undo else ""
    return f"{what}: {counts}{tail}"


def delete_line(rep: shapes.DeleteReport) -> str:
    if rep.get("dry_run"):
        return f"Deleting {rep['id']} would free {size(rep['bytes_freed'])} (nothing deleted)"
    line = f"Deleted {rep['id']}: {size(rep['bytes_freed'])} freed"
    problems = rep.get("problems") or []
    if problems:  # the delete happened; the store's damage kept space from being freed
        line += (
            f"; space not fully freed, the store is damaged: {'; '.join(problems)}"
            " (run: sprite-env store check --read-data)"
        )
    return line


def activity_table(entries: Sequence[shapes.ActivityEntry]) -> str:
    """The ``checkpoints log`` table, newest first."""
    return table(
        ("TIME", "ACTOR", "ACTION", "ID", "OK", "DETAIL"),
        (
            (
                timestamp(str(e.get("time") or "")),
                str(e.get("actor") or ""),
                str(e.get("action") or ""),
                str(e.get("id") or "-"),
                "ok" if e.get("ok") else "FAILED",
                one_line(_detail(e.get("detail"))),
            )
            for e in entries
        ),
    )


def _detail(detail: Any) -> str:
    if detail is None:
        return ""
    if isinstance(detail, str):
        return detail
    return json.dumps(detail, separators=(",", ":"))


def warn(line: str) -> None:
    print(line, file=sys.stderr)


def warn_interrupted(info: dict[str, Any] | None) -> None:
    """Says, on stderr, that a restore did not finish (``Engine.interrupted_restore``)."""
    if not info:
        return
    what = f"a restore to {info['target']}" if info.get("target") else "a reset"
    warn(f"warning: {what} did not finish ({info.get('error')}); the layer is {info['layer']}")
    back = f"; roll back with: {info['roll_back']}" if info.get("roll_back") else ""
    warn(f"  finish it with: {info['finish']}{back}")


def need_terminal(*, what: str, flag: str) -> None:
    """Refuses, when stdin is not a terminal, what only a question could confirm.

    Raises:
        UserError: nobody to ask: ``flag`` must confirm.
    """
    if not sys.stdin.isatty():
        raise UserError(
            f"{what} replaces the live layer: confirm with {flag} (no terminal to ask on)"
        )


#: The exit code of a question answered "no": the user's choice, not a bug (exit 1).
EXIT_DECLINED = 2


def should_ask(yes: bool) -> bool:
    """Whether a restore asks first: only a person at a terminal, without ``--yes``. Every
    restore can be undone, so a script (no terminal) goes ahead, as Sprites' own
    self-checkpointing pattern expects of ``sprite-env checkpoints restore v4``."""
    return not yes and sys.stdin.isatty()


def confirm(question: str, lines: Iterable[str], *, what: str, flag: str) -> bool:
    """Shows ``lines`` and asks ``question [y/N]`` on the terminal (stderr, so that
    ``> out.txt`` still shows the question); False (after saying "Aborted.") unless the
    answer is yes.

    Raises:
        UserError: stdin is not a terminal (see :func:`need_terminal`).
    """
    need_terminal(what=what, flag=flag)
    for line in lines:
        print(line, file=sys.stderr)
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    if answer.strip().lower() in ("y", "yes"):
        return True
    print("Aborted.", file=sys.stderr)
    return False


def reset_lines() -> Iterator[str]:
    yield "Reset empties the layer back to the base image below it (every checkpoint is kept,"
    yield "and an automatic checkpoint of what it removes comes first: it can be undone)."


def not_a_file(cid: str, entry: shapes.Entry) -> str:
    """Why ``checkpoints cat`` printed nothing: the entry (``GET .../files/PATH``) is not a
    regular file."""
    what: str = entry["type"]
    if what == "symlink":
        what = f"symlink (to {entry.get('target')}; not followed)"
    return (
        f"{entry.get('path')} is a {what} in {cid}, not a file: nothing written. "
        f"See it with: sprite-env checkpoints cat --json {cid} {entry.get('path')}"
    )


def exported_line(cid: str, dest: str, stats: dict[str, Any]) -> str:
    written = size(int(stats.get("bytes_written") or 0))
    return f"Exported {cid} to {dest}: {stats.get('created', 0)} entries, {written}"
