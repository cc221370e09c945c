"""The activity log: who did what to which checkpoint, and whether it worked.

On-disk format (``STATE/activity.jsonl``): JSON lines, oldest first, one object per
action, always with these keys in this order, then any extras the caller passes::

    {"time": "2026-11-29T08:15:00.123456Z", "action": "restore", "id": "v3",
     "actor": "user", "ok": true, "detail": ""}

``time`` is RFC 3339 UTC with microseconds; ``id`` may be null (a reset names no
checkpoint). Lines are ASCII (``json.dumps`` escapes the rest), so a newline inside a
value can never split a record.

Durability: each record is one ``os.write`` of the whole line to an ``O_APPEND`` fd,
then ``fsync``. A crash can still leave a torn last line; readers skip any line that does
not parse, and the next writer starts on a fresh line so the torn one never swallows it.

Rotation: a record that would take the file past ``max_bytes`` first renames it to
``activity.jsonl.1`` (replacing the older generation), so the log holds between
``max_bytes`` and twice that. :meth:`ActivityLog.entries` reads across both files.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sprite_env import privacy

if TYPE_CHECKING:
    from collections.abc import Generator

DEFAULT_MAX_BYTES = 4 << 20
_BLOCK = 64 << 10
_RESERVED = frozenset({"time", "action", "id", "actor", "ok", "detail"})


def _now() -> str:
    return datetime.now(tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ActivityLog:
    """An append-only, rotated JSON-lines log (format in the module docstring).

    Thread-safe: records come from the job workers' threads. Both methods do blocking
    file I/O (``record`` an fsync), so async code calls them via ``trio.to_thread``.
    """

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.path = os.fspath(path)
        self.old_path = self.path + ".1"
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        # Private (sprite_env/privacy.py) from the start, not from the next record: an
        # older version's log may be 0644.
        for p in (self.path, self.old_path):
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(p)
                if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) != privacy.FILE_MODE:
                    os.chmod(p, privacy.FILE_MODE)

    def record(
        self,
        action: str,
        cid: str | None,
        actor: str,
        ok: bool,
        detail: str = "",
        **extra: Any,
    ) -> dict[str, Any]:
        """Appends one entry and makes it durable.

        Args:
            action: what was done (``create``, ``restore``, ``delete``, ``reset``...).
            cid: the checkpoint it concerned, if any.
            actor: who asked (already passed through :func:`clean_actor`).
            ok: whether it succeeded.
            detail: a human note (the error message on failure).
            **extra: more JSON-serializable fields, stored after the standard ones.

        Returns:
            The entry as written.

        Raises:
            ValueError: an extra field would override a standard one.
            TypeError: an extra value is not JSON-serializable.
            OSError: the log cannot be written.
        """
        clash = _RESERVED & extra.keys()
        if clash:
            raise ValueError(f"activity fields {sorted(clash)} are reserved")
        entry: dict[str, Any] = {
            "time": _now(),
            "action": action,
            "id": cid,
            "actor": actor,
            "ok": ok,
            "detail": detail,
            **extra,
        }
        line = (json.dumps(entry, allow_nan=False) + "\n").encode("ascii")
        with self._lock:
            fd = self._open_for_append(len(line))
            try:
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    # A torn line from a crash: end it, or it would swallow this record.
                    line = b"\n" + line
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
        return entry

    def _open_for_append(self, incoming: int) -> int:
        """Opens the current file, rotating it first if ``incoming`` bytes would not fit."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        except FileNotFoundError:
            return self._create()
        size = os.fstat(fd).st_size
        if size == 0 or size + incoming <= self.max_bytes:
            return fd
        os.close(fd)
        os.replace(self.path, self.old_path)
        return self._create()

    def _create(self) -> int:
        # Read-write: ``record`` reads the last byte back to detect a torn line.
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        fd = privacy.open_file(self.path, flags)
        # The new name must survive a crash along with the records written to it.
        dir_fd = os.open(os.path.dirname(self.path) or ".", os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return fd

    def entries(self, limit: int | None = 100, action: str | None = None) -> list[dict[str, Any]]:
        """Returns logged entries, newest first.

        Reads backwards from the end of the file in blocks, so the cost follows ``limit``
        (and how many entries the ``action`` filter skips), not the size of the log.
        Lines that do not parse (a torn write) are skipped.

        Args:
            limit: at most this many entries; None for all of them.
            action: only entries of this action.

        Raises:
            ValueError: ``limit`` is negative.
            OSError: a log file exists but cannot be read.
        """
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, not {limit}")
        out: list[dict[str, Any]] = []
        if limit == 0:
            return out
        # Under the lock, so a rotation cannot make us read one generation twice.
        with self._lock:
            for path in (self.path, self.old_path):
                with contextlib.closing(_lines_backwards(path)) as lines:
                    for raw in lines:
                        entry = _parse(raw)
                        if entry is None or (action is not None and entry.get("action") != action):
                            continue
                        out.append(entry)
                        if limit is not None and len(out) >= limit:
                            return out
        return out


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        entry = json.loads(raw)
    except ValueError:  # also UnicodeDecodeError
        return None
    return entry if isinstance(entry, dict) else None


def _lines_backwards(path: str, block: int = _BLOCK) -> Generator[bytes, None, None]:
    """Yields the non-empty lines of ``path``, last first; nothing if it does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        pos = os.fstat(fd).st_size
        tail = b""  # the start of a line whose beginning is in an earlier block
        while pos > 0:
            n = min(block, pos)
            pos -= n
            parts = (os.pread(fd, n, pos) + tail).split(b"\n")
            tail = parts[0]
            for line in reversed(parts[1:]):
                if line:
                    yield line
        if tail:
            yield tail
    finally:
        os.close(fd)
