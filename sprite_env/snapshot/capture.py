"""Capture: a directory tree -> tree objects and chunks in the store.

The walk is depth first with names sorted, through directory file descriptors: symlinks
are recorded, never followed; other file systems (mount points) and excluded paths are
left out. Per directory, children whose signature matches the files cache
(``dircache.py``) reuse their previous entry without being opened, and a directory whose
children all match keeps its previous tree id without being read or re-encoded: a capture
costs one ``stat`` per entry plus work in proportion to what changed.

A changed regular file is read once through the chunker; each chunk is hashed here and
compressed on the store writer's worker threads (both release the GIL). All-zero chunks
become holes. A file whose size, mtime or ctime moves while it is read is read again (up
to ``READ_ATTEMPTS`` times); if it keeps changing its last reading is kept and it is named
in the capture's warnings.

Error handling:
    A per-entry problem (vanished, unreadable, a socket) becomes a :class:`CaptureWarning`
    passed to ``on_warning``; the entry is left out and the capture goes on. Errors that
    make the whole capture meaningless (the root unreadable, the store failing) raise.
"""

from __future__ import annotations

import dataclasses
import errno
import fnmatch
import os
import stat
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from sprite_env.errors import SpriteError
from sprite_env.ids import ObjectId
from sprite_env.snapshot import dircache
from sprite_env.snapshot.dircache import RACY_NS, CachedDir, Sig, is_racy, sig_of
from sprite_env.snapshot.fsmeta import O_DIR, proc_path, read_xattrs
from sprite_env.snapshot.tree import (
    INLINE_CHUNKS,
    Kind,
    Piece,
    TreeEntry,
    decode_chunks,
    decode_tree,
    encode_chunks,
    encode_tree,
)
from sprite_env.store.chunker import Chunker
from sprite_env.store.codec import object_id
from sprite_env.store.pack import ObjectKind

_scan_dir: Callable[[int, int, int, int], tuple[bytes, list[bytes], int, int, int, int, bool]]
try:
    from sprite_env._native import scan_dir as _scan_dir
except ImportError:  # the pure-Python walk does the same, slower
    _scan_dir = None  # type: ignore[assignment]

READ_ATTEMPTS = 3
#: Threads reading files: reads, chunking and hashing release the GIL, and several reads
#: in flight keep a virtual disk's queue full.
READERS = 3
#: Files at least this big, changed in place (same inode), are compared with their
#: previous version page by page instead of being chunked afresh.
IN_PLACE_MIN = 1 << 20
PAGE = 4096
_O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class ObjectSink(Protocol):
    """Where a capture puts objects (a ``StoreWriter``, or a hash-only sink)."""

    def put(self, data: bytes, kind: ObjectKind = ...) -> ObjectId: ...


@dataclass(frozen=True, slots=True)
class CaptureWarning:
    """Something left out of, or uncertain in, a checkpoint."""

    path: bytes
    message: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.path.decode(errors="backslashreplace"), "message": self.message}


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


@dataclass
class CaptureResult:
    top_tree: ObjectId
    stats: CaptureStats
    warnings: list[CaptureWarning]
    cache_changed: dict[bytes, CachedDir]
    cache_removed: set[bytes]


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
        if (st.st_dev, st.st_ino) in self.inodes:
            return True
        return any(fnmatch.fnmatchcase(rel, p) for p in self.patterns)


Progress = Callable[[CaptureStats], None]
OnWarning = Callable[[CaptureWarning], None]
ReadTree = Callable[[ObjectId], bytes]


def _join(rel: bytes, name: bytes) -> bytes:
    return name if not rel else rel + b"/" + name


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
        future: Future[tuple[TreeEntry, os.stat_result] | None] | None = None,
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


class Capturer:
    """Captures one tree; see the module docstring. Use :func:`capture`."""

    def __init__(
        self,
        root: bytes,
        sink: ObjectSink,
        read_tree: ReadTree,
        cache: dict[bytes, CachedDir],
        *,
        excludes: Excludes | None = None,
        chunker: Chunker | None = None,
        progress: Progress | None = None,
        on_warning: OnWarning | None = None,
    ) -> None:
        self.root = root
        self.sink = sink
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

    # -- driver --------------------------------------------------------------------------

    def run(self) -> CaptureResult:
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        old_limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old_limit, 20_000))  # one frame per directory level
        self._readers = ThreadPoolExecutor(READERS, thread_name_prefix="capture-read")
        try:
            st = os.fstat(fd)
            self._root_dev = st.st_dev
            subtree, _ = self._dir(fd, b"")
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
            sys.setrecursionlimit(old_limit)
            os.close(fd)
        top_id = self.sink.put(encode_tree([top]), ObjectKind.TREE)
        self._report(force=True)
        return CaptureResult(
            top_id,
            self.stats,
            self.warnings,
            self.cache_changed,
            set(self.cache) - self.visited,
        )

    def _warn(self, rel: bytes, message: str) -> None:
        w = CaptureWarning(rel, message)
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

    def _dir(self, fd: int, rel: bytes) -> tuple[ObjectId, bool]:
        """Captures the directory open at ``fd``; returns its tree id and whether it changed
        since the files cache's record of it."""
        cached = self.cache.get(rel)
        if cached is None or _scan_dir is None:
            return self._dir_slow(fd, rel, {})
        # Fast path: one native call lists and stats the children and encodes their
        # signatures; if they equal the cache's, only the subdirectories remain to check.
        blob, subdirs, files, nbytes, symlinks, specials, irregular = _scan_dir(
            fd, self.start_ns, RACY_NS, self._root_dev
        )
        if irregular or blob != cached.stat:
            return self._dir_slow(fd, rel, {})
        done: dict[bytes, tuple[ObjectId, bool]] = {}
        for name in subdirs:
            try:
                cfd = os.open(name, O_DIR, dir_fd=fd)
            except OSError:
                return self._dir_slow(fd, rel, done)  # replaced since the listing
            try:
                done[name] = self._dir(cfd, _join(rel, name))
            finally:
                os.close(cfd)
        if any(changed for _, changed in done.values()):
            return self._dir_slow(fd, rel, done)
        self.visited.add(rel)
        self.stats.dirs += 1
        self.stats.dirs_reused += 1
        self.stats.files += files
        self.stats.bytes += nbytes
        self.stats.symlinks += symlinks
        self.stats.specials += specials
        self._report()
        return cached.tree, False

    def _dir_slow(
        self, fd: int, rel: bytes, done: dict[bytes, tuple[ObjectId, bool]]
    ) -> tuple[ObjectId, bool]:
        """The directory entry by entry; ``done`` holds subdirectories already captured."""
        self.visited.add(rel)
        self.stats.dirs += 1
        cached = self.cache.get(rel)
        prev_sigs = cached.sigs() if cached else {}
        sigs: dict[bytes, Sig] = {}
        pending: list[_Pending] = []
        prev_tree: dict[bytes, TreeEntry] | None = None
        unchanged = cached is not None
        try:
            with os.scandir(fd) as it:
                names = sorted((os.fsencode(d.name), d) for d in it)
        except OSError as e:
            self._warn(rel, f"cannot list directory: {e.strerror}")
            names = []
        for name, dentry in names:
            child = _join(rel, name)
            try:
                st = dentry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # vanished since the listing: it simply is not there
            if self.excludes.match(child, st):
                continue
            mode = st.st_mode
            if stat.S_ISSOCK(mode):
                self._warn(child, "socket skipped (a socket cannot be restored)")
                continue
            if stat.S_ISDIR(mode) and st.st_dev != self._root_dev:
                self._warn(child, "mount point skipped (other file system)")
                continue
            s = sig_of(st, self.start_ns)
            prev_sig = prev_sigs.get(name)
            same = not is_racy(s) and prev_sig == s
            if not stat.S_ISDIR(mode) and st.st_nlink > 1:
                same = False  # hard-link groups are re-derived every time (cheap, rare)
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
            if name in done and stat.S_ISDIR(mode):
                subtree, changed = done[name]
                if same:
                    p: _Pending | None = _Pending(
                        name, st, subtree=subtree, subtree_changed=changed
                    )
                else:
                    p = _Pending(name, st, self._dir_entry(fd, name, st, subtree), subtree=subtree)
            else:
                p = self._child(fd, child, name, st, same, prev_entry)
            if p is not None:
                pending.append(p)
                sigs[name] = s
            self._report()
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
        tree_id = self.sink.put(encode_tree(entries), ObjectKind.TREE)
        self.cache_changed[rel] = CachedDir(tree_id, dircache.encode_sigs(sigs))
        return tree_id, cached is None or tree_id != cached.tree

    def _prev_tree(self, cached: CachedDir) -> dict[bytes, TreeEntry]:
        try:
            return {e.name: e for e in decode_tree(self.read_tree(cached.tree))}
        except SpriteError:
            return {}  # unreadable old tree: every child below is captured afresh

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
    ) -> _Pending | None:
        mode = st.st_mode
        try:
            if stat.S_ISDIR(mode):
                try:
                    cfd = os.open(name, O_DIR, dir_fd=dirfd)
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
        if prev is not None and prev.kind is Kind.FILE:
            try:
                raw = self.read_tree(ObjectId(prev.payload)) if prev.indirect else prev.payload
                pieces = decode_chunks(raw)
            except SpriteError:
                pieces = None
        try:
            fd = os.open(name, _O_FILE, dir_fd=dirfd)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ELOOP):
                return None
            if e.errno in (errno.EACCES, errno.EPERM):
                self._warn(rel, f"skipped: {e.strerror}")
                return None
            raise
        try:
            entry, st_after = self._read_file(fd, rel, name, link, pieces)
        finally:
            os.close(fd)
        if entry is None:
            return None
        if st.st_nlink > 1:
            self.link_payload[st.st_ino] = entry
        return entry, st_after

    def _pieces(
        self, fd: int, size: int, regions: list[tuple[int, int]], pos: int
    ) -> tuple[list[Piece], int]:
        """Chunks ``[pos, size)`` with the content-defined chunker; holes stay holes."""
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
            for chunk in self.chunker.chunks_of_fd(fd, limit=end - start):
                chunks.append((self.sink.put(bytes(chunk), ObjectKind.DATA), 0, len(chunk)))
                with self._stats_lock:
                    self.stats.bytes_read += len(chunk)
            pos = end
        if size > pos:
            chunks.append((None, 0, size - pos))
        return chunks, size

    def _pieces_in_place(
        self, fd: int, size: int, regions: list[tuple[int, int]], prev: list[Piece]
    ) -> tuple[list[Piece], int]:
        """Compares a file changed in place with its previous pieces, page by page.

        A previous piece whose bytes are unchanged is kept (a whole-object piece is
        checked by its hash, a slice against the old object's bytes); a changed one is
        compared in ``PAGE``-sized windows aligned to file offsets, the equal windows kept
        as slices of the old object and each run of changed windows stored as one new
        object. A database that rewrote 6% of its pages stores about 6% of its size, where
        whole-chunk comparison would store the ~60% of chunks those pages touch.
        """
        out: list[Piece] = []
        pos = 0
        old_id: ObjectId | None = None
        old_bytes = b""
        for oid, off, n in prev:
            if pos >= size:
                break
            n = min(n, size - pos)
            if _in_hole(regions, pos, n):
                out.append((None, 0, n))
                pos += n
                continue
            if oid is None or not _in_data(regions, pos, n):
                # holes appeared or were filled here: chunk this range afresh, holes exact
                fresh, _ = self._pieces(fd, pos + n, regions, pos)
                out.extend(fresh)
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
            pos += n
        tail, _ = self._pieces(fd, size, regions, pos)
        return out + tail, size

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
        self, fd: int, rel: bytes, name: bytes, link: bytes, prev: list[Piece] | None = None
    ) -> tuple[TreeEntry | None, os.stat_result]:
        for _attempt in range(READ_ATTEMPTS):
            before = os.fstat(fd)
            if not stat.S_ISREG(before.st_mode):
                return None, before  # replaced by something else since the listing
            size = before.st_size
            regions = data_regions(fd, size)
            if prev is not None:
                chunks, total = self._pieces_in_place(fd, size, regions, prev)
            else:
                chunks, total = self._pieces(fd, size, regions, 0)
            after = os.fstat(fd)
            with self._stats_lock:
                self.stats.files_read += 1
            if _stable(before, after) and total == after.st_size:
                break
        else:
            self._warn(
                rel,
                f"changed while being read ({READ_ATTEMPTS} attempts); the last reading was kept",
            )
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
            size=total,
            nlink=after.st_nlink,
            xattrs=read_xattrs(fd),
            link=link,
            payload=payload,
            indirect=indirect,
        )
        return entry, after


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
    cache: dict[bytes, CachedDir] | None = None,
    *,
    excludes: Excludes | None = None,
    progress: Progress | None = None,
    on_warning: OnWarning | None = None,
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

    Returns:
        The top tree's id, counters, warnings, and the files-cache rows to write.
    """
    return Capturer(
        os.fsencode(root),
        sink,
        read_tree,
        cache or {},
        excludes=excludes,
        progress=progress,
        on_warning=on_warning,
    ).run()


__all__ = [
    "CaptureResult",
    "CaptureStats",
    "CaptureWarning",
    "Capturer",
    "Excludes",
    "ObjectSink",
    "capture",
]
