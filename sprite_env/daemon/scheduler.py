"""The auto-checkpoint timer.

The timer only says "it is time"; the daemon's callback decides whether the layer changed
enough to take an automatic checkpoint, takes it, and applies retention. Time comes from
trio alone (``trio.current_time``/``trio.sleep_until``), so tests drive it with
``trio.testing.MockClock``.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import trio

from sprite_env.errors import SpriteError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

#: The reason passed to the callback on each tick.
REASON = "scheduled"


async def run_scheduler(
    take: Callable[[str], Awaitable[object]],
    *,
    interval: float,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Calls ``await take("scheduled")`` every ``interval`` seconds, forever.

    Ticks keep to a fixed rate from the start (``interval``, ``2 * interval``, ...). A tick
    whose ``take`` runs past the next one's time (a checkpoint queued behind a long
    restore) skips the missed ticks instead of firing them back to back.

    Args:
        take: the daemon's callback; its result is ignored.
        interval: seconds between ticks; ``<= 0`` disables the timer.
        task_status: for ``nursery.start``; started at once.

    Raises:
        ValueError: ``interval`` is NaN.

    Error handling:
        An exception from ``take`` is logged as a warning and the timer carries on: one
        failed auto checkpoint must not bring the daemon down.

    Cancellation:
        Cancelling the task stops the timer, during the sleep or inside ``take``.
    """
    if math.isnan(interval):
        raise ValueError("scheduler interval is NaN")
    task_status.started()
    if interval <= 0:
        return
    deadline = trio.current_time() + interval
    while True:
        await trio.sleep_until(deadline)
        try:
            await take(REASON)
        except Exception as exc:  # trio.Cancelled is a BaseException: it passes through
            # Our own errors explain themselves; anything else needs its traceback.
            log.warning(
                "scheduled checkpoint failed: %s", exc, exc_info=not isinstance(exc, SpriteError)
            )
        deadline += interval
        now = trio.current_time()
        if deadline < now:  # ticks missed while take ran: skip them, keep to the grid
            deadline += math.ceil((now - deadline) / interval) * interval
