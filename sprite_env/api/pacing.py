"""Pacing: while a job runs, requests are admitted at a bounded rate.

The daemon is one process, and a client that polls in a tight loop (``while curl
.../jobs/7; do :; done``) takes the GIL from the job's worker threads: measured, 20 such
clients made a create ten times slower. Jobs come first, so while one runs, requests
are admitted at most ``rate`` per second (a token bucket with a small burst); each waits
its turn rather than being refused. At rest there is no limit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from collections.abc import Callable


class Pacer:
    def __init__(self, busy: Callable[[], bool], rate: float = 500.0, burst: int = 50) -> None:
        self.busy = busy
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._stamp = trio.current_time()
        self._lock = trio.Lock()  # FIFO: waiting requests are admitted in arrival order

    async def admit(self) -> None:
        if not self.busy():
            return
        async with self._lock:
            while True:
                now = trio.current_time()
                self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
                self._stamp = now
                if self._tokens >= 1 - 1e-9 or not self.busy():  # (float rounding)
                    self._tokens = max(0.0, self._tokens - 1)
                    return
                # Never less than 0.1 ms: a wait that rounds to nothing would spin.
                await trio.sleep(max((1 - self._tokens) / self.rate, 1e-4))
