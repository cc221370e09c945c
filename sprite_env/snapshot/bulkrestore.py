"""Bulk restore: a whole checkpoint written into an empty directory (an export).

With nothing on the other side to compare with, the diff walk of ``restore.py`` is all
overhead: it created each file under a temporary name and renamed it, and paid a future,
a lookup and ~10 system calls from Python per file, on four writer threads that spent
more time waiting for the GIL than in the kernel (profile of the medium layer's export,
110k files: the walk's thread busy all of the 25 s, 44% of it reading trees one by one;
the writers ~60% in GIL waits). Here, in order:

1. **Trees**, level by level, ``TREE_BATCH`` at a time with one ``read_many`` each (one
   catalog query and a few ``pread`` per batch, not one of each per directory).
2. **The walk**, depth first in name order (the order a capture stores files, so packs
   are read front to back): each directory is created 0700 (its own mode comes last) and
   opened; its symlinks, FIFOs and devices are made at once; its regular files are queued
   in batches of at most ``BATCH_FILES`` files or ``BATCH_BYTES`` bytes.
3. **Data**, on ``WORKERS`` threads: a batch is one ``read_many`` of every object of its
   files, then one native ``write_files`` call that creates, writes (holes skipped, big
   files preallocated), chowns, chmods and stamps each file with the GIL released. A file
   whose chunk list has its own object (more than ``tree.INLINE_CHUNKS`` chunks: big
   files) is written from Python, ``BATCH_BYTES`` of pieces at a time.
4. **Hard links** after the data they name (the group's first member must exist; if it
   cannot be linked, the member is written in full, as ``restore.py`` does).
5. **Directory metadata** once nothing more is written in a directory: each directory
   holds a count of what may still change it (the walk, its queued batches, its
   subdirectories, its deferred links), and the one that drops it to zero applies the
   metadata and lets go of the descriptor; so mtimes stick, children before parents,
   the root last.

Safety is ``restore.py``'s: every name is one checked component created relative to a
directory descriptor opened with ``O_NOFOLLOW``; files are created with ``O_EXCL``, so
nothing already there (or planted meanwhile) is followed or overwritten. The caller
checks that ``root`` is empty; :func:`restore.restore` takes this path only then.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from sprite_env.errors import SnapshotError, SpriteError
from sprite_env.ids import ObjectId
from sprite_env.snapshot.fsmeta import (
    apply_meta,
    check_name,
    open_dir,
    open_dir_at,
    pwrite_piece,
    syncfs,
)
from sprite_env.snapshot.tree import Kind, Piece, TreeEntry, decode_chunks, decode_tree, placed
from sprite_env.store.ports import ObjectReader, reader_of

if TYPE_CHECKING:
    from collections.abc import Callable

    from sprite_env.snapshot.diff import ReadTree
    from sprite_env.snapshot.restore import Progress, RestoreResult

_Spec = tuple[int, bytes, int, int, int, int, bytes]
_write_files: Callable[..., list[int]] | None
try:
    from sprite_env._native import write_files as _write_files
except ImportError:  # built without it: restore.py's path does the same, slower
    _write_files = None

#: Trees read with one ``read_many``.
TREE_BATCH = 512
#: Writer threads: the data phase is native code and zstd with the GIL released, one
#: thread per core of the 2-core VM; the walk's thread is the third. Both read and decode
#: at once, but only one at a time creates files in a directory (the batch holds the
#: directory's lock): creates in one directory serialize on its inode lock anyway, and
#: contend for it (20k files of 3 KB created by one thread: 0.65 s; by two in one
#: directory: 1.15 s; by two in a directory each: 0.46 s, bench VM, ext4). The medium
#: bench layer has 29% of its files in two directories (21k and 11k files).
WORKERS = 2
#: A batch of small files: at most this many files, bytes of pieces, directories.
BATCH_FILES = 256
BATCH_BYTES = 8 << 20
BATCH_DIRS = 32
#: Batches queued or being written at once (each holds its directories' descriptors).
INFLIGHT = 6
#: Directories whose hard links wait for the data, at most (each holds a descriptor):
#: beyond this the walk waits for the data written so far and makes them.
LINK_DIRS = 256

_FILE_TYPE = {
    Kind.SYMLINK: stat.S_IFLNK,
    Kind.CHR: stat.S_IFCHR,
    Kind.BLK: stat.S_IFBLK,
    Kind.FIFO: stat.S_IFIFO,
    Kind.FILE: stat.S_IFREG,
}


def available() -> bool:
    """Whether the native writer is built (else :func:`restore.restore` does it all)."""
    return _write_files is not None


class _Dir:
    """A directory being filled: its descriptor, what may still change it, and the lock
    a batch holds while it creates files in it (``seq``: the order locks are taken in)."""

    __slots__ = ("entry", "fd", "lock", "parent", "refs", "seq")

    def __init__(self, fd: int, entry: TreeEntry, parent: _Dir | None, seq: int) -> None:
        self.fd = fd
        self.entry = entry
        self.parent = parent
        self.refs = 1  # the walk's
        self.lock = threading.Lock()
        self.seq = seq


class _Batch:
    """Files written together: their directories (by identity) and objects."""

    __slots__ = ("bytes", "data", "dirs", "files", "oids")

    def __init__(self) -> None:
        self.files: list[tuple[_Dir, TreeEntry]] = []
        self.dirs: dict[int, _Dir] = {}
        self.oids: dict[ObjectId, None] = {}
        self.bytes = 0  # the files' sizes
        self.data = 0  # of them, bytes of data (not holes)


class BulkRestorer:
    """One bulk restore; see the module docstring. Use :func:`restore_into_empty`."""

    def __init__(
        self,
        root: bytes,
        read_tree: ReadTree,
        read_object: ObjectReader | Callable[[ObjectId], bytes],
        result: RestoreResult,
        progress: Progress | None,
    ) -> None:
        self.root = root
        self.read_tree = read_tree
        self.trees_reader = reader_of(read_tree)
        self.reader = reader_of(read_object)
        self.result = result
        self.stats = result.stats
        self.progress = progress
        self._trees: dict[ObjectId, list[TreeEntry]] = {}
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._inflight: list[Future[None]] = []
        self._slots = threading.Semaphore(INFLIGHT)
        self._batch = _Batch()
        self._dirs = 0  # made so far: the next one's seq
        self._links: list[tuple[_Dir, bytes, TreeEntry]] = []
        self._link_dirs: set[int] = set()
        self._last_progress = 0.0
        self._skips: dict[str, object] = {}

    # -- the whole run ---------------------------------------------------------------------

    def run(self, target: TreeEntry) -> None:
        self._read_trees(target.subtree)
        root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self._skips = _no_ops(root_fd)
            top = _Dir(os.dup(root_fd), target, None, 0)  # closed once its metadata is set
            self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="restore-bulk")
            try:
                try:
                    self._walk(top)
                    self._flush()
                    self._drain()
                    self._make_links()
                finally:
                    self._pool.shutdown(wait=True, cancel_futures=True)
            except BaseException:
                self._close_all(top)
                raise
            syncfs(root_fd)  # one flush for the whole restore, as restore.py does
        finally:
            os.close(root_fd)
        self._report(force=True)

    def _close_all(self, top: _Dir) -> None:
        """After a failure: closes every descriptor still held (no metadata applied)."""
        seen: set[int] = set()
        for d in [top, *(d for d, _n, _e in self._links)]:
            while d is not None and id(d) not in seen:
                seen.add(id(d))
                if d.fd >= 0:
                    os.close(d.fd)
                    d.fd = -1
                d = d.parent  # type: ignore[assignment]

    def _report(self, force: bool = False) -> None:
        if self.progress is None:
            return
        now = time.monotonic()
        if force or now - self._last_progress >= 0.1:
            self._last_progress = now
            self.progress(self.stats)

    # -- 1. trees --------------------------------------------------------------------------

    def _read_trees(self, top: ObjectId) -> None:
        level = [top]
        while level:
            ids = list(dict.fromkeys(t for t in level if t not in self._trees))
            nxt: list[ObjectId] = []
            for i in range(0, len(ids), TREE_BATCH):
                part = ids[i : i + TREE_BATCH]
                for tid, data in zip(part, self.trees_reader.read_many(part), strict=True):
                    entries = decode_tree(data)
                    self._trees[tid] = entries
                    nxt.extend(e.subtree for e in entries if e.kind is Kind.DIR)
            level = nxt

    # -- 2. the walk -----------------------------------------------------------------------

    def _walk(self, top: _Dir) -> None:
        # Depth first, names sorted, without recursion: (directory, its path, its entries,
        # the index of the next one).
        stack: list[tuple[_Dir, bytes, list[TreeEntry], int]] = [
            (top, b"", self._trees[top.entry.subtree], 0)
        ]
        try:
            while stack:
                d, rel, entries, i = stack.pop()
                if i == len(entries):
                    self._release(d)  # the walk's reference
                    continue
                stack.append((d, rel, entries, i + 1))
                e = entries[i]
                name = check_name(e.name)
                path = name if not rel else rel + b"/" + name
                self.stats.created += 1
                if e.kind is Kind.DIR:
                    os.mkdir(name, 0o700, dir_fd=d.fd)
                    self._dirs += 1
                    child = _Dir(open_dir_at(d.fd, name), e, d, self._dirs)
                    with self._lock:
                        d.refs += 1  # released by the child's own metadata
                    stack.append((child, path, self._trees[e.subtree], 0))
                elif e.link:
                    self._defer_link(d, path, e)
                elif e.kind is Kind.FILE:
                    self._queue_file(d, e)
                else:
                    self._make_special(d.fd, name, e)
                self._report()
        except BaseException:
            for d, _rel, _entries, _i in stack:  # let go of the walk's descriptors
                if d.fd >= 0 and d.parent is not None:
                    os.close(d.fd)
                    d.fd = -1
            raise

    def _make_special(self, dfd: int, name: bytes, e: TreeEntry) -> None:
        if e.kind is Kind.SYMLINK:
            os.symlink(e.target, name, dir_fd=dfd)
        elif e.kind is Kind.FIFO:
            os.mkfifo(name, e.mode, dir_fd=dfd)
        else:
            os.mknod(name, _FILE_TYPE[e.kind] | e.mode, e.rdev, dir_fd=dfd)
        apply_meta(dfd, name, _FILE_TYPE[e.kind], e.mode, e.uid, e.gid, e.mtime_ns, e.xattrs)

    # -- 3. data ---------------------------------------------------------------------------

    def _queue_file(self, d: _Dir, e: TreeEntry) -> None:
        if e.indirect:  # a big file: a batch of its own, written piece window by window
            self._flush()
            b = _Batch()
            self._hold(b, d)
            b.files.append((d, e))
            self._submit(b)
            return
        b = self._batch
        if id(d) not in b.dirs and len(b.dirs) >= BATCH_DIRS:
            self._flush()
            b = self._batch
        self._hold(b, d)
        b.files.append((d, e))
        for oid, _off, n in decode_chunks(e.payload):
            if oid is not None:
                b.oids[oid] = None
                b.data += n
        b.bytes += e.size
        if len(b.files) >= BATCH_FILES or b.bytes >= BATCH_BYTES:
            self._flush()

    def _hold(self, b: _Batch, d: _Dir) -> None:
        """Notes that ``b`` writes into ``d``: one reference, dropped once it is written."""
        if id(d) not in b.dirs:
            b.dirs[id(d)] = d
            with self._lock:
                d.refs += 1

    def _flush(self) -> None:
        if self._batch.files:
            b, self._batch = self._batch, _Batch()
            self._submit(b)

    def _submit(self, b: _Batch) -> None:
        assert self._pool is not None
        self._slots.acquire()  # at most INFLIGHT batches: they hold descriptors
        try:
            fut = self._pool.submit(self._write_batch, b)
        except BaseException:
            self._slots.release()
            raise
        fut.add_done_callback(lambda _f: self._slots.release())
        self._inflight.append(fut)
        if len(self._inflight) > 4 * INFLIGHT:  # done ones: surface their errors early
            self._inflight = [f for f in self._inflight if not self._check(f)]

    def _check(self, f: Future[None]) -> bool:
        """True if ``f`` is done (raising its error if it failed)."""
        if not f.done():
            return False
        f.result()
        return True

    def _drain(self) -> None:
        """Waits for every batch submitted, then raises the first error (if any)."""
        first: BaseException | None = None
        for f in self._inflight:
            try:
                f.result()
            except Exception as err:
                first = first or err
        self._inflight = []
        if first is not None:
            raise first

    def _write_batch(self, b: _Batch) -> None:
        try:
            if len(b.files) == 1 and b.files[0][1].indirect:
                d, e = b.files[0]
                self._write_big(d.fd, e)
            else:
                self._write_small(b)
        finally:
            for d in b.dirs.values():
                self._release(d)

    def _write_small(self, b: _Batch) -> None:
        assert _write_files is not None
        oids = list(b.oids)
        files = b.files
        failed: SpriteError | None = None
        try:
            objects: dict[bytes, bytes] = dict(zip(oids, self.reader.read_many(oids), strict=True))
        except SpriteError:
            # Damage somewhere in the batch: read file by file, write those that can be
            # read, then raise the error of the first one that cannot (as restore.py).
            objects, files = {}, []
            for d, e in b.files:
                mine = [oid for oid, _o, _n in decode_chunks(e.payload) if oid is not None]
                try:
                    objects.update(zip(mine, self.reader.read_many(mine), strict=True))
                except SpriteError as err:
                    failed = failed or err
                    continue
                files.append((d, e))
        specs = [(d.fd, e.name, e.mode, e.uid, e.gid, e.mtime_ns, e.payload) for d, e in files]
        held = sorted({id(d): d for d, _e in files}.values(), key=lambda d: d.seq)
        with contextlib.ExitStack() as locks:
            for d in held:  # in seq order: two batches never wait for each other's
                locks.enter_context(d.lock)
            try:
                fix = set(_write_files(specs, objects, **self._skips))
            except ValueError as err:  # a chunk list that does not fit its objects
                raise SnapshotError(f"cannot restore a file: {err}") from None
        for k, (d, e) in enumerate(files):
            if e.xattrs or k in fix:  # xattrs to set, or inherited ones to remove
                fix_new_meta(d.fd, e.name, e)
        if failed is not None:
            raise failed
        with self._lock:
            self.stats.bytes_written += b.data

    def _write_big(self, dfd: int, e: TreeEntry) -> None:
        pieces = decode_chunks(self.read_tree(ObjectId(e.payload)))
        out = os.open(
            e.name,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=dfd,
        )
        try:
            size = sum(n for _oid, _off, n in pieces)
            if all(oid is not None for oid, _off, _n in pieces):
                # one extent up front (a file system without it just grows the file)
                with contextlib.suppress(OSError):
                    os.posix_fallocate(out, 0, size)
            data, end = placed(pieces)
            self._write_pieces(out, data)
            os.ftruncate(out, end)
            apply_meta(
                dfd, e.name, stat.S_IFREG, e.mode, e.uid, e.gid, e.mtime_ns, e.xattrs, fd=out
            )
        except BaseException:
            os.close(out)
            out = -1
            os.unlink(e.name, dir_fd=dfd)
            raise
        finally:
            if out >= 0:
                os.close(out)

    def _write_pieces(self, out: int, placed: list[tuple[int, Piece]]) -> None:
        """Writes the pieces at their offsets, reading about ``BATCH_BYTES`` of them with
        each ``read_many`` (consecutive slices of one object read it once)."""
        k = 0
        while k < len(placed):
            window: dict[ObjectId, None] = {}
            size = 0
            j = k
            while j < len(placed):
                oid, _off, n = placed[j][1]
                assert oid is not None
                if oid not in window:
                    if window and size + n > BATCH_BYTES:
                        break
                    window[oid] = None
                size += n
                j += 1
            ids = list(window)
            got = dict(zip(ids, self.reader.read_many(ids), strict=True))
            written = 0
            for at, piece in placed[k:j]:
                assert piece[0] is not None
                pwrite_piece(out, got[piece[0]], piece, at)
                written += piece[2]
            with self._lock:
                self.stats.bytes_written += written
            k = j

    # -- 4. hard links ---------------------------------------------------------------------

    def _defer_link(self, d: _Dir, path: bytes, e: TreeEntry) -> None:
        with self._lock:
            d.refs += 1  # released once the link is made
        self._links.append((d, path, e))
        self._link_dirs.add(id(d))
        if len(self._link_dirs) >= LINK_DIRS:
            self._flush()
            self._drain()
            self._make_links()

    def _make_links(self) -> None:
        links, self._links = self._links, []
        self._link_dirs = set()
        root = next((d for d, _p, _e in links), None)
        while root is not None and root.parent is not None:
            root = root.parent
        for k, (d, _path, e) in enumerate(links):
            try:
                assert root is not None
                if not self._link_from(root.fd, d.fd, e):
                    # Its first member is not there as the same kind: the member alone,
                    # with all its content (every member carries it).
                    if e.kind is Kind.FILE:
                        b = _Batch()
                        b.files.append((d, e))
                        if e.indirect:
                            self._write_big(d.fd, e)
                        else:
                            for oid, _o, n in decode_chunks(e.payload):
                                if oid is not None:
                                    b.oids[oid] = None
                                    b.data += n
                            self._write_small(b)
                    else:
                        self._make_special(d.fd, e.name, e)
            except BaseException:
                for d2, _p2, _e2 in links[k:]:
                    self._release(d2)
                raise
            self._release(d)

    def _link_from(self, root_fd: int, dfd: int, e: TreeEntry) -> bool:
        """Hard-links ``e.name`` to the group's first member; False if that is not there."""
        parts = e.link.split(b"/")
        cur = os.dup(root_fd)
        try:
            for part in parts[:-1]:
                nxt = open_dir(cur, part)
                os.close(cur)
                cur = nxt
            st = os.stat(check_name(parts[-1]), dir_fd=cur, follow_symlinks=False)
            if stat.S_IFMT(st.st_mode) != _FILE_TYPE[e.kind]:
                return False
            os.link(parts[-1], e.name, src_dir_fd=cur, dst_dir_fd=dfd, follow_symlinks=False)
            return True
        except OSError:
            return False
        finally:
            os.close(cur)

    # -- 5. directory metadata -------------------------------------------------------------

    def _release(self, d: _Dir) -> None:
        """Drops one reference of ``d``; the last one applies its metadata and closes it
        (the root's descriptor too), then drops the one it held on its parent."""
        while True:
            with self._lock:
                d.refs -= 1
                if d.refs:
                    return
            e = d.entry
            try:
                apply_meta(
                    d.fd, b".", stat.S_IFDIR, e.mode, e.uid, e.gid, e.mtime_ns, e.xattrs, fd=d.fd
                )
            finally:
                os.close(d.fd)
                d.fd = -1
            if d.parent is None:
                return
            d = d.parent


def process_umask() -> int:
    """The process's umask without changing it (``/proc/self/status``); -1 if unknown.
    Read once per restore, not per directory: a read of the file and a parse of its ~55
    lines with the GIL held was 41 of the writers' py-spy samples in the medium undo,
    whose ~1,100 directory batches each read it."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return -1


def _no_ops(root_fd: int) -> dict[str, object]:
    """The steps of ``write_files`` that are no-ops under ``root`` (see filewrite.h).

    Every directory below the root is made by this restore, 0700 with no extended
    attributes until its own metadata comes last, so what a new file gets on its own
    depends on the root alone: its user is the process's, its group the process's or,
    under a setgid root (or a file system mounted ``grpid``), the root's, passed down by
    every ``mkdir``: known only when the two are the same. It inherits extended attributes
    (a default ACL) only if the root has some. Skipping chown, chmod and listxattr where
    they change nothing took 3 of the 7 system calls of most small files (medium bench
    layer: fchown 127k -> 24k, fchmod 127k -> 24k, flistxattr 127k -> 17k, directories')."""
    owner = _new_files_owner(os.fstat(root_fd))
    try:
        xattrs = bool(os.listxattr(root_fd))
    except OSError as e:  # ENOTSUP: no extended attributes here at all, none to inherit
        xattrs = e.errno != errno.ENOTSUP
    return {"owner": owner, "umask": process_umask(), "xattrs": xattrs}


def fix_new_meta(dfd: int, name: bytes, e: TreeEntry) -> None:
    """Makes the metadata of the file ``name`` that ``write_files`` just made in ``dfd``
    exactly ``e``'s (its xattrs set, inherited ones removed), through its descriptor."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    try:
        apply_meta(dfd, name, stat.S_IFREG, e.mode, e.uid, e.gid, e.mtime_ns, e.xattrs, fd=fd)
    finally:
        os.close(fd)


def _new_files_owner(dir_st: os.stat_result) -> tuple[int, int] | None:
    """The (uid, gid) a file made now in the directory ``dir_st`` gets, if that is known:
    its user is the process's, its group the process's or, setgid (or ``grpid``), the
    directory's; known only when the two are the same."""
    return (os.geteuid(), os.getegid()) if dir_st.st_gid == os.getegid() else None


def write_into(
    dirfd: int, specs: list[_Spec], objects: dict[bytes, bytes], *, umask: int
) -> list[int]:
    """``write_files`` for new files in one existing directory ``dirfd`` of a live layer
    (``restore.py``'s batches, each of one directory): nothing is known of what a new file
    gets there but by that directory, so only its owner may be skipped, when the directory
    hands down the process's own group whatever its setgid bit (as :func:`_no_ops`); the
    mode is set unless the umask keeps it, and inherited extended attributes are always
    looked for (a default ACL there also overrides the umask: such a file is returned, and
    the caller makes its metadata exact). ``umask``: the process's (:func:`process_umask`),
    -1 if unknown (every mode is then set).

    Raises:
        OSError, ValueError: as ``write_files``; the files before the failed one exist.
    """
    assert _write_files is not None
    owner = _new_files_owner(os.fstat(dirfd))
    return _write_files(specs, objects, owner=owner, umask=umask, xattrs=True)


def restore_into_empty(
    root: bytes,
    read_tree: ReadTree,
    read_object: ObjectReader | Callable[[ObjectId], bytes],
    target: TreeEntry,
    result: RestoreResult,
    progress: Progress | None = None,
) -> None:
    """Writes the directory ``target`` (a checkpoint's root entry) into the empty directory
    ``root``, its metadata included; counts into ``result.stats``. See the module docstring.

    Raises:
        StoreError: an object is missing or damaged.
        SnapshotError: an unsafe name, or a chunk list that does not fit its objects.
        OSError: the file system refused something (``root`` not empty, no space...).
    """
    BulkRestorer(root, read_tree, read_object, result, progress).run(target)
