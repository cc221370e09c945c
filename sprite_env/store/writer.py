"""Writing to the store: a :class:`StoreWriter` adds objects and commits them.

Objects are hashed on the caller's thread (so the caller gets the id at once and duplicates
cost nothing more), checked against the catalog and compressed on worker threads (zstd and
SQLite release the GIL, so both cores work), appended to open packs, and become part of
the store only when :meth:`StoreWriter.commit` publishes the packs and inserts their rows
in one catalog transaction. A kill at any instant therefore leaves the previous state;
packs published but not committed are orphans, deleted at the next writable open. Get one
with :meth:`Store.writer <sprite_env.store.repository.Store.writer>`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sprite_env.errors import StoreError
from sprite_env.store import codec
from sprite_env.store.catalog import CommitHook, add_meta_counter, insert_pack
from sprite_env.store.faults import crashpoint
from sprite_env.store.pack import Entry, ObjectKind, PackWriter, _fsync_dir, pack_path

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sprite_env.ids import ObjectId, PackName
    from sprite_env.store.repository import Store

#: A batch of objects for one compression task: this many bytes, or objects.
BATCH_BYTES = 1 << 20
BATCH_OBJECTS = 64

#: An object on its way to a pack: id, bytes, kind, and whether the catalog is still to be
#: asked about it (``put_known`` without ``known``).
_Put = tuple["ObjectId", bytes, ObjectKind, bool]


@dataclass
class WriteStats:
    """What a writer did since it was opened."""

    objects_offered: int = 0
    bytes_offered: int = 0  # raw bytes passed to put, duplicates included
    objects_new: int = 0
    bytes_new: int = 0  # raw bytes of new objects
    bytes_stored: int = 0  # their encoded size in packs (headers excluded)
    packs_written: int = 0


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
        self._batch: list[_Put] = []
        self._batch_bytes = 0
        self._unsynced_names = False  # packs renamed into packs/ since its last fsync
        self._publisher: ThreadPoolExecutor | None = None  # see _finish_pack
        self._publishing: list[tuple[PackWriter, Future[None]]] = []

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

    def put_many(
        self, datas: Sequence[bytes], kind: ObjectKind = ObjectKind.DATA
    ) -> list[ObjectId]:
        """:meth:`put` of each, asking the catalog about all of them in a few queries (the
        changed pages of a database: 3.2k objects of 4 KiB, 60 ms asked one by one)."""
        oids = [codec.object_id(d) for d in datas]
        known = self.store.catalog.has_many(oids)
        for oid, data in zip(oids, datas, strict=True):
            self.put_known(oid, data, kind, oid in known)
        return oids

    def put_known(
        self, oid: ObjectId, data: bytes, kind: ObjectKind, known: bool | None = None
    ) -> bool:
        """Like :meth:`put` for a caller that already hashed ``data``; True if it is new to
        this writer (it is then stored, unless the catalog has it).

        ``known``: whether the catalog has it, if the caller asked; None: asked on an
        encoding thread, in one query for its whole batch (:meth:`_encode_and_append`).
        Asked here, one query an object cost the capture's walk, which puts the chunks of
        the files a native batch read, 0.8 s of its 6 s sampled (py-spy, the medium layer's
        step, load 12): each query releases the GIL, and taking it back beside a busy
        Python thread waits up to the switch interval. :attr:`stats` count an object as
        new once that is known: exact after :meth:`drain`, :meth:`flush` or :meth:`commit`.
        """
        self._raise_pending_error()
        n = len(data)
        with self._lock:
            self.stats.objects_offered += 1
            self.stats.bytes_offered += n
            self._uncounted_offered += n
            if oid in self._pending:
                return False
        if known and oid not in self.store.damaged:
            return False
        with self._lock:
            if oid in self._pending:
                return False
            # Pending from here on, also if the catalog turns out to have it: has() is then
            # true either way, and a second put of it is dropped at once.
            self._pending.add(oid)
            self._batch.append((oid, data, kind, known is None))
            self._batch_bytes += n
            batch = None
            if self._batch_bytes >= BATCH_BYTES or len(self._batch) >= BATCH_OBJECTS:
                batch, self._batch, self._batch_bytes = self._batch, [], 0
        if batch:
            self._submit(batch)
        return True

    def _submit(self, batch: list[_Put]) -> None:
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

    def _unknown(self, batch: list[_Put]) -> list[_Put]:
        """The objects of ``batch`` to store: those the catalog lacks (asked in one query for
        those put without ``known``) or holds damaged. Counts them as new."""
        ask = [oid for oid, _, _, unasked in batch if unasked]
        have = self.store.catalog.has_many(ask) if ask else set()
        if have:
            damaged = self.store.damaged
            batch = [b for b in batch if b[0] not in have or b[0] in damaged]
        with self._lock:
            self.stats.objects_new += len(batch)
            self.stats.bytes_new += sum(len(data) for _, data, _, _ in batch)
        return batch

    def _encode_and_append(self, batch: list[_Put]) -> None:
        try:
            batch = self._unknown(batch)
            coded = codec.encode_many([data for _, data, _, _ in batch])
            encoded = [
                (oid, kind, c, payload, len(data))
                for (oid, data, kind, _), (c, payload) in zip(batch, coded, strict=True)
            ]
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

    def _finish_pack(self, cls: int, *, later: bool = False) -> None:
        """Seals the open pack of ``cls`` and publishes it (fsync, rename): here (a full
        pack, on the encoding worker that filled it) or, ``later``, on a publishing thread
        (the last packs of a flush: their fsyncs, 20-25 ms for a step's 21 MB at load 8,
        run while the commit fills its transaction). The directory is fsync'd once for all
        the packs of a commit (:meth:`_published`), not per pack."""
        w = self._open.pop(cls)
        name = w.seal()
        self._finished.append((name, cls, w.size, w.entries))
        self._unsynced_names = True
        self.stats.packs_written += 1
        if not later:
            w.publish(self.store.packs_dir, sync_dir=False)
            return
        if self._publisher is None:
            self._publisher = ThreadPoolExecutor(2, thread_name_prefix="store-publish")
        self._publishing.append(
            (w, self._publisher.submit(w.publish, self.store.packs_dir, sync_dir=False))
        )

    def _published(self) -> None:
        """Waits for the packs being published, then fsyncs ``packs/`` once for every name
        given since its last fsync. It must return before the transaction whose rows name
        these packs commits: a row naming a pack whose data or name the disk forgot would be
        a lost pack, where a pack with no row is only an orphan (deleted at the next open).

        Raises:
            OSError: a pack could not be made durable (the writer is then unusable).
        """
        pending, self._publishing = self._publishing, []
        error: BaseException | None = None
        for w, f in pending:
            try:
                f.result()
            except Exception as e:
                w.abort()
                error = error or e
        if error is not None:
            self._error = error
            raise error
        if self._unsynced_names:
            _fsync_dir(self.store.packs_dir)
            self._unsynced_names = False

    def drain(self) -> None:
        """Waits until every put so far is encoded and appended (so :attr:`stats` are final),
        leaving the open packs open: what is put next joins them."""
        with self._lock:
            batch, self._batch, self._batch_bytes = self._batch, [], 0
        if batch:
            self._submit(batch)
        with self._lock:
            futures, self._futures = self._futures, []
        wait(futures)
        self._raise_pending_error()

    def flush(self, *, durable: bool = True) -> None:
        """Waits for all puts and publishes the open packs (not yet committed).

        Args:
            durable: also fsync ``packs/`` for the names of the packs published since its
                last fsync (:meth:`commit` always does, before its transaction). False for a
                caller that puts more before it commits: one fsync then covers both.
        """
        self.drain()
        with self._pack_lock:
            for cls in list(self._open):
                if self._open[cls].entries:
                    self._finish_pack(cls, later=True)
        if durable:
            self._published()

    def commit(self, hook: CommitHook | None = None) -> list[PackName]:
        """Makes everything put so far part of the store, in one catalog transaction.

        Args:
            hook: called with the open transaction's connection to add rows that must
                commit together with these objects (e.g. the checkpoint record).

        Returns:
            The names of the packs this commit published.
        """
        self.flush(durable=False)
        crashpoint("catalog-before-commit")
        damaged = frozenset(self.store.damaged)  # a copy: readers add to it meanwhile
        with self.store.catalog.transaction() as db:
            for name, cls, size, entries in self._finished:
                insert_pack(db, name, cls, size, entries, replacing=damaged)
            crashpoint("catalog-mid-commit")
            add_meta_counter(db, "ingested_bytes", self._uncounted_offered)
            if hook is not None:
                hook(db)
            self._published()  # the packs' fsyncs ran meanwhile; the COMMIT waits for them
        crashpoint("catalog-after-commit")
        self.store.catalog.note_committed(e.id for f in self._finished for e in f[3])
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
        if self._publisher is not None:
            self._publisher.shutdown(wait=True)
        for w, _ in self._publishing:  # never waited for: drop what is left of them
            w.abort()
        self._publishing.clear()
        with self._pack_lock:
            for w in self._open.values():
                w.abort()
            self._open.clear()
        for name, *_ in self._finished:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(pack_path(self.store.packs_dir, name))
        self._finished.clear()
