"""The pacer admits everything at rest and a bounded rate while a job runs (MockClock)."""

from __future__ import annotations

import trio
import trio.testing

from sprite_env.api.pacing import Pacer


def _run(busy: bool, n: int) -> float:
    async def main() -> float:
        p = Pacer(lambda: busy, rate=100.0, burst=10)
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(p.admit)
        return trio.current_time() - start

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_at_rest_nothing_waits() -> None:
    assert _run(False, 1000) == 0


def test_while_busy_the_rate_is_bounded() -> None:
    took = _run(True, 210)  # 10 at once (the burst), then 200 at 100 per second
    assert 1.95 <= took <= 2.05


def test_admission_resumes_at_once_when_the_job_ends() -> None:
    async def main() -> float:
        state = {"busy": True}
        p = Pacer(lambda: state["busy"], rate=1.0, burst=1)
        await p.admit()  # the burst

        async def end_job() -> None:
            await trio.sleep(0.5)
            state["busy"] = False

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(end_job)
            await p.admit()  # would wait 1 s; the job ends after 0.5 s
        return trio.current_time() - start

    took = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert took <= 1.0
