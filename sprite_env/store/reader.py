"""Reading objects out of packs: the one module that reads packs for their objects.

Concepts:

- :class:`PackFiles` holds the read-only descriptors of a store's packs, one per pack,
  shared by every reader of the :class:`~sprite_env.store.repository.Store` and counted by
  users. A descriptor no reader uses stays open (least recently used first out, at most
  ``MAX_IDLE``), so reading trees one by one does not open and close a pack each time; one
  in use is never closed under its reader. :meth:`PackFiles.forget` (a prune is about to
  unlink the pack) drops it from the cache and it closes with its last user; one whose
  pack another process unlinked (``st_nlink`` 0) closes with its last user too, so the
  disk space comes back.
- :func:`read_entries` reads objects of one pack: objects this close in the pack
  (``MAX_GAP``, as a file's chunks usually are) are read with one ``pread`` of at most
  ``MAX_RUN`` bytes, one system call and one release of the GIL per run instead of per
  object. Each object's header is checked by ``pack.parse_entry``, its payload decoded and
  its id re-hashed.
- :class:`PackPin` resolves a set of objects to their packs and entries once (one catalog
  query per ``LOCATE_BATCH`` ids) and holds each pack's descriptor until closed: reads
  then skip the catalog, and keep working after a prune dropped or moved the objects (on
  Linux an unlinked file stays readable through a descriptor opened before; packs are
  immutable). The view pins an open file's objects; :meth:`Store.read_many` is a pin
  held for one call.

Moved by a prune: a prune commits the objects' new places, then unlinks the old packs, so
a lookup made just before its commit may name a pack that is gone by the time it is
opened. The one retry is here (:meth:`PackPin._pin`): the objects whose pack is missing
are looked up once more, and read only if they moved; else ``CorruptPack`` ("pack file is
missing"), which is data loss (see ``Store.lost_packs``).

Damage: an object whose bytes are bad where the catalog says (cut short, a header that
does not match, a payload that does not decode or hash) is added to ``Store.damaged`` (the
next write stores it afresh) and raised as ``CorruptPack`` with its offset; a missing pack
is not damage of an object (its offset is None).

A remote backend (issue 14: packs as objects in S3-compatible storage, with a local cache)
plugs in below this module, as a :class:`~sprite_env.store.ports.PackOpener` given to
:class:`PackFiles`: ``open(name)`` returns a descriptor of a local file holding the pack's
bytes. Over object storage that file is a cache entry: fetched on a miss under a temporary
name and renamed (a pack is immutable and named by its hash, so a cached copy never goes
stale and needs no invalidation), evicted by unlinking, which readers holding a descriptor
survive exactly as they survive a prune here. A pin of a few objects of a pack not held
locally may instead get a private descriptor holding just their byte ranges
(:meth:`PackFiles.open_entries`, an opener's optional ``open_entries``: ranged GETs),
which it alone reads, and only at those objects. Everything above (lookups, coalescing,
parsing, decoding, hashing, pinning) stays as it is.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from sprite_env.errors import CorruptPack, ObjectNotFound, StoreError
from sprite_env.store import codec
from sprite_env.store.pack import ENTRY, pack_path, parse_entry

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

    from sprite_env.ids import ObjectId, PackName
    from sprite_env.store.catalog import Located
    from sprite_env.store.pack import Entry
    from sprite_env.store.ports import PackOpener
    from sprite_env.store.repository import Store

#: Idle pack descriptors kept open (in use ones are never closed under their reader).
MAX_IDLE = 64
#: Objects this close in a pack are read together (the bytes between are read and dropped).
MAX_GAP = 64 << 10
#: One read covers at most this much of a pack.
MAX_RUN = 8 << 20
#: Reads of up to this many bytes go to a reused buffer (a read-ahead batch, ~1 MiB,
#: fits); larger ones get a buffer of their own ...
SCRATCH_BYTES = 2 << 20
#: ... and this many such buffers are kept.
SCRATCH_KEPT = 8


class LocalPacks:
    """The :class:`~sprite_env.store.ports.PackOpener` of a local store: ``packs/<name>.pack``."""

    def __init__(self, packs_dir: str) -> None:
        self.packs_dir = packs_dir

    def open(self, name: PackName) -> int:
        return os.open(pack_path(self.packs_dir, name), os.O_RDONLY | os.O_CLOEXEC)


class PackSlot:
    """One open descriptor of a pack and how many readers use it (see :class:`PackFiles`)."""

    __slots__ = ("fd", "name", "users")

    def __init__(self, name: PackName, fd: int) -> None:
        self.name = name
        self.fd = fd
        self.users = 0


class PackFiles:
    """The store's pack descriptors, shared by its readers and counted by users; see the
    module docstring. Thread-safe."""

    def __init__(self, opener: PackOpener, max_idle: int = MAX_IDLE) -> None:
        self._opener = opener
        self._max_idle = max_idle
        self._lock = threading.Lock()
        self._slots: OrderedDict[PackName, PackSlot] = OrderedDict()
        self._held = 0

    def prefetch(self, names: Iterable[PackName]) -> None:
        """Lets an opener that fetches packs (a store in object storage) fetch those of
        ``names`` not open here all at once, before they are acquired one by one."""
        fetch = getattr(self._opener, "prefetch", None)
        if fetch is None:
            return
        with self._lock:
            todo = [n for n in names if n not in self._slots]
        fetch(todo)

    @property
    def ranges(self) -> bool:
        """Whether the opener reads packs by range (:meth:`open_entries` may answer)."""
        return hasattr(self._opener, "open_entries")

    def open_entries(self, name: PackName, spans: list[tuple[int, int]]) -> int | None:
        """A private descriptor holding only the pack's bytes at ``spans`` (``(offset,
        length)`` pairs), where the opener would rather fetch those than the pack (a store
        in object storage: ``RemotePacks.open_entries``); None: :meth:`acquire` it (an
        opener without ranges, a pack open here already, or too much of it wanted). The
        caller closes the descriptor and reads nothing outside ``spans``.

        Raises:
            FileNotFoundError: the pack is gone.
            OSError, StoreError: as the opener's.
        """
        fetch = getattr(self._opener, "open_entries", None)
        if fetch is None:
            return None
        with self._lock:
            if name in self._slots:
                return None
        fd: int | None = fetch(name, spans)
        return fd

    def acquire(self, name: PackName) -> PackSlot:
        """A descriptor of the pack, held until :meth:`release`.

        Raises:
            FileNotFoundError: the pack is gone (pruned, or lost).
            OSError: it could not be opened (``EMFILE``, ``EACCES``...).
        """
        with self._lock:
            slot = self._slots.get(name)
            if slot is not None:
                self._slots.move_to_end(name)
                self._take(slot)
                return slot
        fd = self._opener.open(name)
        with self._lock:
            slot = self._slots.get(name)
            if slot is not None:  # another thread opened it meanwhile
                os.close(fd)
            else:
                slot = self._slots[name] = PackSlot(name, fd)
            self._take(slot)
            self._evict()
            return slot

    def _take(self, slot: PackSlot) -> None:
        slot.users += 1
        if slot.users == 1:
            self._held += 1

    def release(self, slot: PackSlot) -> None:
        """Lets go of a descriptor from :meth:`acquire`."""
        with self._lock:
            slot.users -= 1
            if slot.users:
                return
            self._held -= 1
            cached = self._slots.get(slot.name) is slot
            if cached and os.fstat(slot.fd).st_nlink > 0:
                self._evict()
                return
            if cached:  # unlinked by another process: keep no disk space
                del self._slots[slot.name]
            os.close(slot.fd)

    @contextlib.contextmanager
    def lend(self, name: PackName) -> Iterator[int]:
        """A descriptor of the pack for the ``with`` block (see :meth:`acquire`)."""
        slot = self.acquire(name)
        try:
            yield slot.fd
        finally:
            self.release(slot)

    def _evict(self) -> None:
        if len(self._slots) <= self._max_idle:
            return
        for victim in [s for s in self._slots.values() if s.users == 0]:
            if len(self._slots) <= self._max_idle:
                break
            del self._slots[victim.name]
            os.close(victim.fd)

    def forget(self, name: PackName) -> None:
        """Drops the cached descriptor of a pack about to be deleted; one in use closes
        when its last reader lets go."""
        with self._lock:
            slot = self._slots.pop(name, None)
            if slot is not None and slot.users == 0:
                os.close(slot.fd)

    def held(self) -> int:
        """Descriptors some reader holds now (for tests and statistics)."""
        with self._lock:
            return self._held

    def close(self) -> None:
        """Closes every cached descriptor (the store is closing)."""
        with self._lock:
            for slot in self._slots.values():
                os.close(slot.fd)
            self._slots.clear()


def read_entries(
    pack: PackName,
    fd: int,
    entries: Sequence[Entry],
    *,
    verify: bool = True,
    damaged: set[ObjectId] | None = None,
    errors: dict[ObjectId, CorruptPack] | None = None,
) -> list[bytes]:
    """The raw bytes of objects of one pack, in the order given, read in coalesced runs.

    Args:
        pack: the pack's name (for errors).
        fd: a descriptor of it.
        entries: the objects' catalog rows (repeats allowed).
        verify: re-hash each object against its id.
        damaged: where to add the ids of objects whose bytes are bad.
        errors: None to raise the first error; else each bad object's error goes here
            (by id) and its place in the result is ``b""`` (``check`` reads on).

    Raises:
        CorruptPack: an object is cut short, or its header, payload or hash is wrong.
    """
    out: list[bytes] = [b""] * len(entries)
    order = sorted(range(len(entries)), key=lambda i: entries[i].offset)
    run: list[int] = []
    for i in order:
        if run:
            prev, e = entries[run[-1]], entries[i]
            gap = e.offset - (prev.offset + ENTRY.size + prev.stored_len)
            if not 0 <= gap <= MAX_GAP or e.offset - entries[run[0]].offset > MAX_RUN:
                _read_run(pack, fd, entries, run, out, verify, damaged, errors)
                run = []
        run.append(i)
    if run:
        _read_run(pack, fd, entries, run, out, verify, damaged, errors)
    return out


def _read_run(
    pack: PackName,
    fd: int,
    entries: Sequence[Entry],
    run: list[int],
    out: list[bytes],
    verify: bool,
    damaged: set[ObjectId] | None,
    errors: dict[ObjectId, CorruptPack] | None,
) -> None:
    start = entries[run[0]].offset
    last = entries[run[-1]]
    n = last.offset + ENTRY.size + last.stored_len - start
    try:
        buf, scratch = _read_pack(pack, fd, n, start)
    except CorruptPack as err:  # the read itself failed: every object of the run
        for i in run:
            _failed(entries[i], CorruptPack(pack, entries[i].offset, err.reason), damaged, errors)
        return
    try:
        for i in run:
            e = entries[i]
            try:
                out[i] = decode(pack, buf, e.offset - start, e, verify=verify)
            except CorruptPack as err:
                _failed(e, err, damaged, errors)
    finally:
        buf.release()
        if scratch is not None and len(_scratch) < SCRATCH_KEPT:
            _scratch.append(scratch)


def _failed(
    e: Entry,
    err: CorruptPack,
    damaged: set[ObjectId] | None,
    errors: dict[ObjectId, CorruptPack] | None,
) -> None:
    if damaged is not None and err.offset is not None:
        damaged.add(e.id)
    if errors is None:
        raise err
    errors.setdefault(e.id, err)


def decode(
    pack: PackName, buf: bytes | bytearray | memoryview, at: int, entry: Entry, *, verify: bool
) -> bytes:
    """The object whose entry header starts at ``buf[at]``, checked against its catalog row
    (``pack.parse_entry``) and, with ``verify``, its id.

    Raises:
        CorruptPack: cut short, a header that does not match, a payload that does not
            decode, or bytes that do not hash to the id.
    """
    payload = parse_entry(buf, at, entry, pack)
    try:
        data = codec.decode(entry.codec, payload, entry.raw_len)
    except ValueError as e:
        raise CorruptPack(pack, entry.offset, f"object {entry.id.hex()[:16]}: {e}") from None
    if verify and codec.object_id(data) != entry.id:
        raise CorruptPack(pack, entry.offset, f"object {entry.id.hex()[:16]}: hash mismatch")
    return data


#: Scratch buffers for reads of packs, reused (at most ``SCRATCH_KEPT`` are kept).
_scratch: list[bytearray] = []


def _read_pack(pack: PackName, fd: int, n: int, offset: int) -> tuple[memoryview, bytearray | None]:
    """Up to ``n`` bytes of a pack at ``offset`` (fewer at its end: ``parse_entry`` names
    the objects cut short), in a reused scratch buffer if they fit: reading into fresh
    memory costs a page fault per 4 KiB, as much as the read itself (a 1 MiB ``pread`` into
    new memory 0.6 ms, into reused memory 0.1 ms, bench VM).

    Returns:
        The bytes, and the scratch buffer they are in (None: a buffer of their own); the
        caller releases the view, then gives the buffer back to ``_scratch``.

    Raises:
        CorruptPack: the read failed.
    """
    if n > SCRATCH_BYTES:
        try:
            return memoryview(os.pread(fd, n, offset)), None
        except OSError as e:
            raise CorruptPack(pack, offset, f"read failed: {e}") from None
    try:
        buf = _scratch.pop()  # atomic under the GIL, as append is
    except IndexError:
        buf = bytearray(SCRATCH_BYTES)
    whole = memoryview(buf)
    try:
        got = os.preadv(fd, [whole[:n]], offset)
    except OSError as e:
        whole.release()
        _scratch.append(buf)
        raise CorruptPack(pack, offset, f"read failed: {e}") from None
    view = whole[:got]
    whole.release()
    return view, buf


class PackPin:
    """A :class:`~sprite_env.store.ports.PinnedReader` over pack descriptors taken when it
    was made; see the module docstring. Use :meth:`Store.pin`.

    ``read_many`` may run on several threads at once, but not concurrently with
    :meth:`close` (the view closes a file's reader only once its reads and read-aheads are
    done).

    Raises:
        ObjectNotFound: one of the objects is not in the catalog.
        CorruptPack: a pack is missing, and the objects in it did not move.
        StoreError: a pack could not be opened.
    """

    def __init__(self, store: Store, oids: Iterable[ObjectId]) -> None:
        self._files = store.pack_files
        self._damaged = store.damaged
        self._where: dict[ObjectId, Located] = {}
        self._slots: dict[PackName, PackSlot] = {}
        # Private descriptors of packs read by range (PackFiles.open_entries): only the
        # pinned objects' bytes are in them, and only those are ever read.
        self._own: dict[PackName, int] = {}
        done = False
        try:
            self._pin(store, list(dict.fromkeys(oids)))
            done = True
        finally:
            if not done:
                self.close()

    def _pin(self, store: Store, oids: list[ObjectId]) -> None:
        todo = oids
        gone: set[PackName] = set()
        for _attempt in range(2):
            where = store.locate_many(todo)
            for oid in todo:
                if oid not in where:
                    raise ObjectNotFound(oid)
            self._where.update(where)
            gone = set()
            packs = sorted({loc.pack for loc in where.values()} - self._slots.keys())
            spans: dict[PackName, list[tuple[int, int]]] = {}
            if self._files.ranges:  # (a local store's pins skip this loop)
                for loc in where.values():
                    e = loc.entry
                    spans.setdefault(loc.pack, []).append((e.offset, ENTRY.size + e.stored_len))
            whole: list[PackName] = []
            for pack in packs:
                if pack in self._own:
                    continue
                if not spans:
                    whole.append(pack)
                    continue
                try:
                    fd = self._files.open_entries(pack, spans[pack])
                except FileNotFoundError:
                    gone.add(pack)
                    continue
                except OSError as e:
                    raise StoreError(f"cannot read pack {pack}: {e}") from None
                if fd is None:
                    whole.append(pack)
                else:
                    self._own[pack] = fd
            self._files.prefetch(whole)
            for pack in whole:
                if pack in self._slots:
                    continue
                try:
                    self._slots[pack] = self._files.acquire(pack)
                except FileNotFoundError:
                    # A prune moved these objects and unlinked the pack between the
                    # lookup and the open: the next lookup gives their new place.
                    gone.add(pack)
                except OSError as e:  # EMFILE, EACCES...: the store's failure, not ours
                    raise StoreError(f"cannot open pack {pack}: {e}") from None
            if not gone:
                return
            todo = [oid for oid in todo if self._where[oid].pack in gone]
        raise CorruptPack(min(gone), None, "pack file is missing")

    def read(self, oid: ObjectId) -> bytes:
        return self.read_many([oid])[0]

    def read_many(self, oids: Sequence[ObjectId]) -> list[bytes]:
        """The objects' raw bytes, in order (see :func:`read_entries`).

        Raises:
            ObjectNotFound: one is not among the pinned objects.
            CorruptPack: a pack is damaged, or the reader is closed.
        """
        by_pack: dict[PackName, list[int]] = {}
        entries: list[Entry] = []
        for i, oid in enumerate(oids):
            loc = self._where.get(oid)
            if loc is None:
                raise ObjectNotFound(oid)
            by_pack.setdefault(loc.pack, []).append(i)
            entries.append(loc.entry)
        if len(by_pack) == 1:  # the usual case: one file's chunks, or one tree
            pack = next(iter(by_pack))
            return read_entries(pack, self._fd(pack), entries, damaged=self._damaged)
        out: list[bytes] = [b""] * len(entries)
        for pack, idx in by_pack.items():
            got = read_entries(
                pack, self._fd(pack), [entries[i] for i in idx], damaged=self._damaged
            )
            for i, data in zip(idx, got, strict=True):
                out[i] = data
        return out

    def _fd(self, pack: PackName) -> int:
        own = self._own.get(pack)
        if own is not None:
            return own
        slot = self._slots.get(pack)
        if slot is None:
            raise CorruptPack(pack, None, "read after close")
        return slot.fd

    def close(self) -> None:
        """Lets go of the packs (idempotent)."""
        slots, self._slots = self._slots, {}
        own, self._own = self._own, {}
        for slot in slots.values():
            self._files.release(slot)
        for fd in own.values():
            os.close(fd)

    def __len__(self) -> int:
        return len(self._where)

    def __enter__(self) -> PackPin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
