from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from sprite_env.daemon.scheduler import run_scheduler
from sprite_env.errors import UserError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


def run(main: Callable[[], Awaitable[object]]) -> None:
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


class Recorder:
    """A fake ``take``: notes the time of each call; can fail or dawdle on chosen calls."""

    def __init__(self, fail: dict[int, Exception] | None = None, busy: float = 0) -> None:
        self.calls: list[tuple[float, str]] = []
        self.fail = fail or {}
        self.busy = busy

    async def __call__(self, reason: str) -> None:
        self.calls.append((trio.current_time(), reason))
        if self.busy:
            await trio.sleep(self.busy)
        exc = self.fail.get(len(self.calls))
        if exc is not None:
            raise exc

    @property
    def times(self) -> list[float]:
        return [t for t, _ in self.calls]


async def run_for(take: Recorder, interval: float, seconds: float) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(run_scheduler, take, interval=interval))
        await trio.sleep(seconds)
        nursery.cancel_scope.cancel()


def test_ticks_at_the_interval() -> None:
    take = Recorder()

    async def main() -> None:
        await run_for(take, 10, 45)

    run(main)
    assert take.calls == [
        (10, "scheduled"),
        (20, "scheduled"),
        (30, "scheduled"),
        (40, "scheduled"),
    ]


def test_a_failed_tick_does_not_stop_later_ones(expect_log: Callable[[str], None]) -> None:
    expect_log(r"scheduled checkpoint failed: (disk full|layer busy)")
    take = Recorder(fail={2: OSError("disk full"), 3: UserError("layer busy")})

    async def main() -> None:
        await run_for(take, 5, 26)

    run(main)
    assert take.times == [5, 10, 15, 20, 25]


def test_failure_is_logged_as_a_warning(
    caplog: pytest.LogCaptureFixture, expect_log: Callable[[str], None]
) -> None:
    expect_log("scheduled checkpoint failed")
    take = Recorder(fail={1: RuntimeError("boom")})

    async def main() -> None:
        await run_for(take, 1, 1.5)

    run(main)
    [rec] = caplog.records
    assert rec.levelname == "WARNING"
    assert rec.getMessage() == "scheduled checkpoint failed: boom"
    assert rec.exc_info is not None  # unexpected errors keep their traceback


def test_slow_take_skips_missed_ticks() -> None:
    take = Recorder(busy=25)

    async def main() -> None:
        await run_for(take, 10, 75)

    run(main)
    # 10 ends at 35: the ticks at 20 and 30 are skipped, not fired late.
    assert take.times == [10, 40, 70]


def test_cancellation_stops_it_even_inside_take() -> None:
    take = Recorder(busy=100)
    finished = False

    async def main() -> None:
        nonlocal finished
        with trio.move_on_after(50):
            await run_scheduler(take, interval=10)
        finished = True
        await trio.sleep(100)

    run(main)
    assert finished
    assert take.times == [10]


def test_cancellation_stops_further_ticks() -> None:
    take = Recorder()

    async def main() -> None:
        with trio.move_on_after(35):
            await run_scheduler(take, interval=10)
        await trio.sleep(100)

    run(main)
    assert take.times == [10, 20, 30]


@pytest.mark.parametrize("interval", [0, -1.0])
def test_non_positive_interval_never_calls(interval: float) -> None:
    take = Recorder()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(run_scheduler, take, interval=interval))
        # The nursery closed by itself: the scheduler returned at once.
        assert trio.current_time() == 0
        await trio.sleep(1000)

    run(main)
    assert take.calls == []


def test_nan_interval_is_rejected() -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="NaN"):
            await run_scheduler(Recorder(), interval=float("nan"))

    run(main)
