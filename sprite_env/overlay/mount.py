"""Mounting and unmounting the overlay (mount(2) through libc: no helper binary needed).

Overlayfs forbids changing UPPER or WORK while mounted ("undefined behaviour" in the kernel
docs), so a restore must unmount MERGED first, and WORK (the kernel's scratch space) is
emptied before mounting again: a half-finished copy-up left there must not resurface.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import shutil
import threading
from dataclasses import dataclass

from sprite_env.errors import UserError
from sprite_env.mountinfo import fstype_at, fstype_of
from sprite_env.snapshot.fsmeta import syncfs

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
MNT_DETACH = 2
#: How long :meth:`Overlay.start_unmount` waits between looks at whether its unmount has
#: ended without a change of the mount table (it failed): milliseconds.
_UNMOUNT_LOOK_MS = 5


class OverlayError(UserError):
    pass


@dataclass(frozen=True)
class Overlay:
    lower: str  # the base image (read-only); several may be joined with ':' in LOWER
    upper: str  # the writable layer: what checkpoints hold
    work: str  # overlayfs' scratch directory, on UPPER's file system
    merged: str  # where the environment sees its root

    @classmethod
    def parse(cls, spec: str) -> Overlay:
        """``LOWER:UPPER:WORK:MERGED`` (absolute paths)."""
        parts = spec.split(":")
        if len(parts) != 4 or not all(parts):
            raise OverlayError(f"--overlay wants LOWER:UPPER:WORK:MERGED, not {spec!r}")
        paths = [os.path.abspath(p) for p in parts]
        o = cls(*paths)
        o.check()
        return o

    def check(self) -> None:
        for name in ("lower", "upper", "work", "merged"):
            path = getattr(self, name)
            if not os.path.isdir(path):
                raise OverlayError(f"overlay {name} {path} is not a directory")
        if os.stat(self.upper).st_dev != os.stat(self.work).st_dev:
            raise OverlayError(
                f"overlay work {self.work} must be on the same file system as upper {self.upper}"
            )
        for a in (self.upper, self.work):
            if _inside(a, self.merged) or _inside(self.merged, a):
                raise OverlayError(f"{a} and merged {self.merged} must not contain each other")

    def options(self) -> str:
        # index=off, redirect_dir=off, metacopy=off: a layer whose every file is whole, so a
        # capture of UPPER alone means the same thing on any kernel.
        return (
            f"lowerdir={self.lower},upperdir={self.upper},workdir={self.work},"
            "index=off,redirect_dir=off,metacopy=off"
        )

    def is_mounted(self) -> bool:
        return fstype_at(self.merged) == "overlay"

    def mount(self) -> None:
        if self.is_mounted():
            return
        r = _libc.mount(
            b"sprite-overlay", os.fsencode(self.merged), b"overlay", 0, self.options().encode()
        )
        if r != 0:
            e = ctypes.get_errno()
            raise OverlayError(f"cannot mount overlay at {self.merged}: {os.strerror(e)}")

    def flush(self) -> None:
        """Writes UPPER's file system's dirty data back now. Unmounting MERGED syncs UPPER
        (overlayfs' ``sync_fs``), and a restore unmounts it with the environment down: 40 MB
        written through MERGED made that unmount take 0.18 s, 6.5 ms after a flush (this
        VM's ext4). Flushed while the environment still runs, only what it writes after is
        left to the unmount."""
        fd = os.open(self.upper, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            syncfs(fd)
        finally:
            os.close(fd)

    def unmount(self) -> None:
        """Unmounts MERGED. Processes inside must be gone first (else EBUSY), and then a
        lazy unmount would leave them writing to a layer being replaced: refuse instead."""
        self.start_unmount().finish()

    def start_unmount(self) -> Unmounting:
        """:meth:`unmount`, returning as soon as MERGED has left the mount table: the
        kernel then still tears the overlay's super block down (it evicts every dentry and
        inode it cached, and syncs UPPER's file system), in the calling thread of
        ``umount(2)`` before that returns: 0.39 s after one walk of the medium layer's 110k
        files through MERGED, against 1.2 ms for MERGED to leave the table. Nothing can
        reach the overlay after that, so a restore may write UPPER meanwhile; call
        :meth:`Unmounting.finish` before mounting again (a second super block on the same
        UPPER and WORK is refused or warned about by the kernel).

        The plain ``umount(2)`` (not lazy) runs on a thread of its own, so that a process
        still inside fails it with EBUSY as before. Its end is seen in the mount table
        (``poll`` on ``/proc/self/mountinfo`` wakes at every mount or unmount), never by a
        look at MERGED itself: a path lookup through the mount holds a reference to it for
        a moment, and an unmount that met one would fail with EBUSY.

        Raises:
            OverlayError: MERGED is busy, or cannot be unmounted.
        """
        if not self.is_mounted():
            return Unmounting(self.merged, None, [])
        mountpoint = os.path.realpath(self.merged)  # before the unmount: it looks at MERGED
        table = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
        try:
            watch = select.poll()
            watch.register(table, select.POLLPRI)
            result: list[int] = []

            def run() -> None:
                ok = _libc.umount2(os.fsencode(mountpoint), 0) == 0
                result.append(0 if ok else ctypes.get_errno())

            thread = threading.Thread(target=run, name="overlay-unmount", daemon=True)
            thread.start()
            while thread.is_alive():
                if watch.poll(_UNMOUNT_LOOK_MS) and fstype_of(mountpoint) != "overlay":
                    return Unmounting(self.merged, thread, result)  # gone from the table
            return Unmounting(self.merged, thread, result).finish()
        finally:
            os.close(table)

    def empty_work(self) -> None:
        """Empties WORK (overlayfs leaves a ``work`` directory with mode 000 in it)."""
        for name in os.listdir(self.work):
            path = os.path.join(self.work, name)
            if os.path.isdir(path) and not os.path.islink(path):
                os.chmod(path, 0o700)
                shutil.rmtree(path)
            else:
                os.unlink(path)


class Unmounting:
    """An unmount of MERGED that has taken it out of the mount table (or failed, or had
    nothing to do), the kernel perhaps still tearing the overlay down; see
    :meth:`Overlay.start_unmount`."""

    def __init__(self, merged: str, thread: threading.Thread | None, result: list[int]) -> None:
        self.merged = merged
        self._thread = thread
        self._result = result

    def finish(self) -> Unmounting:
        """Waits for the unmount to end; returns self.

        Raises:
            OverlayError: it failed (MERGED busy, or another error).
        """
        if self._thread is None:
            return self
        self._thread.join()
        e = self._result[0] if self._result else errno.EIO
        if e == errno.EBUSY:
            raise OverlayError(f"{self.merged} is busy: a process still uses it")
        if e != 0:
            raise OverlayError(f"cannot unmount {self.merged}: {os.strerror(e)}")
        return self


def _inside(path: str, parent: str) -> bool:
    return os.path.commonpath([path, parent]) == parent
