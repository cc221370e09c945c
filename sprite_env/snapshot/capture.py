"""Capture: a directory tree -> tree objects and chunks in the store.

The walk is depth first with names sorted, through directory file descriptors: symlinks
are recorded, never followed; other file systems (mount points) and excluded paths are
left out. Per directory, children whose signature matches the files cache
(``dircache.py``) reuse their previous entry without being opened, and a directory whose
children all match keeps its previous tree id without being read or re-encoded: a capture
costs one ``stat`` per entry plus work in proportion to what changed.

The full walk (no journal's hint, or one it could not vouch for) starts with one native
walk of the whole tree (``scan_tree``, native/treescan.c: ``WALKERS`` threads, no GIL)
that lists and stats every directory and compares it with its row in the same pass, as
``_dir_walk``'s fast path does one directory at a time. What it cannot vouch for becomes a
hint (``WalkHint.scanned``) that the walk below takes like the journal's: those directories
and their ancestors are walked exactly as before, every other one keeps its tree id
unopened. Unchanged, the medium bench layer (110k files, 17k directories) costs 1.2-1.3
``find`` of it this way warm (2.1-2.3 without) and half of one cold
(``benchmarks/bench_walk.py``).

A first capture (no rows at all: a fresh layer, or after a reset) starts with the same
native walk keeping every directory's listing (``scan_listing``), which the walk below takes
instead of listing and stat'ing each directory again (``Capturer._list_tree``). Knowing the
whole tree up front, it also reads ahead of itself: the small files of the next directories
in walk order (``_ReadAhead``), and every big file from the start (``Capturer._start_big``).

A changed regular file is read once through the chunker; each chunk is hashed here and
compressed on the store writer's worker threads (both release the GIL). All-zero chunks
become holes. A file whose size, mtime or ctime moves while it is read is read again (up
to ``READ_ATTEMPTS`` times); if it keeps changing its last reading is kept and it is named
in the capture's warnings.

Big files changed in place (``IN_PLACE_MIN`` and up, same inode) are compared with their
previous version by page digests (``pagesums.py``). Those a previous capture read, in a
directory the hint names dirty, are read from the start of the capture
(``Capturer._start_early``), and their directory is finished only when its parent needs
its tree (``_Done``), so that such a read overlaps the walk instead of holding it up.

The journal's hint (``WalkHint``, from ``sprite_env/journal``): directories not dirty, with
no dirty descendant and not below a void path, keep the files cache's tree id without being
opened, provided their parent was walked and found them with the signature its row
recorded. Why a missed event can cost speed only, never a file:

- The rows the hint trusts were written by a walk that began after the journal was armed:
  the first capture of a journal walks everything, and so does the next after any doubt
  (overflow, an unresolvable handle, a failed capture, a daemon start).
- The journal's epoch changes when a capture begins, before its walk: a change that lands
  behind the walk is an event of the next epoch, so its directory is dirty next time.
- Every way a directory's contents can change is an event naming it (creating, removing
  or renaming a child, a child's write, truncate, close after writing, chmod, chown,
  xattr, utimes). Writes through a shared mapping produce none until close, so the
  journal also marks the directories of files mapped writable at each capture. A name that
  now holds another directory (created, removed, moved) is void: rows there are not
  trusted. Hard links: a write through one name changes every member's entry, so the
  directories of every known group are walked each time. A file whose link count changed,
  or that was written under a name it lost, comes as its inode (``WalkHint.inodes``): every
  name the files cache has for it is named (its names at the last capture; one made since
  is an event of its own). A group neither the memo nor the hint knows restarts the walk
  with its members' old names named (``NewLinkGroup``); a replaced root, as a full walk.
- Every trusted directory is still checked the way a full walk checks a file: its
  signature in its walked parent must match the parent's row.
So the journal narrows a walk to what the walk itself would have found different; if it
ever says too little, the result is a stale subtree until the next full walk, which is why
every doubt turns into one.

Error handling:
    A per-entry problem (vanished, unreadable, a socket) becomes a :class:`CaptureWarning`
    passed to ``on_warning``; the entry is left out and the capture goes on. Errors that
    make the whole capture meaningless (the root unreadable, the store failing) raise.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import errno
import fnmatch
import functools
import os
import stat
import sys
import threading
import time
from array import array
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from sprite_env.errors import SnapshotError, SpriteError
from sprite_env.ids import ObjectId
from sprite_env.snapshot import dircache, pagesums
from sprite_env.snapshot.dircache import RACY_NS, CachedDir, Sig, is_racy, sig_of
from sprite_env.snapshot.fsmeta import (
    close_dir,
    fd_room,
    open_dir_at,
    proc_path,
    read_xattrs,
)
from sprite_env.snapshot.pagesums import PageSums
from sprite_env.snapshot.tree import (
    INLINE_CHUNKS,
    Kind,
    Piece,
    TreeEntry,
    decode_chunks,
    decode_entry,
    decode_tree,
    encode_chunks,
    encode_entry,
    encode_tree,
    entry_meta,
    with_payload,
)
from sprite_env.store.chunker import Chunker
from sprite_env.store.codec import object_id
from sprite_env.store.pack import ObjectKind
from sprite_env.store.ports import ObjectSink  # re-exported: it was defined here

_scan_dir: Callable[[int, int, int, int], tuple[bytes, list[bytes], int, int, int, int, bool]]
_scan_tree: Callable[..., tuple[list[bytes], dict[bytes, tuple[int, int, int, int, int]]]]
try:
    from sprite_env._native import scan_dir as _scan_dir
    from sprite_env._native import scan_tree as _scan_tree
except ImportError:  # the pure-Python walk does the same, slower
    _scan_dir = None  # type: ignore[assignment]
    _scan_tree = None  # type: ignore[assignment]

#: A directory's children as a native walk listed them: (name, lstat), sorted by name.
_Listing = list[tuple[bytes, os.stat_result]]
_scan_listing: Callable[[int, int, list[tuple[int, int]], list[bytes], int], dict[bytes, _Listing]]
try:
    from sprite_env._native import scan_listing as _scan_listing
except ImportError:  # every directory listed by scandir
    _scan_listing = None  # type: ignore[assignment]

_sig_diff: Callable[[bytes, bytes], tuple[list[bytes], list[bytes]]] | None
_sig_splice: Callable[[bytes, bytes, list[bytes]], bytes] | None
_tree_splice: Callable[[bytes, bytes, list[bytes]], bytes] | None
_tree_find: Callable[[bytes, bytes], bytes | None] | None
_tree_find_many: Callable[[bytes, list[bytes]], list[bytes | None]] | None
_tree_counts: Callable[[bytes], tuple[int, int, int, int, list[bytes]]] | None
try:
    from sprite_env._native import sig_diff as _sig_diff
    from sprite_env._native import sig_splice as _sig_splice
    from sprite_env._native import tree_counts as _tree_counts
    from sprite_env._native import tree_find as _tree_find
    from sprite_env._native import tree_find_many as _tree_find_many
    from sprite_env._native import tree_splice as _tree_splice
except ImportError:  # without them a changed directory takes the entry-by-entry path
    _sig_diff = _sig_splice = _tree_splice = _tree_find = _tree_find_many = _tree_counts = None

#: (stat_result's fields, bytes, chunk ends, chunk ids, xattr fd) of a file read whole, or
#: None for the general path: ``read_finish`` in native/bulkread_py.c.
_BulkRead = tuple[tuple[int, ...], bytes, list[int], bytes, int] | None
_read_start: Callable[[int, list[bytes], int, int, int, int, int, bool], object] | None
_read_finish: Callable[[object], list[_BulkRead]] | None
_lstat_names: Callable[[int, list[bytes]], list[tuple[int, ...] | None]] | None
try:
    from sprite_env._native import lstat_names as _lstat_names
    from sprite_env._native import read_finish as _read_finish
    from sprite_env._native import read_start as _read_start
except ImportError:  # every file takes the general path
    _read_start = _read_finish = _lstat_names = None

READ_ATTEMPTS = 3
#: Journal-driven walks of one capture, at most, before a full walk: each restart names
#: the new hard-link groups the walk before it met (``NewLinkGroup``), so a second one
#: comes only from a group linked into a directory the first restart named.
NEW_GROUP_TRIES = 3
#: Threads of the native full walk (``scan_tree``): more than cores, as a cold walk waits
#: on the disk. The medium layer (17k directories, 110k files) on the 2 cores of the
#: development VM, warm: 0.23-0.29 s on one thread, 0.16-0.18 s (about one ``find``) on
#: 2 to 16; cold (its metadata read through a direct-I/O loop device): 2.3 s on 2, 1.2 s
#: on 4, 0.9 s on 8, 0.8 s on 16, ``find`` 2.0 s.
WALKERS = 8
#: Threads reading files: reads, chunking and hashing release the GIL, and several reads
#: in flight keep a virtual disk's queue full.
READERS = 3
#: Threads reading a first capture's big files from its start (``Capturer._start_big``).
BIG_READERS = 2
#: Files at least this big, changed in place (same inode), are compared with their
#: previous version page by page instead of being chunked afresh.
IN_PLACE_MIN = 1 << 20
#: Native batches of one directory in flight at most (see ``_Batches``).
BULK_GROUPS = 8
#: Small files (one link, under ``IN_PLACE_MIN``: no page digests to make) of a directory
#: are read, chunked and hashed in batches of up to this many files or bytes by one native
#: call (``read_files``, native/bulkread.c) on ``BULK_THREADS`` threads without the GIL,
#: instead of one reader task each. 98% of the medium bench layer's 110k files are under
#: 64 KiB: per file, Python and its GIL cost more than the bytes did (issue 12.2).
BULK_FILES = 64
BULK_BYTES = 4 << 20
#: More than cores: a cold read waits on the disk (reading the small bench layer's files
#: cold: 7.2 s one at a time, 3.2 s eight at a time).
BULK_THREADS = 8
PAGE = 4096
_O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


@dataclass(frozen=True, slots=True)
class CaptureWarning:
    """Something left out of, or uncertain in, a checkpoint.

    ``code`` is stable, for clients to branch on (as they do on the API's error codes):

    - ``unreadable``: a file or directory this process may not read (EACCES/EPERM): left
      out, as a restore cannot bring back what was never read;
    - ``changed_while_read``: kept changing over every attempt; the last reading is kept;
    - ``socket_skipped``: a socket (its state cannot be captured or restored);
    - ``mount_point``: another file system mounted inside the layer: left out, and left in
      place by restores.

    Any other error reading a file (EIO, a failing disk) is not a warning: it fails the
    checkpoint (:class:`CaptureFailed`), since a checkpoint without that file would make a
    restore delete it.
    """

    path: bytes
    message: str
    code: str = "unreadable"

    def to_json(self) -> dict[str, str]:
        return {
            "path": self.path.decode(errors="backslashreplace"),
            "code": self.code,
            "message": self.message,
        }


class CaptureFailed(SnapshotError):
    """A file could not be read for a reason other than permissions: no checkpoint."""

    code = "io_error"

    def __init__(self, path: bytes, error: OSError) -> None:
        shown = path.decode(errors="backslashreplace")
        super().__init__(
            f"cannot read {shown}: {error.strerror or error}; no checkpoint was taken (one "
            "without this file would make a restore delete it). Check the disk (dmesg), or "
            "exclude the path"
        )
        self.path = path
        self.errno = error.errno


@dataclass
class CaptureStats:
    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    specials: int = 0
    bytes: int = 0  # logical size of all regular files
    files_read: int = 0
    bytes_read: int = 0
    dirs_reused: int = 0


#: A subtree's counts: files, dirs, symlinks, specials, bytes (as in ``CaptureStats``).
Totals = tuple[int, int, int, int, int]


@dataclass(frozen=True, slots=True)
class WalkMemo:
    """What a walk leaves for the next journal-driven one (kept in memory by the journal).

    Attributes:
        totals: per directory walked or kept, its subtree's counts (a kept subtree is not
            walked, but the checkpoint still says how many files it holds).
        link_dirs: directories that hold a non-directory with more than one link. They are
            walked every time: a write through one name of a hard-link group changes every
            member's entry, and the event names one directory only.
        link_inos: the inodes of those files (a group the walk has not seen before may
            have a member in a directory the journal has no event for: see ``NewLinkGroup``).
        root_ino: the root directory's inode (a replaced root trusts nothing).
    """

    totals: dict[bytes, Totals]
    link_dirs: frozenset[bytes]
    link_inos: frozenset[int]
    root_ino: int


@dataclass(frozen=True, slots=True)
class WalkHint:
    """What a change journal says about the layer since the walk of ``memo``.

    Attributes:
        dirty: directories (relative paths, ``b""`` the root) whose entries may have
            changed: each is walked like a full walk would, and so is every ancestor.
        void: paths where a directory was created, removed or moved (to or from): the
            files cache's rows at and below them may describe another directory, so the
            subtree there is walked without the hint.
        memo: the previous walk's memo.
        scanned: the hint is not a journal's but the native walk's of the whole tree, at
            the start of this capture (see ``Capturer._scan``): every directory was listed
            and compared with its row, so no hard-link group can hide (each directory
            holding one is dirty) and a row neither walked nor kept is gone.
        named: per dirty directory, the children whose entries may have changed (every
            event on a child names it); None: list every walked directory whole. A walk
            that has them stats only those children and the walked subdirectories (see
            ``Capturer._dir_named``), not the whole listing; a dirty directory with no
            names is listed whole.
        inodes: files with several links whose changed names no event gave (a link made
            or removed elsewhere, a write through a name the file has lost): every name
            the files cache has for them is named too (:func:`capture` adds them), and
            any name made since is an event of its own. Without them a link made outside
            the layer, or a new group, made the walk full.
    """

    dirty: frozenset[bytes]
    void: frozenset[bytes]
    memo: WalkMemo
    scanned: bool = False
    named: Mapping[bytes, frozenset[bytes]] | None = None
    inodes: frozenset[int] = frozenset()


@dataclass
class CaptureResult:
    top_tree: ObjectId
    stats: CaptureStats
    warnings: list[CaptureWarning]
    cache_changed: dict[bytes, CachedDir]
    cache_removed: set[bytes]
    #: Rows to delete with everything below them (a journal-driven walk names only the
    #: roots of what vanished: it did not visit what it kept).
    cache_removed_trees: set[bytes] = field(default_factory=set)
    #: "journal" (the hint narrowed the walk) or "full", and why a full walk.
    walk: str = "full"
    walk_reason: str = ""
    memo: WalkMemo | None = None
    #: The page digests of the big files read, by path, to save (``pagesums.save``).
    page_sums: dict[bytes, PageSums] = field(default_factory=dict)


@dataclass
class Excludes:
    """What a capture leaves out: paths (fnmatch patterns relative to the root, matched
    against the whole relative path) and directories identified by (st_dev, st_ino), so
    the store is left out wherever it is mounted."""

    patterns: list[bytes] = field(default_factory=list)
    inodes: set[tuple[int, int]] = field(default_factory=set)

    def add_dir(self, path: str | bytes) -> None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return
        self.inodes.add((st.st_dev, st.st_ino))

    def match(self, rel: bytes, st: os.stat_result) -> bool:
        # asked of every child a walk looks at: with no pattern (the daemon's usual case:
        # its store is excluded by inode) no generator is made (19 ms of the medium step's
        # checkpoint, py-spy --gil)
        if self.inodes and (st.st_dev, st.st_ino) in self.inodes:
            return True
        return bool(self.patterns) and any(fnmatch.fnmatchcase(rel, p) for p in self.patterns)


Progress = Callable[[CaptureStats], None]
OnWarning = Callable[[CaptureWarning], None]
ReadTree = Callable[[ObjectId], bytes]
ReadMany = Callable[[list[ObjectId]], list[bytes]]
#: A file's page digests as last saved, by path (``pagesums.Lookup``; if it has a method
#: ``find(path, pieces)``, that is asked for the vector of a given chunk list instead).
PageSumsLookup = Callable[[bytes], PageSums | None]


def _join(rel: bytes, name: bytes) -> bytes:
    return name if not rel else rel + b"/" + name


def _parent(rel: bytes) -> bytes:
    i = rel.rfind(b"/")
    return b"" if i < 0 else rel[:i]


def _base(rel: bytes) -> bytes:
    return rel[rel.rfind(b"/") + 1 :]


def _ancestors(rel: bytes) -> list[bytes]:
    """``rel`` and every directory above it, up to the root ``b""``."""
    out = [rel]
    while rel:
        rel = _parent(rel)
        out.append(rel)
    return out


def _lost_names(new: bytes, old: bytes) -> list[bytes]:
    """The names of a directory's old signature row that may no longer be the directory
    they were: gone from its new row, or with another signature there (retyped, replaced).

    A name with the same signature in both rows was walked or kept by this capture (every
    listed subdirectory is), so only these can have lost their rows. One merge in C of the
    two sorted blobs (``sig_diff``): decoding the old rows in Python was 16% of the
    checkpoint after the benchmark's agent step (61k names in 1,130 directories).
    """
    if _sig_diff is not None:
        try:
            changed, removed = _sig_diff(new, old)
            return changed + removed
        except ValueError:
            pass  # a malformed row: every name it holds, as decoded below
    return list(dircache.decode_sigs(old))


def _under_any(rel: bytes, tops: frozenset[bytes] | set[bytes]) -> bool:
    """True if ``rel`` is one of ``tops`` or below one of them."""
    if not tops:
        return False
    return any(a in tops for a in _ancestors(rel))


class NewLinkGroup(Exception):
    """A journal-driven walk met what the journal cannot vouch for: hard-link groups it
    has not seen (``inodes``: one of their other names may sit in a directory with no
    event; the capture starts again with those names, see :func:`capture`), or a replaced
    root (no ``inodes``: it starts again as a full walk)."""

    def __init__(self, reason: str, inodes: frozenset[int] = frozenset()) -> None:
        super().__init__(reason)
        self.inodes = inodes


_Read = tuple[TreeEntry, os.stat_result] | None


class _Group:
    """Small files of one directory read by one native batch (``read_start``), collected
    on the walk's thread (``Capturer._collect``) when the first of them is waited for."""

    __slots__ = ("batch", "items", "nbytes", "results")

    def __init__(self) -> None:
        self.items: list[tuple[bytes, bytes, os.stat_result]] = []  # rel, name, stat
        self.nbytes = 0
        self.batch: object = None  # the native batch in flight
        self.results: list[_Read | Future[_Read]] | None = None


class _Slot:
    """One file of a :class:`_Group`: what ``_Pending.future`` holds for it."""

    __slots__ = ("batches", "group", "index")

    def __init__(self, batches: _Batches, group: _Group, index: int) -> None:
        self.batches = batches
        self.group = group
        self.index = index

    def result(self) -> _Read:
        r = self.batches.results(self.group)[self.index]
        return r.result() if isinstance(r, Future) else r


class _Batches:
    """A directory's small files cut into groups as they are listed, each started once
    full (or by ``flush``: before a subdirectory is walked, so that the reads overlap its
    walk, and before any wait). At most ``BULK_GROUPS`` groups are in flight: a directory
    of many files collects the oldest before it starts another (memory stays bounded)."""

    __slots__ = ("collect", "dirfd", "group", "in_flight", "ready", "start")

    def __init__(
        self,
        dirfd: int,
        start: Callable[[int, list[bytes]], object],
        collect: Callable[[int, _Group, list[_BulkRead]], list[_Read | Future[_Read]]],
    ) -> None:
        self.dirfd = dirfd
        self.group = _Group()
        self.start = start
        self.collect = collect
        self.in_flight: list[_Group] = []
        #: The files a read-ahead started before the walk came (``start_ahead``), by name.
        self.ready: dict[bytes, _Slot] = {}

    def start_ahead(self, items: list[tuple[bytes, bytes, os.stat_result]]) -> int:
        """Starts reading ``items`` (rel, name, stat) before the walk reaches them, in at
        most ``BULK_GROUPS`` groups; returns the bytes started. ``add`` of one of them with
        the same stat object (the walk takes the same listing) gives its slot."""
        started = 0
        i = 0
        while i < len(items) and len(self.in_flight) < BULK_GROUPS:
            g = _Group()
            while i < len(items) and len(g.items) < BULK_FILES and g.nbytes < BULK_BYTES:
                rel, name, st = items[i]
                self.ready[name] = _Slot(self, g, len(g.items))
                g.items.append(items[i])
                g.nbytes += st.st_size
                i += 1
            g.batch = self.start(self.dirfd, [name for _, name, _ in g.items])
            self.in_flight.append(g)
            started += g.nbytes
        return started

    def add(self, rel: bytes, name: bytes, st: os.stat_result) -> _Slot:
        if self.ready:
            slot = self.ready.pop(name, None)
            if slot is not None and slot.group.items[slot.index][2] is st:
                return slot
        g = self.group
        slot = _Slot(self, g, len(g.items))
        g.items.append((rel, name, st))
        g.nbytes += st.st_size
        if len(g.items) >= BULK_FILES or g.nbytes >= BULK_BYTES:
            self.flush()
        return slot

    def flush(self) -> None:
        g = self.group
        if not g.items:
            return
        if len(self.in_flight) >= BULK_GROUPS:
            self.results(self.in_flight[0])
        g.batch = self.start(self.dirfd, [name for _, name, _ in g.items])
        self.in_flight.append(g)
        self.group = _Group()

    def results(self, g: _Group) -> list[_Read | Future[_Read]]:
        if g.results is None:
            assert _read_finish is not None
            assert g.batch is not None, "a group is started before any wait"
            reads = _read_finish(g.batch)
            g.batch = None
            self.in_flight.remove(g)
            g.results = self.collect(self.dirfd, g, reads)
        return g.results


#: A first capture reads the small files of the directories ahead of the walk (in its
#: order) while it is elsewhere, up to this many directories or bytes ahead.
AHEAD_DIRS = 64
AHEAD_BYTES = 32 << 20
#: A narrowed walk's plan (``Capturer._plan``) starts the reads of at most this many
#: directories before the walk (the medium step dirties 1,130), each native batch holding
#: a descriptor of its directory, with ``PLAN_SPARE_FDS`` left to the rest of the daemon.
PLAN_READ_DIRS = 4096
PLAN_SPARE_FDS = 1024


@dataclass(slots=True)
class _Ahead:
    """A directory opened, and its small files' reads started, before the walk came."""

    fd: int
    batches: _Batches
    nbytes: int
    taken: bool = False  # the walk owns ``fd`` (``take_fd``)


class _ReadAhead:
    """Reads ahead of a first capture's walk (``Capturer._list_tree``'s listings).

    The walk reaches a directory, starts its small files' reads and, a leaf, waits for them
    at once: one directory's reads (about 6 files in the medium layer) were in flight at a
    time, and the walk's thread waited for each. Knowing every listing from the start, this
    opens the next directories in walk order (depth first, names sorted: the same rules as
    the walk for what it enters) through their parent's descriptor while the parent is
    open, and starts their small files' batches, ``AHEAD_DIRS`` directories or
    ``AHEAD_BYTES`` ahead. The walk then takes the descriptor (``take_fd``) and the
    batches (``batches``) instead of opening and starting its own; a file is taken only
    with the very stat object it was started for, so the walk reads what it decides to read
    exactly as before, and a directory it passes by is dropped unread.
    """

    def __init__(self, capturer: Capturer, listing: dict[bytes, _Listing], root_dev: int) -> None:
        self.capturer = capturer
        self.listing = listing  # shared: the walk pops what it enters
        order: list[bytes] = []
        stack = [b""]
        excludes = capturer.excludes
        while stack:
            rel = stack.pop()
            kids = listing.get(rel)
            if kids is None:
                continue  # listed by the walk itself, nothing below it read ahead
            order.append(rel)
            subs = []
            for name, st in kids:
                if stat.S_ISDIR(st.st_mode) and st.st_dev == root_dev:
                    child = _join(rel, name)
                    if not excludes.match(child, st):
                        subs.append(child)
            stack.extend(reversed(subs))
        self.order = order
        self.pos = {p: i for i, p in enumerate(order)}
        self.cursor = 0
        self.ahead: dict[bytes, _Ahead] = {}  # in walk order
        self.nbytes = 0

    def take_fd(self, rel: bytes) -> int | None:
        a = self.ahead.get(rel)
        if a is None or a.taken:
            return None
        a.taken = True
        return a.fd

    def batches(self, rel: bytes, fd: int) -> _Batches | None:
        """The batches started ahead for ``rel``, the walk in it with ``fd``."""
        a = self.ahead.pop(rel, None)
        if a is None:
            return None
        self.nbytes -= a.nbytes
        if not a.taken:
            os.close(a.fd)
            return None
        return a.batches if a.fd == fd else None

    def fill(self, rel: bytes) -> None:
        """The walk is in ``rel``: drops what it passed by, starts what lies ahead."""
        i = self.pos.get(rel)
        if i is None:
            return
        while self.ahead:
            first = next(iter(self.ahead))
            if self.pos[first] > i:
                break
            self._drop(first)
        self.cursor = max(self.cursor, i + 1)
        while (
            self.cursor < len(self.order)
            and self.cursor - i <= AHEAD_DIRS
            and self.nbytes < AHEAD_BYTES
        ):
            self._start(self.order[self.cursor])
            self.cursor += 1

    def _start(self, rel: bytes) -> None:
        c = self.capturer
        parent, _, name = rel.rpartition(b"/")
        pfd = c._fds.get(parent)
        if pfd is None:
            up = self.ahead.get(parent)
            if up is None:
                return  # its parent is not open: the walk lists and reads it itself
            pfd = up.fd
        try:
            fd = open_dir_at(pfd, name)
        except OSError:
            return  # the walk meets whatever this is
        items = []
        excludes = c.excludes
        for kid, st in self.listing.get(rel, ()):
            if _batched(st):
                child = _join(rel, kid)
                if not excludes.match(child, st):  # an excluded file's bytes stay out
                    items.append((child, kid, st))
        batches = _Batches(fd, c._start_group, c._collect)
        self.ahead[rel] = a = _Ahead(fd, batches, 0)  # closed by ``_drop`` if this raises
        a.nbytes = batches.start_ahead(items) if items else 0
        self.nbytes += a.nbytes

    def _drop(self, rel: bytes) -> None:
        a = self.ahead.pop(rel)
        self.nbytes -= a.nbytes
        if not a.taken:
            os.close(a.fd)

    def close(self) -> None:
        while self.ahead:
            self._drop(next(iter(self.ahead)))


class _EarlyRead:
    """A big file's read begun before the walk (``Capturer._start_early``), as the walk
    found the file: what ``_Pending.future`` holds for it."""

    __slots__ = ("args", "capturer", "future", "read_prev")

    def __init__(
        self,
        capturer: Capturer,
        early: tuple[Future[_Read], TreeEntry | None],
        dirfd: int,
        rel: bytes,
        name: bytes,
        st: os.stat_result,
        link: bytes,
        prev: TreeEntry | None,
    ) -> None:
        self.capturer = capturer
        self.future, self.read_prev = early
        self.args = (dirfd, rel, name, st, link, prev)

    def result(self) -> _Read:
        """The early read if it read the file the walk listed, else the file read now.

        The walk's signature of the file is what its row will vouch for: the early read
        stands for it only if the read ended with that very stat (not racy, one link) and
        compared with the same previous entry the walk found. A change after the read's
        last ``fstat`` moves ctime, and one within the clock's tick is racy (it happened
        after the capture began), so equal signatures mean the bytes read are the file's.
        """
        dirfd, rel, name, st, link, prev = self.args
        r = self.future.result()
        if r is not None and not link:
            entry, after = r
            now = self.capturer.start_ns
            sig = sig_of(after, now)
            if (
                not is_racy(sig)
                and sig == sig_of(st, now)
                and after.st_nlink == st.st_nlink == 1
                and prev == self.read_prev
            ):
                self.capturer.early_taken += 1
                return entry, after
        return self.capturer._file(dirfd, rel, name, st, link, prev)


class _Pending:
    """A child of a directory being captured: a fresh entry, or "as before"."""

    __slots__ = ("entry", "future", "name", "st", "subtree", "subtree_changed")

    def __init__(
        self,
        name: bytes,
        st: os.stat_result,
        entry: TreeEntry | None = None,
        subtree: ObjectId | None = None,
        subtree_changed: bool = False,
        future: Future[_Read] | _Slot | _EarlyRead | None = None,
    ) -> None:
        self.name = name
        self.st = st
        self.entry = entry  # None: the previous entry, as it was (with ``subtree`` if a dir)
        self.subtree = subtree
        self.subtree_changed = subtree_changed
        self.future = future  # a file being read on a reader thread; fills entry and st

    @property
    def reuse(self) -> bool:
        return self.entry is None and self.future is None


class _Later:
    """A directory whose tree waits for a big file read early (``Capturer._start_early``):
    the rest of its capture (``finish``), run when its parent needs its tree. It owns the
    directory's descriptor until then."""

    __slots__ = ("capturer", "done", "fd", "finish", "rel")

    def __init__(
        self,
        capturer: Capturer,
        fd: int,
        rel: bytes,
        done: dict[bytes, tuple[ObjectId, bool]],
        finish: Callable[[], tuple[ObjectId, bool] | None],
    ) -> None:
        self.capturer = capturer
        self.fd = fd
        self.rel = rel
        self.done = done
        self.finish = finish
        capturer._later.append(self)

    def result(self) -> tuple[ObjectId, bool]:
        """Finishes the directory (entry by entry if the splice gives up, as ``_dir_walk``
        would have), adds what it counted to its subtree's counts and closes it."""
        c, s = self.capturer, self.capturer.stats
        before = (s.files, s.dirs, s.symlinks, s.specials, s.bytes)
        try:
            out = self.finish()
            if out is None:
                out = c._dir_slow(self.fd, self.rel, self.done)
        finally:
            self.close()
        after = (s.files, s.dirs, s.symlinks, s.specials, s.bytes)
        t = c.totals[self.rel]
        c.totals[self.rel] = (
            t[0] + after[0] - before[0],
            t[1] + after[1] - before[1],
            t[2] + after[2] - before[2],
            t[3] + after[3] - before[3],
            t[4] + after[4] - before[4],
        )
        return out

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _Done(dict[bytes, tuple[ObjectId, bool]]):
    """A directory's subdirectories captured so far, by name, and those still waiting for
    a big file's read (``later``). The big file's directory is finished only when its
    parent needs its tree (``settle``: after the parent's other subdirectories were
    walked), so that the read of the 215 MB database of the benchmark step overlaps the
    walk of its siblings instead of holding it up: the walk is in name order, and the
    database's ``data/`` comes before the project, the venv and the web app."""

    __slots__ = ("later",)

    def __init__(self) -> None:
        super().__init__()
        self.later: dict[bytes, _Later] = {}

    def settle(self) -> None:
        while self.later:
            name, later = self.later.popitem()
            self[name] = later.result()


@dataclass(slots=True)
class _Looked:
    """A narrowed directory's named children looked at (``Capturer._look``): the row with
    their signatures spliced in, their stats, what differs from the old row, and the reads
    of its changed small files if the plan started them."""

    blob: bytes
    known: dict[bytes, os.stat_result]
    changed: list[bytes]
    removed: list[bytes]
    batches: _Batches | None = None


class Capturer:
    """Captures one tree; see the module docstring. Use :func:`capture`."""

    def __init__(
        self,
        root: bytes,
        sink: ObjectSink,
        read_tree: ReadTree,
        cache: Mapping[bytes, CachedDir],
        *,
        excludes: Excludes | None = None,
        chunker: Chunker | None = None,
        progress: Progress | None = None,
        on_warning: OnWarning | None = None,
        hint: WalkHint | None = None,
        reread: frozenset[bytes] = frozenset(),
        page_sums: PageSumsLookup | None = None,
        page_sums_out: dict[bytes, PageSums] | None = None,
        read_many: ReadMany | None = None,
        trees_out: dict[ObjectId, bytes] | None = None,
    ) -> None:
        self.root = root
        #: Where the trees this capture reads (its directories' old trees) and writes go,
        #: by id, when a caller asks (``capture(trees_out=...)``).
        self.trees_out = trees_out
        #: Reads many trees in one batch (``ObjectReader.read_many``), or None: one by one.
        self.read_many = read_many
        #: Where the page digests of big files are looked up (None: never made or used),
        #: and where those this capture makes go (by path; see ``pagesums.py``).
        self.page_sums = page_sums if pagesums.NATIVE else None
        self.page_sums_out = page_sums_out if page_sums_out is not None else {}
        self.sink = sink
        #: a writer's ``put_known`` takes the ids the native batch read computed already
        self._put_known: Callable[[ObjectId, bytes, ObjectKind], object] | None = getattr(
            sink, "put_known", None
        )
        self.read_tree = read_tree
        self.cache = cache
        self.excludes = excludes or Excludes()
        self.chunker = chunker or Chunker()
        self.progress = progress
        self.on_warning = on_warning
        self.stats = CaptureStats()
        self.warnings: list[CaptureWarning] = []
        self.cache_changed: dict[bytes, CachedDir] = {}
        self.visited: set[bytes] = set()
        self.links: dict[int, bytes] = {}  # inode -> path of the group's first member
        self.link_payload: dict[int, TreeEntry] = {}  # inode -> entry read this capture
        self.start_ns = time.time_ns()
        self._stats_lock = threading.Lock()  # readers update the read counters
        self._readers: ThreadPoolExecutor | None = None
        self._last_progress = 0.0
        self._root_dev = 0
        self.hint = hint
        self.reread = reread
        self._reread_dirs = {_parent(p) for p in reread}
        self._walk: set[bytes] = set()  # with a hint: the dirty paths and their ancestors
        #: With a journal's names (``WalkHint.named``): per walked directory, the children to
        #: stat, those of it that are walked, and the walked directories listed whole.
        self._names: dict[bytes, set[bytes]] | None = None
        self._walk_children: dict[bytes, list[bytes]] = {}
        self._whole: set[bytes] = set()
        #: What the plan (``_plan``) looked at before the walk, and the old trees it read.
        self._planned: dict[bytes, _Looked] = {}
        self._trees: dict[ObjectId, bytes] = {}
        if hint is not None:
            self._set_hint(hint)
        self.kept: set[bytes] = set()  # directories kept on the hint's word, not walked
        self.totals: dict[bytes, Totals] = {}
        self.link_dirs: set[bytes] = set()
        self.link_inos: set[int] = set()
        #: hard-link groups a journal-driven walk met that neither its memo nor its hint
        #: knew, with the first member met (see ``NewLinkGroup``)
        self._new_groups: dict[int, bytes] = {}
        #: Big files changed in place whose reads began before the walk (``_start_early``),
        #: by path, until the walk reaches them; and the descriptors of their directories.
        self._early: dict[bytes, tuple[Future[_Read], TreeEntry | None]] = {}
        self._big: ThreadPoolExecutor | None = None  # a first capture's early reads
        self._early_fds: list[int] = []
        self.early_started = self.early_taken = 0  # (for tests and benchmarks)
        self._later: list[_Later] = []  # directories finished late (see ``_Done``)
        #: A first capture's listings by directory, until the walk takes them (``_list_tree``),
        #: the reads ahead of its walk, and the descriptors of the directories it is in.
        self._listing: dict[bytes, _Listing] = {}
        self._ahead: _ReadAhead | None = None
        self._fds: dict[bytes, int] = {}

    # -- driver --------------------------------------------------------------------------

    def _set_hint(self, hint: WalkHint) -> None:
        self.hint = hint
        walk = self._walk
        for p in (*hint.dirty, *hint.void, *hint.memo.link_dirs):
            while p not in walk:  # an ancestor already in has all of its own in too
                walk.add(p)
                if not p:
                    break
                p = _parent(p)
        self._names = None
        if (
            hint.named is None
            or hint.scanned
            or _sig_splice is None
            or _lstat_names is None
            or _tree_counts is None
        ):
            return
        # A walked directory's own entry is in its parent, and moves (a new tree id, an
        # mtime when its listing changed): each is a name its parent must stat. Children of
        # a directory that no event named and that are not walked keep their old entries.
        names = {rel: set(n) for rel, n in hint.named.items()}
        children = self._walk_children = {}
        for p in walk:
            if p:
                parent, base = _parent(p), _base(p)
                names.setdefault(parent, set()).add(base)
                children.setdefault(parent, []).append(base)
        self._names = names
        self._whole = {
            *(hint.dirty - hint.named.keys()),
            *hint.memo.link_dirs,
            *hint.void,
        }

    def _scan(self, fd: int, root: os.stat_result) -> WalkHint | None:
        """A full walk's hint, from one native walk of the whole tree (issue 11.4).

        ``scan_tree`` lists and stats every directory on ``WALKERS`` threads without the
        GIL and compares each one's signature blob with its row, as ``_dir_walk``'s fast
        path does one directory at a time from Python (which left Python 40% of a warm
        full walk). The directories it cannot vouch for are dirty: walked with their
        ancestors exactly as a full walk would, every other one keeps its row's tree id.
        None (walk as before) without the native module or without rows to compare with.
        """
        if _scan_tree is None or self.hint is not None or not self.cache:
            return None
        rows = {p: c.stat for p, c in self.cache.items()}
        dirty, totals = _scan_tree(
            fd,
            self.start_ns,
            RACY_NS,
            root.st_dev,
            rows,
            list(self.excludes.inodes),
            self.excludes.patterns,
            WALKERS,
        )
        # a file mapped writable may have changed without its signature: read it anyway
        marked = frozenset(dirty).union(self._reread_dirs)
        memo = WalkMemo(totals, frozenset(), frozenset(), root.st_ino)
        return WalkHint(marked, frozenset(), memo, scanned=True)

    def _list_tree(self, fd: int, root: os.stat_result) -> None:
        """Before a walk with no rows at all (a first checkpoint, or after a reset): one
        native walk of the whole tree on ``WALKERS`` threads (``scan_listing``) that lists
        and stats every directory, kept in ``_listing`` for the walk below to take instead
        of its own ``scandir`` and ``stat`` of every child. Cold, on the medium bench layer,
        the walk waited 8 s in ``getdents64`` and 2 s in ``stat`` for them one at a time;
        the native walk reads them in about 1 s. Warm, listing again from Python was still
        a quarter of the walk's thread (a GIL round trip per child, issue 12).

        A listing is older than a ``scandir`` at the walk would be, by seconds: what changes
        meanwhile is captured as the walk finds it (a file read is signed by its stat after
        the read, a vanished one left out, a new one missed) and the files cache's row is the
        listing the walk used, so the next walk, comparing its own listing with that row,
        walks that directory again. A directory the native walk could not list (or with a
        child it could not stat) is absent and listed by ``scandir``, which meets the error.
        """
        if _scan_listing is None or self.hint is not None or self.cache:
            return
        self._listing = _scan_listing(
            fd, root.st_dev, list(self.excludes.inodes), self.excludes.patterns, WALKERS
        )
        if _read_start is not None:
            self._ahead = _ReadAhead(self, self._listing, root.st_dev)

    def _kept_subtrees(self) -> dict[bytes, Totals]:
        """The native walk's counts of every directory at or below a kept one."""
        assert self.hint is not None
        clean = self.hint.memo.totals
        if b"" in self.kept:
            return clean
        paths = sorted(clean)
        out: dict[bytes, Totals] = {}
        for top in self.kept:
            out[top] = clean[top]
            lo = bisect.bisect_left(paths, top + b"/")
            hi = bisect.bisect_left(paths, top + b"0", lo)  # "0" sorts right after "/"
            for p in paths[lo:hi]:
                out[p] = clean[p]
        return out

    def run(self) -> CaptureResult:
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        old_limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old_limit, 20_000))  # one frame per directory level
        self._readers = ThreadPoolExecutor(READERS, thread_name_prefix="capture-read")
        try:
            st = os.fstat(fd)
            self._root_dev = st.st_dev
            if self.hint is not None and self.hint.memo.root_ino != st.st_ino:
                raise NewLinkGroup("the layer's root directory was replaced")
            scanned = self._scan(fd, st)
            if scanned is not None:
                self._set_hint(scanned)  # the scan read every row already
            else:
                self._prefetch()
                self._list_tree(fd, st)
                self._plan(fd)
            self._start_early(fd)
            self._start_big(fd)
            kept = self._reuse(b"")
            subtree = kept if kept is not None else self._dir(fd, b"")[0]
            top = TreeEntry(
                b".",
                Kind.DIR,
                stat.S_IMODE(st.st_mode),
                st.st_uid,
                st.st_gid,
                st.st_mtime_ns,
                xattrs=read_xattrs(fd),
                payload=subtree,
            )
        finally:
            self._readers.shutdown(wait=True, cancel_futures=True)
            if self._big is not None:
                self._big.shutdown(wait=True, cancel_futures=True)
            sys.setrecursionlimit(old_limit)
            os.close(fd)
            for dfd in self._early_fds:
                os.close(dfd)
            for later in self._later:  # a capture that failed before it finished them
                later.close()
            if self._ahead is not None:
                self._ahead.close()
            self._planned.clear()  # reads the walk did not take: dropped unread
            self._trees.clear()
        if self._new_groups:
            first = next(iter(self._new_groups.values()))
            raise NewLinkGroup(
                f"a new hard link ({os.fsdecode(first)})", frozenset(self._new_groups)
            )
        for rel in self._early:  # read early, then not taken by the walk: not this entry's
            self.page_sums_out.pop(rel, None)
        top_id = self._put_tree(encode_tree([top]))
        self._report(force=True)
        links = frozenset(self.link_dirs), frozenset(self.link_inos)
        memo = WalkMemo(self.totals, *links, st.st_ino)
        if self.hint is None or self.hint.scanned:
            removed = set(self.cache) - self.visited
            if self.hint is not None:  # what the native walk vouched for was not walked
                vouched = self._kept_subtrees()
                removed.difference_update(vouched)
                memo = WalkMemo({**vouched, **self.totals}, *links, st.st_ino)
            return CaptureResult(
                top_id,
                self.stats,
                self.warnings,
                self.cache_changed,
                removed,
                memo=memo,
            )
        # Rows not visited are kept (the hint vouched for them) unless their directory
        # was walked and no longer holds them as directories: then they and everything
        # below are gone. Only a directory that got a new row can have lost a child, so
        # only those rows' old children are looked at (not the whole cache: 15 ms of a
        # 90 ms no-change checkpoint on 18k directories).
        gone = set()
        known = self.hint.memo.totals  # every directory of the last walk: in memory
        for rel, new in self.cache_changed.items():
            old = self.cache.get(rel)
            for name in _lost_names(new.stat, old.stat) if old is not None else ():
                p = _join(rel, name)
                if p in self.visited or p in self.kept:
                    continue
                # a name that was no directory at the last walk has no row of its own:
                # not asked (60k lookups of files after the benchmark's agent step)
                if p in known and p in self.cache:
                    gone.add(p)
        totals = {**self.hint.memo.totals, **self.totals}
        if gone:
            # one startswith a row (in C), not _under_any's walk up every ancestor: 0.30 s
            # of the main thread's 7.2 s sampled (py-spy) in the medium step's checkpoint
            # under load 9; 17k paths 9 deep in process under load 7: 250 ms -> 10 ms
            below = tuple(g + b"/" for g in gone)
            totals = {p: t for p, t in totals.items() if p not in gone and not p.startswith(below)}
        memo = WalkMemo(totals, memo.link_dirs, memo.link_inos, memo.root_ino)
        return CaptureResult(
            top_id,
            self.stats,
            self.warnings,
            self.cache_changed,
            set(),
            gone,
            walk="journal",
            memo=memo,
        )

    def _start_early(self, root_fd: int) -> None:
        """Starts reading, before the walk, the big files that a previous capture read (they
        have page digests, ``pagesums.Lookup.paths``) and that changed in place in a
        directory the hint names dirty.

        The walk reaches a file in walk order and waits for its directory's reads before it
        goes on, so the 215 MB database of the benchmark step (0.5-0.7 s of reading under
        load 10) held up the walk of every directory after its own; read from the start,
        it overlaps the walk. The walk takes the early read only if the file's stat at its
        listing equals the stat the read ended with (``_EarlyRead``): the entry then
        describes the bytes the signature vouches for, as a read started by the walk does.
        Otherwise (changed since, or looked at differently) the walk reads it again.
        """
        hint, lookup = self.hint, self.page_sums
        paths = getattr(lookup, "paths", None)
        if hint is None or paths is None or _tree_find is None or self._readers is None:
            return
        dirs: dict[bytes, int | None] = {}
        for rel in paths():
            parent = _parent(rel)
            if parent not in hint.dirty or rel in self.reread or _under_any(parent, hint.void):
                continue
            named = self._named(parent)
            if named is not None and rel.rpartition(b"/")[2] not in named:
                continue  # no event named it: the walk keeps its entry unread
            cached = self.cache.get(parent)
            if cached is None:
                continue
            if parent not in dirs:
                dirs[parent] = self._open_dir(root_fd, parent)
            dfd = dirs[parent]
            if dfd is None:
                continue
            name = rel.rpartition(b"/")[2]
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except OSError:
                continue  # gone, or not ours to read: the walk decides
            prev_sig = dircache.decode_sigs(cached.stat).get(name)
            if (
                not stat.S_ISREG(st.st_mode)
                or st.st_nlink != 1
                or st.st_size < IN_PLACE_MIN
                or st.st_dev != self._root_dev
                or prev_sig is None
                or prev_sig[0] != st.st_ino
                or sig_of(st, self.start_ns) == prev_sig
                or self.excludes.match(rel, st)
            ):
                continue  # not a big file changed in place: the walk decides
            try:
                raw = _tree_find(self.read_tree(cached.tree), name)
            except (SpriteError, ValueError):
                continue
            if raw is None:
                continue
            prev = decode_entry(raw)
            fut = self._readers.submit(self._file, dfd, rel, name, st, b"", prev)
            self._early[rel] = (fut, prev)
            self.early_started += 1

    def _start_big(self, root_fd: int) -> None:
        """A first capture starts reading its big files (``IN_PLACE_MIN`` and up, one link:
        those the batches leave to a reader thread) before the walk, in walk order, on
        ``BIG_READERS`` threads of their own, from the listings (``_list_tree``).

        The walk waits for a directory's reads before it leaves it: 114 files of the medium
        layer hold 906 MB of its 1.7 GB (a 215 MB database, a 131 MB native module, ...),
        and the walk stood still while each was read, chunked and hashed. Read from the
        start they overlap the walk. The walk takes such a read as it takes the journal's
        early reads (``_EarlyRead``): only if the read ended with the stat it listed, else it
        reads the file again. Their own threads: the walk's other reads (holes, hard links)
        do not queue behind them.
        """
        ahead = self._ahead
        if ahead is None or BIG_READERS <= 0:
            return
        excludes = self.excludes
        for rel in ahead.order:
            dfd: int | None = None
            for name, st in self._listing.get(rel, ()):
                if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size < IN_PLACE_MIN:
                    continue
                child = _join(rel, name)
                if excludes.match(child, st):
                    continue
                if dfd is None:
                    dfd = self._open_dir(root_fd, rel)
                    if dfd is None:
                        break  # the walk meets whatever it is
                if self._big is None:
                    self._big = ThreadPoolExecutor(BIG_READERS, thread_name_prefix="capture-big")
                fut = self._big.submit(self._file, dfd, child, name, st, b"", None)
                self._early[child] = (fut, None)
                self.early_started += 1

    def _open_dir(self, root_fd: int, rel: bytes) -> int | None:
        """The directory ``rel`` opened component by component without following a
        symlink (paths never leave the root), or None."""
        fd = os.dup(root_fd)
        for part in rel.split(b"/") if rel else ():
            try:
                nxt = open_dir_at(fd, part)
            except OSError:
                close_dir(fd)
                return None
            close_dir(fd)
            fd = nxt
        self._early_fds.append(fd)
        return fd

    def _prefetch(self) -> None:
        """With a hint, reads at once the files-cache rows the walk will look up: the
        directories it walks and their subdirectories as of the last walk (1,130 walked
        directories after the benchmark's agent step: 5.5k rows, one query per 500)."""
        prefetch = getattr(self.cache, "prefetch", None)
        if self.hint is None or prefetch is None:
            return
        walk = self._walk
        names = self._names
        if names is not None:
            # a narrowed walk looks up the rows of walked directories and of named children;
            # a directory listed whole, those of all its subdirectories
            totals, whole = self.hint.memo.totals, self._whole
            named = (_join(rel, n) for rel, ns in names.items() for n in ns)
            want = [*walk, *(p for p in named if p in totals)]
            if whole:
                want += [p for p in totals if p and _parent(p) in whole]
            prefetch(want)
            return
        prefetch([*walk, *(p for p in self.hint.memo.totals if p and _parent(p) in walk)])

    def _warn(self, rel: bytes, message: str, code: str = "unreadable") -> None:
        w = CaptureWarning(rel, message, code)
        self.warnings.append(w)
        if self.on_warning:
            self.on_warning(w)

    def _report(self, force: bool = False) -> None:
        if self.progress is None:
            return
        now = time.monotonic()
        if force or now - self._last_progress >= 0.1:
            self._last_progress = now
            self.progress(self.stats)

    # -- directories -----------------------------------------------------------------------

    def _reuse(self, rel: bytes) -> ObjectId | None:
        """The tree id the files cache has for ``rel`` if the hint vouches for its whole
        subtree, counted as if walked; None if it must be walked.

        The caller has checked that the directory is the one the cache describes: its
        signature in its parent is the one its parent's row recorded (same inode, ctime,
        size, mtime, and not racy), the test a full walk applies to every file.
        """
        hint = self.hint
        if hint is None or rel in self._walk or _under_any(rel, hint.void):
            return None
        cached = self.cache.get(rel)
        t = hint.memo.totals.get(rel)
        if cached is None or t is None:
            return None  # never walked, or its row was dropped (a prune): walk it
        s = self.stats
        s.files += t[0]
        s.dirs += t[1]
        s.symlinks += t[2]
        s.specials += t[3]
        s.bytes += t[4]
        s.dirs_reused += t[1]
        self.kept.add(rel)
        return cached.tree

    def _dir(self, fd: int, rel: bytes) -> tuple[ObjectId, bool]:
        """Captures the directory open at ``fd``; returns its tree id and whether it changed
        since the files cache's record of it. Records the subtree's counts in the memo."""
        out = self._dir_or_later(fd, rel, False)
        assert not isinstance(out, _Later)
        return out

    def _dir_or_later(self, fd: int, rel: bytes, defer: bool) -> tuple[ObjectId, bool] | _Later:
        """:meth:`_dir`; with ``defer``, a directory still waiting for a big file read
        early may come back as a :class:`_Later` (see ``_Done``), which then owns ``fd``."""
        s = self.stats
        before = (s.files, s.dirs, s.symlinks, s.specials, s.bytes)
        out = self._dir_walk(fd, rel, defer)
        self.totals[rel] = (
            s.files - before[0],
            s.dirs - before[1],
            s.symlinks - before[2],
            s.specials - before[3],
            s.bytes - before[4],
        )
        return out

    def _dir_walk(self, fd: int, rel: bytes, defer: bool = False) -> tuple[ObjectId, bool] | _Later:
        cached = self.cache.get(rel)
        if cached is None or _scan_dir is None or rel in self._reread_dirs:
            return self._dir_slow(fd, rel, {})
        names = self._named(rel)
        if names is not None:
            narrowed = self._dir_named(fd, rel, cached, names, defer)
            if narrowed is not None:
                return narrowed
        # Fast path: one native call lists and stats the children and encodes their
        # signatures; if they equal the cache's, only the subdirectories remain to check.
        blob, subdirs, files, nbytes, symlinks, specials, irregular = _scan_dir(
            fd, self.start_ns, RACY_NS, self._root_dev
        )
        counts = (files, nbytes, symlinks, specials)
        if irregular:
            return self._dir_slow(fd, rel, {})
        done = _Done()
        if blob != cached.stat:
            out = self._dir_partial(fd, rel, cached, blob, subdirs, counts, done, defer)
            return out if out is not None else self._dir_slow(fd, rel, done)
        for name in subdirs:
            # every child's signature matched the row: each subdirectory is the one cached
            if not self._subdir(fd, rel, name, True, done):
                return self._dir_slow(fd, rel, done)  # replaced since the listing
        done.settle()  # after every sibling was walked: they overlapped the reads waited for
        if any(changed for _, changed in done.values()):
            out = self._dir_partial(fd, rel, cached, blob, subdirs, counts, done, defer)
            return out if out is not None else self._dir_slow(fd, rel, done)
        self._count_listed(rel, counts)
        self.stats.dirs_reused += 1
        self._report()
        return cached.tree, False

    def _named(self, rel: bytes) -> set[bytes] | None:
        """The children of walked directory ``rel`` to stat, or None to list it whole."""
        names = self._names
        if names is None or rel in self._whole:
            return None
        hint = self.hint
        assert hint is not None
        if hint.void and _under_any(rel, hint.void):
            return None
        return names.get(rel, set())

    def _dir_named(
        self, fd: int, rel: bytes, cached: CachedDir, names: set[bytes], defer: bool
    ) -> tuple[ObjectId, bool] | _Later | None:
        """A walked directory of which the journal named some children (``WalkHint.named``):
        only those are stat'ed; the row's other signatures and the old tree's other entries
        are kept as they are (``sig_splice``, ``tree_splice``). After the benchmark's agent
        step the 1,130 walked directories of medium hold 61k children, of which the events
        name about 2.5k: listing and stat'ing all of them was 2.8 s of the 9 s sampled.

        Why that is a full walk's result: a child no event named since the last capture's
        epoch began was neither created, removed, renamed, written, truncated, chmod'ed,
        chown'ed nor given xattrs (each is an event naming it in this directory), and its
        hard-link groups live in directories listed whole (``WalkMemo.link_dirs``); so a full
        walk would find its signature equal to the row, and copy its entry as this does. A
        racy (poisoned) row of the old blob is stat'ed as well, as a full walk would.

        Returns None, with nothing walked or read, when the directory must be listed (a
        named child that is unusual: see ``_dir_partial``; or an old row or tree the
        memo cannot vouch for).
        """
        looked = self._planned.pop(rel, None) if self._planned else None
        if looked is None:
            looked = self._look(fd, rel, cached, names)
        if looked is None:
            return None
        known = looked.known
        subdirs = [
            n
            for n in self._walk_children.get(rel, ())
            if n in known and stat.S_ISDIR(known[n].st_mode)
        ]
        done = _Done()
        out = self._dir_partial(
            fd, rel, cached, looked.blob, subdirs, (0, 0, 0, 0), done, defer, named=looked
        )
        return out if out is not None else self._dir_slow(fd, rel, done)

    def _look(self, fd: int, rel: bytes, cached: CachedDir, names: set[bytes]) -> _Looked | None:
        """The first half of :meth:`_dir_named`: stats the named children of ``rel`` (open
        at ``fd``) and splices them into its row; None if the directory must be listed."""
        assert _sig_splice is not None
        assert _lstat_names is not None
        assert _sig_diff is not None
        known: dict[bytes, os.stat_result] = {}
        gone: list[bytes] = []
        look = sorted(names)
        for _ in range(2):  # the second time for racy rows the first splice carried over
            try:
                stats = _lstat_names(fd, look)
            except OSError:
                return None
            for name, fields in zip(look, stats, strict=True):
                if fields is None:
                    gone.append(name)
                    continue
                st = os.stat_result(fields)
                if stat.S_ISDIR(st.st_mode) and st.st_dev != self._root_dev:
                    return None  # a mount point: the listing path warns about it
                if self.excludes.match(_join(rel, name), st):
                    gone.append(name)  # left out, as a listing leaves it out
                    continue
                known[name] = st
            patch = dircache.encode_sigs({n: sig_of(st, self.start_ns) for n, st in known.items()})
            try:
                blob = _sig_splice(cached.stat, patch, sorted(gone))
                changed, removed = _sig_diff(blob, cached.stat)
            except ValueError:
                return None
            look = [n for n in changed if n not in known and n not in gone]
            if not look:
                return _Looked(blob, known, changed, removed)
        return None

    def _plan(self, root_fd: int) -> None:
        """Before a narrowed walk: looks at every walked directory's named children
        (:meth:`_look`), reads their old trees in one batch, and starts reading their
        changed small files, ``AHEAD_BYTES`` at most, on the native threads.

        Walking, a directory's reads were started when the walk got there and waited for
        before it left: after the benchmark's agent step, 1,130 directories with about 4
        changed files each, one directory's reads in flight at a time (the wait was a third
        of the capture's main thread, py-spy). Started here, they overlap each other and the
        walk. The walk takes a file's read only with the very stat object it was started
        for (``_Batches.add``), which is the one :meth:`_dir_named` decides with, so it
        reads exactly what it would have; what it does not take is dropped unread.
        """
        names = self._names
        if names is None or _read_start is None:
            return
        # in walk order (depth first, names sorted), so a parent stays open for its subtree
        order = sorted(
            (p for p in self._walk if p not in self._reread_dirs and self._named(p) is not None),
            key=lambda p: p.split(b"/"),
        )
        fds: dict[bytes, int] = {b"": root_fd}
        trees: list[ObjectId] = []
        budget, batches = AHEAD_BYTES, fd_room(PLAN_READ_DIRS, PLAN_SPARE_FDS)
        try:
            for rel in order:
                cached = self.cache.get(rel)
                if cached is None:
                    continue
                fd = self._plan_fd(fds, rel)
                if fd is None:
                    continue
                looked = self._look(fd, rel, cached, names.get(rel, set()))
                if looked is None:
                    continue
                self._planned[rel] = looked
                # its old tree, which _dir_partial reads, in the batch below: also for a
                # directory walked only for a subdirectory's sake (read one by one, those
                # were 0.10-0.15 s of the medium step's check, py-spy, load 1)
                trees.append(cached.tree)
                if budget > 0 and batches > 0:
                    started = self._plan_reads(fd, rel, looked)
                    budget -= started
                    batches -= started > 0
        finally:
            for p, fd in fds.items():
                if p:
                    close_dir(fd)
        if trees and self.read_many is not None:
            # on an error each is read (and fails) where the walk needs it
            with contextlib.suppress(SpriteError):
                self._trees = dict(zip(trees, self.read_many(trees), strict=True))

    @staticmethod
    def _plan_fd(fds: dict[bytes, int], rel: bytes) -> int | None:
        """``rel`` opened through its parent (the plan goes in sorted order: parents first),
        closing the directories the plan has left behind."""
        parent = _parent(rel) if rel else None
        for p in [p for p in fds if p and p != parent and not rel.startswith(p + b"/")]:
            close_dir(fds.pop(p))
        if parent is None:
            return fds[b""]
        pfd = fds.get(parent)
        if pfd is None:
            return None  # its parent could not be opened: the walk meets whatever it is
        try:
            fd = open_dir_at(pfd, _base(rel))
        except OSError:
            return None
        fds[rel] = fd
        return fd

    def _plan_reads(self, fd: int, rel: bytes, looked: _Looked) -> int:
        """Starts the native reads of ``rel``'s changed small files (what ``_dir_partial``
        would hand to ``_Batches.add``); returns the bytes started."""
        items = []
        for name in looked.changed:
            st = looked.known.get(name)
            if st is None or not _batched(st):
                continue
            child = _join(rel, name)
            if child in self.reread:
                continue
            items.append((child, name, st))
        if not items:
            return 0
        batches = _Batches(fd, self._start_lazy, self._collect)
        try:
            started = batches.start_ahead(items)
        except OSError:
            return 0  # no descriptor to spare, say: the walk starts its own reads
        looked.batches = batches
        return started

    def _subdir(
        self,
        fd: int,
        rel: bytes,
        name: bytes,
        may_reuse: bool,
        done: dict[bytes, tuple[ObjectId, bool]],
    ) -> bool:
        """Captures subdirectory ``name`` into ``done`` (kept on the hint's word if
        ``may_reuse`` and the hint vouches for it); False if it was replaced since the
        listing."""
        child = _join(rel, name)
        kept = self._reuse(child) if may_reuse else None
        if kept is not None:
            done[name] = (kept, False)
            return True
        try:
            cfd = open_dir_at(fd, name)
        except OSError:
            return False
        out: tuple[ObjectId, bool] | _Later | None = None
        try:
            out = self._dir_or_later(cfd, child, isinstance(done, _Done))
        finally:
            if not isinstance(out, _Later):
                close_dir(cfd)
        if isinstance(out, _Later):
            assert isinstance(done, _Done)
            done.later[name] = out
        else:
            done[name] = out
        return True

    def _count_listed(self, rel: bytes, counts: tuple[int, int, int, int]) -> None:
        """Counts a directory captured from its native listing (``scan_dir``'s counts of
        its children; its subdirectories count themselves)."""
        self.visited.add(rel)
        s = self.stats
        s.dirs += 1
        s.files += counts[0]
        s.bytes += counts[1]
        s.symlinks += counts[2]
        s.specials += counts[3]

    def _dir_partial(
        self,
        fd: int,
        rel: bytes,
        cached: CachedDir,
        blob: bytes,
        subdirs: list[bytes],
        counts: tuple[int, int, int, int],
        done: dict[bytes, tuple[ObjectId, bool]],
        defer: bool = False,
        named: _Looked | None = None,
    ) -> tuple[ObjectId, bool] | _Later | None:
        """A directory that differs from its row, in proportion to what changed in it.

        ``blob`` is the native listing's signature blob (no socket, mount point, hard link
        or racy child in it: ``scan_dir`` said so), ``counts`` its children's counts. Only
        the children whose signature differs from the row are looked at (and read, if
        files); every other entry is copied from the old tree byte for byte by
        ``tree_splice``, which also proves that the new tree names exactly the listed
        children. After the benchmark's agent step, 1,130 such directories held 61k
        children, 2.5k of them changed: entry by entry they cost 1.2 s of Python.

        Returns None, with nothing read yet, when the slow path must decide (a child
        excluded, retyped into something unusual, gone, hard-linked, or an old tree
        that cannot be spliced); subdirectories already captured are then in ``done``.
        With ``defer``, a :class:`_Later` if a big file read early is still being read:
        the rest is done when the parent needs this directory's tree.

        ``named``: when the blob is not a listing but the old row with the journal's named
        children spliced in (``_dir_named``): their stats, and reads the plan started;
        ``subdirs`` are then the walked ones only, and the directory's counts are the
        memo's less what changed.
        """
        if _sig_diff is None or _tree_splice is None or _tree_find is None:
            return None
        known = named.known if named is not None else None
        if named is not None:
            changed, removed = named.changed, named.removed
        else:
            changed, removed = _sig_diff(blob, cached.stat)
        is_changed = set(changed)
        looked: list[tuple[bytes, bytes, os.stat_result]] = []
        # their stats in one native call that keeps the GIL (issue 11: a stat each from
        # Python lets go of it, and taking it back beside a busy thread can wait 5 ms)
        stats = None
        if known is None and _lstat_names is not None:
            stats = _lstat_names(fd, changed)
        for i, name in enumerate(changed):  # classified before anything is walked, read or counted
            child = _join(rel, name)
            if known is not None:
                if name not in known:
                    return None
                st = known[name]
            elif stats is not None:
                fields = stats[i]
                if fields is None:
                    return None
                st = os.stat_result(fields)
            else:
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    return None
            mode = st.st_mode
            if (
                stat.S_ISSOCK(mode)
                or (stat.S_ISDIR(mode) and st.st_dev != self._root_dev)
                or (not stat.S_ISDIR(mode) and st.st_nlink > 1)
                or child in self.reread
                or self.excludes.match(child, st)
            ):
                return None
            looked.append((name, child, st))
        # Every subdirectory, its signature changed or not, in name order: the walk's order
        # names each hard-link group by its first member (the oracle caught a group named
        # by b/f3 when a/, changed, was walked after b/, unchanged).
        now_dirs = {name for name, _, st in looked if stat.S_ISDIR(st.st_mode)}
        for name in sorted({*(n for n in subdirs if n not in is_changed), *now_dirs}):
            if name not in done and not self._subdir(fd, rel, name, name not in is_changed, done):
                return None  # replaced since the listing
        if isinstance(done, _Done):
            done.settle()
        old_tree = self._trees.pop(cached.tree, None) if self._trees else None
        if old_tree is None:
            try:
                old_tree = self.read_tree(cached.tree)
            except SpriteError:
                return None
        if self.trees_out is not None:
            self.trees_out[cached.tree] = old_tree
        prev_sigs: dict[bytes, Sig] | None = None
        pending: list[_Pending] = []
        bulk = named.batches if named is not None else None
        if bulk is not None:
            bulk.dirfd = fd  # the plan's descriptor is closed (each batch holds a copy)
        else:
            bulk = self._batches(fd)
        for name, child, st in looked:
            if stat.S_ISDIR(st.st_mode):  # walked above: its entry anew (its own stat moved)
                subtree = done[name][0]
                d = _Pending(name, st, self._dir_entry(fd, name, st, subtree), subtree=subtree)
                pending.append(d)
                continue
            prev_entry = None
            if stat.S_ISREG(st.st_mode) and st.st_size >= IN_PLACE_MIN:
                if prev_sigs is None:
                    prev_sigs = cached.sigs()
                prev_sig = prev_sigs.get(name)
                raw = _tree_find(old_tree, name) if prev_sig is not None else None
                if prev_sig is not None and prev_sig[0] == st.st_ino and raw is not None:
                    prev_entry = decode_entry(raw)  # a big file changed in place
            p = self._child(fd, child, name, st, False, prev_entry, bulk)
            if p is None:
                if bulk is not None:
                    bulk.flush()
                return self._give_up(pending)
            pending.append(p)
            self._report()
        if bulk is not None:
            bulk.flush()
        if named is not None:
            narrowed = self._narrowed_counts(rel, old_tree, pending, done, removed)
            if narrowed is None:
                return self._give_up(pending)
        else:
            narrowed = None
        finish = functools.partial(
            self._dir_finish, rel, cached, blob, counts, done, pending, old_tree, narrowed
        )
        if defer and any(
            isinstance(p.future, _EarlyRead) and not p.future.future.done() for p in pending
        ):
            return _Later(self, fd, rel, done, finish)
        return finish()

    def _dir_finish(
        self,
        rel: bytes,
        cached: CachedDir,
        blob: bytes,
        counts: tuple[int, int, int, int],
        done: dict[bytes, tuple[ObjectId, bool]],
        pending: list[_Pending],
        old_tree: bytes,
        narrowed: Totals | None = None,
    ) -> tuple[ObjectId, bool] | None:
        """The end of :meth:`_dir_partial`: waits for the children's reads and splices.
        ``narrowed``: the directory's counts but for its changed children (``_dir_named``)."""
        assert _tree_find is not None
        assert _tree_splice is not None
        added: dict[bytes, bytes] = {}
        for p in pending:
            if p.future is not None:
                read = p.future.result()
                p.future = None
                if read is None:
                    return self._give_up(pending)  # gone or retyped while read
                p.entry, p.st = read
            assert p.entry is not None
            added[p.name] = encode_entry(p.entry)
        for name, (subtree, sub_changed) in done.items():
            if sub_changed and name not in added:
                raw = _tree_find(old_tree, name)
                if raw is None:
                    return None
                added[name] = with_payload(raw, subtree)
        if narrowed is not None and not added and blob == cached.stat:
            self._count_narrowed(rel, narrowed, pending)
            self.stats.dirs_reused += 1
            return cached.tree, False
        try:
            body = _tree_splice(old_tree, blob, [added[n] for n in sorted(added)])
        except ValueError:
            return None  # the old tree and its row disagree: decide entry by entry
        if narrowed is not None:
            self._count_narrowed(rel, narrowed, pending)
        else:
            self._count_listed(rel, counts)
        tree_id = self._put_tree(body)
        self.cache_changed[rel] = CachedDir(tree_id, blob)
        return tree_id, tree_id != cached.tree

    def _narrowed_counts(
        self,
        rel: bytes,
        old_tree: bytes,
        pending: list[_Pending],
        done: dict[bytes, tuple[ObjectId, bool]],
        removed: list[bytes],
    ) -> Totals | None:
        """The counts of a narrowed directory's subtree (``_dir_named``) but for its changed,
        removed and walked children: what its old tree holds directly (``tree_counts``) less
        those children's old entries, plus the memo's counts of the subdirectories it keeps.
        The walked subdirectories count themselves and the changed children are counted as
        read. The old tree, not the memo's count of the directory itself: after a restore
        the row (the restore's) is newer than the memo (the undo checkpoint's walk), while a
        kept subdirectory had no event since that walk. None if the memo or the old tree
        cannot say (the directory is then listed)."""
        assert _tree_find_many is not None
        assert _tree_counts is not None
        assert self.hint is not None
        totals = self.hint.memo.totals
        looked = {*(p.name for p in pending), *done, *removed}
        try:
            files, nbytes, symlinks, specials, subdirs = _tree_counts(old_tree)
            # one pass over the old tree for all of them (one tree_find each rescanned it:
            # 23 ms for 200 names of the medium layer's 21k-entry directory)
            old = _tree_find_many(old_tree, list(looked))
        except ValueError:
            return None
        for raw in old:
            if raw is None:
                continue  # new since then
            # the header alone (kind, size): decode_entry of each was 32 ms of the medium
            # step's 0.55 s of the walk's thread (py-spy --gil)
            kind, _mode, _uid, _gid, _mtime, size = entry_meta(raw)
            if kind == Kind.DIR:
                continue  # a subdirectory is counted below if kept
            if kind == Kind.FILE:
                files -= 1
                nbytes -= size
            elif kind == Kind.SYMLINK:
                symlinks -= 1
            else:
                specials -= 1
        dirs = 0
        for name in subdirs:
            if name in looked:
                continue  # walked, or no directory any more
            t = totals.get(_join(rel, name))
            if t is None:
                return None
            files += t[0]
            dirs += t[1]
            symlinks += t[2]
            specials += t[3]
            nbytes += t[4]
        if min(files, symlinks, specials, nbytes) < 0:
            return None
        return files, dirs, symlinks, specials, nbytes

    def _count_narrowed(self, rel: bytes, rest: Totals, pending: list[_Pending]) -> None:
        """Counts a narrowed directory: itself, what it kept (``rest``: the subdirectories it
        kept are reused, as ``_reuse`` counts them), and its changed non-directories."""
        self.visited.add(rel)
        s = self.stats
        s.files += rest[0]
        s.dirs += rest[1] + 1
        s.symlinks += rest[2]
        s.specials += rest[3]
        s.bytes += rest[4]
        s.dirs_reused += rest[1]
        for p in pending:
            if not stat.S_ISDIR(p.st.st_mode):
                self._count(p.st)

    @staticmethod
    def _give_up(pending: list[_Pending]) -> None:
        """Lets the reads already started finish before the slow path takes over (their
        objects are stored either way; the slow path reads them again). The subdirectories
        were all walked before any read began, so they are in ``done`` already."""
        for p in pending:
            if p.future is not None:
                p.future.result()

    def _dir_slow(
        self, fd: int, rel: bytes, done: dict[bytes, tuple[ObjectId, bool]]
    ) -> tuple[ObjectId, bool]:
        """The directory entry by entry; ``done`` holds subdirectories already captured."""
        if isinstance(done, _Done):
            done.settle()
        self.visited.add(rel)
        self.stats.dirs += 1
        cached = self.cache.get(rel)
        prev_sigs = cached.sigs() if cached else {}
        ahead = self._ahead
        bulk = ahead.batches(rel, fd) if ahead is not None else None
        if bulk is None:
            bulk = self._batches(fd)
        if ahead is not None:
            self._fds[rel] = fd  # its subdirectories are opened through it while it is open
        try:
            if ahead is not None:
                ahead.fill(rel)
            return self._dir_entries(fd, rel, cached, prev_sigs, bulk, done)
        finally:
            if ahead is not None:
                del self._fds[rel]

    def _dir_entries(
        self,
        fd: int,
        rel: bytes,
        cached: CachedDir | None,
        prev_sigs: dict[bytes, Sig],
        bulk: _Batches | None,
        done: dict[bytes, tuple[ObjectId, bool]],
    ) -> tuple[ObjectId, bool]:
        """The rest of :meth:`_dir_slow`: lists (or takes the listing of) the directory,
        captures its children and encodes its tree."""
        sigs: dict[bytes, Sig] = {}
        pending: list[_Pending] = []
        prev_tree: dict[bytes, TreeEntry] | None = None
        unchanged = cached is not None
        listed = self._listing.pop(rel, None) if self._listing else None
        for name, st in listed if listed is not None else self._list(fd, rel):
            child = _join(rel, name)
            if self.excludes.match(child, st):
                continue
            mode = st.st_mode
            if stat.S_ISSOCK(mode):
                self._warn(child, "socket skipped (a socket cannot be restored)", "socket_skipped")
                continue
            if stat.S_ISDIR(mode) and st.st_dev != self._root_dev:
                self._warn(child, "mount point skipped (other file system)", "mount_point")
                continue
            s = sig_of(st, self.start_ns)
            prev_sig = prev_sigs.get(name)
            same = not is_racy(s) and prev_sig == s
            if child in self.reread:
                same = False  # mapped writable: its signature may not have moved
            if not stat.S_ISDIR(mode) and st.st_nlink > 1:
                same = False  # hard-link groups are re-derived every time (cheap, rare)
                self.link_dirs.add(rel)
                self.link_inos.add(st.st_ino)
                hint = self.hint
                if (
                    hint is not None
                    and not hint.scanned
                    and st.st_ino not in hint.memo.link_inos
                    and st.st_ino not in hint.inodes
                ):
                    # its other names may be where no event was: looked up once the walk
                    # has met every such group (one restart, not one per group: a package
                    # manager links thousands of files at once)
                    self._new_groups.setdefault(st.st_ino, child)
            prev_entry = None
            if (
                not same
                and cached is not None
                and stat.S_ISREG(mode)
                and st.st_size >= IN_PLACE_MIN
                and prev_sig is not None
                and prev_sig[0] == st.st_ino
            ):  # a big file changed in place: compare it with its previous version
                if prev_tree is None:
                    prev_tree = self._prev_tree(cached)
                prev_entry = prev_tree.get(name)
            if bulk is not None and stat.S_ISDIR(mode):
                bulk.flush()  # the files listed so far are read while it is walked
            if name in done and stat.S_ISDIR(mode):
                subtree, changed = done[name]
                if same:
                    p: _Pending | None = _Pending(
                        name, st, subtree=subtree, subtree_changed=changed
                    )
                else:
                    p = _Pending(name, st, self._dir_entry(fd, name, st, subtree), subtree=subtree)
            else:
                p = self._child(fd, child, name, st, same, prev_entry, bulk)
            if p is not None:
                pending.append(p)
                sigs[name] = s
            self._report()
        if bulk is not None:
            bulk.flush()
        kept = []
        for p in pending:
            if p.future is not None:  # wait for the reader threads (in walk order)
                read = p.future.result()
                p.future = None
                if read is None:
                    del sigs[p.name]  # gone or retyped while we looked
                    continue
                p.entry, p.st = read
                if not is_racy(sigs[p.name]):  # signed by its stat after the read
                    sigs[p.name] = sig_of(p.st, self.start_ns)
            if not stat.S_ISDIR(p.st.st_mode):
                self._count(p.st)
            if not p.reuse or p.subtree_changed:
                unchanged = False
            kept.append(p)
        pending = kept
        if cached is not None and unchanged and sigs.keys() == prev_sigs.keys():
            self.stats.dirs_reused += 1
            return cached.tree, False
        entries = self._materialize(rel, fd, cached, pending)
        tree_id = self._put_tree(encode_tree(entries))
        self.cache_changed[rel] = CachedDir(tree_id, dircache.encode_sigs(sigs))
        return tree_id, cached is None or tree_id != cached.tree

    def _list(self, fd: int, rel: bytes) -> _Listing:
        """The children of the directory open at ``fd`` with their lstat, sorted by name
        (a child that vanished since the listing is simply not there)."""
        try:
            if _lstat_names is not None:
                # one listing, then every lstat in one native call that keeps the GIL: a
                # stat each from Python lets go of it, and beside the encoders taking it
                # back can wait (a new directory's listing, ~1.3k files of a pip install
                # in the medium step: 23 ms of the walk's thread, py-spy --gil)
                names = sorted(map(os.fsencode, os.listdir(fd)))
            else:
                with os.scandir(fd) as it:
                    names = sorted(os.fsencode(d.name) for d in it)
        except OSError as e:
            self._warn(rel, f"cannot list directory: {e.strerror}")
            return []
        if _lstat_names is not None:
            stats = _lstat_names(fd, names)
            return [(n, os.stat_result(f)) for n, f in zip(names, stats, strict=True) if f]
        out: _Listing = []
        for name in names:
            try:
                out.append((name, os.stat(name, dir_fd=fd, follow_symlinks=False)))
            except FileNotFoundError:
                continue
        return out

    def _prev_tree(self, cached: CachedDir) -> dict[bytes, TreeEntry]:
        try:
            raw = self.read_tree(cached.tree)
        except SpriteError:
            return {}  # unreadable old tree: every child below is captured afresh
        if self.trees_out is not None:
            self.trees_out[cached.tree] = raw
        return {e.name: e for e in decode_tree(raw)}

    def _put_tree(self, body: bytes) -> ObjectId:
        tree_id = self.sink.put(body, ObjectKind.TREE)
        if self.trees_out is not None:
            self.trees_out[tree_id] = body
        return tree_id

    def _materialize(
        self, rel: bytes, fd: int, cached: CachedDir | None, pending: list[_Pending]
    ) -> list[TreeEntry]:
        prev: dict[bytes, TreeEntry] = {}
        if cached is not None and any(p.reuse for p in pending):
            prev = self._prev_tree(cached)
        out = []
        for p in pending:
            if p.entry is not None:
                out.append(p.entry)
                continue
            old = prev.get(p.name)
            if old is None or old.kind is not _kind(p.st.st_mode):
                # The cache vouched for an entry the old tree lacks: capture it for real.
                if p.subtree is not None:
                    out.append(self._dir_entry(fd, p.name, p.st, p.subtree))
                else:
                    fresh = self._child(fd, _join(rel, p.name), p.name, p.st, False)
                    if fresh is not None and fresh.future is not None:
                        done = fresh.future.result()
                        fresh.entry = done[0] if done is not None else None
                    if fresh is not None and fresh.entry is not None:
                        out.append(fresh.entry)
                continue
            if p.subtree is not None and p.subtree_changed:
                old = dataclasses.replace(old, payload=p.subtree)
            out.append(old)
        return out

    # -- entries -----------------------------------------------------------------------------

    def _child(
        self,
        dirfd: int,
        rel: bytes,
        name: bytes,
        st: os.stat_result,
        same: bool,
        prev: TreeEntry | None = None,
        bulk: _Batches | None = None,
    ) -> _Pending | None:
        mode = st.st_mode
        try:
            if stat.S_ISDIR(mode):
                kept = self._reuse(rel) if same else None
                if kept is not None:
                    return _Pending(name, st, subtree=kept)
                cfd = self._ahead.take_fd(rel) if self._ahead is not None else None
                try:
                    if cfd is None:
                        cfd = open_dir_at(dirfd, name)
                except OSError as e:
                    if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                        return None  # replaced since the listing
                    raise
                try:
                    subtree, changed = self._dir(cfd, rel)
                    if same:
                        return _Pending(name, st, subtree=subtree, subtree_changed=changed)
                    entry = self._dir_entry(dirfd, name, st, subtree, cfd)
                    return _Pending(name, st, entry, subtree=subtree)
                finally:
                    os.close(cfd)
            if same:
                return _Pending(name, st)
            if stat.S_ISREG(mode):
                link = self._link_of(st, rel)  # decided here, in walk order
                done = self.link_payload.get(st.st_ino) if st.st_nlink > 1 else None
                if done is not None:  # another member of the group was read already
                    return _Pending(name, st, dataclasses.replace(done, name=name, link=link))
                # (a file changed in place, ``prev``, is compared with it, not read whole)
                if bulk is not None and _batched(st) and not prev:
                    return _Pending(name, st, future=bulk.add(rel, name, st))
                early = self._early.pop(rel, None) if self._early else None
                if early is not None:
                    taken = _EarlyRead(self, early, dirfd, rel, name, st, link, prev)
                    return _Pending(name, st, future=taken)
                assert self._readers is not None
                fut = self._readers.submit(self._file, dirfd, rel, name, st, link, prev)
                return _Pending(name, st, future=fut)
            xattrs = read_xattrs(proc_path(dirfd, name))
            base = (name, _kind(mode), stat.S_IMODE(mode), st.st_uid, st.st_gid, st.st_mtime_ns)
            link = self._link_of(st, rel)
            if stat.S_ISLNK(mode):
                target = os.readlink(name, dir_fd=dirfd)
                entry = TreeEntry(
                    *base,
                    size=len(target),
                    nlink=st.st_nlink,
                    xattrs=xattrs,
                    link=link,
                    payload=target,
                )
                return _Pending(name, st, entry)
            rdev = st.st_rdev if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else 0
            entry = TreeEntry(*base, rdev=rdev, nlink=st.st_nlink, xattrs=xattrs, link=link)
            return _Pending(name, st, entry)
        except FileNotFoundError:
            return None
        except PermissionError as e:
            self._warn(rel, f"skipped: {e.strerror}")
            return None

    def _count(self, st: os.stat_result) -> None:
        m = st.st_mode
        if stat.S_ISREG(m):
            self.stats.files += 1
            self.stats.bytes += st.st_size
        elif stat.S_ISLNK(m):
            self.stats.symlinks += 1
        elif not stat.S_ISDIR(m):
            self.stats.specials += 1

    def _dir_entry(
        self, dirfd: int, name: bytes, st: os.stat_result, subtree: ObjectId, fd: int | None = None
    ) -> TreeEntry:
        xattrs = read_xattrs(fd) if fd is not None else read_xattrs(proc_path(dirfd, name))
        return TreeEntry(
            name,
            Kind.DIR,
            stat.S_IMODE(st.st_mode),
            st.st_uid,
            st.st_gid,
            st.st_mtime_ns,
            xattrs=xattrs,
            payload=subtree,
        )

    def _link_of(self, st: os.stat_result, rel: bytes) -> bytes:
        """The path of the first member of ``st``'s hard-link group, if it is not ``rel``."""
        if st.st_nlink < 2:
            return b""
        first = self.links.setdefault(st.st_ino, rel)
        return b"" if first == rel else first

    def _file(
        self,
        dirfd: int,
        rel: bytes,
        name: bytes,
        st: os.stat_result,
        link: bytes,
        prev: TreeEntry | None = None,
    ) -> tuple[TreeEntry, os.stat_result] | None:
        """Reads one regular file (on a reader thread); None if it is gone.

        ``prev`` is the file's entry in the previous capture when it was changed in place.
        """
        pieces = None
        old_sums = None
        if prev is not None and prev.kind is Kind.FILE:
            try:
                raw = self.read_tree(ObjectId(prev.payload)) if prev.indirect else prev.payload
                pieces = decode_chunks(raw)
            except SpriteError:
                pieces = None
            if pieces is not None and self.page_sums is not None:
                pid = prev.payload if prev.indirect else object_id(raw)
                old_sums = self._old_sums(rel, pid, pieces)
        try:
            fd = os.open(name, _O_FILE, dir_fd=dirfd)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ELOOP):
                return None
            if e.errno in (errno.EACCES, errno.EPERM):
                self._warn(rel, f"skipped: {e.strerror}")
                return None
            raise CaptureFailed(rel, e) from e
        try:
            entry, st_after = self._read_file(fd, rel, name, link, pieces, old_sums)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):  # the store's disk, not this file
                raise
            raise CaptureFailed(rel, e) from e
        finally:
            os.close(fd)
        if entry is None:
            return None
        if st.st_nlink > 1:
            self.link_payload[st.st_ino] = entry
        return entry, st_after

    def _batches(self, dirfd: int) -> _Batches | None:
        """Where the directory open at ``dirfd`` groups its small files (None: no native
        batch read, every file is read on its own)."""
        if _read_start is None:
            return None
        return _Batches(dirfd, self._start_group, self._collect)

    def _start_group(self, dirfd: int, names: list[bytes], lazy: bool = False) -> object:
        assert _read_start is not None
        c = self.chunker
        limit = IN_PLACE_MIN - 1
        return _read_start(
            dirfd, names, limit, c.min_size, c.avg_size, c.max_size, BULK_THREADS, lazy
        )

    def _start_lazy(self, dirfd: int, names: list[bytes]) -> object:
        """``_start_group`` for the plan, which starts the reads of every walked directory
        in a row and waits for them later: the pool wakes its own threads (``lazy``), not
        the walk's thread with the GIL held (the wakes were 55-80 ms of the medium step's
        checkpoint, py-spy --gil: each a futex call of ~24 us on this VM)."""
        return self._start_group(dirfd, names, True)

    def _collect(
        self, dirfd: int, g: _Group, reads: list[_BulkRead]
    ) -> list[_Read | Future[_Read]]:
        """The entries of a group the native batch read (on the walk's thread, which waited
        for it): those it read whole are stored here, any other (holes, a link, changed
        while read, an error) goes to a reader thread's :meth:`_file`, which decides as
        it always did."""
        out: list[_Read | Future[_Read]] = []
        assert self._readers is not None
        try:
            for i, ((rel, name, st), r) in enumerate(zip(g.items, reads, strict=True)):
                if r is None:
                    out.append(self._readers.submit(self._file, dirfd, rel, name, st, b""))
                else:
                    reads[i] = None  # its descriptor is the entry's to close
                    out.append(self._bulk_entry(rel, name, *r))
        finally:
            for r in reads:  # not reached: an error above
                if r is not None and r[4] >= 0:
                    os.close(r[4])
        return out

    def _bulk_entry(
        self,
        rel: bytes,
        name: bytes,
        st_fields: tuple[int, ...],
        data: bytes,
        ends: list[int],
        ids: bytes,
        xattr_fd: int,
    ) -> tuple[TreeEntry, os.stat_result]:
        """The entry of a file the native batch read whole: the same objects and entry as
        ``_read_file`` makes of it (``tests/snapshot/test_bulk_read.py`` compares them)."""
        after = os.stat_result(st_fields)
        try:
            xattrs = read_xattrs(xattr_fd) if xattr_fd >= 0 else ()
        except OSError as e:
            raise CaptureFailed(rel, e) from e
        finally:
            if xattr_fd >= 0:
                os.close(xattr_fd)
        put = self._put_known
        chunks: list[Piece] = []
        start = 0
        for i, end in enumerate(ends):
            chunk = data if start == 0 and end == len(data) else data[start:end]
            oid = ObjectId(ids[i * 32 : i * 32 + 32])
            if put is not None:
                put(oid, chunk, ObjectKind.DATA)
            else:
                self.sink.put(chunk, ObjectKind.DATA)
            chunks.append((oid, 0, end - start))
            start = end
        with self._stats_lock:
            self.stats.bytes_read += len(data)
            self.stats.files_read += 1
        payload = encode_chunks(chunks)
        indirect = len(chunks) > INLINE_CHUNKS
        if indirect:
            payload = self.sink.put(payload, ObjectKind.CHUNKLIST)
        entry = TreeEntry(
            name,
            Kind.FILE,
            stat.S_IMODE(after.st_mode),
            after.st_uid,
            after.st_gid,
            after.st_mtime_ns,
            size=len(data),
            nlink=after.st_nlink,
            xattrs=xattrs,
            payload=payload,
            indirect=indirect,
        )
        return entry, after

    def _old_sums(self, rel: bytes, pid: bytes, pieces: list[Piece]) -> PageSums | None:
        """The saved page digests of ``rel`` if they are those of ``pieces`` (chunk list id
        ``pid``); else None, and the file is compared against the store."""
        assert self.page_sums is not None
        # a lookup that keeps older vectors (``pagesums.Lookup.find``) is asked for this
        # version's: after a restore of the previous checkpoint the newest is another's
        find = getattr(self.page_sums, "find", None)
        ps = find(rel, pid) if find is not None else self.page_sums(rel)
        if ps is None or ps.pieces != pid:
            return None  # none yet, or of another version (a restore, another file)
        if len(ps.sums) != pagesums.SUM_LEN * pagesums.window_count(pieces):
            return None
        return ps

    def _pieces(
        self,
        fd: int,
        size: int,
        regions: list[tuple[int, int]],
        pos: int,
        sums: list[bytes | _Span] | None = None,
        key: bytes = b"",
    ) -> tuple[list[Piece], int]:
        """Chunks ``[pos, size)`` with the content-defined chunker; holes stay holes. With
        ``sums``, appends the page digests of each chunk (keyed with ``key``)."""
        chunks: list[Piece] = []
        for start, end in regions:
            if end <= pos:
                continue
            if start >= size:
                break
            start, end = max(start, pos), min(end, size)
            if start > pos:
                chunks.append((None, 0, start - pos))  # a hole, recorded, never read
            os.lseek(fd, start, os.SEEK_SET)
            at = start
            for chunk in self.chunker.chunks_of_fd(fd, limit=end - start):
                chunks.append((self.sink.put(bytes(chunk), ObjectKind.DATA), 0, len(chunk)))
                if sums is not None:  # from the bytes stored: the digests describe them
                    sums.append(pagesums.digests(chunk, at, key))
                at += len(chunk)
                with self._stats_lock:
                    self.stats.bytes_read += len(chunk)
            pos = end
        if size > pos:
            chunks.append((None, 0, size - pos))
        return chunks, size

    def _pieces_in_place(
        self,
        fd: int,
        size: int,
        regions: list[tuple[int, int]],
        prev: list[Piece],
        old: PageSums | None = None,
        key: bytes | None = None,
    ) -> tuple[list[Piece], int, list[bytes | _Span] | None]:
        """Compares a file changed in place with its previous pieces, page by page.

        A previous piece whose bytes are unchanged is kept; a changed one is compared in
        windows (the piece cut at every multiple of ``PAGE`` of the file's offsets, where
        databases write), the equal windows kept as slices of the old object and each run
        of changed windows stored as one new object. A database that rewrote 6% of its
        pages stores about 6% of its size, where whole-chunk comparison would store the
        ~60% of chunks those pages touch.

        With ``old``, the digests of the previous pieces' windows (``pagesums.py``), the
        windows are told apart by digest: the file is read once and hashed in C on both
        cores, and nothing of the old version is read (``benchmarks/bench_inplace.py``).
        Without it, each piece is read and checked by its hash (a whole object) or against
        the old object's bytes, read back from the store. Both ways give the same pieces.

        Returns:
            The pieces, the size, and with ``key`` the new vector's parts (digests keyed
            with ``key``, and spans of the windows compared by digest: see
            :meth:`_compare_sums`), else None.
        """
        sums: list[bytes | _Span] | None = [] if key is not None else None
        out: list[Piece] = []
        # pieces compared by digest: (index in out, pos, n, oid, off, old vector's window)
        plan: list[tuple[int, int, int, ObjectId, int, int]] = []
        dense = regions == [(0, size)]  # no hole anywhere: no region to look up
        by_sums = old is not None and sums is not None
        pos = win = cur = 0
        old_id: ObjectId | None = None
        old_bytes = b""
        for oid, off, full in prev:
            if pos >= size:
                break
            n = min(full, size - pos)
            w = win
            if oid is not None:
                win += (pos + full - 1) // PAGE - pos // PAGE + 1  # its windows
            if not dense and _in_hole(regions, pos, n):
                out.append((None, 0, n))
                pos += n
                continue
            if oid is None or not (dense or _in_data(regions, pos, n)):
                # holes appeared or were filled here: chunk this range afresh, holes exact
                fresh, _ = self._pieces(fd, pos + n, regions, pos, sums, key or b"")
                out.extend(fresh)
                pos += n
                continue
            if by_sums and (n == full or (pos + n) % PAGE == 0):
                # its windows are those the vector has (a cut at a page boundary keeps a
                # prefix of them); it stays as it was unless a window's digest differs
                assert sums is not None
                nw = (pos + n - 1) // PAGE - pos // PAGE + 1
                plan.append((len(out), pos, n, oid, off, w))
                span = sums[-1] if sums else None
                if isinstance(span, _Span) and span.end == cur:
                    span.end = cur + nw
                else:
                    sums.append(_Span(cur, cur + nw))
                cur += nw
                out.append((oid, off, n))
                pos += n
                continue
            data = os.pread(fd, n, pos)
            if len(data) != n:
                break  # shrank while read: the caller's stat check will retry
            with self._stats_lock:
                self.stats.bytes_read += n
            if off == 0 and object_id(data) == oid:
                out.append((oid, 0, n))
            else:
                if oid != old_id:
                    old_id, old_bytes = oid, self.read_tree(oid)
                out.extend(self._compare_pages(pos, data, oid, old_bytes[off : off + n], off))
            if sums is not None:
                sums.append(pagesums.digests(data, pos, key or b""))
            pos += n
        if plan:
            assert old is not None
            assert sums is not None
            assert key is not None
            try:
                out = self._compare_sums(fd, plan, old, key, out, sums)
            except _Shrank:  # the file ended before a window: read it the old way
                return self._pieces_in_place(fd, size, regions, prev, None, key)
        tail, _ = self._pieces(fd, size, regions, pos, sums, key or b"")
        return out + tail, size, sums

    def _compare_sums(
        self,
        fd: int,
        plan: list[tuple[int, int, int, ObjectId, int, int]],
        old: PageSums,
        key: bytes,
        out: list[Piece],
        sums: list[bytes | _Span],
    ) -> list[Piece]:
        """Tells the planned pieces' windows apart by digest (one pass in C over their
        bytes); returns ``out`` with each planned piece that has a changed window replaced
        by its runs, and turns the spans in ``sums`` into the new digests.

        A kept window keeps its digest (its bytes are the old ones); a changed run is
        stored from the very bytes its digests were computed from (copied in the same
        pass), so the vector describes the pieces even if the file moved meanwhile.

        Raises:
            _Shrank: the file ended before a planned window (the caller reads it again).
        """
        step = pagesums.SUM_LEN
        expected: list[bytes] = []  # the old digests of the planned windows, in order
        start = last = -1
        ranges = array("Q")
        for _, pos, n, _, _, w in plan:
            ranges.append(pos)
            ranges.append(n)
            if w != last:  # not next in line in the old vector: pieces between were not
                if last >= 0:
                    expected.append(old.sums[start * step : last * step])
                start = w
            last = w + (pos + n - 1) // PAGE - pos // PAGE + 1
        expected.append(old.sums[start * step : last * step])
        try:
            new, runs = pagesums.compare_fd(fd, ranges, key, b"".join(expected))
        except OSError as e:
            if e.errno == errno.ENODATA:
                raise _Shrank from e
            raise
        with self._stats_lock:
            self.stats.bytes_read += sum(ranges[1::2])
        put_many = getattr(self.sink, "put_many", None)  # one catalog query per 500 runs
        datas = [data for _, _, data in runs]
        if put_many is not None:
            ids: list[ObjectId] = put_many(datas, ObjectKind.DATA)
        else:
            ids = [self.sink.put(d, ObjectKind.DATA) for d in datas]
        spliced: list[Piece] = []
        done = 0
        i = 0
        while i < len(runs):
            r = runs[i][0]
            slot, pos, n, oid, off, _ = plan[r]
            spliced.extend(out[done:slot])
            at = pos
            while i < len(runs) and runs[i][0] == r:
                _, start, data = runs[i]
                if start > at:
                    spliced.append((oid, off + at - pos, start - at))
                spliced.append((ids[i], 0, len(data)))
                at = start + len(data)
                i += 1
            if at < pos + n:
                spliced.append((oid, off + at - pos, pos + n - at))
            done = slot + 1
        spliced.extend(out[done:])
        for j, part in enumerate(sums):
            if isinstance(part, _Span):
                sums[j] = new[part.start * step : part.end * step]
        return spliced

    def _compare_pages(
        self, pos: int, data: bytes, oid: ObjectId, old: bytes, off: int
    ) -> list[Piece]:
        out: list[Piece] = []
        i = 0
        n = len(data)
        while i < n:
            # windows end on page boundaries of the file, where databases write
            j = min(n, (pos + i) // PAGE * PAGE + PAGE - pos)
            same = data[i:j] == old[i:j]
            k = j
            while k < n:
                nxt = min(n, k + PAGE)
                if (data[k:nxt] == old[k:nxt]) != same:
                    break
                k = nxt
            if same:
                out.append((oid, off + i, k - i))
            else:
                out.append((self.sink.put(data[i:k], ObjectKind.DATA), 0, k - i))
            i = k
        return out

    def _read_file(
        self,
        fd: int,
        rel: bytes,
        name: bytes,
        link: bytes,
        prev: list[Piece] | None = None,
        old_sums: PageSums | None = None,
    ) -> tuple[TreeEntry | None, os.stat_result]:
        # page digests for every big file, so that its first change in place is found
        # without the store (the benchmark's database: one checkpoint, then the change)
        key = None
        if self.page_sums is not None:
            key = old_sums.key if old_sums is not None else pagesums.new_key()
        for _attempt in range(READ_ATTEMPTS):
            before = os.fstat(fd)
            if not stat.S_ISREG(before.st_mode):
                return None, before  # replaced by something else since the listing
            size = before.st_size
            regions = data_regions(fd, size)
            sums: list[bytes | _Span] | None = None
            if prev is not None:
                chunks, total, sums = self._pieces_in_place(fd, size, regions, prev, old_sums, key)
            else:
                if key is not None and size >= IN_PLACE_MIN:
                    sums = []
                chunks, total = self._pieces(fd, size, regions, 0, sums, key or b"")
            after = os.fstat(fd)
            with self._stats_lock:
                self.stats.files_read += 1
            if _stable(before, after) and total == after.st_size:
                break
        else:
            self._warn(
                rel,
                f"changed while being read ({READ_ATTEMPTS} attempts); the last reading was kept",
                "changed_while_read",
            )
        payload = encode_chunks(chunks)
        indirect = len(chunks) > INLINE_CHUNKS
        if indirect:
            payload = self.sink.put(payload, ObjectKind.CHUNKLIST)
        if sums is not None and key is not None:
            pid = payload if indirect else object_id(payload)
            parts = [s for s in sums if isinstance(s, bytes)]
            assert len(parts) == len(sums), "every span was filled in"
            self.page_sums_out[rel] = PageSums(key, pid, b"".join(parts), old_sums)
        entry = TreeEntry(
            name,
            Kind.FILE,
            stat.S_IMODE(after.st_mode),
            after.st_uid,
            after.st_gid,
            after.st_mtime_ns,
            size=total,
            nlink=after.st_nlink,
            xattrs=read_xattrs(fd),
            link=link,
            payload=payload,
            indirect=indirect,
        )
        return entry, after


@dataclass(slots=True)
class _Span:
    """Windows ``[start, end)`` of the digest pass of ``_compare_sums``, in a vector's parts
    until that pass fills them in (a dataclass: spans grow while the pass is planned)."""

    start: int
    end: int


class _Shrank(Exception):
    """The file ended before a window of the digest pass."""


def _in_data(regions: list[tuple[int, int]], pos: int, n: int) -> bool:
    """True if ``[pos, pos+n)`` lies inside one data region."""
    return any(start <= pos and pos + n <= end for start, end in regions)


def _in_hole(regions: list[tuple[int, int]], pos: int, n: int) -> bool:
    """True if ``[pos, pos+n)`` overlaps no data region."""
    return not any(start < pos + n and end > pos for start, end in regions)


def data_regions(fd: int, size: int) -> list[tuple[int, int]]:
    """The file's data extents ``[(start, end)]`` up to ``size`` (SEEK_DATA/SEEK_HOLE).

    What lies between them are holes: recorded as such, never read, restored as holes. A
    file system without hole support reports one region, the whole file.
    """
    regions = []
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:
                break  # only a hole from pos to the end
            raise
        if start >= size:
            break
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        regions.append((start, end))
        pos = end
    return regions


def _batched(st: os.stat_result) -> bool:
    """Whether the native batches read this file (a regular file of one link under
    ``IN_PLACE_MIN``: no page digests to make) when the walk reads it whole: what the walk
    puts in a directory's batches, and so what ``_ReadAhead`` starts for it."""
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_size < IN_PLACE_MIN


def _stable(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_size, a.st_mtime_ns, a.st_ctime_ns) == (b.st_size, b.st_mtime_ns, b.st_ctime_ns)


def _kind(mode: int) -> Kind:
    if stat.S_ISREG(mode):
        return Kind.FILE
    if stat.S_ISDIR(mode):
        return Kind.DIR
    if stat.S_ISLNK(mode):
        return Kind.SYMLINK
    if stat.S_ISCHR(mode):
        return Kind.CHR
    if stat.S_ISBLK(mode):
        return Kind.BLK
    if stat.S_ISFIFO(mode):
        return Kind.FIFO
    raise ValueError(f"unsupported file type {stat.S_IFMT(mode):o}")


def capture(
    root: str | bytes,
    sink: ObjectSink,
    read_tree: ReadTree,
    cache: Mapping[bytes, CachedDir] | None = None,
    *,
    excludes: Excludes | None = None,
    progress: Progress | None = None,
    on_warning: OnWarning | None = None,
    hint: WalkHint | None = None,
    reread: frozenset[bytes] = frozenset(),
    page_sums: PageSumsLookup | None = None,
    read_many: ReadMany | None = None,
    trees_out: dict[ObjectId, bytes] | None = None,
) -> CaptureResult:
    """Captures ``root`` into ``sink``.

    Args:
        root: the directory to capture.
        sink: where objects go (a ``StoreWriter``).
        read_tree: reads a tree object by id (for entries reused from the files cache).
        cache: the files cache (``dircache.load``); empty means read everything.
        excludes: paths and directories left out.
        progress: called with the running counters, at most every 0.1 s.
        on_warning: called with each warning as it happens.
        hint: a change journal's word on what changed since the walk of ``hint.memo``
            (see the module docstring: "The journal's hint"); None walks everything.
        reread: files to read even if their signature matches the cache (files mapped
            shared and writable: see ``journal.WalkPlan.reread``).
        page_sums: where the page digests of big files are looked up (``pagesums.Lookup``):
            a file changed in place is then compared without reading its old version, and
            every big file read gets new digests (``page_sums`` of the result). None:
            neither.
        read_many: reads many trees at once (the store's ``read_many``): a walk the
            journal narrowed reads the old trees of its changed directories in one batch.
        trees_out: receives, by id, the trees the capture read (the old trees of the
            directories it walked) and wrote: both sides of a diff between the files
            cache's checkpoint and the result, for a restore's plan that follows.

    Returns:
        The top tree's id, counters, warnings, the files-cache rows and page digests to
        write, and which walk it took (``walk``, ``walk_reason``) with the memo for the
        next hint.
    """
    rows = cache if cache is not None else {}  # not ``or``: a view's len reads all
    capturer = functools.partial(
        Capturer,
        os.fsencode(root),
        sink,
        read_tree,
        rows,
        excludes=excludes,
        progress=progress,
        reread=reread,
        page_sums=page_sums,
        read_many=read_many,
        trees_out=trees_out,
    )
    reason = ""
    tries = 0
    while hint is not None:
        if hint.inodes:
            try:
                hint = _naming(hint, rows)
            except dircache.DamagedRows as e:
                reason = str(e)  # a name may be in a row that is gone: walk everything
                break
        try:
            sums: dict[bytes, PageSums] = {}
            r = capturer(hint=hint, page_sums_out=sums).run()
            r.page_sums = sums
            if on_warning is not None:  # told once the walk is final (it may start again)
                for w in r.warnings:
                    on_warning(w)
            return r
        except NewLinkGroup as e:
            # what it stored is kept (content-addressed); warnings are not. New groups:
            # walked again with their members' old names (each walk names the groups it
            # met, so a second restart means a group linked to one of those: rare)
            reason = str(e)
            tries += 1
            hint = replace(hint, inodes=hint.inodes | e.inodes) if e.inodes else None
            if tries >= NEW_GROUP_TRIES:
                hint = None
    sums = {}  # the full walk reads those files again: only its digests are saved
    r = capturer(on_warning=on_warning, page_sums_out=sums).run()
    r.page_sums = sums
    r.walk_reason = reason
    return r


def _naming(hint: WalkHint, cache: Mapping[bytes, CachedDir]) -> WalkHint:
    """``hint`` with every name the files cache has for ``hint.inodes`` named (and its
    directory dirty): where the last capture found those files' other names."""
    found = dircache.names_of(cache, hint.inodes)
    if not found:
        return hint
    named = None
    if hint.named is not None:
        named = dict(hint.named)
        for rel, names in found.items():
            named[rel] = named.get(rel, frozenset()) | names
    return replace(hint, dirty=hint.dirty | found.keys(), named=named)


__all__ = [
    "CaptureResult",
    "CaptureStats",
    "CaptureWarning",
    "Capturer",
    "Excludes",
    "NewLinkGroup",
    "ObjectSink",
    "WalkHint",
    "WalkMemo",
    "capture",
]
