"""The view's LRU of loaded values: bounds, single flight, errors, cancellation."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from sprite_env.fuse.cache import AsyncLru
from sprite_env.fuse.workers import Workers

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def workers() -> Iterator[Workers]:
    w = Workers(4)
    yield w
    w.close()


def _lru(workers: Workers, max_bytes: int = 100) -> AsyncLru[str, bytes]:
    return AsyncLru(max_bytes, len, workers)


def test_concurrent_misses_of_one_key_load_it_once(workers: Workers) -> None:
    calls: list[list[str]] = []
    gate = threading.Event()

    def load(keys: list[str]) -> list[bytes]:
        calls.append(keys)
        gate.wait(5)
        return [k.encode() * 2 for k in keys]

    async def main() -> list[dict[str, bytes]]:
        lru = _lru(workers)
        results: list[dict[str, bytes]] = []

        async def get(keys: list[str]) -> None:
            results.append(await lru.get_many(keys, load))

        async with trio.open_nursery() as n:
            n.start_soon(get, ["a", "b"])
            await trio.testing.wait_all_tasks_blocked()
            n.start_soon(get, ["b", "c"])  # b is in flight: only c is loaded here
            await trio.testing.wait_all_tasks_blocked()
            gate.set()
        assert lru.misses == 3
        return results

    results = trio.run(main)
    assert sorted(map(sorted, calls)) == [["a", "b"], ["c"]]
    assert {k: v for r in results for k, v in r.items()} == {"a": b"aa", "b": b"bb", "c": b"cc"}


def test_least_recently_used_values_go_first_and_huge_ones_are_not_kept(
    workers: Workers,
) -> None:
    async def main() -> None:
        lru = _lru(workers, max_bytes=10)
        for key in ("a", "b", "c"):
            await lru.get(key, lambda key=key: key.encode() * 3)  # type: ignore[misc]
        assert lru.peek("a") == b"aaa"  # a is now the most recent
        await lru.get("d", lambda: b"dddd")
        assert lru.peek("b") is None
        assert lru.peek("a") == b"aaa"
        assert lru.peek("d") == b"dddd"
        assert lru.bytes == 10
        assert await lru.get("big", lambda: b"x" * 11) == b"x" * 11
        assert lru.peek("big") is None
        assert lru.bytes == 10

    trio.run(main)


def test_an_error_reaches_every_waiter_and_nothing_is_cached(workers: Workers) -> None:
    gate = threading.Event()

    def fail(keys: list[str]) -> list[bytes]:
        gate.wait(5)
        raise OSError("disk gone")

    async def main() -> None:
        lru = _lru(workers)
        errors: list[BaseException] = []

        async def get() -> None:
            try:
                await lru.get_many(["k"], fail)
            except OSError as e:
                errors.append(e)

        async with trio.open_nursery() as n:
            n.start_soon(get)
            await trio.testing.wait_all_tasks_blocked()
            n.start_soon(get)
            await trio.testing.wait_all_tasks_blocked()
            gate.set()
        assert [str(e) for e in errors] == ["disk gone", "disk gone"]
        assert "k" not in lru
        assert await lru.get("k", lambda: b"v") == b"v"

    trio.run(main)


def test_a_load_whose_caller_was_cancelled_still_lands_in_the_cache(workers: Workers) -> None:
    gate = threading.Event()

    def load(keys: list[str]) -> list[bytes]:
        gate.wait(5)
        return [b"v"]

    async def main() -> None:
        lru = _lru(workers)
        async with trio.open_nursery() as n:
            caller = trio.CancelScope()

            async def get() -> None:
                with caller:
                    await lru.get_many(["k"], load)  # returns: the load was not abandoned
                    await trio.lowlevel.checkpoint()  # the cancellation lands here
                    pytest.fail("not cancelled")

            n.start_soon(get)
            await trio.testing.wait_all_tasks_blocked()
            caller.cancel()
            await trio.sleep(0.05)
            assert "k" in lru  # still loading: the thread cannot be stopped
            gate.set()
        assert caller.cancelled_caught
        assert lru.peek("k") == b"v"

    trio.run(main)


@pytest.mark.parametrize("n", [0, 1, 5])
def test_get_many_of_cached_keys_needs_no_thread(workers: Workers, n: int) -> None:
    async def main() -> None:
        lru = _lru(workers)
        keys = [str(i) for i in range(n)]
        await lru.get_many(keys, lambda ks: [k.encode() for k in ks])
        got = await lru.get_many(keys, lambda ks: pytest.fail("loaded again"))
        assert got == {k: k.encode() for k in keys}
        assert lru.hits == n

    trio.run(main)
