"""Deferred frees: the inodes a restore unlinks, freed after it instead of during it.

On this VM's ext4 (mounted ``discard``) removing a file's last name costs about 1 ms of
waiting and 0.2 ms of CPU, nearly all of it the inode's eviction (truncating it, freeing
its blocks and the inode in the journal), not the directory entry: 1,500 files of 6 KB
unlinked on one thread took 1.5-2.3 s, and 0.025 s when each was held open by an
``O_PATH`` descriptor first, the evictions then running at the close (1.3-1.5 s). The
undo of one agent step removes or renames over about 2,400 files (the packages the step
installed, the files it edited), and the environment is down meanwhile.

So a restore holds an ``O_PATH`` descriptor to every entry just before it unlinks it,
renames over it or removes it as an emptied directory, and the caller closes them all
(:meth:`Frees.release`, on threads of their own) once the restore is committed and the
services can run again.

Nothing of this is ever on the layer: the entries are gone from their directories at
once, as before, so no capture, view or user sees them, and no trash directory exists
to clean. A kill -9 (or any exit) closes the descriptors, and the kernel frees the inodes
then; after a power cut ext4 frees them from its orphan list at the next mount. The only
difference a user can see is that the space comes back after the restore rather than
during it, and the restore's room check (``preflight``) never counts on freed space.

A descriptor costs a slot of ``RLIMIT_NOFILE``: at most ``MAX_HELD`` are held (the soft
limit is raised towards the hard one for them); beyond that an entry is freed at once, as
before.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

from sprite_env.snapshot.fsmeta import fd_room

#: Descriptors held at most by one restore (the typical undo of the medium layer needs
#: about 2,400); also never more than the soft limit minus ``SPARE_FDS``.
MAX_HELD = 16384
#: Descriptors left to everything else (the restore's own directories: up to 512 at once;
#: the store, the catalog, a FUSE view, the API's connections).
SPARE_FDS = 2048
#: Threads closing the descriptors afterwards: each close waits on the file system (about
#: 1 ms: the eviction) with little CPU, so a few overlap their waits.
CLOSERS = 4
_O_HOLD = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC

_releasing: set[threading.Thread] = set()
_releasing_lock = threading.Lock()


def _room() -> int:
    """How many descriptors may be held, raising the soft limit if that gives more."""
    return fd_room(MAX_HELD, SPARE_FDS)


class Frees:
    """The descriptors one restore holds; thread-safe (the writers and unlinkers add)."""

    def __init__(self, limit: int | None = None) -> None:
        self._limit = _room() if limit is None else limit
        self._fds: list[int] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._fds)

    def __enter__(self) -> Frees:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def hold(self, dir_fd: int, name: bytes) -> None:
        """Holds the entry ``name`` of the directory open at ``dir_fd`` (about to lose that
        name), unless the limit is reached or there is no such entry (then nothing)."""
        if len(self._fds) >= self._limit:
            return
        try:
            fd = os.open(name, _O_HOLD, dir_fd=dir_fd)
        except OSError:
            return  # gone already, or no descriptor left: it is freed at once
        self.keep(fd)

    def keep(self, fd: int) -> None:
        """Takes ``fd`` (an open descriptor of an entry just removed) to close later; over
        the limit it is closed now."""
        with self._lock:
            if len(self._fds) < self._limit:
                self._fds.append(fd)
                return
        os.close(fd)

    def release(self, *, wait: bool = False) -> None:
        """Closes every descriptor held, on ``CLOSERS`` threads; in the background unless
        ``wait`` (see :func:`wait_released`). Idempotent."""
        with self._lock:
            fds, self._fds = self._fds, []
        if not fds:
            return
        if wait:
            _close_all(fds)
            return
        t = threading.Thread(target=_close_all, args=(fds,), name="restore-frees")
        with _releasing_lock:
            _releasing.difference_update([r for r in _releasing if not r.is_alive()])
            _releasing.add(t)
        t.start()


def _close_all(fds: list[int]) -> None:
    if len(fds) < 64:  # a thread pool costs more than it saves
        _close_part(fds)
        return
    with ThreadPoolExecutor(CLOSERS, thread_name_prefix="restore-free") as pool:
        step = -(-len(fds) // (CLOSERS * 4))
        list(pool.map(_close_part, (fds[i : i + step] for i in range(0, len(fds), step))))


def _close_part(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def wait_released() -> None:
    """Waits until every release in the background has closed its descriptors (the inodes
    are then freed): for an engine that closes, a benchmark, a test."""
    with _releasing_lock:
        running = list(_releasing)
    for t in running:
        t.join()
        with _releasing_lock:
            _releasing.discard(t)
