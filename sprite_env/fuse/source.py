"""Where the view gets its checkpoints and objects: the :class:`CheckpointSource` protocol.

The view never opens a store itself. A host hands it a source: the daemon (or a test) the
one of its own :class:`~sprite_env.checkpoints.Engine` (:meth:`StoreSource.from_engine`),
so checkpoints created and deleted through that engine show up in the mount at once; the
standalone ``checkpoints mount`` command one over a store it opened read-only.

Pinning. A checkpoint can be deleted, and its objects pruned, while one of its files is
open. :meth:`CheckpointSource.pin` resolves a file's objects to their pack and offset when
the file is opened and keeps a descriptor of each pack involved: on Linux an unlinked file
stays readable through a descriptor opened before the unlink, and packs are immutable, so
the open file reads the same bytes after a prune dropped its objects from the catalog or
moved them to a new pack. The descriptors are shared between the open files of the
source (one per pack, reference-counted) and closed with the last file that uses them; the
pack's disk space is freed then (see ``store/prune.py``, "Readers and deleted packs").
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sprite_env.checkpoints.registry import Registry
from sprite_env.errors import CorruptPack, ObjectNotFound, StoreError
from sprite_env.store import codec
from sprite_env.store.pack import ENTRY, ENTRY_MAGIC, pack_path

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

    from sprite_env.checkpoints import Engine
    from sprite_env.ids import ObjectId, PackName
    from sprite_env.store import Store
    from sprite_env.store.catalog import Located
    from sprite_env.store.pack import Entry


#: Objects this close in a pack are read together (the bytes between are read and dropped).
MAX_GAP = 64 << 10
#: One read covers at most this much of a pack.
MAX_RUN = 8 << 20
#: Reads of packs up to this size go to a reused buffer (a read-ahead batch, ~1 MiB,
#: fits); larger ones get a buffer of their own ...
SCRATCH_BYTES = 2 << 20
#: ... and this many such buffers are kept.
SCRATCH_KEPT = 8


@dataclass(frozen=True, slots=True)
class CheckpointRef:
    """What the view needs to know of one checkpoint."""

    id: str
    top_tree: ObjectId  # the tree holding the root directory as its one entry b"."
    create_time_ns: int
    is_auto: bool
    files: int = 0
    bytes: int = 0


class ObjectReader(Protocol):
    """Reads a fixed set of objects until closed (see :meth:`CheckpointSource.pin`)."""

    def read_many(self, oids: Sequence[ObjectId]) -> list[bytes]:
        """The objects' raw bytes, in order; blocking, thread-safe.

        Raises:
            ObjectNotFound: one is not among the pinned objects.
            StoreError: a pack is damaged.
        """
        ...

    def close(self) -> None:
        """Lets go of the pinned objects (idempotent)."""
        ...


class CheckpointSource(Protocol):
    """The view's window on a store. Every method blocks and may be called from any thread.

    Error handling:
        Methods raise :class:`~sprite_env.errors.SpriteError` (a store error, or
        ``ObjectNotFound`` for an object that is gone); the view turns it into ``EIO``, or
        ``ESTALE`` inside a checkpoint that no longer exists.
    """

    def checkpoints(self) -> Sequence[CheckpointRef]:
        """Every checkpoint (automatic ones included), newest first."""
        ...

    def read(self, oid: ObjectId) -> bytes:
        """An object's raw bytes (trees, chunk lists)."""
        ...

    def pin(self, oids: Iterable[ObjectId]) -> ObjectReader:
        """A reader of ``oids`` that keeps working after a delete and prune removed them.

        Raises:
            ObjectNotFound: one of them is already gone.
        """
        ...


class StoreSource:
    """A :class:`CheckpointSource` over an open store and its checkpoint registry.

    Args:
        store: open writable (an engine's) or read-only; the source never writes.
        registry: the engine's registry, or None to make one over ``store``'s catalog.
    """

    def __init__(self, store: Store, registry: Registry | None = None) -> None:
        self.store = store
        self.registry = registry if registry is not None else Registry(store.catalog)
        self._packs = _SharedPackFds(store.packs_dir)

    @classmethod
    def from_engine(cls, engine: Engine) -> StoreSource:
        """The source a host that owns ``engine`` mounts: it sees the engine's changes."""
        return cls(engine.store, engine.registry)

    def checkpoints(self) -> list[CheckpointRef]:
        return [
            CheckpointRef(c.id, c.top_tree, c.create_time_ns, c.is_auto, c.files, c.bytes)
            for c in self.registry.all()
        ]

    def read(self, oid: ObjectId) -> bytes:
        return self.store.read(oid)

    def pin(self, oids: Iterable[ObjectId]) -> ObjectReader:
        return PinnedObjects(self.store, self._packs, oids)

    @property
    def open_pack_fds(self) -> int:
        """Pack descriptors held for open files (for tests and statistics)."""
        return self._packs.count()


class _SharedPackFds:
    """Read-only pack descriptors shared by the pinned readers, reference-counted."""

    def __init__(self, packs_dir: str) -> None:
        self._dir = packs_dir
        self._lock = threading.Lock()
        self._fds: dict[PackName, list[int]] = {}  # name -> [fd, users]

    def acquire(self, name: PackName) -> int:
        """A descriptor of the pack; FileNotFoundError if it is gone (pruned)."""
        with self._lock:
            slot = self._fds.get(name)
            if slot is not None:
                slot[1] += 1
                return slot[0]
        fd = os.open(pack_path(self._dir, name), os.O_RDONLY | os.O_CLOEXEC)
        with self._lock:
            slot = self._fds.get(name)
            if slot is not None:  # another thread opened it meanwhile
                os.close(fd)
                slot[1] += 1
                return slot[0]
            self._fds[name] = [fd, 1]
            return fd

    def release(self, name: PackName) -> None:
        with self._lock:
            slot = self._fds[name]
            slot[1] -= 1
            if slot[1] == 0:
                del self._fds[name]
                os.close(slot[0])

    def count(self) -> int:
        with self._lock:
            return len(self._fds)


class PinnedObjects:
    """An :class:`ObjectReader` over pack descriptors taken when it was made.

    Resolving costs one catalog query per ``LOCATE_BATCH`` objects (a 256 MiB file has
    ~3,600); reads then skip the catalog altogether.
    """

    def __init__(self, store: Store, packs: _SharedPackFds, oids: Iterable[ObjectId]) -> None:
        self._packs = packs
        self._where: dict[ObjectId, Located] = {}
        self._fds: dict[PackName, int] = {}
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
            for pack in {loc.pack for loc in where.values()}:
                if pack in self._fds:
                    continue
                try:
                    self._fds[pack] = self._packs.acquire(pack)
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
        """See :meth:`ObjectReader.read_many`; must not run concurrently with
        :meth:`close` (the view closes a file's reader only once its reads and read-aheads
        are done).

        Objects that lie one after the other in a pack (as a file's chunks usually do)
        are read with one ``pread``: one system call, and one release of the GIL, per run
        instead of per object.
        """
        locs: list[Located] = []
        for oid in oids:
            loc = self._where.get(oid)
            if loc is None:
                raise ObjectNotFound(oid)
            locs.append(loc)
        out: list[bytes] = [b""] * len(locs)
        order = sorted(range(len(locs)), key=lambda i: (locs[i].pack, locs[i].entry.offset))
        run: list[int] = []
        for i in order:
            if run:
                prev, loc = locs[run[-1]], locs[i]
                gap = loc.entry.offset - (prev.entry.offset + ENTRY.size + prev.entry.stored_len)
                span = loc.entry.offset - locs[run[0]].entry.offset
                if loc.pack != prev.pack or not 0 <= gap <= MAX_GAP or span > MAX_RUN:
                    self._read_run(run, locs, out)
                    run = []
            run.append(i)
        if run:
            self._read_run(run, locs, out)
        return out

    def _read_run(self, run: list[int], locs: list[Located], out: list[bytes]) -> None:
        first, last = locs[run[0]], locs[run[-1]]
        pack = first.pack
        fd = self._fds.get(pack, -1)
        if fd < 0:
            raise CorruptPack(pack, None, "read after close")
        start = first.entry.offset
        n = last.entry.offset + ENTRY.size + last.entry.stored_len - start
        with _read_pack(pack, fd, n, start) as buf:
            for i in run:
                out[i] = _decode(pack, buf, locs[i].entry.offset - start, locs[i].entry)

    def close(self) -> None:
        fds, self._fds = self._fds, {}
        for name in fds:
            self._packs.release(name)

    def __len__(self) -> int:
        return len(self._where)


#: Scratch buffers for reads of packs, reused (at most ``SCRATCH_KEPT`` are kept).
_scratch: list[bytearray] = []


@contextlib.contextmanager
def _read_pack(pack: PackName, fd: int, n: int, offset: int) -> Iterator[memoryview]:
    """The ``n`` bytes of a pack at ``offset``, in a reused scratch buffer if they fit:
    reading into fresh memory costs a page fault per 4 KiB, as much as the read itself (a
    1 MiB ``pread`` into new memory 0.6 ms, into reused memory 0.1 ms, bench VM). The view
    is valid inside the ``with`` block only.

    Raises:
        CorruptPack: the read failed or came short (a truncated pack).
    """
    buf = None
    try:
        if n > SCRATCH_BYTES:
            view = memoryview(os.pread(fd, n, offset))
        else:
            try:
                buf = _scratch.pop()  # atomic under the GIL, as append is
            except IndexError:
                buf = bytearray(SCRATCH_BYTES)
            with memoryview(buf) as whole:
                view = whole[: os.preadv(fd, [whole[:n]], offset)]
    except OSError as e:
        raise CorruptPack(pack, offset, f"read failed: {e}") from None
    try:
        with view:
            if len(view) != n:
                raise CorruptPack(pack, offset, "truncated object")
            yield view
    finally:
        if buf is not None and len(_scratch) < SCRATCH_KEPT:
            _scratch.append(buf)


def _decode(pack: PackName, buf: memoryview, at: int, entry: Entry) -> bytes:
    """The object whose entry starts at ``buf[at]``, checked against its catalog row and
    its id (the same checks as ``pack.read_payload`` and ``Store.read_entry``)."""
    magic, _kind, codec_, oid, slen, rlen = ENTRY.unpack_from(buf, at)
    expected = (ENTRY_MAGIC, entry.id, entry.stored_len, entry.raw_len, entry.codec)
    if (magic, oid, slen, rlen, codec_) != expected:
        raise CorruptPack(pack, entry.offset, "object header does not match the catalog")
    try:
        data = codec.decode(entry.codec, buf[at + ENTRY.size : at + ENTRY.size + slen], rlen)
    except ValueError as e:
        raise CorruptPack(pack, entry.offset, f"object {oid.hex()[:16]}: {e}") from None
    if codec.object_id(data) != entry.id:
        raise CorruptPack(pack, entry.offset, f"object {oid.hex()[:16]}: hash mismatch")
    return data
