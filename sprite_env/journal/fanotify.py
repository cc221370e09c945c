"""A thin ctypes binding of fanotify in FID mode, and the decoder of its event records.

Only what the journal needs: a notification group that reports file handles
(``FAN_REPORT_DFID_NAME | FAN_REPORT_FID``), a mark on a whole file system
(``FAN_MARK_FILESYSTEM``), non-blocking reads, and ``open_by_handle_at``. No event carries
an open file descriptor in this mode, so nothing here can leak descriptors or block a
writer (``FAN_CLASS_NOTIF`` never waits for us).

Event buffer layout (``<linux/fanotify.h>``), repeated ``event_len`` bytes at a time::

    metadata := event_len:u32 vers:u8 reserved:u8 metadata_len:u16 mask:u64 fd:i32 pid:i32
    info     := info_type:u8 pad:u8 len:u16 body          (until event_len)
    fid body := fsid:2*i32 handle_bytes:u32 handle_type:i32 f_handle[handle_bytes] [name\\0]

Info types 2 (``DFID_NAME``) and 3 (``DFID``) name the directory an event happened in
(with the child's name for type 2); type 1 (``FID``) names the object itself. A handle is
kept as ``handle_type:i32 || f_handle`` bytes: what ``open_by_handle_at`` needs back.

Profile (this machine, 6.18, tmpfs, 2 shared cores): decoding in Python runs at about 0.4
million events a second (16k create events of about 80 bytes each): a full kernel queue
(16384 events) takes 40 ms, far below what the walk it replaces costs, so the binding stays
in ctypes; a C decoder in ``native/`` is the step if a profile ever shows it. The one
call made per name of a capture's events, ``name_to_handle_at``, is in the extension.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

FAN_CLOEXEC = 0x1
FAN_NONBLOCK = 0x2
FAN_CLASS_NOTIF = 0x0
FAN_UNLIMITED_QUEUE = 0x10
FAN_REPORT_FID = 0x200
FAN_REPORT_DIR_FID = 0x400
FAN_REPORT_NAME = 0x800
FAN_REPORT_DFID_NAME = FAN_REPORT_DIR_FID | FAN_REPORT_NAME

FAN_MARK_ADD = 0x1
FAN_MARK_FILESYSTEM = 0x100

FAN_MODIFY = 0x2
FAN_ATTRIB = 0x4
FAN_CLOSE_WRITE = 0x8
FAN_MOVED_FROM = 0x40
FAN_MOVED_TO = 0x80
FAN_CREATE = 0x100
FAN_DELETE = 0x200
FAN_DELETE_SELF = 0x400
FAN_MOVE_SELF = 0x800
FAN_Q_OVERFLOW = 0x4000
FAN_EVENT_ON_CHILD = 0x08000000
FAN_ONDIR = 0x40000000

#: Everything that can change what a capture records: names (create, delete, moves),
#: contents (modify, close-write: the last word after writes through a mapping), metadata
#: (attrib: mode, owner, times, xattrs, link count) and a watched directory's own end.
CHANGE_EVENTS = (
    FAN_CREATE
    | FAN_DELETE
    | FAN_MOVED_FROM
    | FAN_MOVED_TO
    | FAN_MODIFY
    | FAN_ATTRIB
    | FAN_CLOSE_WRITE
    | FAN_DELETE_SELF
    | FAN_MOVE_SELF
)
DIRENT_EVENTS = FAN_CREATE | FAN_DELETE | FAN_MOVED_FROM | FAN_MOVED_TO

INFO_FID = 1
INFO_DFID_NAME = 2
INFO_DFID = 3

_META = struct.Struct("<IBBHQii")
_INFO = struct.Struct("<BBH")
_FID = struct.Struct("<iiIi")  # fsid[2], handle_bytes, handle_type
METADATA_VERSION = 3
#: One read drains up to this much of the queue (an event is 40-300 bytes).
READ_SIZE = 1 << 18

_handle_at: Callable[[bytes], bytes] | None
try:
    from sprite_env._native import handle_at as _handle_at
except ImportError:
    _handle_at = None

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fanotify_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
_libc.fanotify_init.restype = ctypes.c_int
_libc.fanotify_mark.argtypes = [
    ctypes.c_int,
    ctypes.c_uint,
    ctypes.c_uint64,
    ctypes.c_int,
    ctypes.c_char_p,
]
_libc.fanotify_mark.restype = ctypes.c_int
_libc.open_by_handle_at.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
_libc.open_by_handle_at.restype = ctypes.c_int
_libc.name_to_handle_at.argtypes = [
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_int),
    ctypes.c_int,
]
_libc.name_to_handle_at.restype = ctypes.c_int
MAX_HANDLE_SZ = 128
AT_EMPTY_PATH = 0x1000
AT_FDCWD = -100


def _check(rc: int, what: str) -> int:
    if rc < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return rc


def fanotify_init(flags: int, event_f_flags: int) -> int:
    """``fanotify_init(2)``; returns the group's descriptor. Raises OSError."""
    return _check(_libc.fanotify_init(flags, event_f_flags), "fanotify_init")


def fanotify_mark(fd: int, flags: int, mask: int, path: bytes) -> None:
    """``fanotify_mark(2)`` on ``path`` (absolute). Raises OSError."""
    _check(_libc.fanotify_mark(fd, flags, mask, AT_FDCWD, path), "fanotify_mark")


def open_by_handle(mount_fd: int, handle: bytes, flags: int) -> int:
    """``open_by_handle_at(2)`` with a handle as kept by :func:`decode` (type + bytes).

    Raises:
        OSError: ESTALE when the object no longer exists; others as the kernel says.
    """
    htype = handle[:4]
    body = handle[4:]
    buf = ctypes.create_string_buffer(struct.pack("<I", len(body)) + htype + body)
    return _check(_libc.open_by_handle_at(mount_fd, buf, flags), "open_by_handle_at")


def handle_of(fd: int) -> bytes:
    """The handle of the object open at ``fd`` (``name_to_handle_at`` with AT_EMPTY_PATH),
    in :func:`decode`'s form: what fanotify reports for it."""
    return _name_to_handle(fd, b"", AT_EMPTY_PATH)


def handle_at(path: bytes) -> bytes:
    """The handle of what ``path`` names, not following a last symlink, in :func:`decode`'s
    form. Raises OSError (ENOENT, ENOTDIR as ``lstat`` would). 1.1 us with the extension
    (``_native.handle_at``), 5.3 through ctypes, where ``os.lstat`` takes 2.2."""
    if _handle_at is not None:
        return _handle_at(path)
    return _name_to_handle(AT_FDCWD, path, 0)


def _name_to_handle(dirfd: int, path: bytes, flags: int) -> bytes:
    buf = ctypes.create_string_buffer(8 + MAX_HANDLE_SZ)
    struct.pack_into("<I", buf, 0, MAX_HANDLE_SZ)
    mount_id = ctypes.c_int()
    _check(
        _libc.name_to_handle_at(dirfd, path, buf, ctypes.byref(mount_id), flags),
        "name_to_handle_at",
    )
    n, htype = struct.unpack_from("<Ii", buf, 0)
    return struct.pack("<i", htype) + buf.raw[8 : 8 + n]


@dataclass(slots=True)
class Batch:
    """What one read of the queue said, folded for the journal.

    Attributes:
        dirs: handles of directories whose entries changed (a child created, deleted,
            moved, or a child's contents or metadata changed).
        names: (directory handle, name) of every child an event named: the children of a
            directory in ``dirs`` that a capture must look at (see ``WalkHint.named``).
        children: (directory handle, name) of directories created, deleted or moved: their
            paths now name another directory (or none), so what was cached there is void.
        selves: handles of directories whose own metadata changed (their parent records it).
        objects: handles of non-directories reported without a directory (a link count
            changed: ``link``/``unlink`` of a name elsewhere).
        foreign: records of another file system, dropped (counted for the tests).
        overflow: the kernel dropped events (``FAN_Q_OVERFLOW``).
        events: events decoded.
    """

    dirs: set[bytes]
    children: set[tuple[bytes, bytes]]
    selves: set[bytes]
    objects: set[bytes]
    names: set[tuple[bytes, bytes]] = field(default_factory=set)
    #: (directory handle, name) of every create, delete or move of a child: the names of
    #: ``names`` an entry event explains (the others only named a child's data or metadata).
    entries: set[tuple[bytes, bytes]] = field(default_factory=set)
    #: (directory handle, name, file handle) of every other event naming a child that no
    #: entry event had named before it: which file each of those names was a name of when
    #: the event came (see Journal._resolve).
    named_objects: set[tuple[bytes, bytes, bytes]] = field(default_factory=set)
    #: the handles of ``dirs`` and ``selves``, and of ``objects``, added since their taker
    #: (``Journal.poll``, which resolves them ahead) last emptied these: a poll looks at
    #: what came since the one before, not at the whole epoch's sets again (each poll
    #: rebuilt their union: after a copy of the medium layer, 17k directories, 2-5 ms a
    #: poll and 0.5 s of the interpreter during the next checkpoint)
    fresh_dirs: set[bytes] = field(default_factory=set)
    fresh_objects: set[bytes] = field(default_factory=set)
    #: the triples of ``named_objects`` added since their taker (``Journal.poll``) last
    #: emptied it, likewise
    fresh_named: set[tuple[bytes, bytes, bytes]] = field(default_factory=set)
    foreign: int = 0
    overflow: bool = False
    events: int = 0


def new_batch() -> Batch:
    return Batch(set(), set(), set(), set())


def decode(buf: bytes, fsid: tuple[int, int], into: Batch) -> None:
    """Folds the events in ``buf`` (one ``read`` of the group) into ``into``.

    Records whose fsid is not ``fsid`` are dropped first, before any handle is looked at.

    Raises:
        ValueError: a record the kernel would not write (a version this code does not know).
    """
    off = 0
    end = len(buf)
    meta_size = _META.size
    dirs, children, selves, objects = into.dirs, into.children, into.selves, into.objects
    names = into.names
    fresh_dirs, fresh_objects = into.fresh_dirs, into.fresh_objects
    while off + meta_size <= end:
        event_len, vers, _r, meta_len, mask, _fd, _pid = _META.unpack_from(buf, off)
        if vers != METADATA_VERSION or event_len < meta_len:
            raise ValueError(f"fanotify metadata version {vers} (expected {METADATA_VERSION})")
        into.events += 1
        if mask & FAN_Q_OVERFLOW:
            into.overflow = True
            off += event_len
            continue
        ondir = bool(mask & FAN_ONDIR)
        dirent = bool(mask & DIRENT_EVENTS)
        pos = off + meta_len
        stop = off + event_len
        dir_handle: bytes | None = None
        name = b""
        obj_handle: bytes | None = None
        foreign = False
        while pos + 4 <= stop:
            itype, _pad, ilen = _INFO.unpack_from(buf, pos)
            if ilen < 4:
                raise ValueError("corrupt fanotify info record")
            if itype in (INFO_FID, INFO_DFID_NAME, INFO_DFID):
                f0, f1, hbytes, _htype = _FID.unpack_from(buf, pos + 4)
                if (f0, f1) != fsid:
                    foreign = True
                    break
                hstart = pos + 4 + 8 + 4  # the handle type, then the handle's bytes
                handle = buf[hstart : hstart + 4 + hbytes]
                if itype == INFO_FID:
                    obj_handle = handle
                else:
                    dir_handle = handle
                    if itype == INFO_DFID_NAME:
                        nstart = hstart + 4 + hbytes
                        nend = buf.index(b"\0", nstart, pos + ilen)
                        name = buf[nstart:nend]
            pos += ilen
        off += event_len
        if foreign:
            into.foreign += 1
            continue
        if dir_handle is not None and name not in (b"", b"."):
            if dir_handle not in dirs:
                dirs.add(dir_handle)
                fresh_dirs.add(dir_handle)
            names.add((dir_handle, name))
            if dirent:
                into.entries.add((dir_handle, name))
                if ondir:
                    children.add((dir_handle, name))
            elif obj_handle is not None and (dir_handle, name) not in into.entries:
                # (a name an entry event explains is not checked: entries only grow, so a
                # file created this epoch, an npm install's 50k, costs nothing here)
                triple = (dir_handle, name, obj_handle)
                if triple not in into.named_objects:
                    into.named_objects.add(triple)
                    into.fresh_named.add(triple)
        elif dir_handle is not None:  # an event on the directory itself
            if dir_handle not in selves:
                selves.add(dir_handle)
                fresh_dirs.add(dir_handle)
        elif obj_handle is not None:
            if ondir:
                if obj_handle not in selves:
                    selves.add(obj_handle)
                    fresh_dirs.add(obj_handle)
            elif obj_handle not in objects:
                objects.add(obj_handle)
                fresh_objects.add(obj_handle)


def read_events(fd: int, fsid: tuple[int, int], into: Batch) -> int:
    """Reads the queue until it is empty, folding into ``into``; returns bytes read."""
    total = 0
    while True:
        try:
            buf = os.read(fd, READ_SIZE)
        except BlockingIOError:
            return total
        except OSError as e:
            if e.errno == errno.EINTR:
                continue
            raise
        if not buf:
            return total
        total += len(buf)
        decode(buf, fsid, into)


def fsid_of(fd: int) -> tuple[int, int]:
    """The ``f_fsid`` of the file system holding ``fd``, as fanotify reports it."""
    buf = ctypes.create_string_buffer(120)  # struct statfs
    _check(_libc.fstatfs(fd, buf), "fstatfs")
    # struct statfs (x86-64, aarch64): 7 longs and 2 more fields; f_fsid is at byte 56
    f0, f1 = struct.unpack_from("<ii", buf, 56)
    return f0, f1
