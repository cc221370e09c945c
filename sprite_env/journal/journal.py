"""The change journal of one layer: which directories changed since the last capture.

A fanotify group in FID mode watches the whole file system holding the layer
(``FAN_MARK_FILESYSTEM``: under overlayfs that is the upper directory's file system, which
from kernel 6.5 on also sees every write made through MERGED). Events are folded as they
are read into sets of directory handles; a capture's :meth:`Journal.begin` turns those
into paths relative to the layer root, once per distinct directory, and hands them to the
capture as a :class:`~sprite_env.snapshot.capture.WalkHint`.

Epochs. ``begin`` takes everything queued so far and starts a new epoch: what happens while
the capture walks belongs to the next one, so a directory changed behind the walk is dirty
again next time. The capture's commit calls :meth:`Journal.commit` with the walk's memo
(subtree counts, hard-link directories); a capture that fails calls :meth:`Journal.abort`,
which makes the next capture a full walk (what it took is not put back: simpler, and
equally safe).

A hint, never the truth: the capture walks everything (``WalkPlan.hint is None``, with the
reason recorded in the checkpoint) when the group was just started (no previous walk this
journal saw from its start), when the kernel dropped events (queue overflow), when a handle
cannot be resolved for any reason but "the object is gone", when a previous capture
failed, or when the file system stops being what it was at the start. See
``snapshot/capture.py`` for why what the journal leaves out can only cost speed.

Writes through a shared writable mapping produce no event until the file is closed, and
move the file's mtime only when a clean page is first written, so at each ``begin`` the
mappings of every process (``/proc/*/maps``) are scanned for shared writable ones of files
of the layer (about 3 ms for 80 processes): their directories are dirty and the files
themselves are read again by the walk (``WalkPlan.reread``), full or not, as long as the
mapping lives.

Error handling:
    :func:`probe` says why the journal cannot run here (no exception); :class:`Journal`'s
    constructor raises :class:`JournalUnavailable` with that reason.
"""

from __future__ import annotations

import contextlib
import errno
import os
import platform
import re
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sprite_env import mountinfo, procfs
from sprite_env.errors import SpriteError
from sprite_env.journal import fanotify as fan

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from sprite_env.snapshot.capture import CaptureResult, WalkMemo

from sprite_env.snapshot.capture import WalkHint

#: overlayfs passes its writes to fsnotify on the real (upper) files from this kernel on
#: (commit bc2473c90fca, "ovl: enable fsnotify events on underlying real files").
OVERLAY_MIN_KERNEL = (6, 5)
#: fanotify reports the directory and name of a child's events from 5.9 on.
MIN_KERNEL = (5, 9)
_INIT_FLAGS = (
    fan.FAN_CLASS_NOTIF
    | fan.FAN_CLOEXEC
    | fan.FAN_NONBLOCK
    | fan.FAN_REPORT_DFID_NAME
    | fan.FAN_REPORT_FID
)
_MARK_MASK = fan.CHANGE_EVENTS | fan.FAN_ONDIR | fan.FAN_EVENT_ON_CHILD


class JournalUnavailable(SpriteError):
    """The journal cannot run on this kernel or file system (the capture walks everything)."""


@dataclass(frozen=True, slots=True)
class WalkPlan:
    """What :meth:`Journal.begin` hands a capture.

    Attributes:
        hint: the directories to walk, or None for a full walk.
        reason: why a full walk (empty when there is a hint).
        epoch: identifies the epoch for :meth:`Journal.commit`.
        reread: files some process maps shared and writable (relative paths): read again
            by any walk, full or not, since a write through a mapping may leave their
            signature as it was (mtime moves only when a clean page is first written).
    """

    hint: WalkHint | None
    reason: str
    epoch: int
    reread: frozenset[bytes] = frozenset()


def kernel_version(release: str | None = None) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", release or platform.release())
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def kernel_reason(*, overlay: bool = False, release: str | None = None) -> str | None:
    """Why the kernel ``release`` (default: this one) cannot run the journal, or None."""
    version = kernel_version(release)
    need = OVERLAY_MIN_KERNEL if overlay else MIN_KERNEL
    if version >= need:
        return None
    what = "overlayfs writes reach fanotify" if overlay else "fanotify reports names"
    return f"kernel {version[0]}.{version[1]}: {what} only from {need[0]}.{need[1]} on"


def probe(root: str, *, overlay: bool = False) -> str | None:
    """Why a journal cannot watch ``root`` here, or None if it can (tries it for real).

    Args:
        root: the layer (under an overlay: the upper directory).
        overlay: the layer is written through overlayfs MERGED.
    """
    why = kernel_reason(overlay=overlay)
    if why is not None:
        return why
    try:
        fd = fan.fanotify_init(_INIT_FLAGS, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.EPERM:
            return "fanotify needs CAP_SYS_ADMIN"
        return f"fanotify is not available ({os.strerror(e.errno or 0)})"
    try:
        fan.fanotify_mark(fd, fan.FAN_MARK_ADD | fan.FAN_MARK_FILESYSTEM, _MARK_MASK, _abs(root))
    except OSError as e:
        return f"cannot watch the file system of {root} ({os.strerror(e.errno or 0)})"
    finally:
        os.close(fd)
    return None


def _abs(path: str | bytes) -> bytes:
    return os.fsencode(os.path.realpath(path))


#: Tries of an open_by_handle_at that fails with ENOMEM (see Journal._open).
_ENOMEM_TRIES = 3


class _Doubt(Exception):
    """A reason to walk everything."""


class _NotYet(Exception):
    """A handle :meth:`Journal.poll` leaves for :meth:`Journal.begin` to resolve."""


@dataclass(frozen=True, slots=True)
class _Linked:
    """A file with several links whose changed names no event gave (a link made or
    removed elsewhere, a write under a name it lost): its inode, for the capture to name
    every name the files cache has for it (``WalkHint.inodes``)."""

    ino: int


@dataclass(slots=True)
class _Resolved:
    """Handles resolved within one epoch: directories' and objects' paths relative to the
    root (None: gone, or outside the layer), and the first doubt met."""

    dirs: dict[bytes, bytes | None] = field(default_factory=dict)
    objects: dict[bytes, bytes | _Linked | None] = field(default_factory=dict)
    #: (directory handle, name) of a data or metadata event -> the handle of the file that
    #: name names (None: none), and a file's handle -> where it is when that is another
    #: file (see ``Journal._resolve``): looked up by ``Journal.poll`` ahead of ``begin``
    names: dict[tuple[bytes, bytes], bytes | None] = field(default_factory=dict)
    lost: dict[bytes, bytes | _Linked | None] = field(default_factory=dict)
    doubt: str = ""


@dataclass(slots=True)
class _Found:
    """What one epoch's handles resolved to (see :class:`WalkHint`): dirty directories,
    void paths, and the children events named in each directory (a dirty directory with
    no names would be listed whole)."""

    dirty: set[bytes] = field(default_factory=set)
    void: set[bytes] = field(default_factory=set)
    named: dict[bytes, set[bytes]] = field(default_factory=dict)
    inodes: set[int] = field(default_factory=set)

    def name(self, rel: bytes, name: bytes) -> None:
        self.dirty.add(rel)
        names = self.named.get(rel)
        if names is None:
            names = self.named[rel] = set()
        names.add(name)


class Journal:
    """Watches the file system of ``root``; see the module docstring.

    Args:
        root: the layer root.
        views: other paths where the layer's files are seen (overlayfs MERGED), for the
            scan of writable mappings: a file mapped through a view is the layer's file.
        overlay: the layer is written through overlayfs (checked against the kernel).

    Raises:
        JournalUnavailable: see :func:`probe`.
    """

    def __init__(
        self,
        root: str,
        *,
        views: Iterable[str] = (),
        overlay: bool = False,
        bounded_queue: bool = False,
    ) -> None:
        why = kernel_reason(overlay=overlay)
        if why is not None:
            raise JournalUnavailable(why)
        self.root = _abs(root)
        self.views = [_abs(v) for v in views]
        # The kernel's default queue holds 16384 events: one `npm install`, a wipe and
        # restore, or the medium layer's typical step while the reader waits for the GIL
        # (load 6: it overflowed in bench_step) fills it, and the next checkpoint walks
        # everything. So the queue is unlimited (we run with CAP_SYS_ADMIN, which
        # fanotify_init(2) asks for anyway): the reader drains it every 50 ms; the kernel
        # merges repeated events of one object in the queue, and charges the events to
        # the daemon's memory cgroup, which bounds it. ``bounded_queue``: the default
        # queue, for tests that force an overflow.
        flags = _INIT_FLAGS if bounded_queue else _INIT_FLAGS | fan.FAN_UNLIMITED_QUEUE
        try:
            self._fd = fan.fanotify_init(flags, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise JournalUnavailable(f"fanotify_init: {os.strerror(e.errno or 0)}") from None
        try:
            self._mount_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            st = os.fstat(self._mount_fd)
            self._dev = st.st_dev
            self.fsid = fan.fsid_of(self._mount_fd)
            fan.fanotify_mark(
                self._fd, fan.FAN_MARK_ADD | fan.FAN_MARK_FILESYSTEM, _MARK_MASK, self.root
            )
        except OSError as e:
            os.close(self._fd)
            raise JournalUnavailable(f"cannot watch {root}: {e}") from None
        self._lock = threading.Lock()
        self._batch = fan.new_batch()
        self._known = _Resolved()  # this epoch's handles resolved ahead by poll()
        self._memo: WalkMemo | None = None
        self._full_reason = "the journal just started (no walk it saw from its start)"
        self._epoch = 0
        self._in_capture = False
        self._quiet = 0  # restores under way (see quiet())
        self._mounts = self._mounts_under_root()
        self.events = 0  # decoded since the start (for tests and benchmarks)
        self.foreign = 0
        self.overflows = 0

    def close(self) -> None:
        for fd in (self._fd, self._mount_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fd = self._mount_fd = -1

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fileno(self) -> int:
        """The group's descriptor: readable when events are queued (for a poll loop)."""
        return self._fd

    # -- reading -----------------------------------------------------------------------------

    def poll(self) -> int:
        """Reads what the kernel has queued (never blocks); returns the bytes read. Call it
        often enough that the queue does not grow (or, bounded, overflow).

        Between captures it also resolves the handles it has not seen this epoch, so that
        :meth:`begin` only resolves what came since: 20k directories made elsewhere on the
        layer's file system (bench_step's peers restore a copy there) cost 0.35 s of
        ``open_by_handle_at`` and ``readlink`` at a begin. Resolving early is as safe as at
        ``begin``: a path found before a move or removal is stale only where that move or
        removal is itself an event of this epoch (its directory dirty, the names void: the
        new place walked whole); a stale dirty path costs a walk, never a miss. The cache
        lives one epoch: a handle's path is looked up again in the next.
        """
        with self._lock:
            if self._quiet:
                return 0  # left in the kernel's queue until the restore is committed
            n = self._read()
            if self._in_capture:
                return n  # the capture's own time: no contention for the interpreter
            known, batch, epoch = self._known, self._batch, self._epoch
            # only what came since the last poll (a child's directory is in ``dirs`` too);
            # an object left for begin (_NotYet) is not tried again here. Looked up one by
            # one: ``set - dict.keys()`` copies every key resolved this epoch into a set
            # first (26 ms of a poll thread during one checkpoint of the medium step)
            dirs = {h for h in batch.fresh_dirs if h not in known.dirs}
            objects = {h for h in batch.fresh_objects if h not in known.objects}
            named = [t for t in batch.fresh_named if (t[0], t[1]) not in batch.entries]
            batch.fresh_dirs, batch.fresh_objects, batch.fresh_named = set(), set(), set()
        if not dirs and not objects and not named:
            return n
        ahead = _Resolved()
        try:
            for h in dirs:
                self._dir_path(h, ahead.dirs)
            for h in objects:
                with contextlib.suppress(_NotYet):
                    ahead.objects[h] = self._object_path(h, ahead=True)
            self._names_ahead(named, known, ahead, epoch)
        except _Doubt as e:
            ahead.doubt = str(e)
        except OSError:
            return n  # closed meanwhile (the daemon stops): begin resolves as before
        with self._lock:
            if epoch == self._epoch and self._known is known:
                known.dirs.update(ahead.dirs)
                known.objects.update(ahead.objects)
                known.names.update(ahead.names)
                known.lost.update(ahead.lost)
                known.doubt = known.doubt or ahead.doubt
        return n

    def _names_ahead(
        self,
        named: list[tuple[bytes, bytes, bytes]],
        known: _Resolved,
        ahead: _Resolved,
        epoch: int,
    ) -> None:
        """Looks up, ahead of :meth:`begin`, what :meth:`_resolve` looks up for each data
        or metadata event whose name no entry event explains: the file its name names now,
        and, where that is not the event's file, where the event's file is. The medium
        step's ~1.1k files edited in place cost one ``name_to_handle_at`` each in the
        checkpoint's begin (30-40 ms of its thread, py-spy --gil).

        As sound as at begin: a name names another file only after a create, delete or
        move of that name in its directory, which is an entry event: ``begin`` then skips
        the name (``batch.names - batch.entries``), and what the entry event names is
        walked. A file found elsewhere moves only by such events too, which name it where
        it goes. What is in doubt (several links, not in the layer) is left to begin.
        Stops when a capture has begun (``epoch`` is over): what it found would be thrown
        away, and it would only take the interpreter from the capture.
        """
        for h, name, obj in named:
            if self._epoch != epoch:
                return
            rel = ahead.dirs[h] if h in ahead.dirs else known.dirs.get(h)
            if rel is None:
                continue  # not resolved (or outside the layer): begin decides
            key = (h, name)
            if key in known.names or key in ahead.names:
                now = known.names.get(key, ahead.names.get(key))
            else:
                try:
                    now = self._handle_of(rel, name)
                except OSError as e:
                    if e.errno not in (errno.ENOENT, errno.ENOTDIR):
                        continue
                    now = None
                ahead.names[key] = now
            if obj != now and obj not in known.lost and obj not in ahead.lost:
                with contextlib.suppress(_Doubt, _NotYet):
                    ahead.lost[obj] = self._lost_name_path(obj, ahead=True)

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """While the daemon's own restore writes: :meth:`poll` leaves the events in the
        kernel's queue, and the first poll after reads and resolves them all. The undo of
        the medium step writes in ~1,100 directories: decoding and resolving their events
        beside it held the interpreter 94 ms of a 1.4 s undo's downtime (py-spy --gil),
        which the restore's threads waited for. Nothing is lost: the daemon's queue is
        unlimited (a bounded one that overflows meanwhile makes the next walk full), and
        :meth:`begin` reads whatever is still queued."""
        with self._lock:
            self._quiet += 1
        try:
            yield
        finally:
            with self._lock:
                self._quiet -= 1

    def _read(self) -> int:
        """Drains the queue into the current batch (the lock held). A record this code
        cannot decode loses the rest of its read, so it makes the next walk full instead
        of failing the daemon's reader."""
        try:
            return fan.read_events(self._fd, self.fsid, self._batch)
        except ValueError as e:
            self._full_reason = self._full_reason or f"an fanotify record was not understood ({e})"
            return 0

    def force_full(self, reason: str) -> None:
        """Makes the next capture walk everything (the daemon's own writes it cannot
        account for, a configuration change)."""
        with self._lock:
            self._full_reason = self._full_reason or reason

    # -- the capture's protocol ------------------------------------------------------------

    def begin(self) -> WalkPlan:
        """Starts a capture: takes the events so far and says what to walk."""
        with self._lock:
            if self._in_capture:
                raise RuntimeError("Journal.begin while another capture is running")
            self._read()
            batch, self._batch = self._batch, fan.new_batch()
            known, self._known = self._known, _Resolved()
            self._epoch += 1
            self._in_capture = True
            reason, memo = self._full_reason, self._memo
            self._full_reason = ""
        self.events += batch.events
        self.foreign += batch.foreign
        if batch.overflow:
            self.overflows += 1
            reason = reason or "the kernel's event queue overflowed (events were lost)"
        if not reason and memo is None:
            reason = "no previous walk to build on"
        mounts = self._mounts_under_root()
        if mounts != self._mounts:  # a mount makes no event, but a walk skips mount points
            self._mounts = mounts
            reason = reason or "file systems were mounted or unmounted inside the layer"
        mapped = frozenset(self._mapped_writable())
        if not reason and known.doubt:
            reason = known.doubt
        if not reason:
            try:
                found = self._resolve(batch, known)
                for p in mapped:
                    found.name(_parent(p), _base(p))
            except _Doubt as e:
                reason = str(e)
        if reason:
            return WalkPlan(None, reason, self._epoch, mapped)
        assert memo is not None
        hint = WalkHint(
            frozenset(found.dirty),
            frozenset(found.void),
            memo,
            named={rel: frozenset(n) for rel, n in found.named.items()},
            inodes=frozenset(found.inodes),
        )
        return WalkPlan(hint, "", self._epoch, mapped)

    def commit(self, plan: WalkPlan, memo: WalkMemo) -> None:
        """Ends a capture whose files cache committed: its memo is the next base."""
        with self._lock:
            if plan.epoch == self._epoch and self._in_capture:
                self._memo = memo
                self._in_capture = False

    def abort(self, plan: WalkPlan, reason: str = "the previous capture did not finish") -> None:
        """Ends a capture that did not commit: the next one walks everything."""
        with self._lock:
            if plan.epoch == self._epoch:
                self._in_capture = False
                self._memo = None
                self._full_reason = self._full_reason or reason

    # -- resolving handles -------------------------------------------------------------------

    def _path(self, rel: bytes) -> bytes:
        """The absolute path of ``rel`` (relative to the root)."""
        return b"/".join(p for p in (self.root, rel) if p)

    def _handle_of(self, rel: bytes, name: bytes) -> bytes:
        """The handle of what ``name`` in the directory ``rel`` names now (what an event's
        name is checked against: ``_resolve``, and ``_names_ahead`` between captures).

        Raises:
            OSError: ENOENT or ENOTDIR where nothing has the name, or any other error.
        """
        return fan.handle_at(self._path(rel) + b"/" + name)

    def _rel(self, path: bytes) -> bytes | None:
        root = self.root
        if path == root:
            return b""
        if path.startswith(root) and path[len(root) : len(root) + 1] == b"/":
            return path[len(root) + 1 :]
        return None

    def _open(self, handle: bytes) -> int | None:
        # ENOMEM: exportfs's reconnection of a directory handle fails with it (nfsd
        # expects "ESTALE or ENOMEM" from fh_to_dentry), seen once while a restore's
        # unlinker threads removed trees beside it: tried again before it is a doubt.
        for attempt in range(_ENOMEM_TRIES):
            try:
                return fan.open_by_handle(self._mount_fd, handle, os.O_PATH | os.O_CLOEXEC)
            except OSError as e:
                if e.errno == errno.ESTALE:
                    return None  # the object is gone: see _resolve
                if e.errno == errno.ENOMEM and attempt + 1 < _ENOMEM_TRIES:
                    time.sleep(0.001 * (attempt + 1))
                    continue
                why = os.strerror(e.errno or 0)
                raise _Doubt(f"cannot resolve a file handle ({why})") from None
        raise AssertionError("unreachable")

    def _dir_path(self, handle: bytes, cache: dict[bytes, bytes | None]) -> bytes | None:
        """The path of a directory relative to the root; None if gone or outside."""
        if handle in cache:
            return cache[handle]
        fd = self._open(handle)
        rel = None
        if fd is not None:
            try:
                st = os.fstat(fd)
                if st.st_nlink > 0:  # 0: removed, though still open somewhere
                    if not stat.S_ISDIR(st.st_mode) or st.st_dev != self._dev:
                        raise _Doubt("a directory handle resolved to something else")
                    rel = self._rel(os.readlink(b"/proc/self/fd/%d" % fd))
            finally:
                os.close(fd)
        cache[handle] = rel
        return rel

    def _object_path(self, handle: bytes, *, ahead: bool = False) -> bytes | _Linked | None:
        """The path of a non-directory reported alone (its link count changed), or, if it
        has several links now, its inode: one path cannot say where its other names are.

        Raises:
            _NotYet: ``ahead`` (resolving from :meth:`poll`) and the file has several
                links now: whether it still has at the capture's start is what matters.
                ``git`` makes each object by ``link(tmp, name)`` then ``unlink(tmp)``;
                the reader, polling, resolved one of the 210 of the benchmark's step in
                between often enough that the step's checkpoint walked everything (round
                0 of a 3-round run: "a file with several links changed its link count").
        """
        fd = self._open(handle)
        if fd is None:
            return None
        try:
            st = os.fstat(fd)
            if st.st_nlink == 0:
                return None  # unlinked: in no directory any more
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                # an overlayfs whiteout: since 5.8 they are links to one shared inode (made
                # in the work directory); each is a name event where it appears, and it has
                # no contents to change through another name
                return None
            if st.st_nlink > 1:
                if ahead:
                    raise _NotYet
                # a group whose members' events name one member each: see _resolve
                return _Linked(st.st_ino)
            path = os.readlink(b"/proc/self/fd/%d" % fd)
        finally:
            os.close(fd)
        rel = self._rel(path)
        if rel is None:
            # Outside the layer. Its other names (if any) inside the layer are hard links:
            # their directories are walked every time (see capture.WalkMemo.link_dirs), or
            # were just created, which is an event of their own.
            return None
        _same_file(path, st)
        return rel

    def _dir_gone(self, handle: bytes, seen: dict[bytes, bool]) -> bool:
        """Whether the directory of ``handle`` was removed (not merely outside the layer);
        ``seen`` keeps the answers of one resolve, as several names share a directory."""
        if handle not in seen:
            fd = self._open(handle)
            if fd is None:
                seen[handle] = True
            else:
                try:
                    seen[handle] = os.fstat(fd).st_nlink == 0
                finally:
                    os.close(fd)
        return seen[handle]

    def _lost_name_path(self, handle: bytes, *, ahead: bool = False) -> bytes | _Linked | None:
        """Where the file of ``handle`` is now, relative to the root, for an event that named
        it by a name it has lost (see :meth:`_resolve`); None if it is in no directory; its
        inode if it has several links (which of its names are in the layer, one path
        cannot say).

        Raises:
            _Doubt: its place cannot be vouched for: a path outside the layer (moved out,
                or a dentry the kernel could not connect to its directory, whose path says
                nothing), or a path that names another file now.
        """
        fd = self._open(handle)
        if fd is None:
            return None  # gone
        try:
            st = os.fstat(fd)
            if st.st_nlink == 0:
                return None  # removed, still open: no entry anywhere to change
            if st.st_nlink > 1:
                if ahead:
                    raise _NotYet  # how many it has at the capture's start is what matters
                return _Linked(st.st_ino)
            path = os.readlink(b"/proc/self/fd/%d" % fd)
        finally:
            os.close(fd)
        rel = self._rel(path)
        if not rel:
            raise _Doubt("a file changed under a name it lost is not found in the layer")
        _same_file(path, st)
        return rel

    def _resolve(self, batch: fan.Batch, known: _Resolved) -> _Found:
        """Turns handles into the dirty, void and named paths of a hint.

        A handle that resolves to nothing (ESTALE, or a removed directory) is dropped: an
        object that is gone is in no directory, and its removal was itself an event in the
        directory that held it (or in one of its ancestors, removed or moved with it).

        Every event on a child names it (``fan.Batch.names``), so a dirty directory's named
        children are all of its children whose entries can differ from the last capture's;
        an event on a directory itself (its own metadata, its removal or move: ``selves``)
        names it in its parent.
        """
        cache = known.dirs
        found = _Found()
        for h in batch.dirs:
            rel = self._dir_path(h, cache)
            if rel is not None:
                found.dirty.add(rel)  # its names come below (decode keeps both)
        for h, name in batch.names:
            rel = self._dir_path(h, cache)
            if rel is not None:
                found.name(rel, name)
        for h, name in batch.children:
            rel = self._dir_path(h, cache)
            if rel is not None:
                found.name(rel, name)
                found.void.add(_join(rel, name))
        for h in batch.selves:
            # its own metadata (attrib), or its own removal or move: its entry is in its
            # parent, its children are as they were (a move or removal is also a name event
            # in the parents, which voids the paths). So it is named in its parent only; a
            # restore, which sets back the mtime of every directory it wrote in, would
            # otherwise have the next capture list 2.2k directories of medium whole.
            rel = self._dir_path(h, cache)
            if rel:  # the root's own entry is made from its fstat by every capture
                found.name(_parent(rel), _base(rel))
        for h in batch.objects:
            obj = known.objects[h] if h in known.objects else self._object_path(h)
            if isinstance(obj, _Linked):
                # Several links now, one made or removed elsewhere: a change through any
                # of them (an event naming that one only) is every member's change. Its
                # names in the layer are those the files cache has for its inode (the
                # last capture's), and any made since, each an event of its own.
                found.inodes.add(obj.ino)
            elif obj is not None:
                # Its only name now, in the layer. A link was made or removed elsewhere, and
                # while it lived a change through that name (an event naming it only) was
                # this file's change too (the oracle: ``ln a/b/a a/d``, ``utime a/d``, ``rm
                # a/d`` in one epoch left a/b/a's new mtime unseen): named here, it is
                # stat'ed (its ctime moved with the link count) and read if it changed.
                found.name(_parent(obj), _base(obj))
        # Which files the names of the epoch's data and metadata events named when each
        # event came: a name that now names another file (or none) is stale (below).
        named_objects: dict[tuple[bytes, bytes], set[bytes]] = {}
        for h, name, obj in batch.named_objects:
            named_objects.setdefault((h, name), set()).add(obj)
        gone: dict[bytes, bool] = {}
        for h, name in batch.names - batch.entries:
            # An event on a file's data or metadata named a name no create, delete or move
            # of this epoch explains. The name can be stale: a write through a descriptor is
            # reported under the name it was opened by, which the file may have lost since
            # (``rm``, or ``ln`` then ``rm`` through overlayfs MERGED, which reports writes
            # under the name its upper file was first looked up by; the oracle: ``ln c/d/f4
            # a/b/c``, ``rm c/d/f4``, a capture, then a write to a/b/c, reported as c/d/f4:
            # a/b/c kept its old entry; an O_TMPFILE written before its ``linkat`` is
            # "#<inode>"), or in a directory removed since (the oracle: ``ln a/f1 c/d/a/b``,
            # ``rm -r a``, then writes reported as a/f1 in the removed a). Where the name
            # no longer names the event's file, the capture must look where the file is
            # now: found from its own handle, and named there like any event's child; a
            # file in no directory has no entry to change.
            objects = named_objects.get((h, name))
            now: bytes | None = None
            rel = self._dir_path(h, cache)
            if rel is not None and (h, name) in known.names:
                now = known.names[(h, name)]  # looked up by a poll (_names_ahead)
            elif rel is None:
                if not objects or not self._dir_gone(h, gone):
                    continue  # outside the layer (or nothing to find)
            else:
                try:
                    now = self._handle_of(rel, name)
                except OSError as e:
                    if e.errno not in (errno.ENOENT, errno.ENOTDIR):
                        why = os.strerror(e.errno or 0)
                        raise _Doubt(f"cannot look up a name an event gave ({why})") from None
                    if not objects:
                        # every such event carries its file's handle (FAN_REPORT_FID);
                        # without one, where the file went cannot be told
                        if e.errno == errno.ENOENT and _is_dir(self._path(rel)):
                            msg = "an event named a file by a name it does not have"
                            raise _Doubt(msg) from None
                        continue  # the directory left this path: an event of its own
            for obj in objects or ():
                if obj != now:
                    lost = known.lost[obj] if obj in known.lost else self._lost_name_path(obj)
                    if isinstance(lost, _Linked):
                        found.inodes.add(lost.ino)  # every name of it: see the objects above
                    elif lost is not None:
                        found.name(_parent(lost), _base(lost))
        return found

    def _mounts_under_root(self) -> frozenset[str]:
        root = os.fsdecode(self.root)
        return frozenset(
            m.mountpoint for m in mountinfo.mounts() if m.mountpoint.startswith(root + "/")
        )

    def _mapped_writable(self) -> set[bytes]:
        """Layer files (relative paths) some process maps shared and writable.

        Every capture's begin reads each process's ``maps`` (inside a create's pause, too):
        read raw and skipped unless a layer path occurs in it, 70 processes cost 1.2 ms
        here where a buffered read and a parse of every line cost 2.6 ms."""
        out: set[bytes] = set()
        prefixes = [self.root + b"/", *(v + b"/" for v in self.views)]
        for pid in os.listdir(b"/proc"):
            if not pid.isdigit():
                continue
            data = procfs.read(b"/proc/" + pid + b"/maps")
            if not data or not any(p in data for p in prefixes):
                continue  # exited, not ours to read, or nothing of the layer mapped
            for line in data.split(b"\n"):
                parts = line.split(None, 5)
                if len(parts) < 6 or parts[1][1:2] != b"w" or parts[1][3:4] != b"s":
                    continue
                path = parts[5]
                for p in prefixes:
                    if path.startswith(p):
                        out.add(path[len(p) :])
        return out


class NoJournal:
    """Stands in for a journal that is not running (disabled, or not supported here), so
    every checkpoint records why its walk was full."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self._epoch = 0

    def begin(self) -> WalkPlan:
        self._epoch += 1
        return WalkPlan(None, self.reason, self._epoch)

    def commit(self, plan: WalkPlan, memo: WalkMemo) -> None:
        pass

    def abort(self, plan: WalkPlan, reason: str = "") -> None:
        pass

    def poll(self) -> int:
        return 0

    def force_full(self, reason: str) -> None:
        pass

    def quiet(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def close(self) -> None:
        pass


#: What an engine captures with: a running journal, or the reason there is none.
ChangeJournal = Journal | NoJournal


def open_journal(
    root: str, *, views: Iterable[str] = (), overlay: bool = False, enabled: bool = True
) -> ChangeJournal:
    """A journal watching ``root``, or a :class:`NoJournal` saying why there is none."""
    if not enabled:
        return NoJournal("the change journal is off (--no-journal)")
    why = probe(root, overlay=overlay)
    if why is not None:
        return NoJournal(f"no change journal: {why}")
    try:
        return Journal(root, views=views, overlay=overlay)
    except JournalUnavailable as e:
        return NoJournal(f"no change journal: {e}")


class Epoch:
    """One capture's part in a journal's epochs; see :func:`open_epoch`."""

    def __init__(self, journal: ChangeJournal | None, plan: WalkPlan | None) -> None:
        self.journal = journal
        self.plan = plan
        self.memo: WalkMemo | None = None

    def begin(self) -> None:
        """Begins the epoch of an :func:`open_epoch` block opened with ``deferred``: call it
        right before the capture's walk (inside a pause, so that the walk's hint names
        everything changed up to the moment the writers stopped)."""
        if self.plan is not None:
            raise RuntimeError("Epoch.begin: the epoch has begun already")
        if self.journal is not None:
            self.plan = self.journal.begin()

    @property
    def hint(self) -> WalkHint | None:
        return self.plan.hint if self.plan is not None else None

    @property
    def reread(self) -> frozenset[bytes]:
        return self.plan.reread if self.plan is not None else frozenset()

    def walked(self, r: CaptureResult) -> tuple[str, str]:
        """Keeps ``r``'s memo for the commit; returns the walk and reason to record."""
        self.memo = r.memo
        if r.walk == "journal":
            return "journal", ""
        if r.walk_reason:
            return "full", r.walk_reason
        if self.plan is None:
            return "full", "no change journal running"
        return "full", self.plan.reason


@contextlib.contextmanager
def open_epoch(journal: ChangeJournal | None, *, deferred: bool = False) -> Iterator[Epoch]:
    """Brackets one capture that writes the files cache: begins the journal's epoch, and
    commits it if the block ends normally after :meth:`Epoch.walked` (put the catalog
    commit inside the block), or aborts it (the next walk is full). With no journal, a
    plain full walk.

    Args:
        deferred: the block calls :meth:`Epoch.begin` itself, later (the frozen pass of a
            create begins its epoch inside the pause, yet commits after it).
    """
    ep = Epoch(journal, None)
    if not deferred:
        ep.begin()
    try:
        yield ep
    except BaseException:
        if journal is not None and ep.plan is not None:
            journal.abort(ep.plan)
        raise
    plan = ep.plan
    if journal is not None and plan is not None:
        if ep.memo is None:
            journal.abort(plan, "a capture ended without a result")
        else:
            journal.commit(plan, ep.memo)


def _same_file(path: bytes, st: os.stat_result) -> None:
    """Raises a doubt unless ``path`` names the file ``st`` describes (a handle's path read
    from ``/proc/self/fd`` is where the file was when the kernel last saw it named)."""
    try:
        lst = os.lstat(path)
    except FileNotFoundError:
        lst = None
    if lst is None or (lst.st_dev, lst.st_ino) != (st.st_dev, st.st_ino):
        raise _Doubt("a file's handle resolved to a path that names another file")


def _is_dir(path: bytes) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _join(rel: bytes, name: bytes) -> bytes:
    return name if not rel else rel + b"/" + name


def _parent(rel: bytes) -> bytes:
    i = rel.rfind(b"/")
    return b"" if i < 0 else rel[:i]


def _base(rel: bytes) -> bytes:
    return rel[rel.rfind(b"/") + 1 :]
