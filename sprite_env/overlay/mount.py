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
import shutil
from dataclasses import dataclass

from sprite_env.errors import UserError
from sprite_env.mountinfo import fstype_at
from sprite_env.snapshot.fsmeta import syncfs

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
MNT_DETACH = 2


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
        if not self.is_mounted():
            return
        if _libc.umount2(os.fsencode(self.merged), 0) != 0:
            e = ctypes.get_errno()
            if e == errno.EBUSY:
                raise OverlayError(f"{self.merged} is busy: a process still uses it")
            raise OverlayError(f"cannot unmount {self.merged}: {os.strerror(e)}")

    def empty_work(self) -> None:
        """Empties WORK (overlayfs leaves a ``work`` directory with mode 000 in it)."""
        for name in os.listdir(self.work):
            path = os.path.join(self.work, name)
            if os.path.isdir(path) and not os.path.islink(path):
                os.chmod(path, 0o700)
                shutil.rmtree(path)
            else:
                os.unlink(path)


def _inside(path: str, parent: str) -> bool:
    return os.path.commonpath([path, parent]) == parent
