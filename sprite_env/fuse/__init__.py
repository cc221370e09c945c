"""A read-only FUSE view of the newest checkpoints (pyfuse3 on trio).

Concepts:

- A :class:`CheckpointSource` is all the view knows of a store: the list of checkpoints,
  objects by id, and *pinning* (the objects of an open file stay readable after their
  checkpoint is deleted and pruned). :class:`StoreSource` is the one over an open store;
  :meth:`StoreSource.from_engine` shares an :class:`~sprite_env.checkpoints.Engine`'s, so
  a host that creates and deletes checkpoints through that engine sees them in the view.
- :class:`ViewOperations` answers the kernel: the root lists the ``count`` newest
  checkpoints by id (re-listed when older than ``list_ttl``), each checkpoint is its
  captured root directory; ``.checkpoints.json`` beside them says what each one is
  (``status.py``: id, created, comment, auto, storage). It loads lazily (a lookup reads
  only the trees on its path), keeps decoded objects in an LRU, reads and decompresses in
  a fixed pool of worker threads (``workers.py``), one batch per call, and reads ahead:
  the next pieces of a file read sequentially, the small files of a directory whose files
  are being opened, the subdirectories of a directory being listed.
- :func:`serve` mounts it (read-only, ``nodev``, ``nosuid``) and serves until unmounted
  or cancelled; :func:`serve_until_signal` adds SIGINT/SIGTERM for a foreground command.

Invariants:

- Inode numbers are stable for a file for the life of the mount (and across mounts): they
  derive from (checkpoint, path), and all names of a hard-link group share one.
- Nothing under a checkpoint ever changes, so the kernel caches entries, attributes and
  pages for long; only the root's list of names changes.
- Handlers raise only ``pyfuse3.FUSEError``: store errors are logged and become ``EIO``.
- A file open when its checkpoint is deleted stays readable until closed: its objects
  were pinned (or its bytes kept) when it was opened.
- One mount per process (pyfuse3 keeps global state).
"""

from sprite_env.fuse.mount import (
    MountError,
    fuse_options,
    prepare_mountpoint,
    serve,
    serve_until_signal,
    unmount,
)
from sprite_env.fuse.operations import ViewConfig, ViewOperations
from sprite_env.fuse.source import CheckpointRef, CheckpointSource, StoreSource
from sprite_env.mountinfo import mounts
from sprite_env.store.ports import PinnedReader

__all__ = [
    "CheckpointRef",
    "CheckpointSource",
    "MountError",
    "PinnedReader",
    "StoreSource",
    "ViewConfig",
    "ViewOperations",
    "fuse_options",
    "mounts",
    "prepare_mountpoint",
    "serve",
    "serve_until_signal",
    "unmount",
]
