"""Restore: make a live tree equal to a checkpoint, touching only what differs.

Input: the live tree's top id (a capture taken just before, which doubles as the undo
checkpoint) and the target's. The walk is the diff of the two (``diff.classify``):
equal subtrees are skipped unread; an entry that exists only live is removed; a file whose
content differs is written to a temporary name in its directory, given its metadata
through the open descriptor, and renamed over the old one; an entry whose metadata alone
differs is fixed in place; directories get their metadata after their contents, so their
mtimes stick.

Safety: every operation is relative to a directory descriptor opened with O_NOFOLLOW, and
names are single components checked by ``fsmeta.check_name``; a symlink in the live tree,
wherever it points, is only ever removed or replaced, never followed. Excluded paths and
other file systems below the root are left alone.

The restore is idempotent: run again on a half-restored tree (after a kill), with a fresh
capture of it as ``live``, it finishes the job. The caller records the intent first.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import os
import stat
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from sprite_env.errors import SpriteError
from sprite_env.ids import ObjectId
from sprite_env.snapshot import bulkrestore, dircache
from sprite_env.snapshot.capture import Excludes
from sprite_env.snapshot.diff import (
    Change,
    Entries,
    ReadTree,
    TreeMemo,
    classify,
    differing,
    entries_below,
    read_entries,
    root_news,
    top_entry,
)
from sprite_env.snapshot.dircache import CachedDir, Sig, sig_of
from sprite_env.snapshot.frees import Frees
from sprite_env.snapshot.fsmeta import (
    apply_meta,
    apply_meta_proc,
    check_name,
    close_dir,
    close_fd,
    open_at,
    open_dir,
    open_dir_at,
    pwrite_piece,
    set_mtime,
    set_xattrs,
    syncfs,
)
from sprite_env.snapshot.patch import Prefetched, changed_ranges
from sprite_env.snapshot.tree import Kind, Piece, TreeEntry, decode_chunks, entry_meta, placed
from sprite_env.store.faults import crashpoint
from sprite_env.store.ports import ObjectReader, reader_of

_lstat_names: Callable[[int, list[bytes]], list[tuple[int, ...] | None]] | None
_sig_splice: Callable[[bytes, bytes, list[bytes]], bytes] | None
try:
    from sprite_env._native import lstat_names as _lstat_names
    from sprite_env._native import sig_splice as _sig_splice
except ImportError:  # the stat loop does the same, slower
    _lstat_names = _sig_splice = None
_Touch = tuple[bytes, int, int, int, int, int, int, int]
_touch_captured: Callable[[int, list[_Touch]], list[int]] | None
try:
    from sprite_env._native import touch_captured as _touch_captured
except ImportError:  # each goes through _fix_meta, the same checks one by one
    _touch_captured = None

ReadObject = Callable[[ObjectId], bytes]
_TMP_PREFIX = b".sprite-restore."
_TMP_COUNTER = itertools.count()
_RUN_TOKEN = os.urandom(4).hex().encode()
#: Threads writing files: decompression and writes release the GIL. Renaming over an old
#: file and unlinking one wait on the file system (0.2-0.5 ms each on this VM's ext4, 20 us
#: of it CPU): 8 threads brought that to 0.08-0.12 ms a file, against 0.2-0.45 ms on one.
WRITERS = 8
#: Threads unlinking the files of removed directories (they only unlink: never wait on
#: another task, so a writer emptying a directory can wait for them), and files per task.
UNLINKERS = 8
UNLINK_BATCH = 16
#: Directories of a removed subtree open at once (each emptied, then removed, children
#: first; see ``Restorer._empty_dir``).
REMOVE_DIRS = 256
#: Files at least this big whose content changed are patched in place, piece by piece.
PATCH_MIN = 1 << 20
BATCH_FILES = 32
#: Directories whose metadata waits for their writes at most (each holds a descriptor).
LANDING_DIRS = 256
BATCH_BYTES = 8 << 20
_FILE_TYPE = {
    Kind.FILE: stat.S_IFREG,
    Kind.DIR: stat.S_IFDIR,
    Kind.SYMLINK: stat.S_IFLNK,
    Kind.CHR: stat.S_IFCHR,
    Kind.BLK: stat.S_IFBLK,
    Kind.FIFO: stat.S_IFIFO,
}


@dataclass
class RestoreStats:
    """What a restore did, in entries counted recursively from the two trees, as a preview
    counts them (``snapshot.plan``): a live directory of 50 files that the target lacks
    is 51 removed; the root counts only when more than its mtime differs."""

    created: int = 0
    modified: int = 0  # content or type
    removed: int = 0
    meta: int = 0  # metadata only (owner, mode, mtime, xattrs, hard-link grouping)
    bytes_written: int = 0
    dirs_skipped: int = 0


@dataclass
class RestoreResult:
    stats: RestoreStats
    warnings: list[str] = field(default_factory=list)
    cache_changed: dict[bytes, CachedDir] = field(default_factory=dict)
    cache_removed: list[bytes] = field(default_factory=list)


Progress = Callable[[RestoreStats], None]


class Restorer:
    """One restore; see the module docstring. Use :func:`restore`."""

    def __init__(
        self,
        root: bytes,
        read_tree: ReadTree,
        read_object: ObjectReader | ReadObject,
        *,
        excludes: Excludes | None = None,
        progress: Progress | None = None,
        refresh_cache: bool = True,
        trees: TreeMemo | None = None,
        prefetched: Prefetched | None = None,
        frees: Frees | None = None,
        cached: Mapping[bytes, CachedDir] | None = None,
    ) -> None:
        self.root = root
        #: The files cache as the live capture left it (see :meth:`_refresh_cache`).
        self.cached = cached
        #: Where the inodes this restore removes are held until the caller frees them
        #: (``frees.py``); by default none is held: each is freed when removed.
        self.frees = frees if frees is not None else Frees(limit=0)
        #: What the restore's check read and verified already (nothing is read twice).
        self.prefetched = prefetched or Prefetched(limit=0)
        self.refresh_cache = refresh_cache
        self.read_tree = read_tree
        # Each differing directory's two trees are decoded once: the files-cache refresh
        # reads the target's again, and a caller's preflight may have decoded them all.
        self._trees: TreeMemo = trees if trees is not None else {}
        self.reader = reader_of(read_object)
        #: Per writer thread: the objects its batch read ahead (see :meth:`_run_batch`).
        self._ahead = threading.local()
        self.excludes = excludes or Excludes()
        self.progress = progress
        self.result = RestoreResult(RestoreStats())
        self.stats = self.result.stats
        self._synced: list[_Synced] = []  # directories rewritten
        #: Per path, the inode and ctime a batch of small files left it with, lstat'ed as
        #: soon as the batch's renames were done (see :func:`_left`).
        self._placed: dict[bytes, tuple[int, int]] = {}
        self._root_fd = -1
        self._root_dev = 0
        self._umask = -1  # the process's, read when the run starts
        self._last_progress = 0.0
        self._lock = threading.Lock()  # counters updated by writer threads
        self._writers: ThreadPoolExecutor | None = None
        self._unlinkers: ThreadPoolExecutor | None = None
        self._inflight: set[Future[None]] = set()
        self._open_writes: list[_Writes] = []  # batches of the directories being walked
        # Directories walked whose writes may still be in flight (a descriptor each), and
        # those of them whose metadata waits for those writes (in walk order: children
        # first; each by its landing's descriptor).
        self._landing: list[_Landing] = []
        self._dir_metas: list[_Landing] = []
        #: Files the writers' ``touch_captured`` left (another inode, an error), with the
        #: directory's descriptor and writes: decided by ``_fix_meta`` at the next landing.
        self._touch_left: list[tuple[int, bytes, bytes, TreeEntry, TreeEntry, _Writes]] = []

    def run(self, live_top: ObjectId | None, target_top: ObjectId) -> RestoreResult:
        self._root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._writers = ThreadPoolExecutor(WRITERS, thread_name_prefix="restore-write")
        self._unlinkers = ThreadPoolExecutor(UNLINKERS, thread_name_prefix="restore-unlink")
        try:
            self._root_dev = os.fstat(self._root_fd).st_dev
            self._umask = bulkrestore.process_umask()
            target = top_entry(self.read_tree, target_top)
            live = top_entry(self.read_tree, live_top) if live_top is not None else None
            if live is None or live.subtree != target.subtree:
                self._sync_dir(self._root_fd, b"", live.subtree if live else None, target.subtree)
            # Writeback started while the last writes land: the flush below then has less
            # left to do. Its error, if any, is this restore's too (a syncfs reports a
            # write-back error once per descriptor: the one below could miss it).
            early = self._unlinkers.submit(syncfs, self._root_fd)
            self._land()
            if (
                live is None
                or classify(live, target) is not None
                or (live.subtree != target.subtree)
            ):
                self._apply_meta_fd(self._root_fd, target)
            if live is not None and root_news(live, target):
                self.stats.meta += 1
            written_ns = time.time_ns()  # no entry changes after this
            # One flush for the whole restore, not one per file; on an unlinker (idle now)
            # while the files cache is scanned, which only stats and needs no flush first
            # (one after the other, the medium layer's undo waited 0.26 s for the flush).
            synced = self._unlinkers.submit(syncfs, self._root_fd)
            try:
                if self.refresh_cache:
                    self._refresh_cache(written_ns)
            finally:
                early.result()
                synced.result()
        finally:
            self._writers.shutdown(wait=True, cancel_futures=True)
            self._unlinkers.shutdown(wait=True, cancel_futures=True)
            # a restore that failed part-way: each descriptor once (a directory whose
            # metadata waits may still be landing too)
            for land in {id(x): x for x in self._landing + self._dir_metas}.values():
                os.close(land.fd)
            os.close(self._root_fd)
        self._report(force=True)
        return self.result

    def _report(self, force: bool = False) -> None:
        if self.progress is None:
            return
        now = time.monotonic()
        if force or now - self._last_progress >= 0.1:
            self._last_progress = now
            self.progress(self.stats)

    # -- walk ------------------------------------------------------------------------------

    def _sync_dir(
        self, fd: int, rel: bytes, live: ObjectId | None, target: ObjectId, *, own: bool = False
    ) -> _Landing:
        """Makes the directory open at ``fd`` hold ``target``'s entries. ``own``: the
        descriptor is handed over (closed once the directory's writes landed; else a
        duplicate is kept for them). Returns the directory's landing."""
        try:
            a = read_entries(self.read_tree, live, self._trees)
            b = read_entries(self.read_tree, target, self._trees)
        except BaseException:
            if own:
                os.close(fd)
            raise
        writes = _Writes(self)  # this directory's files being written
        # The writes queued here name the directory by this descriptor: it stays open until
        # they landed. Handed over rather than duplicated where the caller opened it for
        # this (and the directory's deferred metadata uses it too): the walk's thread made
        # two dup() calls a directory, 2,195 in the medium undo.
        land = _Landing(writes, fd if own else os.dup(fd))
        self._landing.append(land)
        self._open_writes.append(writes)
        try:
            names = self._sync_entries(land.fd, rel, a, b, writes)
        finally:
            self._open_writes.pop()
            writes.flush()
        land.synced = _Synced(rel, target, live, names)
        self._synced.append(land.synced)
        return land

    def _left_in(self, fd: int, sy: _Synced) -> Left:
        """How the restore left the names it acted on in ``sy``'s directory (open at
        ``fd``): the small files a batch wrote as that batch left them (``_placed``: the
        earlier the record, the smaller the window it leaves), the others lstat'ed now, as
        the directory's writes landed and its landed subdirectories' metadata was set (a
        subdirectory's own landing comes no later than its parent's, children first)."""
        left: Left = {}
        rest = []
        with self._lock:
            for name in sy.touched:
                at = self._placed.pop(sy.rel + b"/" + name if sy.rel else name, None)
                if at is None:
                    rest.append(name)
                else:
                    left[name] = at
        left.update(_left(fd, rest))
        return left

    def _meta_after_writes(self, land: _Landing, old: TreeEntry | None, new: TreeEntry) -> None:
        """Gives the directory of ``land`` (just synced, captured as ``old``, None if new)
        ``new``'s metadata once every write in it landed. Not at once: waiting for each
        directory's writes before the walk goes on kept the writers idle while it walked,
        one directory at a time (0.9 s of the 2 s the typical undo on the medium layer was
        down: 1,092 directories, a file or two written in each)."""
        land.meta = (old, new)
        self._dir_metas.append(land)
        if len(self._landing) >= LANDING_DIRS:
            self._land()

    def _land(self) -> None:
        """Waits for every write submitted so far, then applies the directories' metadata
        deferred until then (children before their parents, as walked)."""
        done = [x for x in self._landing if x.writes not in self._open_writes]
        self._landing = [x for x in self._landing if x.writes in self._open_writes]
        # Every directory whose metadata waits is done walking, so among ``done``; their
        # descriptors are closed below, whatever happens.
        metas, self._dir_metas = self._dir_metas, []
        try:
            first: Exception | None = None
            for x in done:  # all of them, then the first error (as ``_wait_all``)
                try:
                    x.writes.wait()
                except Exception as err:
                    first = first or err
            if first is not None:
                raise first
            with self._lock:
                left, self._touch_left = self._touch_left, []
            if left:  # what the writers' touches left, before any directory's metadata
                for fd, name, path, was, want, writes in left:
                    self._fix_meta(fd, name, path, was, want, writes)
                for x in done:
                    x.writes.wait()
            for x in metas:
                assert x.meta is not None
                old, new = x.meta
                # its own writes moved its mtime: always set (``touched``)
                _apply_meta_delta(x.fd, stat.S_IFDIR, old, new, touched=True)
            if self.refresh_cache:  # after the metadata: a subdirectory's moves its ctime
                for x in done:
                    if x.synced is not None:
                        x.synced.left = self._left_in(x.fd, x.synced)
        finally:
            for x in done:
                close_dir(x.fd)

    def _sync_entries(
        self,
        fd: int,
        rel: bytes,
        a: Entries,
        b: Entries,
        writes: _Writes,
    ) -> list[bytes]:
        """Makes the directory's entries ``a`` (live) those of ``b``; returns the names it
        acted on (every other entry is left alone)."""
        names = differing(a, b)  # equal entries are left alone, undecoded
        self.stats.dirs_skipped += sum(
            1 for n, raw in a.raw.items() if raw[2] == Kind.DIR and b.raw.get(n) == raw
        )
        touch: list[tuple[bytes, bytes, TreeEntry, TreeEntry]] = []
        for name in names:
            check_name(name)
            old, new = a.get(name), b.get(name)
            path = name if not rel else rel + b"/" + name
            change = classify(old, new)
            if new is None:
                assert old is not None
                # On the writer threads with the directory's writes: an unlink (or the
                # rename over an old file) waits on the file system, 0.2-0.5 ms each on
                # this VM's ext4 against 20 us of CPU, and waits overlap (8 threads: about
                # 0.1 ms a file). The typical undo on the medium layer removes 1,310
                # entries: 0.9 s on the walking thread alone.
                writes.add(functools.partial(self._remove, fd, name, path), 0)
                self.stats.removed += 1 + entries_below(self.read_tree, old)
            elif _patchable(old, new):
                assert old is not None
                assert self._writers is not None
                writes.add(functools.partial(self._patch, fd, name, path, old, new), new.size)
                self.stats.modified += 1
            elif (
                old is None
                or change is Change.MODIFIED
                or (new.kind is not Kind.DIR and old.link != new.link)
            ):
                self._create(fd, name, path, new, writes)
                if old is None:
                    self.stats.created += 1
                elif change is Change.MODIFIED:
                    self.stats.modified += 1
                    # a live directory replaced: its contents went with it (a new
                    # directory's contents are counted as created by its own walk)
                    self.stats.removed += entries_below(self.read_tree, old)
                else:  # only the hard-link grouping differs: same content, re-linked
                    self.stats.meta += 1
            elif new.kind is Kind.DIR:
                if old.payload != new.payload:
                    cfd = self._open_dir(fd, name)
                    land = self._sync_dir(cfd, path, old.subtree, new.subtree, own=True)
                    self._meta_after_writes(land, old, new)
                else:
                    self.stats.dirs_skipped += 1
                    if change is Change.META:  # through its own descriptor: no symlink
                        cfd = self._open_dir(fd, name)
                        try:
                            _apply_meta_delta(cfd, stat.S_IFDIR, old, new, touched=False)
                        finally:
                            close_dir(cfd)
                if change is Change.META:
                    self.stats.meta += 1
            elif change is Change.META:
                assert old is not None
                if _touch_captured is not None and _mtime_only(old, new):
                    touch.append((name, path, old, new))
                else:
                    self._fix_meta(fd, name, path, old, new, writes)
                self.stats.meta += 1
            self._report()
        if touch:
            writes.add(functools.partial(self._touch, fd, touch, writes), 0)
        return names

    def _touch(
        self, fd: int, touch: list[tuple[bytes, bytes, TreeEntry, TreeEntry]], writes: _Writes
    ) -> None:
        """:meth:`_fix_meta` of a directory's files whose only change is their mtime, in
        one native call without the GIL, on a writer thread with the directory's writes
        (``touch_captured``: the same open through the name, the same checks of the inode
        against what the capture saw, one utime). Each it leaves (another inode, an error)
        goes through :meth:`_fix_meta` on the walk's thread, at the directory's landing
        (before its own metadata). The medium step's undo gives 2,552 git objects back
        their mtime (git freshens the objects it would have written): on the walk's
        thread, one by one, they were 0.24 s of a 1.9 s downtime (py-spy, bench_undo,
        load 2-3), and 0.15 s in one native call a directory: four system calls a file."""
        assert _touch_captured is not None
        items = [
            (
                name,
                _FILE_TYPE[old.kind] | old.mode,
                old.uid,
                old.gid,
                old.nlink,
                old.mtime_ns,
                old.size,
                new.mtime_ns,
            )
            for name, _, old, new in touch
        ]
        left = [(fd, *touch[i], writes) for i in _touch_captured(fd, items)]
        if left:
            with self._lock:
                self._touch_left += left

    def _open_dir(self, fd: int, name: bytes) -> int:
        return open_dir(fd, name)

    # -- creating --------------------------------------------------------------------------

    def _tmp_name(self) -> bytes:
        # Unique across the restores of a process (a failed one may leave names behind
        # until its resume removes them) and across processes (a killed one's, its pid
        # reused): O_EXCL must never meet an old one.
        return _TMP_PREFIX + b"%d.%s.%d" % (os.getpid(), _RUN_TOKEN, next(_TMP_COUNTER))

    def _create(self, fd: int, name: bytes, path: bytes, e: TreeEntry, writes: _Writes) -> None:
        if e.kind is Kind.DIR:
            self._create_dir(fd, name, path, e)
            return
        if e.kind is Kind.FILE and not e.link:
            # Reading, decompressing and writing a file's chunks runs on a writer thread.
            writes.place(fd, name, path, e)
            return
        if e.link:
            # The group's first member may still be queued or being written, in this
            # directory or one above it: send every batch, then wait for every write in
            # flight (errors surface where they were submitted).
            for w in self._open_writes:
                w.flush()
            with self._lock:
                inflight = list(self._inflight)
            wait(inflight)
        self._place(fd, name, path, e)

    def _submit(
        self, tasks: list[Callable[[], None]], files: list[TreeEntry], places: list[_Place]
    ) -> Future[None]:
        assert self._writers is not None
        fut = self._writers.submit(self._run_batch, tasks, files, places)
        with self._lock:
            self._inflight.add(fut)
        fut.add_done_callback(self._landed)
        return fut

    def _patch(self, fd: int, name: bytes, path: bytes, old: TreeEntry, new: TreeEntry) -> None:
        """Rewrites only the pieces of a big file that differ, in place.

        The live file's pieces are those of ``old`` (captured just before); a piece of
        ``new`` at the same offset with the same (object, offset, length) is left alone.
        In place is not atomic, but a restore is resumable: an interrupted patch is found
        changed by the resume's capture and patched again. Anything unexpected (another
        link to the inode, a type change, a hole to punch) falls back to a full rewrite.
        """
        plan = changed_ranges(self._pieces_of(old), self._pieces_of(new))
        if plan is None:  # a hole where data was: punching one is not portable
            self._place(fd, name, path, new)
            return
        try:
            out = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except OSError:
            self._place(fd, name, path, new)
            return
        try:
            st = os.fstat(out)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size != old.size:
                os.close(out)
                out = -1
                self._place(fd, name, path, new)
                return
            self._write_pieces(out, plan)
            os.ftruncate(out, new.size)
            apply_meta(
                fd, name, stat.S_IFREG, new.mode, new.uid, new.gid, new.mtime_ns, new.xattrs, fd=out
            )
            crashpoint("restore-entry-written")
        finally:
            if out >= 0:
                os.close(out)

    def _run_batch(
        self, tasks: list[Callable[[], None]], files: list[TreeEntry], places: list[_Place]
    ) -> None:
        """Runs a batch of writes on a writer thread, after one ``read_many`` of every
        object of its ``files`` (whole small files, whose pieces the tree entry holds):
        one catalog query and one ``pread`` per run of neighbours in a pack for the
        batch, instead of one of each per object. A batch that cannot be read whole
        (damage) is written file by file, so the error names the file that needs it.
        ``places``: whole small files of one directory to write (:meth:`_place_many`)."""
        oids = list(
            dict.fromkeys(
                oid
                for e in files
                if not e.indirect
                for oid, _off, _n in decode_chunks(e.payload)
                if oid is not None
            )
        )
        kept = self.prefetched.objects
        ahead = {oid: kept[oid] for oid in oids if oid in kept}
        oids = [oid for oid in oids if oid not in ahead]
        if oids:
            try:
                ahead.update(zip(oids, self.reader.read_many(oids), strict=True))
            except SpriteError:
                ahead = {}
        self._ahead.objects = ahead
        try:
            if places:
                self._place_many(places, ahead)
            _run_all(tasks)
        finally:
            self._ahead.objects = {}

    def _place_many(self, places: list[_Place], ahead: dict[ObjectId, bytes]) -> None:
        """Writes whole small files under temporary names in one native call per
        directory (``bulkrestore.write_into``: create, data, owner, mode, times with the
        GIL released), then renames each over its name as :meth:`_place` does.

        One at a time in Python, a file cost about ten system calls, each giving up the
        GIL and waiting to get it back beside the other writers and the walk; the medium
        layer's undo writes about 1,060 files so. Files whose objects were not read ahead
        (damage: the batch is read file by file) and anything ``write_files`` refuses go
        the Python way, which names the file that fails.
        """
        # by directory (one, usually): each with its temporary name and its data's bytes
        ready: dict[int, list[tuple[_Place, bytes, int]]] = {}
        for p in places:
            pieces = decode_chunks(p[3].payload)
            if all(oid is None or oid in ahead for oid, _o, _n in pieces):
                data = sum(n for oid, _o, n in pieces if oid is not None)
                ready.setdefault(p[0], []).append((p, self._tmp_name(), data))
            else:
                self._place(*p)
        for fd, files in ready.items():
            self._place_in(fd, files, ahead)

    def _place_in(
        self, fd: int, files: list[tuple[_Place, bytes, int]], ahead: dict[ObjectId, bytes]
    ) -> None:
        specs = [
            (fd, tmp, e.mode, e.uid, e.gid, e.mtime_ns, e.payload)
            for (_f, _n, _p, e), tmp, _data in files
        ]
        try:
            written = bulkrestore.write_into(fd, specs, ahead, umask=self._umask)  # type: ignore[arg-type]
            fix = set(written)
        except (OSError, ValueError):
            for _p, tmp, _data in files:  # those before the one that failed
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=fd)
            for p, _tmp, _data in files:
                self._place(*p)
            return
        for k, ((_f, name, path, e), tmp, data) in enumerate(files):
            try:
                if e.xattrs or k in fix:  # xattrs to set, or inherited ones to remove
                    bulkrestore.fix_new_meta(fd, tmp, e)
                self._rename_over(fd, tmp, name, path)
                with self._lock:
                    self.stats.bytes_written += data
                crashpoint("restore-entry-written")
            except BaseException:  # no temporary name is left behind (this one's is gone)
                for _p, left, _data in files[k:]:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(left, dir_fd=fd)
                raise
        if self.refresh_cache:  # how the batch left them, before its directory lands
            placed = _left(fd, [name for (_f, name, _p, _e), _t, _d in files])
            with self._lock:
                for (_f, name, path, _e), _t, _d in files:
                    if name in placed:
                        self._placed[path] = placed[name]

    def _write_pieces(self, out: int, placed: list[tuple[int, Piece]]) -> None:
        """Writes each piece's bytes at its file offset: objects the batch read ahead,
        else read ``read_many`` at a time, about ``BATCH_BYTES`` of pieces each
        (consecutive slices of one object read it once)."""
        ahead: dict[ObjectId, bytes] = getattr(self._ahead, "objects", {})
        kept = self.prefetched.pieces
        window: dict[ObjectId, bytes] = {}
        for k, (at, piece) in enumerate(placed):
            oid = piece[0]
            assert oid is not None
            got = kept.get(piece)
            if got is not None:  # the check kept these bytes: no read
                pwrite_piece(out, got, (oid, 0, piece[2]), at)
                with self._lock:
                    self.stats.bytes_written += piece[2]
                continue
            data = ahead.get(oid)
            if data is None:
                data = self.prefetched.objects.get(oid)
            if data is None:
                data = window.get(oid)
            if data is None:
                window = self._read_window(placed, k, ahead)
                data = window[oid]
            pwrite_piece(out, data, piece, at)
            with self._lock:
                self.stats.bytes_written += piece[2]

    def _read_window(
        self, placed: list[tuple[int, Piece]], k: int, ahead: dict[ObjectId, bytes]
    ) -> dict[ObjectId, bytes]:
        """The objects of ``placed[k:]`` not read ahead, up to about ``BATCH_BYTES`` of
        pieces (at least one), in one ``read_many``."""
        oids: dict[ObjectId, None] = {}
        size = 0
        kept, whole = self.prefetched.pieces, self.prefetched.objects
        for _at, (oid, off, n) in placed[k:]:
            assert oid is not None
            if oid in ahead or oid in oids or oid in whole or (oid, off, n) in kept:
                continue
            if oids and size + n > BATCH_BYTES:
                break
            oids[oid] = None
            size += n
        return dict(zip(oids, self.reader.read_many(list(oids)), strict=True))

    def _pieces_of(self, e: TreeEntry) -> list[Piece]:
        # read_tree: the live side's chunk list may exist only in a hash-only capture
        return decode_chunks(self.read_tree(ObjectId(e.payload)) if e.indirect else e.payload)

    def _landed(self, fut: Future[None]) -> None:
        with self._lock:
            self._inflight.discard(fut)

    def _place(self, fd: int, name: bytes, path: bytes, e: TreeEntry) -> None:
        """Creates the entry under a temporary name, then renames it over ``name``."""
        tmp = self._tmp_name()
        try:
            linked = bool(e.link) and self._link_from(fd, tmp, e.link, e.kind)
            if linked:
                pass  # one more name for the group's inode, metadata and all
            elif e.kind is Kind.FILE:
                self._write_file(fd, tmp, e)
            elif e.kind is Kind.SYMLINK:
                os.symlink(e.target, tmp, dir_fd=fd)
                self._apply_meta_at(fd, tmp, e)
            elif e.kind is Kind.FIFO:
                os.mkfifo(tmp, e.mode, dir_fd=fd)
                self._apply_meta_at(fd, tmp, e)
            else:
                os.mknod(tmp, _FILE_TYPE[e.kind] | e.mode, e.rdev, dir_fd=fd)
                self._apply_meta_at(fd, tmp, e)
            self._rename_over(fd, tmp, name, path)
            if linked:
                # rename() between two names of one inode does nothing and leaves both
                # (POSIX): ``name`` already was this link, so the temporary one goes.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=fd)
            crashpoint("restore-entry-written")
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=fd)
            raise

    def _rename_over(self, fd: int, tmp: bytes, name: bytes, path: bytes) -> None:
        self.frees.hold(fd, name)  # the old inode's eviction waits until after the restore
        try:
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except OSError as err:
            # A directory (or something untracked) is in the way: remove it, then rename.
            if err.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise
            self._remove(fd, name, path)
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)

    def _create_dir(self, fd: int, name: bytes, path: bytes, e: TreeEntry) -> None:
        try:
            os.mkdir(name, 0o700, dir_fd=fd)
        except FileExistsError:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                self._remove(fd, name, path)
                os.mkdir(name, 0o700, dir_fd=fd)
        cfd = self._open_dir(fd, name)
        # Usually a new, empty directory. If an uncaptured one was already there (it was
        # excluded or appeared after the capture), its extra contents are left alone.
        land = self._sync_dir(cfd, path, None, e.subtree, own=True)
        self._meta_after_writes(land, None, e)

    def _write_file(self, fd: int, tmp: bytes, e: TreeEntry) -> None:
        chunks = self._pieces_of(e)
        out = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=fd,
        )
        try:
            data, end = placed(chunks)
            self._write_pieces(out, data)
            os.ftruncate(out, end)
            apply_meta(fd, tmp, stat.S_IFREG, e.mode, e.uid, e.gid, e.mtime_ns, e.xattrs, fd=out)
        finally:
            os.close(out)

    def _link_from(self, fd: int, tmp: bytes, leader: bytes, kind: Kind) -> bool:
        """Hard-links ``tmp`` to the group's first member; False if that is not there."""
        parts = leader.split(b"/")
        dfd = os.dup(self._root_fd)
        try:
            for part in parts[:-1]:
                nfd = open_dir(dfd, part)
                close_dir(dfd)
                dfd = nfd
            st = os.stat(check_name(parts[-1]), dir_fd=dfd, follow_symlinks=False)
            if stat.S_IFMT(st.st_mode) != _FILE_TYPE[kind]:
                return False
            os.link(parts[-1], tmp, src_dir_fd=dfd, dst_dir_fd=fd, follow_symlinks=False)
            return True
        except OSError:
            return False
        finally:
            close_dir(dfd)

    # -- removing --------------------------------------------------------------------------

    def _remove(self, fd: int, name: bytes, path: bytes) -> None:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            if st.st_dev != self._root_dev:
                self.result.warnings.append(f"{path!r}: mount point left in place")
                return
            cfd = open_dir_at(fd, name)
            try:
                kept = self._empty_dir(cfd, path)
            except BaseException:
                os.close(cfd)
                raise
            self._close_emptied(fd, name, cfd, kept)
            self.result.cache_removed.append(path)
        else:
            self.frees.hold(fd, name)
            os.unlink(name, dir_fd=fd)
            crashpoint("restore-entry-removed")

    def _close_emptied(self, pfd: int, name: bytes, cfd: int, kept: bool) -> None:
        """Removes the emptied directory ``name`` of the directory open at ``pfd`` unless
        something in it was ``kept``, and lets go of ``cfd``, its own descriptor (closed
        whatever happens). Removed while open, its eviction waits for that descriptor's
        close, which ``frees`` holds until the restore committed."""
        try:
            if not kept:
                os.rmdir(name, dir_fd=pfd)
        except BaseException:
            os.close(cfd)
            raise
        if kept:
            os.close(cfd)
        else:
            self.frees.keep(cfd)

    def _empty_dir(self, fd: int, rel: bytes) -> bool:
        """Removes a directory's contents, its whole subtree at once; True if something had
        to be kept (an excluded entry, a mount point, anywhere below).

        The subtree is walked first (a descriptor per directory, ``REMOVE_DIRS`` open at
        most), its files unlinked on the unlinker threads ``UNLINK_BATCH`` at a time, all
        directories' batches in flight together, then the emptied directories removed,
        children first. Each unlink waits on the file system (see :meth:`_sync_entries`);
        one directory at a time, each waiting for its own unlinks before the next was
        walked, the 1,300 entries of the packages the typical step installs were one
        writer's serial chain of 0.54 s (py-spy, small layer, load 1), most of the undo's
        wait for its writes."""
        assert self._unlinkers is not None
        unlinkers = self._unlinkers
        futures: list[Future[None]] = []
        # Walked directories, children before their parents: (parent fd, name, own fd,
        # kept); a parent's descriptor stays open until its own entry is done.
        walked: list[tuple[int, bytes, int, bool]] = []

        def drain() -> None:
            """Waits for the unlinks in flight, then removes the walked directories."""
            nodes = walked[:]
            walked.clear()
            done = 0
            try:
                _wait_all(futures)
                for pfd, name, cfd, kept in nodes:
                    done += 1
                    self._close_emptied(pfd, name, cfd, kept)
            finally:
                for _pfd, _name, cfd, _kept in nodes[done:]:
                    os.close(cfd)

        def walk(dfd: int, drel: bytes) -> bool:
            kept = False
            with os.scandir(dfd) as it:
                children = [os.fsencode(d.name) for d in it]
            files: list[bytes] = []
            for name in children:
                path = drel + b"/" + name
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if self.excludes.match(path, st):
                    kept = True
                    continue
                if not stat.S_ISDIR(st.st_mode):
                    files.append(name)
                    continue
                if st.st_dev != self._root_dev:
                    self.result.warnings.append(f"{path!r}: mount point left in place")
                    kept = True
                    continue
                cfd = open_dir_at(dfd, name)
                try:
                    child_kept = walk(cfd, path)
                except BaseException:
                    os.close(cfd)
                    raise
                walked.append((dfd, name, cfd, child_kept))
                self.result.cache_removed.append(path)
                kept = kept or child_kept
                if len(walked) >= REMOVE_DIRS:  # open: these, and the walk's own ancestors
                    drain()
            futures.extend(
                unlinkers.submit(_unlink_all, dfd, files[i : i + UNLINK_BATCH], self.frees)
                for i in range(0, len(files), UNLINK_BATCH)
            )
            return kept

        try:
            kept_top = walk(fd, rel)
        finally:
            drain()
        return kept_top

    # -- metadata --------------------------------------------------------------------------

    def _fix_meta(
        self, fd: int, name: bytes, path: bytes, old: TreeEntry, new: TreeEntry, writes: _Writes
    ) -> None:
        """Gives an existing entry ``new``'s metadata, only through a descriptor of the
        very inode the live capture saw as ``old``.

        By name, a chmod or utime follows whatever is there now: a hard link to a file
        outside the layer planted meanwhile got the checkpoint's mode and mtime (issue 15,
        15 of 15 audit rounds). Anything else than the captured inode (another type, link
        count, size, owner, mode or mtime) is not touched: the entry is written anew from
        the checkpoint and renamed over it, so an outside file keeps its own.
        """
        if new.kind is Kind.SYMLINK:  # no mode; owner and times of the link itself
            self._apply_meta_at(fd, name, new)
            return
        device = new.kind in (Kind.CHR, Kind.BLK)
        # A device is never opened for real (opening one can act); O_PATH reaches its inode.
        flags = (os.O_PATH if device else os.O_RDONLY | os.O_NONBLOCK) | os.O_NOFOLLOW
        try:
            mfd = open_at(fd, name, flags)
        except OSError:
            mfd = -1
        if mfd >= 0:
            try:
                if _is_captured(os.fstat(mfd), old):
                    if device:
                        apply_meta_proc(mfd, new.mode, new.uid, new.gid, new.mtime_ns, new.xattrs)
                    else:
                        _apply_meta_delta(mfd, _FILE_TYPE[new.kind], old, new, touched=False)
                    return
            finally:
                close_fd(mfd)
        if new.kind is Kind.FILE and not new.link:
            writes.place(fd, name, path, new)
        else:
            self._place(fd, name, path, new)

    def _apply_meta_at(self, fd: int, name: bytes, e: TreeEntry) -> None:
        apply_meta(fd, name, _FILE_TYPE[e.kind], e.mode, e.uid, e.gid, e.mtime_ns, e.xattrs)

    def _apply_meta_fd(self, dfd: int, e: TreeEntry) -> None:
        apply_meta(dfd, b".", stat.S_IFDIR, e.mode, e.uid, e.gid, e.mtime_ns, e.xattrs, fd=dfd)

    # -- files cache -----------------------------------------------------------------------

    def _refresh_cache(self, written_ns: int) -> None:
        """Records what was just written (until ``written_ns``), so the next capture reads
        none of it again."""
        # Let the restore's own timestamps age past the racy window (else their signatures
        # are poisoned and the next capture reads them all again); the syncfs already took
        # part of the 50 ms, and an undo restore is down for all of them.
        time.sleep(max(0, written_ns + dircache.RACY_NS - time.time_ns()) / 1e9)
        now = time.time_ns()

        def scan(part: list[_Synced]) -> list[tuple[bytes, CachedDir]]:
            out = []
            with _DirStack(self._root_fd) as dirs:
                for sy in part:
                    rel, tree = sy.rel, sy.target
                    try:
                        fd = dirs.open(rel)
                    except OSError:
                        continue
                    names = read_entries(self.read_tree, tree, self._trees)
                    row = rows.get(rel)
                    left = sy.left or {}
                    blob = None
                    if row is not None and row.tree == sy.live:
                        blob = _spliced(fd, row.stat, sy.touched, names, now, left)
                    if blob is None:  # no live row to keep: every name stat'ed and checked
                        blob = _spliced(fd, b"", list(names), names, now, left)
                    if blob is None:
                        sigs: dict[bytes, Sig] = {}
                        for name in names:
                            try:
                                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                            except FileNotFoundError:
                                sigs[name] = dircache.vanished()  # see _spliced
                                continue
                            sigs[name] = _signed(st, names.raw[name], now, left.get(name))
                        blob = dircache.encode_sigs(sigs)
                    out.append((rel, CachedDir(tree, blob)))
            return out

        # Walk order (each directory right after its parent), in runs of BATCH_FILES
        # directories on the writer threads, idle by now: a run opens each of its
        # directories once, through its parent's descriptor (``_DirStack``), where opening
        # each from the root cost one open per path component (the medium layer's typical
        # undo: 1,098 directories, 7,701 opens from the root, 1,308 in walk order; the
        # refresh's time did not move measurably, its scans are most of it). On the
        # walking thread alone the scan took 0.29 s of the downtime.
        #
        # A directory whose row in the files cache is the live capture's (its tree the live
        # side's) keeps that row's signatures for every entry the restore left alone (they
        # describe those very entries, equal in both trees): only the names it acted on
        # are stat'ed and spliced in (``_spliced``). The medium undo's 1,098 directories
        # hold 60k entries, of which it touches about 5k: the full scans (scan_dir with the
        # GIL held for small directories, then each blob decoded to check its names) were
        # most of the refresh: in process, load 3-6, 0.63-0.86 s scanning whole, 0.11-0.26
        # s spliced (the 50 ms racy wait included). An entry changed by someone else since
        # the capture keeps a signature that no longer matches it: the next capture reads
        # it again (a missed change costs a read, never a wrong tree), as when its own row
        # is reused.
        assert self._writers is not None
        synced = sorted(self._synced, key=lambda s: s.rel.split(b"/") if s.rel else [])
        rows: Mapping[bytes, CachedDir] = self.cached if self.cached is not None else {}
        if isinstance(rows, dircache.CacheView):  # read on this thread, in a few queries
            rows.prefetch(sy.rel for sy in synced if sy.live is not None)
        parts = [synced[i : i + BATCH_FILES] for i in range(0, len(synced), BATCH_FILES)]
        for done in self._writers.map(scan, parts):
            self.result.cache_changed.update(done)


class _DirStack:
    """Opens directories below a root in walk order (sorted by path components, so that
    each comes after its parent), each once: the descriptors of the current path's
    ancestors stay open, and a directory is opened through its parent's. Every component
    is opened with ``open_dir`` (O_NOFOLLOW: a symlink is never followed). Descriptors are
    the stack's: :meth:`open`'s result is valid until the next call, all closed on exit."""

    def __init__(self, root_fd: int) -> None:
        self._root_fd = root_fd
        self._path: list[bytes] = []  # components of the deepest directory open
        self._fds: list[int] = []  # their descriptors, one per component

    def __enter__(self) -> _DirStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pop(0)

    def _pop(self, depth: int) -> None:
        while len(self._fds) > depth:
            self._path.pop()
            close_dir(self._fds.pop())

    def open(self, rel: bytes) -> int:
        """The descriptor of directory ``rel`` (b"": the root's)."""
        parts = rel.split(b"/") if rel else []
        common = 0
        for have, want in zip(self._path, parts, strict=False):
            if have != want:
                break
            common += 1
        self._pop(common)
        for part in parts[common:]:
            fd = open_dir(self._fds[-1] if self._fds else self._root_fd, part)
            self._path.append(part)
            self._fds.append(fd)
        return self._fds[-1] if self._fds else self._root_fd


@dataclass(slots=True)
class _Synced:
    """A directory the walk rewrote: where, its two trees, the names it acted on, and
    (``left``, see :func:`_left`) how it left them."""

    rel: bytes
    target: ObjectId
    live: ObjectId | None
    touched: list[bytes]
    left: Left | None = None


#: Per name, the inode and ctime a restore left an entry with (:func:`_left`).
Left = dict[bytes, tuple[int, int]]


def _left(fd: int, names: list[bytes]) -> Left:
    """The inode and ctime of each of ``names`` in the directory open at ``fd`` (none for
    a name not there), lstat'ed once the restore is done with them (``Restorer._left_in``).

    Why: the files-cache refresh comes later (after the rest of the restore and the racy
    window's wait), and a row signed then vouches for the file as it is then. A change
    another process made meanwhile that leaves the restored entry's size, mode, owner and
    mtime (an xattr set, a same-size write with the mtime set back) moved only the ctime,
    which no process can set back: the refresh poisons a name whose inode or ctime is no
    longer what this recorded. What stays unseen: such a change between the restore's
    last action on the entry and this lstat (as with git's index, written after a
    checkout). For the small files a native batch writes (most of an undo's: the medium
    layer's, about 1,060) the batch calls this as soon as its renames are done
    (``Restorer._placed``), a window of the batch's last few system calls; for the rest it
    ends when the directory's writes have landed: directories land in groups of up to
    ``LANDING_DIRS`` (the medium layer's undo, 1,098 directories: 5 groups in 0.6-0.9 s).
    Before, it reached to the refresh, after the rest of the restore and the racy wait.
    Each name is lstat'ed once, by its batch or at its landing. A later action of the
    restore itself on the inode (a hard link to it, a name of it removed) also moves the
    ctime: the next capture then reads the file again, which costs a read, never a wrong
    tree. One native call for the directory (the GIL kept), a stat loop without it."""
    look = sorted(names)
    out: Left = {}
    if _lstat_names is not None:
        try:
            fields = _lstat_names(fd, look)
        except (OSError, ValueError):
            return out  # nothing recorded: the refresh checks as before
        stats = [None if f is None else os.stat_result(f) for f in fields]
    else:
        stats = []
        for name in look:
            try:
                stats.append(os.stat(name, dir_fd=fd, follow_symlinks=False))
            except OSError:
                stats.append(None)
    for name, st in zip(look, stats, strict=True):
        if st is not None:
            out[name] = (st.st_ino, st.st_ctime_ns)
    return out


def _spliced(
    fd: int, old: bytes, touched: list[bytes], names: Entries, now: int, left: Left
) -> bytes | None:
    """The signature blob of the directory open at ``fd``, holding ``names``: ``old`` (the
    live capture's row) with the rows of ``touched`` (the names the restore acted on)
    stat'ed anew, or left out where the target has none; with ``old`` empty and every name
    touched, the whole directory's (no live row to keep). A name the target has that is
    gone (another process removed it since the restore wrote it) keeps a row that matches
    nothing (``dircache.vanished``): left out, the row and its tree agreed with a listing
    without the name, and the next capture kept the tree that names it (the refresh's
    oracle test found it: a file removed before the refresh stayed in the checkpoint).
    Each is signed by :func:`_signed` (``left``: as the restore left them). None if the
    native helpers are missing or ``old`` is malformed (the caller's stat loop does the
    same).

    A poisoned row of ``old`` (a file the live capture found within the racy window) is
    carried over poisoned, though the window has passed by now: signed anew, it would
    vouch for the bytes the capture read, whatever changed since (in the same clock tick,
    leaving no trace in the timestamps, or before this stat, which would sign the change),
    and the next capture would keep the old entry. It costs that capture a read of the
    file (``test_a_file_changed_behind_a_racy_row_during_an_undo_is_read_again``)."""
    if _lstat_names is None or _sig_splice is None:
        return None
    look = sorted(n for n in touched if n in names)
    gone = sorted(n for n in touched if n not in names)
    try:
        stats = _lstat_names(fd, look)
    except OSError:
        return None
    sigs: dict[bytes, Sig] = {}
    for name, fields in zip(look, stats, strict=True):
        if fields is None:
            sigs[name] = dircache.vanished()
        else:
            sigs[name] = _signed(os.stat_result(fields), names.raw[name], now, left.get(name))
    try:
        return _sig_splice(old, dircache.encode_sigs(sigs), sorted(gone))
    except ValueError:
        return None


#: Kinds whose ``st_size`` a tree entry records (a directory's is the file system's).
_SIZED = (Kind.FILE, Kind.SYMLINK)


def _signed(st: os.stat_result, raw: bytes, now: int, left: tuple[int, int] | None) -> Sig:
    """The files-cache signature of ``st``, the entry the restore left as ``raw`` (encoded;
    or found so and left alone), if it still has that entry's type, size, mode, owner and
    mtime, and (``left``, recorded by :func:`_left` for a name the restore acted on) the
    inode and ctime the restore left it with; else a poisoned one. Signed, a row vouches
    that the file holds the entry's bytes: a file another process wrote, truncated,
    chmod'ed or gave an xattr while the restore ran (it stops only the services) differs
    in one of them, and must be read by the next capture. Signed as it is now, its new
    timestamps matched the row and the next capture kept the entry: the change was in no
    checkpoint until the file changed again (tests change a restored file 200 ms before
    this refresh: an append, a chmod, an xattr, a same-size write with the mtime set
    back)."""
    kind, mode, uid, gid, mtime, size = entry_meta(raw)
    if (
        (left is not None and left != (st.st_ino, st.st_ctime_ns))
        or stat.S_IFMT(st.st_mode) != _FILE_TYPE[Kind(kind)]
        or (kind in _SIZED and st.st_size != size)
        or (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns)
        != (mode, uid, gid, mtime)
    ):
        return dircache.poisoned(st)
    return sig_of(st, now)


def _apply_meta_delta(
    fd: int, st_mode: int, old: TreeEntry | None, new: TreeEntry, *, touched: bool
) -> None:
    """Gives the inode open at ``fd``, captured as ``old`` (None: unknown), ``new``'s
    metadata, setting only what differs from ``old``; ``touched``: the restore changed the
    inode since (a directory it wrote into: its mtime moved).

    The typical step leaves 2,552 git objects with only a newer mtime (git freshens the
    objects it would have written) and 1,098 written directories with only theirs:
    ``apply_meta`` made 4 calls each (chown, listxattr, chmod, utime) on the walk's thread;
    one utime does it (11k system calls fewer; the thread's wall time in them did not move,
    0.49 -> 0.48 s under cProfile: it waits as long for the GIL, which 8 busy writers
    hold, at the calls that remain). A new owner
    clears setuid, setgid and ``security.capability``, so then everything is set, in
    ``apply_meta``'s order. What the capture saw is trusted as the diff trusts it: an
    entry equal in both trees is not looked at at all."""
    if old is None or (old.uid, old.gid) != (new.uid, new.gid):
        apply_meta(fd, b".", st_mode, new.mode, new.uid, new.gid, new.mtime_ns, new.xattrs, fd=fd)
        return
    if old.xattrs != new.xattrs:
        set_xattrs(fd, new.xattrs)
    if old.mode != new.mode:
        os.fchmod(fd, new.mode)
    if touched or old.mtime_ns != new.mtime_ns:
        set_mtime(fd, new.mtime_ns)


def _mtime_only(old: TreeEntry, new: TreeEntry) -> bool:
    """A plain file (one link group of its own, as captured and as wanted) whose metadata
    differs in its mtime alone: :meth:`Restorer._touch` sets it back."""
    return (
        old.kind is Kind.FILE
        and new.kind is Kind.FILE
        and not old.link
        and not new.link
        and (old.mode, old.uid, old.gid, old.xattrs) == (new.mode, new.uid, new.gid, new.xattrs)
    )


def _is_captured(st: os.stat_result, e: TreeEntry) -> bool:
    """Whether ``st`` is the inode a capture recorded as ``e`` (as far as stat can tell)."""
    return (
        stat.S_IFMT(st.st_mode) == _FILE_TYPE[e.kind]
        and stat.S_IMODE(st.st_mode) == e.mode
        and (st.st_uid, st.st_gid, st.st_nlink, st.st_mtime_ns)
        == (e.uid, e.gid, e.nlink, e.mtime_ns)
        and (e.kind is not Kind.FILE or st.st_size == e.size)
    )


def _patchable(old: TreeEntry | None, new: TreeEntry | None) -> bool:
    """A big file whose content changed, in one inode before and after: patch in place."""
    return (
        old is not None
        and new is not None
        and old.kind is Kind.FILE
        and new.kind is Kind.FILE
        and not old.link
        and not new.link
        and old.nlink == 1
        and new.nlink == 1
        and min(old.size, new.size) >= PATCH_MIN
        and not old.same_content(new)
    )


def _unlink_all(fd: int, names: list[bytes], frees: Frees) -> None:
    """Unlinks non-directories in the directory open at ``fd`` (one gone already is fine),
    each held in ``frees`` first."""
    for name in names:
        frees.hold(fd, name)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=fd)
        crashpoint("restore-entry-removed")


def _run_all(tasks: list[Callable[[], None]]) -> None:
    for task in tasks:
        task()


#: A whole file to write: (directory descriptor, name, path from the root, its entry).
_Place = tuple[int, bytes, bytes, TreeEntry]


@dataclass(slots=True, eq=False)
class _Landing:
    """A directory walked, until its writes landed: its descriptor (the writes name it),
    and the metadata (captured, wanted) to give it then, if any."""

    writes: _Writes
    fd: int
    meta: tuple[TreeEntry | None, TreeEntry] | None = None
    synced: _Synced | None = None


class _Writes:
    """One directory's file writes, handed to the writer threads in batches.

    One task per small file cost more in futures and wake-ups (the GIL held) than the
    write itself: measured, ``submit`` and ``notify`` were the top GIL holders of a restore
    of 31k files. Batches of ``BATCH_FILES`` files or ``BATCH_BYTES`` bytes.
    """

    def __init__(self, restorer: Restorer) -> None:
        self._r = restorer
        self._tasks: list[Callable[[], None]] = []
        self._places: list[_Place] = []  # whole small files, written in one native call
        self._files: list[TreeEntry] = []  # whole files to read ahead, all at once
        self._bytes = 0
        self._futures: list[Future[None]] = []

    def add(self, task: Callable[[], None], size: int, whole: TreeEntry | None = None) -> None:
        """Queues ``task``; ``whole``: the file it writes whole (its objects are read
        with the batch's), None for a patch (which reads only the ranges that changed)."""
        self._tasks.append(task)
        if whole is not None and size <= BATCH_BYTES:
            self._files.append(whole)
        self._bytes += size
        self._flush_full()

    def place(self, fd: int, name: bytes, path: bytes, e: TreeEntry) -> None:
        """Queues writing the file ``e`` whole as ``name`` (a plain file, no hard link):
        with the batch's other small ones in one native call where it is built."""
        if e.indirect or e.size > BATCH_BYTES or not bulkrestore.available():
            self.add(functools.partial(self._r._place, fd, name, path, e), e.size, e)
            return
        self._places.append((fd, name, path, e))
        self._files.append(e)
        self._bytes += e.size
        self._flush_full()

    def _flush_full(self) -> None:
        if len(self._tasks) + len(self._places) >= BATCH_FILES or self._bytes >= BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        if self._tasks or self._places:
            self._futures.append(self._r._submit(self._tasks, self._files, self._places))
            self._tasks, self._places, self._files, self._bytes = [], [], [], 0

    def wait(self) -> None:
        self.flush()
        _wait_all(self._futures)


def _wait_all(futures: list[Future[None]]) -> None:
    """Waits for every future, then raises the first error (after all have finished)."""
    first: BaseException | None = None
    for f in futures:
        try:
            f.result()
        except Exception as e:
            first = first or e
    futures.clear()
    if first is not None:
        raise first


def restore(
    root: str | bytes,
    read_tree: ReadTree,
    read_object: ObjectReader | ReadObject,
    live_top: ObjectId | None,
    target_top: ObjectId,
    *,
    excludes: Excludes | None = None,
    progress: Progress | None = None,
    refresh_cache: bool = True,
    trees: TreeMemo | None = None,
    bulk: bool = True,
    prefetched: Prefetched | None = None,
    frees: Frees | None = None,
    cached: Mapping[bytes, CachedDir] | None = None,
) -> RestoreResult:
    """Makes the tree at ``root`` equal to ``target_top``; see the module docstring.

    Into an empty directory (``live_top`` None, no files-cache rows wanted: an export) it
    is a bulk restore instead (``bulkrestore.py``: no diff, files written in batches by
    native code), unless ``bulk`` is false.

    Args:
        root: the live tree.
        read_tree: reads tree objects (of both ``live_top`` and ``target_top``).
        read_object: reads data and chunk-list objects of the target: an
            :class:`~sprite_env.store.ports.ObjectReader` (the store: batches read with
            ``read_many``), or a callable (read one object at a time).
        live_top: the top tree of a capture of ``root`` taken just before (None: compare
            against nothing, i.e. restore into an empty directory).
        target_top: the checkpoint's top tree.
        excludes: what captures leave out; never removed here either.
        progress: called with the counters, at most every 0.1 s.
        refresh_cache: compute files-cache rows for what was written (skip for an export).
        trees: trees already decoded (a preflight's), by id; those decoded here are added.
        bulk: take the bulk path where it applies (False: the oracle of its tests).
        prefetched: bytes the restore's check read and verified (``patch.Prefetched``).
        frees: holds the inodes the restore removes, for the caller to free once it
            committed (``frees.py``: their evictions are most of what a removal costs);
            None: each is freed as it is removed.
        cached: the files cache as the capture of ``live_top`` left it (a
            ``dircache.CacheView``: only the rows needed are read); a rewritten directory
            whose row holds its live tree gets its new row by stat'ing only the entries
            the restore acted on. None: each rewritten directory is scanned whole.

    Returns:
        Counters, warnings, and the files-cache rows to write.
    """
    broot = os.fsencode(root)
    if bulk and live_top is None and not refresh_cache and bulkrestore.available():
        with os.scandir(broot) as it:
            empty = next(it, None) is None
        if empty:
            result = RestoreResult(RestoreStats())
            target = top_entry(read_tree, target_top)
            bulkrestore.restore_into_empty(broot, read_tree, read_object, target, result, progress)
            return result
    return Restorer(
        broot,
        read_tree,
        read_object,
        excludes=excludes,
        progress=progress,
        refresh_cache=refresh_cache,
        trees=trees,
        prefetched=prefetched,
        frees=frees,
        cached=cached,
    ).run(live_top, target_top)
