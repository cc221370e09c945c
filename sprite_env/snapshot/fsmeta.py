"""Reading and writing metadata through directory file descriptors.

Every operation names a single path component relative to an open directory, and never
follows a final symlink, so nothing here can be led out of the tree by a symlink planted
in it. Extended attributes have no ``*at`` system calls; ``/proc/self/fd/N/name`` gives
the same guarantee (the kernel resolves the directory by its fd, and ``name`` is not
followed when ``follow_symlinks=False``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import resource
import stat
from typing import TYPE_CHECKING

from sprite_env.errors import SnapshotError

if TYPE_CHECKING:
    from collections.abc import Callable

    from sprite_env.snapshot.tree import Piece

Xattrs = tuple[tuple[bytes, bytes], ...]

O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

_open_at: Callable[[int, bytes, int], int] | None
#: ``os.close`` with the GIL kept, for a directory's descriptor (see :func:`open_dir_at`).
close_dir: Callable[[int], None]
_set_mtime: Callable[[int, int], None] | None
try:
    from sprite_env._native import close_fd as _close_fd
    from sprite_env._native import open_at as _open_at
    from sprite_env._native import set_mtime as _set_mtime
except ImportError:
    _open_at = _set_mtime = None
    close_dir = os.close
else:
    close_dir = _close_fd
#: ``os.close`` with the GIL kept, for any descriptor :func:`open_at` opened.
close_fd = close_dir


_libc = ctypes.CDLL(None, use_errno=True)


def syncfs(fd: int) -> None:
    """Flushes the file system holding ``fd`` (only that one, unlike ``sync``)."""
    if _libc.syncfs(fd) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def check_name(name: bytes) -> bytes:
    """Refuses names that could step out of a directory."""
    if not name or b"/" in name or b"\0" in name or name in (b".", b".."):
        raise SnapshotError(f"refusing unsafe file name {name!r}")
    return name


def proc_path(dirfd: int, name: bytes) -> bytes:
    return b"/proc/self/fd/%d/%s" % (dirfd, name)


def open_dir(dirfd: int, name: bytes) -> int:
    """Opens a subdirectory; fails (ELOOP/ENOTDIR) if ``name`` is a symlink or not a dir."""
    return open_dir_at(dirfd, check_name(name))


def open_dir_at(dirfd: int, name: bytes) -> int:
    """``os.open(name, O_DIR, dir_fd=dirfd)`` with the GIL kept where the extension is
    built (``close_dir``: ``os.close`` so). A walk opens and closes each directory it
    visits, and each release of the GIL beside a busy Python thread (the store's encoders,
    a restore's writers) can take up to the switch interval (5 ms) to take back: the
    capture's open and close of the medium step's ~1,100 dirty directories were 0.23 s of
    its walk's thread (py-spy, load 2), and keeping the GIL made that checkpoint 0.89-0.91x
    (bench_capture_step, 3 rounds). An open that must read the disk holds it that long."""
    if _open_at is None:
        return os.open(name, O_DIR, dir_fd=dirfd)
    return _open_at(dirfd, name, O_DIR)


def open_at(dirfd: int, name: bytes, flags: int) -> int:
    """``os.open(name, flags | O_CLOEXEC, dir_fd=dirfd)`` with the GIL kept where the
    extension is built, as :func:`open_dir_at` (close it with :func:`close_fd`): a
    restore opens each entry whose metadata alone changed (the medium undo counts 2.7k
    metadata changes, most of them git objects git freshened) on its walk's thread, beside
    8 busy writers."""
    if _open_at is None:
        return os.open(name, flags | os.O_CLOEXEC, dir_fd=dirfd)
    return _open_at(dirfd, name, flags | os.O_CLOEXEC)


def set_mtime(fd: int, mtime_ns: int) -> None:
    """``os.utime(fd, ns=(mtime_ns, mtime_ns))`` (atime: see :func:`apply_meta`) with the
    GIL kept where the extension is built, as :func:`open_dir_at` opens: the undo of the
    medium step sets back the mtime of 1,098 directories it wrote in and 2,552 files whose
    only change was theirs, each call on the restore's walk beside 8 busy writers."""
    if _set_mtime is None:
        os.utime(fd, ns=(mtime_ns, mtime_ns))
    else:
        _set_mtime(fd, mtime_ns)


def pwrite_piece(fd: int, data: bytes, piece: Piece, at: int) -> None:
    """Writes ``piece``'s slice of its object's bytes ``data`` at offset ``at``, whole.

    Raises:
        SnapshotError: the object is shorter than the piece says.
    """
    oid, off, n = piece
    view = memoryview(data)[off : off + n]
    if len(view) != n:
        name = oid.hex()[:16] if oid is not None else "hole"
        raise SnapshotError(f"chunk {name} is shorter than its piece")
    while view:
        w = os.pwrite(fd, view, at)
        view = view[w:]
        at += w


def read_xattrs(target: int | bytes, *, follow: bool = False) -> Xattrs:
    """All extended attributes of an fd or a (proc) path, sorted; symlinks not followed
    unless ``follow`` (a ``/proc/self/fd/N`` link to an ``O_PATH`` descriptor's inode)."""
    try:
        if isinstance(target, int) or follow:
            names = os.listxattr(target)
            items = [(n, os.getxattr(target, n)) for n in names]
        else:
            names = os.listxattr(target, follow_symlinks=False)
            items = [(n, os.getxattr(target, n, follow_symlinks=False)) for n in names]
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return ()
        raise
    return tuple(sorted((os.fsencode(n), v) for n, v in items))


def apply_meta(
    dirfd: int,
    name: bytes,
    st_mode: int,
    mode: int,
    uid: int,
    gid: int,
    mtime_ns: int,
    xattrs: Xattrs,
    *,
    fd: int | None = None,
) -> None:
    """Sets owner, xattrs, mode and mtime, in the order that keeps each one.

    chown clears setuid/setgid and security.capability, so it goes first; the mode comes
    after the xattrs (a capability set on a file resets nothing, but be explicit); the
    mtime goes last because every other change touches the inode. ``st_mode`` tells the
    file type (symlinks have no mode of their own). ``fd``, when given, is an open
    descriptor of the same file, used instead of paths where the kernel allows.
    """
    is_link = stat.S_ISLNK(st_mode)
    path = proc_path(dirfd, name)
    if fd is not None:
        os.fchown(fd, uid, gid)
    else:
        os.chown(name, uid, gid, dir_fd=dirfd, follow_symlinks=False)
    set_xattrs(fd if fd is not None else path, xattrs)
    if not is_link:
        if fd is not None:
            os.fchmod(fd, mode)
        else:
            os.chmod(name, mode, dir_fd=dirfd, follow_symlinks=False)
    if fd is not None:
        set_mtime(fd, mtime_ns)  # atime is not captured; mtime is the closest honest value
    else:
        os.utime(name, ns=(mtime_ns, mtime_ns), dir_fd=dirfd, follow_symlinks=False)


def apply_meta_proc(
    path_fd: int, mode: int, uid: int, gid: int, mtime_ns: int, xattrs: Xattrs
) -> None:
    """:func:`apply_meta` for an ``O_PATH`` descriptor (a device node, which is never
    opened for real): through ``/proc/self/fd/N``, which leads to that very inode."""
    path = b"/proc/self/fd/%d" % path_fd
    os.chown(path, uid, gid)
    set_xattrs(path, xattrs, follow=True)
    os.chmod(path, mode)
    os.utime(path, ns=(mtime_ns, mtime_ns))


def set_xattrs(target: int | bytes, want: Xattrs, *, follow: bool = False) -> None:
    """Makes the xattrs of ``target`` exactly ``want`` (extra ones are removed)."""
    have = dict(read_xattrs(target, follow=follow))
    wanted = dict(want)
    follow = follow or isinstance(target, int)
    for k in have:
        if k not in wanted:
            if follow:
                os.removexattr(target, k)
            else:
                os.removexattr(target, k, follow_symlinks=False)
    for k, v in want:
        if have.get(k) != v:
            if follow:
                os.setxattr(target, k, v)
            else:
                os.setxattr(target, k, v, follow_symlinks=False)


def fd_room(want: int, spare: int) -> int:
    """How many more descriptors (at most ``want``) a caller may hold while ``spare`` are
    left to everything else, raising the soft ``RLIMIT_NOFILE`` towards the hard limit if
    that gives more (a root daemon's soft limit is often 1,024, its hard one far more)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = want + spare
    if soft < need and (hard == resource.RLIM_INFINITY or soft < hard):
        new = need if hard == resource.RLIM_INFINITY else min(need, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
    return max(0, min(want, soft - spare))
