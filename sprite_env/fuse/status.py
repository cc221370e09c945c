"""``.checkpoints.json``: the view's one file of its own, what each checkpoint shown is.

A checkpoint in the view is a directory whose content is exactly the checkpoint's tree, so
nothing about the checkpoint may appear inside it: a synthetic xattr on its root would be
copied by ``cp -a`` and ``rsync -aX`` as if it had been captured. What a script wants to
know of the checkpoints it browses (when each was taken, its comment, whether it is still
only on this machine) is in one read-only file at the mount's root instead, hidden by its
dot (``ls`` and ``for d in */`` see only the checkpoints) under a name no checkpoint id can
take (ids are ``vN`` or ``auto-...``).

Its content is a JSON array, newest first, one object per checkpoint shown::

    [{"id": "v3", "created": "2026-12-02T07:30:00.123456Z", "comment": "before migration",
      "auto": false, "storage": "local"}, ...]

``storage`` is ``remote`` once a generation the store pushed to its bucket holds the
checkpoint, else ``local`` (always ``local`` for a store that is not remote). The view
rebuilds the file whenever it lists the checkpoints (after each job and each push, in the
daemon); when the bytes change, the file's mtime moves and the kernel is told to drop its
cached pages and attributes (see ``ViewOperations``).
"""

from __future__ import annotations

import json
import stat
from typing import TYPE_CHECKING

from sprite_env.fuse.inodes import synthetic_attributes

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pyfuse3

    from sprite_env.fuse.source import CheckpointRef

#: The file's name at the root: a dot hides it from ``ls`` and globs; ids never start so.
STATUS_NAME = b".checkpoints.json"
#: Its inode: below the hashed numbers (``inodes.FIRST_HASHED_INODE``), after the root's 1.
STATUS_INODE = 2


def status_bytes(shown: Sequence[CheckpointRef]) -> bytes:
    """The file's bytes for the checkpoints ``shown`` (newest first)."""
    rows = [
        {
            "id": r.id,
            "created": r.created,
            "comment": r.comment,
            "auto": r.is_auto,
            "storage": r.storage,
        }
        for r in shown
    ]
    return (json.dumps(rows, indent=2) + "\n").encode()


def status_attributes(
    size: int, mtime_ns: int, uid: int, gid: int, timeout: float
) -> pyfuse3.EntryAttributes:
    """What ``stat`` shows for the file: read-only for all, owned as the root is, dated by
    its last change. ``timeout`` is the root's (its content changes with the listing)."""
    a = synthetic_attributes(STATUS_INODE, stat.S_IFREG | 0o444, mtime_ns, uid, gid, timeout)
    a.st_size = size
    a.st_blocks = (size + 511) // 512
    return a
