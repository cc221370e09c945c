"""What processes open on one file system, seen from outside them by fanotify.

A second fanotify group (fd mode, ``FAN_OPEN``, a file-system mark) records every open
and the process that made it: a walk opens each directory it lists, a capture each file
it reads, a restore each file it writes. Tests count those to show that a capture or a
restore touches the directories and files it changes, not the whole tree, whatever the
code inside does (the native walk, the journal's hint, the restore's diff).

``O_PATH`` opens (the journal's ``open_by_handle_at``) make no event, nor does a ``stat``.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass, field

from sprite_env.journal import fanotify as fan

FAN_OPEN = 0x20
_META = struct.Struct("<IBBHQii")


@dataclass
class Opened:
    """Paths opened, relative to the recorder's root, by kind."""

    dirs: set[bytes] = field(default_factory=set)
    files: set[bytes] = field(default_factory=set)


class OpenRecorder:
    """Records the opens on the file system holding ``root``; use as a context manager.

    Args:
        root: paths are reported relative to it (opens outside it are dropped).
    """

    def __init__(self, root: str) -> None:
        self.root = os.fsencode(os.path.realpath(root))
        self._events: list[tuple[int, bytes, bool]] = []
        self._fd = fan.fanotify_init(
            fan.FAN_CLASS_NOTIF | fan.FAN_CLOEXEC | fan.FAN_NONBLOCK | fan.FAN_UNLIMITED_QUEUE,
            os.O_RDONLY | os.O_CLOEXEC | os.O_LARGEFILE,
        )
        try:
            fan.fanotify_mark(
                self._fd,
                fan.FAN_MARK_ADD | fan.FAN_MARK_FILESYSTEM,
                FAN_OPEN | fan.FAN_ONDIR,
                self.root,
            )
        except BaseException:
            os.close(self._fd)
            raise

    def __enter__(self) -> OpenRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd >= 0:
            self.drain()
            os.close(self._fd)
            self._fd = -1

    def drain(self) -> None:
        """Reads what is queued (each event's descriptor is closed at once)."""
        while True:
            try:
                buf = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return
            off = 0
            while off < len(buf):
                length, _v, _r, _ml, _mask, efd, pid = _META.unpack_from(buf, off)
                off += length
                if efd < 0:
                    continue  # an overflow: the tests' trees stay far below the limit
                try:
                    path = os.readlink(b"/proc/self/fd/%d" % efd)
                    is_dir = stat.S_ISDIR(os.fstat(efd).st_mode)
                finally:
                    os.close(efd)
                self._events.append((pid, path, is_dir))

    def clear(self) -> None:
        """Forgets what was recorded so far."""
        self.drain()
        self._events.clear()

    def by(self, pid: int) -> Opened:
        """What process ``pid`` opened under the root since the last :meth:`clear`."""
        self.drain()
        out = Opened()
        for who, path, is_dir in self._events:
            if who != pid:
                continue
            if path == self.root:
                rel = b""
            elif path.startswith(self.root + b"/"):
                rel = path[len(self.root) + 1 :]
            else:
                continue
            (out.dirs if is_dir else out.files).add(rel)
        return out


def ancestors(paths: set[bytes]) -> set[bytes]:
    """Each path and every directory above it, the root ``b""`` included."""
    out = {b""}
    for p in paths:
        while p:
            out.add(p)
            p = p.rpartition(b"/")[0]
    return out
