"""The daemon's read answers (list, info), each built once per change of the checkpoints.

Only a job (or the uploader marking checkpoints remote) changes what list and info
answer, so an answer is kept until the next change, and :meth:`AnswerCache.clear` is
called on every one. Two things matter while clients poll:

- **One read per change, however many ask.** A request that finds no answer waits for
  the read already under way for it, if any, instead of starting its own. Measured
  before (``benchmarks/bench_daemon.py``, small layer, 20 client threads): after every
  job the 20 requests in flight each computed the listing (``unique_bytes`` walks every
  checkpoint's trees: 0.2-1 s of the interpreter each), the first answers took 11 s and
  a create running meanwhile took 2x as long.
- **Built again right after a change.** A key asked for with ``rebuild=True`` (the
  listing every answer is cut from) is read again in the background as soon as it is
  cleared, so the next request usually finds it ready rather than paying for it.

Never stale: a read that began before a change is never kept after it (the generation
it began in is compared at its end), and a change drops the reads under way, so a
request arriving after the change never waits for an answer begun before it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, TypeVar

import trio

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger(__name__)

T = TypeVar("T")
Key = tuple[object, ...]

#: Answers kept at once (list variants and one per checkpoint asked about); past this
#: the cache starts over (the daemon keeps at most a few hundred checkpoints).
MAX_ANSWERS = 1024


class AnswerCache:
    """Values by key, valid until :meth:`clear`; see the module docstring."""

    def __init__(self, max_answers: int = MAX_ANSWERS) -> None:
        self.max_answers = max_answers
        #: Bumped by every :meth:`clear`: a value read in an older generation is not kept.
        self.generation = 0
        #: Reads run so far (tests count them).
        self.reads = 0
        self._values: dict[Key, Any] = {}
        self._reading: dict[Key, trio.Event] = {}
        self._rebuild: dict[Key, Callable[[], Any]] = {}
        self._stale = trio.Event()
        #: Called with the new generation by every :meth:`clear`, in the same step (the
        #: front process drops the answers it repeats).
        self.on_clear: list[Callable[[int], None]] = []

    def clear(self) -> None:
        """Drops every answer (the checkpoints changed); reads under way are not kept."""
        self.generation += 1
        self._values.clear()
        self._reading.clear()
        self._stale.set()
        for callback in self.on_clear:
            callback(self.generation)

    async def get(self, key: Key, read: Callable[[], T], *, since: int | None = None) -> T:
        """The value of ``key``: kept, or being read by another request (then waited
        for), or read now by ``read`` in a worker thread.

        Args:
            key: what is asked (equal keys share one value).
            read: computes the value (in a worker thread).
            since: the generation ``read``'s inputs come from, when it derives the value
                from another one (default: now); the value is kept only if no change
                happened since then.
        """
        while True:
            if key in self._values:
                return self._values[key]  # type: ignore[no-any-return]
            pending = self._reading.get(key)
            if pending is None:
                break
            await pending.wait()  # then kept, or the read failed or was overtaken: again
        generation = self.generation if since is None else since
        done = trio.Event()
        self._reading[key] = done
        try:
            self.reads += 1
            value = await trio.to_thread.run_sync(read)
        finally:
            if self._reading.get(key) is done:
                del self._reading[key]
            done.set()
        if generation == self.generation:
            if len(self._values) >= self.max_answers:
                self._values.clear()
            self._values[key] = value
        return value

    async def rebuilt(self, key: Key, read: Callable[[], T]) -> T:
        """:meth:`get`, and read again in the background after every later change."""
        self._rebuild[key] = read
        return await self.get(key, read)

    async def run(self) -> None:
        """Reads the ``rebuilt`` keys again after each change, until cancelled (a read
        under way is finished first: it runs in a worker thread)."""
        while True:
            await self._stale.wait()
            self._stale = trio.Event()
            for key, read in list(self._rebuild.items()):
                try:
                    await self.get(key, read)
                except Exception as e:  # the next request reads it again and answers the error
                    log.debug("rebuilding %r: %s", key, e)
