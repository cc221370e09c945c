"""A size-bounded LRU of values loaded in worker threads (decoded objects, parsed trees).

Everything the view caches is named by content (an object id, a tree id), so an entry is
never stale and needs no invalidation; only memory bounds it. Concurrent misses of one key
share one load (a "single flight"): eight readers of one file, or a read and the
read-ahead that anticipated it, decompress each object once.

All methods run in the trio thread; only ``load`` runs in a worker thread, one of the
view's :class:`~sprite_env.fuse.workers.Workers`.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from typing import TYPE_CHECKING, Generic, TypeVar

import trio

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Sequence

    from sprite_env.fuse.workers import Workers

K = TypeVar("K", bound="Hashable")
V = TypeVar("V")


class _Flight(Generic[V]):
    __slots__ = ("done", "error", "value")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.value: V | None = None
        self.error: Exception | None = None


class AsyncLru(Generic[K, V]):
    """An LRU cache bounded by the sum of ``size(value)``.

    Args:
        max_bytes: the bound; a value larger than it is returned but not kept.
        size: the cost of a value, in bytes.
        workers: the threads that run loads.
    """

    def __init__(self, max_bytes: int, size: Callable[[V], int], workers: Workers) -> None:
        self.max_bytes = max_bytes
        self._size = size
        self._workers = workers
        self._items: OrderedDict[K, V] = OrderedDict()
        self._bytes = 0
        self._flights: dict[K, _Flight[V]] = {}
        self.hits = 0
        self.misses = 0

    @property
    def bytes(self) -> int:
        return self._bytes

    @property
    def loading(self) -> int:
        """Keys being loaded now."""
        return len(self._flights)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: K) -> bool:
        return key in self._items or key in self._flights

    def peek(self, key: K) -> V | None:
        """The cached value, or None; counts as a use."""
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    async def get(self, key: K, load: Callable[[], V]) -> V:
        """The value of ``key``, loading it with ``load()`` in a worker thread on a miss.

        See :meth:`get_many` for errors and cancellation.
        """
        got = await self.get_many([key], lambda keys: [load()])
        return got[key]

    async def get_many(self, keys: Sequence[K], load: Callable[[list[K]], list[V]]) -> dict[K, V]:
        """The values of ``keys``; the missing ones are loaded by one call of ``load``
        (given the missing keys, it returns their values in order) in a worker thread.

        One thread hand-off costs ~80 us of trio and thread machinery, as much as reading
        and decompressing a 64 KiB chunk: a read of 1 MiB loads its ~16 chunks in one.

        Error handling:
            An exception of ``load`` is raised to the caller and to every caller waiting
            for one of the same keys; nothing is cached, so the next call tries again.

        Cancellation:
            Waiting for another caller's load is cancellable; a load is not (see
            :meth:`Workers.run`), so it is cached even if its caller was cancelled. Should
            a loader leave without a value, its waiters load the values themselves.
        """
        out: dict[K, V] = {}
        waits: list[tuple[K, _Flight[V]]] = []
        todo: list[K] = []
        for key in keys:
            if key in out:
                continue
            value = self.peek(key)
            if value is not None:
                self.hits += 1
                out[key] = value
            elif key in self._flights:
                waits.append((key, self._flights[key]))
            elif key not in todo:
                todo.append(key)
        if todo:
            self.misses += len(todo)
            flights = {key: _Flight[V]() for key in todo}
            self._flights.update(flights)
            try:
                values = await self._workers.run(functools.partial(load, todo))
                for key, value in zip(todo, values, strict=True):
                    flights[key].value = value
                    self._put(key, value)
                    out[key] = value
            except Exception as e:
                for flight in flights.values():
                    flight.error = e
                raise
            finally:
                for key, flight in flights.items():
                    del self._flights[key]
                    flight.done.set()
        for key, flight in waits:
            await flight.done.wait()
            if flight.error is not None:
                raise flight.error
            if flight.value is not None:
                self.hits += 1
                out[key] = flight.value
            else:  # its loader was cancelled before it loaded: load it here
                out.update(await self.get_many([key], load))
        return out

    def discard(self, key: K) -> None:
        """Forgets a cached value (a load in flight is not affected)."""
        value = self._items.pop(key, None)
        if value is not None:
            self._bytes -= self._size(value)

    def put(self, key: K, value: V) -> None:
        """Caches a value loaded some other way (it must be the value of ``key``)."""
        self._put(key, value)

    def _put(self, key: K, value: V) -> None:
        n = self._size(value)
        if n > self.max_bytes:
            return
        old = self._items.pop(key, None)
        if old is not None:
            self._bytes -= self._size(old)
        self._items[key] = value
        self._bytes += n
        while self._bytes > self.max_bytes:
            _k, evicted = self._items.popitem(last=False)
            self._bytes -= self._size(evicted)

    def clear(self) -> None:
        self._items.clear()
        self._bytes = 0
