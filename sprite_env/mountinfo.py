"""What is mounted where: ``/proc/self/mountinfo``, parsed once for every module that asks
(the FUSE view's stale-mount checks, the overlay, the cgroup freezer)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class MountEntry:
    """One line of ``/proc/self/mountinfo``."""

    mountpoint: str
    fstype: str
    source: str
    device: str  # "major:minor"; a FUSE mount's minor names its /sys/fs/fuse/connections/N
    options: tuple[str, ...] = ()  # the super options (a v1 cgroup's controllers are here)


def mounts() -> list[MountEntry]:
    """The mounts this process sees, in mount order (a later one on a path hides those
    before it)."""
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            left, _sep, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) < 5 or len(rest) < 2:
                continue
            options = tuple(rest[2].split(",")) if len(rest) > 2 else ()
            out.append(MountEntry(_unescape(fields[4]), rest[0], rest[1], fields[2], options))
    return out


def fstype_at(path: str) -> str | None:
    """The type of the file system mounted exactly at ``path`` (the last one), or None."""
    return fstype_of(os.path.realpath(path))  # mountinfo shows resolved paths


def fstype_of(mountpoint: str) -> str | None:
    """:func:`fstype_at` for a path resolved already: it looks only at the table, never at
    the path (a lookup through a mount holds a reference to it for a moment, and an
    unmount that meets one fails with EBUSY)."""
    found = None
    for m in mounts():
        if m.mountpoint == mountpoint:
            found = m.fstype
    return found


def _unescape(path: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(path):
        if path[i] == "\\" and path[i + 1 : i + 4].isdigit():
            out.append(chr(int(path[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(path[i])
            i += 1
    return "".join(out)
