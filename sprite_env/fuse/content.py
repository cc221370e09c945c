"""What the view reads: directories (parsed trees) and file contents (pieces of objects).

A file's content is its list of pieces ``(object id or None for a hole, offset in the
object, length)`` (``snapshot/tree.py``). :class:`FileLayout` keeps the cumulative end
offsets next to it, so the pieces a read needs are found by bisection, whatever the file's
size. :class:`OpenFile` serves the reads of one open file: it takes the decoded objects
from the view's shared LRU (loading the missing ones in a worker thread, in one batch), and
when reads are sequential it loads the next pieces ahead of the reader, so decompression
overlaps with the copy to the kernel and runs on every core, and forgets them once they
were read (drop-behind: the kernel keeps the pages).
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sprite_env.errors import SnapshotError
from sprite_env.ids import ObjectId
from sprite_env.snapshot.tree import Kind, Piece, TreeEntry, decode_chunks, decode_tree

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    import trio

    from sprite_env.fuse.cache import AsyncLru
    from sprite_env.store.ports import PinnedReader

log = logging.getLogger(__name__)

#: Read-ahead loads this many bytes of pieces per worker-thread call.
AHEAD_BATCH = 1 << 20
#: A read starting within this distance of where the previous one ended is sequential.
SEQUENTIAL_SLACK = 4 << 20
#: Read-ahead starts once this much was read sequentially, and then stays twice as far
#: ahead as the run is long, up to ``readahead``: a random read of 64 KiB, which the kernel
#: sends as two requests, loads nothing more (measured: 3x fewer objects decoded on the
#: random-read benchmark), and a long sequential one is soon 8 MiB ahead.
AHEAD_AFTER = 256 << 10


@dataclass(frozen=True, slots=True)
class Directory:
    """A parsed tree object: entries in name order, and their positions by name."""

    entries: list[TreeEntry]
    index: dict[bytes, int]
    encoded_size: int

    @classmethod
    def parse(cls, data: bytes) -> Directory:
        entries = decode_tree(data)
        return cls(entries, {e.name: i for i, e in enumerate(entries)}, len(data))

    def get(self, name: bytes) -> TreeEntry | None:
        i = self.index.get(name)
        return None if i is None else self.entries[i]


@dataclass(frozen=True, slots=True)
class FileLayout:
    """A file's pieces and their cumulative end offsets (``ends[i]`` is where piece i ends)."""

    pieces: list[Piece]
    ends: list[int]

    @property
    def size(self) -> int:
        return self.ends[-1] if self.ends else 0

    @classmethod
    def of(cls, entry: TreeEntry, read: Callable[[ObjectId], bytes]) -> FileLayout:
        """The layout of a file entry; reads its CHUNKLIST object if it has one (blocking).

        Raises:
            SnapshotError: the pieces do not add up to the entry's size.
            StoreError: reading the chunk list failed.
        """
        if entry.kind is not Kind.FILE:
            raise ValueError("not a file")
        payload = read(ObjectId(entry.payload)) if entry.indirect else entry.payload
        pieces = decode_chunks(payload)
        ends: list[int] = []
        pos = 0
        for _oid, _off, n in pieces:
            pos += n
            ends.append(pos)
        if pos != entry.size:
            raise SnapshotError(f"chunk list covers {pos} bytes, the file has {entry.size}")
        return cls(pieces, ends)

    def objects(self) -> set[ObjectId]:
        return {oid for oid, _off, _n in self.pieces if oid is not None}

    def first_objects(self, nbytes: int) -> list[ObjectId]:
        """The distinct objects of the pieces that hold the first ``nbytes`` bytes."""
        out: list[ObjectId] = []
        for i in range(min(len(self.pieces), self.index(nbytes - 1) + 1)):
            oid = self.pieces[i][0]
            if oid is not None and oid not in out:
                out.append(oid)
        return out

    def memory(self) -> int:
        """Roughly the bytes this layout occupies (for the layout cache's budget)."""
        return 120 * len(self.pieces) + 64

    def index(self, offset: int) -> int:
        """The piece holding byte ``offset`` (``len(pieces)`` past the end)."""
        return bisect.bisect_right(self.ends, offset)

    def start(self, i: int) -> int:
        return self.ends[i - 1] if i else 0

    def assemble(self, data: Mapping[ObjectId, bytes], offset: int, end: int) -> bytes:
        """Bytes ``[offset, end)`` of the file (``end`` at most its size), from the decoded
        objects of the pieces that hold them; holes are zeros.

        Raises:
            SnapshotError: a piece lies past the end of its object.
            KeyError: ``data`` lacks one of those objects.
        """
        if offset >= end:
            return b""
        parts: list[bytes | memoryview] = []
        for i in range(self.index(offset), self.index(end - 1) + 1):
            oid, off, n = self.pieces[i]
            start = self.start(i)
            a = max(offset, start) - start
            b = min(end, start + n) - start
            if oid is None:
                parts.append(bytes(b - a))
                continue
            obj = data[oid]
            if off + n > len(obj):
                raise SnapshotError(
                    f"piece [{off}, {off + n}) of object {oid.hex()[:16]} is past its "
                    f"{len(obj)} bytes"
                )
            parts.append(memoryview(obj)[off + a : off + b])
        return b"".join(parts)


class OpenFile:
    """The reads of one open file; the file handle of the view.

    Args:
        layout: the file's pieces.
        held: decoded objects the handle keeps for its whole life (those that were in
            memory when it was opened, and its first batch): they need no store access.
        reader: the file's pinned objects, or None if ``held`` has them all; closed once
            the file is released and its last read or read-ahead is done.
        cache: the view's LRU of decoded objects.
        nursery: where read-ahead tasks run.
        readahead: bytes to load ahead of a sequential reader.
        max_ahead_tasks: read-ahead batches in flight at most.
    """

    def __init__(
        self,
        layout: FileLayout,
        held: dict[ObjectId, bytes],
        reader: PinnedReader | None,
        cache: AsyncLru[ObjectId, bytes],
        nursery: trio.Nursery,
        readahead: int,
        max_ahead_tasks: int,
    ) -> None:
        self.layout = layout
        self._held = held
        self._reader = reader
        self._cache = cache
        self._nursery = nursery
        self._readahead = readahead
        self._max_ahead = max_ahead_tasks
        self._busy = 0  # reads and read-aheads in flight
        self._released = False
        self._next_offset = 0  # where a sequential reader reads next
        self._run_bytes = 0  # bytes read sequentially since the last seek
        self._ahead_until = 0  # pieces below this index were scheduled for read-ahead
        self._ahead_tasks = 0
        self._ahead_loaded: set[ObjectId] = set()  # loaded by read-ahead, not yet read
        self._front = 0  # the sequential reader was served every byte below this
        self._served: dict[int, int] = {}  # ranges served past the front (out of order)
        self._drop_from = 0  # pieces below this index were dropped behind the reader
        self._repeats: set[ObjectId] | None = None  # objects of more than one piece

    async def read(self, offset: int, size: int) -> bytes:
        """Bytes ``[offset, offset + size)``, fewer at the end of the file.

        Raises:
            StoreError, SnapshotError: an object could not be read or does not match.
        """
        lay = self.layout
        end = min(offset + size, lay.size)
        if offset >= end:
            return b""
        first = lay.index(offset)
        last = lay.index(end - 1)
        # The kernel's own read-ahead sends several requests at once and they may arrive
        # out of order: a read near where the last one ended is still sequential.
        if abs(offset - self._next_offset) <= SEQUENTIAL_SLACK:
            self._next_offset = max(self._next_offset, end)
            self._run_bytes += end - offset
            if self._run_bytes >= AHEAD_AFTER:  # before waiting, so loads overlap this one
                self._read_ahead(last + 1, min(self._readahead, 2 * self._run_bytes))
        else:  # a seek: read-ahead starts afresh
            self._next_offset = end
            self._run_bytes = end - offset
            self._ahead_until = 0
            self._front = offset
            self._served.clear()
            self._drop_from = first
        self._busy += 1
        try:
            out = lay.assemble(await self._objects(range(first, last + 1)), offset, end)
        finally:
            self._done()
        self._drop_behind(offset, end)
        return out

    async def _objects(self, indexes: range) -> dict[ObjectId, bytes]:
        """The decoded objects of these pieces; the missing ones loaded in one batch."""
        out: dict[ObjectId, bytes] = {}
        rest: list[ObjectId] = []
        for oid, _off, _n in self.layout.pieces[indexes.start : indexes.stop]:
            if oid is None:
                continue
            data = self._held.get(oid)
            if data is not None:
                out[oid] = data
            else:
                rest.append(oid)
        if rest:
            out.update(await self._cache.get_many(rest, self._load))
        return out

    def _load(self, oids: list[ObjectId]) -> list[bytes]:
        """Runs in a worker thread."""
        if self._reader is None:  # cannot happen: a file without a reader holds everything
            raise SnapshotError("object neither held nor pinned")
        return self._reader.read_many(oids)

    def _read_ahead(self, first: int, window: int) -> None:
        """Schedules loads of the pieces from ``first`` on, up to ``window`` bytes ahead,
        in batches of about ``AHEAD_BATCH`` bytes (one thread hand-off each)."""
        lay = self.layout
        i = max(first, self._ahead_until)
        limit = lay.start(first) + window
        while i < len(lay.pieces) and lay.start(i) < limit and self._ahead_tasks < self._max_ahead:
            batch: list[ObjectId] = []
            size = 0
            while i < len(lay.pieces) and size < AHEAD_BATCH and lay.start(i) < limit:
                oid, _off, n = lay.pieces[i]
                if oid is not None and oid not in self._held and oid not in self._cache:
                    batch.append(oid)
                    size += n
                i += 1
            if batch:
                self._ahead_loaded.update(batch)
                self._busy += 1
                self._ahead_tasks += 1
                self._nursery.start_soon(self._load_ahead, batch)
        self._ahead_until = i

    async def _load_ahead(self, batch: list[ObjectId]) -> None:
        try:
            await self._cache.get_many(batch, self._load)
        except Exception as e:  # the read that needs it will load it again and report
            log.debug("read-ahead of %d objects failed: %s", len(batch), e)
        finally:
            self._ahead_tasks -= 1
            self._done()

    def _drop_behind(self, offset: int, end: int) -> None:
        """Forgets the objects read-ahead loaded once the sequential reader has read them.

        The kernel keeps the pages it was sent (``keep_cache``), so nothing asks for them
        again soon, and a long read would otherwise fill the shared cache with them,
        evicting what other files use. Keeping the memory in use small also lets the
        allocator reuse it instead of faulting in new pages: a 256 MiB ``cat`` in a fresh
        server page-faulted ~41,000 times through the 128 MiB cache, ~22,000 times with
        drop-behind (bench VM). Objects of several pieces of the file, and pieces the
        reader has read only part of, stay.
        """
        if offset > self._front:  # out of order: served, but not yet contiguous
            if len(self._served) < 64:
                self._served[offset] = max(end, self._served.get(offset, end))
            return
        front = max(self._front, end)
        while self._served:
            behind = [start for start in self._served if start <= front]
            if not behind:
                break
            for start in behind:
                front = max(front, self._served.pop(start))
        self._front = front
        stop = bisect.bisect_right(self.layout.ends, front)  # pieces read to their end
        if not self._ahead_loaded or stop <= self._drop_from:
            self._drop_from = max(self._drop_from, stop)
            return
        if self._repeats is None:
            seen: set[ObjectId] = set()
            self._repeats = set()
            for oid, _off, _n in self.layout.pieces:
                if oid is not None:
                    (self._repeats if oid in seen else seen).add(oid)
        for oid, _off, _n in self.layout.pieces[self._drop_from : stop]:
            if oid in self._ahead_loaded and oid not in self._repeats:
                self._ahead_loaded.discard(oid)
                self._cache.discard(oid)
        self._drop_from = stop

    def release(self) -> None:
        """The kernel closed the file: let go of its objects once nothing uses them."""
        self._released = True
        if self._busy == 0:
            self._close()

    def _done(self) -> None:
        self._busy -= 1
        if self._released and self._busy == 0:
            self._close()

    def _close(self) -> None:
        self._held = {}
        if self._reader is not None:
            self._reader.close()
