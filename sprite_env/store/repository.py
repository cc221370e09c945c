"""The store: a directory of packs plus the catalog, opened by one writer at a time.

Layout of a store directory::

    sprite-store.json   {"format": 1}: marks the directory as a store, and its version
    lock                flock'd by the process that has the store open (holds its pid)
    catalog.db          the SQLite catalog (see ``catalog.py``), with -wal and -shm
    packs/<name>.pack   immutable packs (see ``pack.py``)
    tmp/                packs being written; emptied when the store is opened for writing

Writes go through a :class:`StoreWriter`: objects are hashed on the caller's thread (so the
caller gets the id at once and duplicates cost nothing more), compressed on worker threads
(zstd releases the GIL, so both cores work), appended to open packs, and become part of the
store only when :meth:`StoreWriter.commit` publishes the packs and inserts their rows in one
catalog transaction. A kill at any instant therefore leaves the previous state; packs
published but not committed are orphans, deleted at the next writable open.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sprite_env import privacy
from sprite_env.errors import CorruptPack, NotAStore, ObjectNotFound, StoreError, StoreLocked
from sprite_env.ids import ObjectId, PackName
from sprite_env.store import codec
from sprite_env.store.catalog import (
    Catalog,
    CommitHook,
    Located,
    PackRow,
    add_meta_counter,
    delete_objects_past,
    delete_packs,
    insert_pack,
    open_for_repair,
)
from sprite_env.store.faults import crashpoint
from sprite_env.store.pack import (
    ENTRY,
    TARGET_PACK_SIZE,
    Entry,
    ObjectKind,
    PackWriter,
    _fsync_dir,
    pack_path,
    read_payload,
)

if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Callable, Iterable, Iterator

    #: Called inside the transaction that forgets lost packs, with the lost object ids.
    LostHook = Callable[[sqlite3.Connection, set[ObjectId]], None]

log = logging.getLogger(__name__)

FORMAT = 1
MARKER = "sprite-store.json"
_MAX_OPEN_PACKS = 64
#: A batch of objects for one compression task: this many bytes, or objects.
BATCH_BYTES = 1 << 20
BATCH_OBJECTS = 64
#: Ids per catalog query of :meth:`Store.locate_many` (SQLite allows 32,766 parameters).
LOCATE_BATCH = 500


@dataclass(frozen=True, slots=True)
class LostPack:
    """A pack whose file is gone (``size`` None) or shorter than its catalog row says."""

    pack: PackRow
    size: int | None


@dataclass
class WriteStats:
    """What a writer did since it was opened."""

    objects_offered: int = 0
    bytes_offered: int = 0  # raw bytes passed to put, duplicates included
    objects_new: int = 0
    bytes_new: int = 0  # raw bytes of new objects
    bytes_stored: int = 0  # their encoded size in packs (headers excluded)
    packs_written: int = 0


class Store:
    """An open store. Use :func:`open_store`.

    Thread-safe for reads; writes go through :meth:`writer`.
    """

    def __init__(self, path: str, *, create: bool, writable: bool, repair: bool = False) -> None:
        self.path = os.path.abspath(path)
        self.writable = writable
        self.packs_dir = os.path.join(self.path, "packs")
        self.tmp_dir = os.path.join(self.path, "tmp")
        self._lock_fd = -1
        self._fds: OrderedDict[str, list[int]] = OrderedDict()  # name -> [fd, users]
        self._fd_lock = threading.Lock()
        #: Objects whose catalog row led a read to bad bytes (hash, decode, header, short):
        #: a writer stores such an object afresh instead of deduplicating against it.
        self.damaged: set[ObjectId] = set()
        self._init_or_validate(create)
        self._take_lock()
        try:
            catalog_path = os.path.join(self.path, "catalog.db")
            packs = [f for f in os.listdir(self.packs_dir) if f.endswith(".pack")]
            if not os.path.exists(catalog_path) and packs and not repair:
                # Never treat every pack as an orphan because the catalog went missing.
                raise StoreError(
                    f"{self.path}: catalog.db is missing but {len(packs)} packs exist; "
                    f"run: sprite-env store rebuild-catalog --store {self.path}"
                )
            #: Where ``rebuild`` found a damaged catalog and renamed it (None if sound).
            self.catalog_set_aside: str | None = None
            if repair:
                self.catalog, self.catalog_set_aside = open_for_repair(catalog_path)
            else:
                self.catalog = Catalog(catalog_path, readonly=not writable)
            if writable and not repair:
                self._remove_orphans()
        except BaseException:
            self._release_lock()
            raise

    # -- opening -----------------------------------------------------------------------

    def _init_or_validate(self, create: bool) -> None:
        """Creates the store, or checks its marker; a writable open of an existing store
        makes it private (see ``sprite_env/privacy.py``: older versions made it 0755/0644).

        Raises:
            privacy.AccessDenied: this user may not open it (it is private to its owner).
        """
        try:
            self._create_or_validate(create)
        except PermissionError as e:
            raise privacy.AccessDenied("store", self.path, e) from None
        if self.writable:
            privacy.tighten(self.path, "store")

    def _create_or_validate(self, create: bool) -> None:
        marker = os.path.join(self.path, MARKER)
        try:
            os.stat(marker)
            exists = True
        except PermissionError:
            raise
        except OSError:  # as os.path.exists, but EACCES is not "no store here"
            exists = False
        if not exists:
            if os.path.isdir(self.path) and os.listdir(self.path) or not create:
                raise NotAStore(
                    f"{self.path} is not a sprite-env store (no {MARKER})"
                    + ("" if create else "; create one first")
                )
            privacy.make_dir(self.path)  # an empty directory given to us gets 0700 too
            privacy.make_dir(self.packs_dir)
            privacy.make_dir(self.tmp_dir)
            tmp = marker + ".tmp"
            with os.fdopen(privacy.open_file(tmp, os.O_WRONLY | os.O_TRUNC), "w") as f:
                json.dump({"format": FORMAT}, f)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, marker)
            _fsync_dir(self.path)
            return
        try:
            with open(marker) as f:
                fmt = json.load(f).get("format")
        except PermissionError:
            raise
        except (OSError, ValueError, AttributeError) as e:
            raise NotAStore(f"{self.path}: unreadable {MARKER}: {e}") from None
        if not isinstance(fmt, int):
            raise NotAStore(f"{self.path}: {MARKER} has no format number")
        if fmt > FORMAT:
            raise NotAStore(
                f"{self.path} is a store of format {fmt}, newer than this sprite-env "
                f"supports ({FORMAT}); upgrade sprite-env"
            )

    def _take_lock(self) -> None:
        path = os.path.join(self.path, "lock")
        try:
            if self.writable:
                fd = privacy.open_file(path, os.O_RDWR)
            else:  # a read-only open changes no mode (it may create the file, 0600)
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, privacy.FILE_MODE)
        except PermissionError as e:
            raise privacy.AccessDenied("store", self.path, e) from None
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if self.writable else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                os.close(fd)
                raise
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            raise StoreLocked(self.path, int(text) if text.isdigit() else None) from None
        if self.writable:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _remove_orphans(self) -> None:
        for name in os.listdir(self.tmp_dir):
            os.unlink(os.path.join(self.tmp_dir, name))
        known = {p.name for p in self.catalog.packs()}
        removed = False
        for fname in os.listdir(self.packs_dir):
            if fname.endswith(".pack") and fname[: -len(".pack")] not in known:
                os.unlink(os.path.join(self.packs_dir, fname))
                removed = True
        if removed:
            _fsync_dir(self.packs_dir)

    def close(self) -> None:
        with self._fd_lock:
            for fd, _users in self._fds.values():
                os.close(fd)
            self._fds.clear()
        self.catalog.close()
        self._release_lock()

    # -- reading -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _pack_fd(self, name: PackName) -> Iterator[int]:
        """Lends a cached read-only fd of a pack; fds in use are never closed under a reader."""
        with self._fd_lock:
            slot = self._fds.get(name)
            if slot is not None:
                self._fds.move_to_end(name)
                slot[1] += 1
        if slot is None:
            try:
                fd = os.open(pack_path(self.packs_dir, name), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise CorruptPack(name, None, "pack file is missing") from None
            with self._fd_lock:
                slot = self._fds.get(name)
                if slot is not None:
                    os.close(fd)
                    slot[1] += 1
                else:
                    slot = self._fds[name] = [fd, 1]
                    self._evict_fds()
        try:
            yield slot[0]
        finally:
            with self._fd_lock:
                slot[1] -= 1
                if slot[1] == 0 and self._fds.get(name) is not slot:
                    os.close(slot[0])  # evicted or forgotten while in use

    def _evict_fds(self) -> None:
        for victim in [n for n, s in self._fds.items() if s[1] == 0]:
            if len(self._fds) <= _MAX_OPEN_PACKS:
                break
            os.close(self._fds.pop(victim)[0])

    def forget_pack(self, name: PackName) -> None:
        """Drops a cached fd of a pack about to be deleted (it closes when its reader ends)."""
        with self._fd_lock:
            slot = self._fds.pop(name, None)
            if slot is not None and slot[1] == 0:
                os.close(slot[0])

    def read(self, oid: ObjectId, *, verify: bool = True) -> bytes:
        """Returns an object's raw bytes.

        Args:
            oid: the object's id.
            verify: re-hash the bytes and compare with ``oid``.

        Raises:
            ObjectNotFound: the catalog has no such object.
            CorruptPack: the pack is missing, truncated or its bytes do not decode/hash.
        """
        loc = self.catalog.locate(oid)
        if loc is None:
            raise ObjectNotFound(oid)
        try:
            return self.read_entry(loc.pack, loc.entry, verify=verify)
        except CorruptPack as e:
            # A prune may have moved the object and unlinked its old pack between the
            # lookup and the open: look once more, and retry only if it moved.
            again = self.catalog.locate(oid)
            if e.offset is not None or again is None or again == loc:
                raise
            return self.read_entry(again.pack, again.entry, verify=verify)

    def locate_many(self, oids: Iterable[ObjectId]) -> dict[ObjectId, Located]:
        """Where each of ``oids`` lives, in one catalog query per ``LOCATE_BATCH`` ids.

        A query per object costs ~10 us of Python and SQLite: locating the 3,570 objects
        of a 256 MiB file took 0.08 s cold and 0.04 s warm one by one, 0.04 s and 0.012 s
        this way (bench VM; cold, see also :meth:`_prefetch_catalog`).

        Returns:
            The location of each object the catalog has; a missing one is absent.

        Raises:
            StoreError: an object's row names a pack the catalog does not have.
        """
        ids = list(dict.fromkeys(oids))
        if len(ids) == 1:  # a plain lookup is a little cheaper
            loc = self.catalog.locate(ids[0])
            return {} if loc is None else {ids[0]: loc}
        self._prefetch_catalog(len(ids))
        out: dict[ObjectId, Located] = {}
        for i in range(0, len(ids), LOCATE_BATCH):
            part = ids[i : i + LOCATE_BATCH]
            rows = self.catalog.query(
                "SELECT o.id, p.name, o.offset, o.stored_len, o.raw_len, o.kind, o.codec "
                "FROM objects AS o LEFT JOIN packs AS p ON p.id = o.pack "
                f"WHERE o.id IN ({','.join('?' * len(part))})",
                part,
            )
            for raw_id, name, off, slen, rlen, kind, codec_ in rows:
                oid = ObjectId(raw_id)
                if name is None:
                    raise StoreError(f"catalog: object {oid.hex()[:16]} is in no known pack")
                out[oid] = Located(PackName(name), Entry(oid, off, slen, rlen, kind, codec_))
        return out

    def _prefetch_catalog(self, lookups: int) -> None:
        """Asks the kernel to read the whole catalog ahead when ``lookups`` would touch
        about as many of its pages one by one: ids are random, so each lookup of a cold
        catalog is a 4 KiB read at a random place (the 3,570 objects of a 256 MiB file:
        0.065-0.107 s in an 8 MB catalog, 0.024-0.042 s after this, bench VM)."""
        if lookups < 256:  # not worth a system call
            return
        try:
            fd = os.open(self.catalog.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if os.fstat(fd).st_size <= lookups * 4096:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError:  # a hint only
            pass
        finally:
            os.close(fd)

    def read_entry(self, pack: PackName, entry: Entry, *, verify: bool = True) -> bytes:
        """Reads an object whose location is known (see :meth:`read`).

        Error handling:
            Bad bytes at the object's place (a short read, a header or hash that does not
            match, a payload that does not decode) add it to :attr:`damaged`; a missing
            pack does not (see :meth:`lost_packs`).
        """
        try:
            try:
                with self._pack_fd(pack) as fd:
                    payload = read_payload(fd, pack, entry)
            except OSError as e:
                raise CorruptPack(pack, entry.offset, f"read failed: {e}") from None
            try:
                data = codec.decode(entry.codec, payload, entry.raw_len)
            except ValueError as e:
                raise CorruptPack(
                    pack, entry.offset, f"object {entry.id.hex()[:16]}: {e}"
                ) from None
            if verify and codec.object_id(data) != entry.id:
                raise CorruptPack(
                    pack, entry.offset, f"object {entry.id.hex()[:16]}: hash mismatch"
                )
        except CorruptPack as e:
            if e.offset is not None:
                self.damaged.add(entry.id)
            raise
        return data

    # -- lost packs --------------------------------------------------------------------

    def lost_packs(self) -> list[LostPack]:
        """Packs the catalog lists whose file is gone or shorter than the catalog says (one
        ``stat`` per pack: cheap next to a capture).

        Nothing in the store's own protocol leaves such a pack: a pack file is durable
        before its row commits, and a prune deletes the row before the file. So this is
        data loss, and the objects past the file's end can never be read again.
        """
        out = []
        for p in self.catalog.packs():
            try:
                size: int | None = os.stat(pack_path(self.packs_dir, p.name)).st_size
            except FileNotFoundError:
                size = None
            if size is None or size < p.size:
                out.append(LostPack(p, size))
        return out

    def forget_lost(self, packs: Iterable[LostPack], hook: LostHook | None = None) -> set[ObjectId]:
        """Removes lost data from the catalog, in one transaction: a missing pack's row and
        its objects' rows, a truncated pack's objects that end past the file's end. So
        ``has`` is false for them, and the next write stores them again instead of
        deduplicating against bytes that are gone (issue 15). Each loss is logged.

        Args:
            packs: from :meth:`lost_packs` (looked at again here: a pack back whole is
                left alone).
            hook: called inside the transaction with the connection and the lost object
                ids (perhaps none), to drop rows of upper layers that refer to them (the
                files cache).

        Returns:
            The ids of the objects that left the catalog.
        """
        if not self.writable:
            return set()
        lost: set[ObjectId] = set()
        said = []
        with self.catalog.transaction() as db:
            for lp in packs:
                p = lp.pack
                try:
                    size: int | None = os.stat(pack_path(self.packs_dir, p.name)).st_size
                except FileNotFoundError:
                    size = None
                if size is None:
                    ids = delete_packs(db, [p.id])
                    said.append(f"pack {p.name} is missing: its {len(ids)} objects are lost")
                elif size < p.size:
                    # The pack row stays (with the size it should have, so ``check`` keeps
                    # reporting it) until a prune rewrites what is left of it.
                    ids = delete_objects_past(db, p.id, size, ENTRY.size)
                    if ids:
                        said.append(
                            f"pack {p.name} is truncated ({size} of {p.size} bytes): "
                            f"{len(ids)} objects past its end are lost"
                        )
                else:
                    continue
                lost |= ids
            if hook is not None:
                hook(db, lost)
        self.catalog.forget_pack_names()
        for lp in packs:
            self.forget_pack(lp.pack.name)
        for line in said:
            log.warning(
                "store %s: %s and left the catalog; checkpoints that used them are damaged "
                "(sprite-env store check --store %s names them), new checkpoints store that "
                "data again",
                self.path,
                line,
                self.path,
            )
        return lost

    def has(self, oid: ObjectId) -> bool:
        return self.catalog.has(oid)

    # -- writing -----------------------------------------------------------------------

    def writer(self, workers: int | None = None, pack_size: int = TARGET_PACK_SIZE) -> StoreWriter:
        """Returns a writer; use it as a context manager (uncommitted work is dropped).

        Args:
            workers: compression threads (default: one per core).
            pack_size: close a pack once it reaches this many bytes.
        """
        if not self.writable:
            raise StoreError("store is open read-only")
        return StoreWriter(self, workers or os.cpu_count() or 2, pack_size)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_store(
    path: str, *, create: bool = False, writable: bool = True, repair: bool = False
) -> Store:
    """Opens (or creates) the store at ``path``; use the result as a context manager.

    Args:
        path: the store directory.
        create: create the store if ``path`` is missing or an empty directory.
        writable: take the writer lock (else a shared lock, read-only catalog).
        repair: open for ``rebuild``: keep packs the catalog does not list, and accept a
            missing catalog.

    Raises:
        NotAStore: ``path`` is not a store (and ``create`` is false or it is not empty),
            or it is of a newer format.
        StoreLocked: another process has it open for writing (or, when ``writable``, at
            all).
    """
    return Store(path, create=create, writable=writable, repair=repair)


class StoreWriter:
    """Adds objects to a store; see the module docstring for the pipeline.

    ``put`` may be called from several threads.

    Error handling:
        An error in a worker (a full disk, say) is raised by the next ``put``, ``flush`` or
        ``commit``; the writer is then unusable and leaving it drops the uncommitted packs.
    """

    def __init__(self, store: Store, workers: int, pack_size: int) -> None:
        self.store = store
        self.pack_size = pack_size
        self.stats = WriteStats()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="store-encode")
        self._slots = threading.BoundedSemaphore(workers * 4)  # bounds memory in flight
        self._lock = threading.Lock()  # pending set, stats, futures
        self._pack_lock = threading.Lock()  # open packs
        self._pending: set[ObjectId] = set()
        self._futures: list[Future[None]] = []
        self._open: dict[int, PackWriter] = {}
        self._finished: list[tuple[PackName, int, int, list[Entry]]] = []
        self._error: BaseException | None = None
        self._uncounted_offered = 0
        # Objects go to the workers in batches: one task per 64 KiB object would cost more
        # in futures and locks (measured: ~10 us each, with the GIL held) than zstd saves.
        self._batch: list[tuple[ObjectId, bytes, ObjectKind]] = []
        self._batch_bytes = 0

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _raise_pending_error(self) -> None:
        if self._error is not None:
            raise self._error

    def has(self, oid: ObjectId) -> bool:
        """True if the object is committed or was put through this writer."""
        with self._lock:
            if oid in self._pending:
                return True
        return self.store.catalog.has(oid)

    def put(self, data: bytes, kind: ObjectKind = ObjectKind.DATA) -> ObjectId:
        """Adds an object unless the store already has it; returns its id at once."""
        oid = codec.object_id(data)
        self.put_known(oid, data, kind)
        return oid

    def put_known(self, oid: ObjectId, data: bytes, kind: ObjectKind) -> bool:
        """Like :meth:`put` for a caller that already hashed ``data``; True if new."""
        self._raise_pending_error()
        n = len(data)
        with self._lock:
            self.stats.objects_offered += 1
            self.stats.bytes_offered += n
            self._uncounted_offered += n
            if oid in self._pending:
                return False
        if self.store.catalog.has(oid) and oid not in self.store.damaged:
            return False
        with self._lock:
            if oid in self._pending:
                return False
            self._pending.add(oid)
            self.stats.objects_new += 1
            self.stats.bytes_new += n
            self._batch.append((oid, data, kind))
            self._batch_bytes += n
            batch = None
            if self._batch_bytes >= BATCH_BYTES or len(self._batch) >= BATCH_OBJECTS:
                batch, self._batch, self._batch_bytes = self._batch, [], 0
        if batch:
            self._submit(batch)
        return True

    def _submit(self, batch: list[tuple[ObjectId, bytes, ObjectKind]]) -> None:
        self._slots.acquire()
        try:
            fut = self._pool.submit(self._encode_and_append, batch)
        except BaseException:
            self._slots.release()
            raise
        with self._lock:
            self._futures.append(fut)
            if len(self._futures) > 256:
                self._futures = [f for f in self._futures if not f.done()]

    def _encode_and_append(self, batch: list[tuple[ObjectId, bytes, ObjectKind]]) -> None:
        try:
            encoded = [(oid, kind, *codec.encode(data), len(data)) for oid, data, kind in batch]
            with self._pack_lock:
                if self._error is not None:
                    return
                for oid, kind, c, payload, raw_len in encoded:
                    cls = kind.pack_class
                    w = self._open.get(cls)
                    if w is None:
                        w = self._open[cls] = PackWriter(self.store.tmp_dir, cls)
                    w.add(oid, int(kind), int(c), payload, raw_len)
                    self.stats.bytes_stored += len(payload)
                    if w.size >= self.pack_size:
                        self._finish_pack(cls)
        except Exception as e:  # handed to the caller's thread by the next call
            self._error = e
        finally:
            self._slots.release()

    def _finish_pack(self, cls: int) -> None:
        w = self._open.pop(cls)
        name, size = w.finish(self.store.packs_dir)
        self._finished.append((name, cls, size, w.entries))
        self.stats.packs_written += 1

    def flush(self) -> None:
        """Waits for all puts and publishes the open packs (not yet committed)."""
        with self._lock:
            batch, self._batch, self._batch_bytes = self._batch, [], 0
        if batch:
            self._submit(batch)
        with self._lock:
            futures, self._futures = self._futures, []
        wait(futures)
        self._raise_pending_error()
        with self._pack_lock:
            for cls in list(self._open):
                if self._open[cls].entries:
                    self._finish_pack(cls)

    def commit(self, hook: CommitHook | None = None) -> list[PackName]:
        """Makes everything put so far part of the store, in one catalog transaction.

        Args:
            hook: called with the open transaction's connection to add rows that must
                commit together with these objects (e.g. the checkpoint record).

        Returns:
            The names of the packs this commit published.
        """
        self.flush()
        crashpoint("catalog-before-commit")
        damaged = frozenset(self.store.damaged)  # a copy: readers add to it meanwhile
        with self.store.catalog.transaction() as db:
            for name, cls, size, entries in self._finished:
                insert_pack(db, name, cls, size, entries, replacing=damaged)
            crashpoint("catalog-mid-commit")
            add_meta_counter(db, "ingested_bytes", self._uncounted_offered)
            if hook is not None:
                hook(db)
        crashpoint("catalog-after-commit")
        names = [f[0] for f in self._finished]
        if damaged:  # stored afresh: their rows now point at the new, sound copies
            self.store.damaged.difference_update(e.id for f in self._finished for e in f[3])
        self._finished.clear()
        with self._lock:
            self._pending.clear()
            self._uncounted_offered = 0
        return names

    def close(self) -> None:
        """Drops uncommitted work and stops the workers."""
        with self._lock:
            futures, self._futures = self._futures, []
        for f in futures:
            f.cancel()
        if self._error is None:
            self._error = StoreError("writer is closed")
        self._pool.shutdown(wait=True)
        with self._pack_lock:
            for w in self._open.values():
                w.abort()
            self._open.clear()
        for name, *_ in self._finished:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(pack_path(self.store.packs_dir, name))
        self._finished.clear()
