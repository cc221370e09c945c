"""The store: a directory of packs plus the catalog, opened by one writer at a time.

Layout of a store directory::

    sprite-store.json   {"format": 1}: marks the directory as a store, and its version
    lock                flock'd by the process that has the store open (holds its pid)
    catalog.db          the SQLite catalog (see ``catalog.py``), with -wal and -shm
    packs/<name>.pack   immutable packs (see ``pack.py``)
    tmp/                packs being written; emptied when the store is opened for writing
    cache/<name>.pack   a store in object storage only (``backend.py``): the bounded cache
                        of packs the bucket holds (``cache.py``); ``packs/`` then holds the
                        packs captured here until a durable generation names them

Reads go through ``reader.py`` (:meth:`Store.read_many`, :meth:`Store.pin`), writes through a
:class:`~sprite_env.store.writer.StoreWriter` (``writer.py``). A pack published but not
committed is an orphan, deleted at the next writable open.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sprite_env import privacy
from sprite_env.errors import CorruptPack, NotAStore, StoreError, StoreLocked
from sprite_env.ids import ObjectId, PackName
from sprite_env.store.catalog import (
    Catalog,
    Located,
    PackRow,
    delete_objects_past,
    delete_packs,
    open_for_repair,
)
from sprite_env.store.pack import (
    ENTRY,
    TARGET_PACK_SIZE,
    Entry,
    _fsync_dir,
    pack_path,
)
from sprite_env.store.reader import LocalPacks, PackFiles, PackPin, read_entries
from sprite_env.store.writer import StoreWriter

if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Callable, Iterable, Sequence

    #: Called inside the transaction that forgets lost packs, with the lost object ids.
    LostHook = Callable[[sqlite3.Connection, set[ObjectId]], None]

log = logging.getLogger(__name__)

FORMAT = 1
MARKER = "sprite-store.json"
_MAX_OPEN_PACKS = 64
#: Ids per catalog query of :meth:`Store.locate_many` (SQLite allows 32,766 parameters).
LOCATE_BATCH = 500


class RemoteSource(Protocol):
    """A store's packs in object storage, behind a bounded local cache (``cache.py``'s
    ``RemotePacks``; made by ``backend.py``). The store reads a pack it does not hold in
    ``packs/`` through it, and asks it before calling a pack lost. Never deletes anything
    in the bucket."""

    #: The bucket (``remote.ObjectStorage``): what a push uploads to.
    storage: Any
    #: The cache's directory (``<store>/cache``): ``<name>.pack`` files.
    dir: str
    #: Called (under the cache's lock) with each pack the bound evicts: the store drops
    #: its idle descriptor, else the unlinked file would keep its disk space.
    on_evict: Callable[[PackName], None] | None

    def open(self, name: PackName) -> int:
        """A descriptor of the pack's cache entry, fetched on a miss.

        Raises:
            FileNotFoundError: the bucket has no such pack.
        """
        ...

    def size(self, name: PackName) -> int | None:
        """Its size in the cache, else in the bucket's listing; None: in neither."""
        ...

    def refresh(self) -> None:
        """Forgets the bucket's listing (the next :meth:`size` lists again)."""
        ...

    def cached(self) -> list[PackName]:
        """The packs in the cache."""
        ...

    def adopt(self, name: PackName, path: str) -> None:
        """Moves a local pack file durable in the bucket into the bounded cache."""
        ...

    def discard(self, name: PackName) -> None:
        """Drops the pack's cache entry (local only)."""
        ...

    def download(self, name: PackName, dest: str) -> None:
        """The bucket's bytes of the pack into a new file, unverified and uncached."""
        ...

    def prefetch(self, names: Iterable[PackName]) -> None:
        """Fetches those of the packs not cached, several at once."""
        ...

    def open_entries(self, name: PackName, spans: list[tuple[int, int]]) -> int | None:
        """A private descriptor of just ``spans`` of the pack, or None (open it whole)."""
        ...


class _LocalThenRemote:
    """The :class:`~sprite_env.store.ports.PackOpener` of a store in object storage:
    ``packs/`` (captured here; not yet durable in the bucket), else the bucket through
    its cache. A pack moving from one to the other (:meth:`Store.packs_durable`) is a
    rename made under the cache's lock, so an open finds it in one of the two."""

    def __init__(self, packs_dir: str, remote: RemoteSource) -> None:
        self.local = LocalPacks(packs_dir)
        self.remote = remote

    def open(self, name: PackName) -> int:
        try:
            return self.local.open(name)
        except FileNotFoundError:
            return self.remote.open(name)

    def open_entries(self, name: PackName, spans: list[tuple[int, int]]) -> int | None:
        """Only ``spans`` of a pack in the bucket (``RemotePacks.open_entries``); None for
        one in ``packs/`` (read here, whole) or not worth reading by range."""
        if os.path.exists(pack_path(self.local.packs_dir, name)):
            return None
        return self.remote.open_entries(name, spans)

    def prefetch(self, names: Iterable[PackName]) -> None:
        """The bucket's packs among ``names`` fetched at once (``PackFiles.prefetch``)."""
        here = self.local.packs_dir
        self.remote.prefetch([n for n in names if not os.path.exists(pack_path(here, n))])


@dataclass(frozen=True, slots=True)
class LostPack:
    """A pack whose file is gone (``size`` None) or shorter than its catalog row says."""

    pack: PackRow
    size: int | None


class Store:
    """An open store. Use :func:`open_store`.

    Thread-safe for reads; writes go through :meth:`writer`.
    """

    def __init__(
        self,
        path: str,
        *,
        create: bool,
        writable: bool,
        repair: bool = False,
        remote: RemoteSource | None = None,
    ) -> None:
        self.path = os.path.abspath(path)
        #: Where the packs not in ``packs/`` are (None: a local store, they are nowhere).
        self.remote = remote
        self.writable = writable
        self.packs_dir = os.path.join(self.path, "packs")
        self.tmp_dir = os.path.join(self.path, "tmp")
        self._lock_fd = -1
        #: The packs' read descriptors, shared by every reader of this store.
        self.pack_files = PackFiles(
            LocalPacks(self.packs_dir)
            if remote is None
            else _LocalThenRemote(self.packs_dir, remote)
        )
        if remote is not None:
            remote.on_evict = self.pack_files.forget
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
        """Deletes the local files of packs the catalog does not list. Only local files:
        with a remote, cache entries of such packs go too, and the bucket is never touched
        (its packs are freed by the remote's own collection, after a durable generation
        drops them)."""
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
        if self.remote is not None:
            for name in self.remote.cached():
                if name not in known:
                    self.remote.discard(name)

    def close(self) -> None:
        self.pack_files.close()
        self.catalog.close()
        self._release_lock()

    # -- reading -----------------------------------------------------------------------

    def forget_pack(self, name: PackName) -> None:
        """Drops a cached fd of a pack about to be deleted (it closes when its reader ends),
        and its local cache entry if the store has a remote (the bucket's copy stays)."""
        self.pack_files.forget(name)
        if self.remote is not None:
            self.remote.discard(name)

    def packs_durable(self, names: Iterable[str]) -> None:
        """Says that a generation naming these packs is durable in the bucket: their files
        in ``packs/`` move into the bounded cache, which may evict them (a no-op for a
        local store). Called by ``remote.push`` after the generation's PUT answered."""
        if self.remote is None:
            return
        for name in names:
            path = pack_path(self.packs_dir, name)
            try:
                self.remote.adopt(PackName(name), path)
            except FileNotFoundError:  # in the bucket only, or already moved
                continue

    @property
    def storage(self) -> Any:
        """The bucket (``remote.ObjectStorage``) of a store in object storage, else None."""
        return None if self.remote is None else self.remote.storage

    def read(self, oid: ObjectId) -> bytes:
        """Returns an object's raw bytes, verified against its id (see :meth:`read_many`)."""
        return self.read_many([oid])[0]

    def read_many(self, oids: Sequence[ObjectId]) -> list[bytes]:
        """Returns the objects' raw bytes, in the order given: one catalog query per
        ``LOCATE_BATCH`` ids, then one ``pread`` per run of objects that lie together in a
        pack (``store/reader.py``).

        Raises:
            ObjectNotFound: the catalog has no such object.
            CorruptPack: a pack is missing (and the object did not move), truncated, or its
                bytes do not decode/hash (the object is then added to :attr:`damaged`).
        """
        with PackPin(self, oids) as pin:
            return pin.read_many(oids)

    def pin(self, oids: Iterable[ObjectId]) -> PackPin:
        """A reader of ``oids`` that keeps working after a delete and prune removed them,
        until closed; use it as a context manager (see ``store/reader.py``).

        Raises:
            ObjectNotFound: one of them is not in the catalog.
            CorruptPack: a pack is missing.
        """
        return PackPin(self, oids)

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
            slot = self.pack_files.acquire(pack)
        except FileNotFoundError:
            raise CorruptPack(pack, None, "pack file is missing") from None
        except OSError as e:
            raise StoreError(f"cannot open pack {pack}: {e}") from None
        try:
            return read_entries(pack, slot.fd, [entry], verify=verify, damaged=self.damaged)[0]
        finally:
            self.pack_files.release(slot)

    # -- lost packs --------------------------------------------------------------------

    def lost_packs(self) -> list[LostPack]:
        """Packs the catalog lists whose file is gone or shorter than the catalog says (one
        ``stat`` per pack: cheap next to a capture). With a remote, a pack the bucket (or
        the cache) holds whole is not lost, wherever its local file is.

        Nothing in the store's own protocol leaves such a pack: a pack file is durable
        before its row commits, a pack leaves ``packs/`` only once the bucket has it, and
        a prune deletes the row before the file. So this is data loss, and the objects
        past the file's end can never be read again.

        A bucket that cannot be listed counts as holding every pack it is asked about
        (logged): only proof of a loss makes one.
        """
        packs = self.catalog.packs()
        out = self._short(packs)
        if out and self.remote is not None:  # the listing may be old: ask the bucket again
            self.remote.refresh()
            out = self._short([lp.pack for lp in out])
        return out

    def _short(self, packs: Iterable[PackRow]) -> list[LostPack]:
        out = []
        for p in packs:
            size = self._pack_size(p)
            if size is None or size < p.size:
                out.append(LostPack(p, size))
        return out

    def _pack_size(self, p: PackRow) -> int | None:
        """The size of the pack's best copy: its file in ``packs/``, else (with a remote)
        its cache entry or the bucket's object; None if there is none (the catalog's
        size if the bucket cannot be asked).
        """
        try:
            size: int | None = os.stat(pack_path(self.packs_dir, p.name)).st_size
        except FileNotFoundError:
            size = None
        if self.remote is not None and (size is None or size < p.size):
            try:
                there = self.remote.size(p.name)
            except StoreError as e:
                # A bucket that does not answer now proves no loss: a capture must not
                # forget objects (or fail) because the network is down.
                log.warning(
                    "store %s: cannot ask the bucket about pack %s: %s", self.path, p.name, e
                )
                return p.size
            if there is not None and (size is None or there > size):
                size = there
        return size

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
                size = self._pack_size(p)
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
    path: str,
    *,
    create: bool = False,
    writable: bool = True,
    repair: bool = False,
    remote: RemoteSource | None = None,
) -> Store:
    """Opens (or creates) the store at ``path``; use the result as a context manager.

    Args:
        path: the store directory.
        create: create the store if ``path`` is missing or an empty directory.
        writable: take the writer lock (else a shared lock, read-only catalog).
        repair: open for ``rebuild``: keep packs the catalog does not list, and accept a
            missing catalog.
        remote: the store's packs in object storage (``backend.open_backed_store`` gives
            it); None: a local store.

    Raises:
        NotAStore: ``path`` is not a store (and ``create`` is false or it is not empty),
            or it is of a newer format.
        StoreLocked: another process has it open for writing (or, when ``writable``, at
            all).
    """
    return Store(path, create=create, writable=writable, repair=repair, remote=remote)
