"""Human output shared by the online and offline paths: sizes, tables, records, changes,
and the one question commands ask (``confirm``).

Everything here takes the JSON shapes of the API (a checkpoint object, a change, an activity
entry), which the offline path produces too, and returns text; printing is the caller's.
Tables are plain text (no rich: this module is on the start-up path of every command) and
keep whole lines, so they read as well in a pipe as on a terminal.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from sprite_env.errors import UserError

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

#: Paths a restore confirmation shows before "... and N more".
PREVIEW_LINES = 20

# The API marks changes "+ - M m"; the offline engine's JSON spells them out.
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


def checkpoint_table(rows: Sequence[dict[str, Any]]) -> str:
    """The ``checkpoints list`` table; ``*`` marks the active checkpoint."""
    return table(
        ("ID", "CREATED", "FILES", "SIZE", "ADDED", "COMMENT"),
        (
            (
                c["id"]
                + (" (auto)" if c.get("is_auto") else "")
                + (" *" if c["is_active"] else ""),
                timestamp(c["create_time"]),
                str(c["files"]),
                size(c["bytes"]),
                size(c["bytes_added"]),
                one_line(c["comment"]),
            )
            for c in rows
        ),
        right=("FILES", "SIZE", "ADDED"),
    )


def show_checkpoints(rows: Sequence[dict[str, Any]], *, as_json: bool) -> None:
    """What ``checkpoints list`` prints (online and offline alike)."""
    if as_json:
        print_json(list(rows))
    elif rows:
        print(checkpoint_table(rows))
    else:
        print("no checkpoints yet (sprite-env checkpoints create --comment ...)")


def show_checkpoint(c: dict[str, Any], *, as_json: bool) -> None:
    """What ``checkpoints info`` prints."""
    if as_json:
        print_json(c)
    else:
        print("\n".join(checkpoint_info(c)))


def show_deleted(rep: dict[str, Any], *, as_json: bool) -> None:
    """What ``checkpoints delete`` prints."""
    if as_json:
        print_json(rep)
    else:
        print(delete_line(rep))


def checkpoint_info(c: dict[str, Any]) -> Iterator[str]:
    """The ``checkpoints info`` lines."""
    flags = (" (auto)" if c.get("is_auto") else "") + (" (active)" if c["is_active"] else "")
    yield f"ID:       {c['id']}{flags}"
    yield f"Created:  {c['create_time']} by {c['created_by']}"
    yield f"Comment:  {one_line(c['comment'])}"
    history = c.get("history") or []
    yield f"History:  {' <- '.join(history) if history else '(none)'}"
    yield f"Files:    {c['files']} files in {c['dirs']} directories, {size(c['bytes'])}"
    yield f"Stored:   {size(c['bytes_added'])} new in this checkpoint"
    for w in c.get("warnings") or []:
        yield f"Warning:  {w['path']}: {w['message']}"


def created_line(c: dict[str, Any]) -> str:
    return (
        f"Checkpoint {c['id']} created: {c['files']} files, {size(c['bytes'])}, "
        f"{size(c['bytes_added'])} newly stored"
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


def change_lines(changes: Iterable[dict[str, Any]]) -> Iterator[str]:
    """``+ etc/hosts`` per change: ``+`` added, ``-`` removed, ``M`` content modified, ``m``
    metadata only (owner, mode, times, xattrs)."""
    for ch in changes:
        mark = _MARKS.get(ch["change"], ch["change"])
        yield f"{mark} {display_path(ch['path'])}"


def restore_summary(cid: str, counts: dict[str, int], *, would: bool = True) -> str:
    verb = "would" if would else "will"
    return (
        f"Restoring {cid} {verb} create {counts['create']}, change {counts['change']} "
        f"and remove {counts['remove']} entries"
    )


def preview_lines(
    cid: str, counts: dict[str, int], changes: Sequence[dict[str, Any]], *, limit: int | None
) -> Iterator[str]:
    """A restore preview: the counts, then the changes since ``cid`` (the first ``limit``):
    the restore removes what ``+`` marks and brings back what ``-`` marks."""
    if not changes:
        yield f"Nothing to restore: the layer already equals {cid}."
        return
    yield f"{restore_summary(cid, counts)}; changes since {cid}:"
    shown = changes if limit is None else changes[:limit]
    yield from (f"  {line}" for line in change_lines(shown))
    if len(shown) < len(changes):
        yield f"  ... and {len(changes) - len(shown)} more (sprite-env restore {cid} --preview)"


def restored_line(cid: str | None, stats: dict[str, Any], undo: str | None) -> str:
    """After a restore (or a reset: ``cid`` None)."""
    what = f"Restored {cid}" if cid is not None else "Reset the layer to its base"
    counts = (
        f"{stats.get('created', 0)} created, {stats.get('modified', 0)} changed, "
        f"{stats.get('removed', 0)} removed, {stats.get('meta', 0)} metadata fixed"
    )
    tail = f"; undo with: sprite-env restore {undo}" if undo else ""
    return f"{what}: {counts}{tail}"


def delete_line(rep: dict[str, Any]) -> str:
    line = f"Deleted {rep['id']}: {size(rep['bytes_freed'])} freed"
    problems = rep.get("problems") or []
    if problems:  # the delete happened; the store's damage kept space from being freed
        line += (
            f"; space not fully freed, the store is damaged: {'; '.join(problems)}"
            " (run: sprite-env store check --read-data)"
        )
    return line


def activity_table(entries: Sequence[dict[str, Any]]) -> str:
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


def need_terminal(*, what: str, flag: str) -> None:
    """Refuses, when stdin is not a terminal, what only a question could confirm.

    Raises:
        UserError: nobody to ask: ``flag`` must confirm.
    """
    if not sys.stdin.isatty():
        raise UserError(
            f"{what} replaces the live layer: confirm with {flag} (no terminal to ask on)"
        )


def confirm(question: str, lines: Iterable[str], *, what: str, flag: str) -> bool:
    """Shows ``lines`` and asks ``question [y/N]`` on the terminal; False (after saying
    "Aborted.") unless the answer is yes.

    Raises:
        UserError: stdin is not a terminal (see :func:`need_terminal`).
    """
    need_terminal(what=what, flag=flag)
    for line in lines:
        print(line)
    if input(f"{question} [y/N] ").strip().lower() in ("y", "yes"):
        return True
    print("Aborted.")
    return False


def reset_lines() -> Iterator[str]:
    yield "Reset empties the layer back to the base image below it (every checkpoint is kept,"
    yield "and an automatic checkpoint of what it removes comes first: it can be undone)."
