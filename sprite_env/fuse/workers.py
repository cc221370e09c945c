"""A fixed pool of worker threads for the view's blocking store calls, awaited from trio.

Why not ``trio.to_thread.run_sync`` with a ``CapacityLimiter``: trio's threads end after
10 s idle and new ones start with the next burst, and each thread that looks an object up
opens its own SQLite connection (``Catalog._reader``), which lives as long as the catalog.
A view that serves bursts for days would pile up connections (three file descriptors
each). The threads of this pool live as long as the view, so the connections are bounded
by its size; the pool's size is also the bound on concurrent loads.

The calls themselves (``pread``, zstd, BLAKE3, SQLite) release the GIL, so the workers
use every core while the trio thread answers the kernel.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

import trio

if TYPE_CHECKING:
    from collections.abc import Callable
    from concurrent.futures import Future

T = TypeVar("T")


class Workers:
    """Worker threads; :meth:`run` awaits a call made in one of them.

    Args:
        threads: how many (and so how many calls run at once; more wait in a queue).
    """

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="sprite-fuse")

    async def run(self, fn: Callable[[], T]) -> T:
        """Runs ``fn()`` in a worker thread and returns its result (or raises its error).

        Cancellation:
            Like ``trio.to_thread.run_sync``, the call is waited for (shielded), since a
            thread cannot be stopped; it is short (one object, or one batch of objects).
        """
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()

        def wake(_future: Future[T]) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(done.set)

        future = self._pool.submit(fn)
        future.add_done_callback(wake)
        with trio.CancelScope(shield=True):
            await done.wait()
        return future.result()

    def close(self) -> None:
        """Waits for the calls in progress; drops those not started."""
        self._pool.shutdown(wait=True, cancel_futures=True)
