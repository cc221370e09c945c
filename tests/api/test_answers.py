"""List and info answers are read once per change and never outlive it (issue 12, point 4).

In-process: :class:`~sprite_env.daemon.answers.AnswerCache` shares one read among the
requests that wait for it, never keeps a read begun before a change, and rebuilds what
it was asked to after each change. Then a real daemon polled from a thread throughout:
after every create, restore and delete, the first list and info answers show the change
(ids, the active checkpoint, ``unique_bytes`` that a delete moves to another checkpoint).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
import trio

from sprite_env.daemon.answers import AnswerCache
from tests.helpers.daemon import write_file

KiB = 1024


def test_one_read_serves_every_request_waiting_for_it() -> None:
    release = threading.Event()

    def read() -> str:
        release.wait(10)
        return "rows"

    async def main() -> tuple[list[str], int]:
        cache = AnswerCache()
        got: list[str] = []

        async def ask() -> None:
            got.append(await cache.get(("rows",), read))

        async with trio.open_nursery() as nursery:
            for _ in range(20):
                nursery.start_soon(ask)
            await trio.sleep(0.2)  # all 20 are waiting: one read is under way
            release.set()
        got.append(await cache.get(("rows",), read))  # kept: no read
        return got, cache.reads

    got, reads = trio.run(main)
    assert got == ["rows"] * 21
    assert reads == 1


def test_a_read_begun_before_a_change_is_never_kept_nor_waited_for() -> None:
    old_may_end = threading.Event()
    truth = {"value": "old"}

    def read() -> str:
        value = truth["value"]
        if value == "old":
            old_may_end.wait(10)
        return value

    async def main() -> tuple[str, str, str, int]:
        cache = AnswerCache()
        out: dict[str, str] = {}

        async def early() -> None:
            out["early"] = await cache.get(("k",), read)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(early)
            await trio.sleep(0.1)  # its read has the old state and is blocked
            truth["value"] = "new"
            cache.clear()
            # After the change: not the blocked read's answer, and no wait for it.
            with trio.fail_after(5):
                late = await cache.get(("k",), read)
            old_may_end.set()
        again = await cache.get(("k",), read)
        return out["early"], late, again, cache.reads

    early, late, again, reads = trio.run(main)
    assert early == "old"  # its own caller began before the change
    assert late == "new"
    assert again == "new"  # the old read, ending last, was not kept over the new one
    assert reads == 2


def test_a_value_derived_from_an_older_generation_is_not_kept() -> None:
    async def main() -> tuple[str, str]:
        cache = AnswerCache()
        since = cache.generation
        cache.clear()  # a change between reading the inputs and deriving from them
        first = await cache.get(("list",), lambda: "derived from old rows", since=since)
        second = await cache.get(("list",), lambda: "derived from new rows")
        return first, second

    assert trio.run(main) == ("derived from old rows", "derived from new rows")


def test_rebuilt_keys_are_read_again_right_after_a_change() -> None:
    state = {"n": 0}

    def read() -> int:
        state["n"] += 1
        return state["n"]

    async def main() -> tuple[int, int, int, int]:
        cache = AnswerCache()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cache.run)
            first = await cache.rebuilt(("rows",), read)
            cache.clear()
            with trio.fail_after(5):
                # no request: the background rebuild reads it (in a worker thread)
                while cache.reads < 2:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            await trio.sleep(0.05)
            reads_before = cache.reads
            second = await cache.get(("rows",), read)  # ready: no read of its own
            nursery.cancel_scope.cancel()
        return first, second, reads_before, cache.reads

    first, second, reads_before, reads_after = trio.run(main)
    assert (first, second) == (1, 2)
    assert reads_before == reads_after == 2


@pytest.mark.integration
def test_list_and_info_show_every_change_at_once(daemon_factory: Any) -> None:
    d = daemon_factory("--no-view")
    stop = threading.Event()
    polled = {"n": 0}

    def poll() -> None:  # keeps the answers cached during every job
        while not stop.is_set():
            d.json("GET", "/v1/checkpoints")
            d.json("GET", "/v1/checkpoints?include_auto=true")
            d.json("GET", "/v1/checkpoints/v0")
            polled["n"] += 1

    def rows() -> dict[str, dict[str, Any]]:
        status, cps = d.json("GET", "/v1/checkpoints?include_auto=true")
        assert status == 200
        return {c["id"]: c for c in cps}

    def info(cid: str) -> tuple[int, Any]:
        return d.json("GET", f"/v1/checkpoints/{cid}")

    write_file(os.path.join(d.root, "shared.bin"), os.urandom(16 * KiB))
    d.create("v0")
    poller = threading.Thread(target=poll)
    poller.start()
    try:
        assert rows()["v0"]["is_active"]
        write_file(os.path.join(d.root, "data.bin"), os.urandom(200 * KiB))
        d.create("v1")
        d.create("v2")  # shares v1's data.bin: neither holds it alone
        now = rows()
        assert set(now) == {"v0", "v1", "v2"}
        assert [c["id"] for c in d.json("GET", "/v1/checkpoints")[1]] == ["v2", "v1", "v0"]
        assert now["v2"]["is_active"]
        assert not now["v1"]["is_active"]
        assert now["v1"]["unique_bytes"] < 8 * KiB
        assert info("v1")[1] == now["v1"]
        history = d.json("GET", "/v1/checkpoints?history=v1")[1]
        assert [c["id"] for c in history] == ["v2", "v1"]

        write_file(os.path.join(d.root, "after-v2"), b"kept by the undo checkpoint")
        status, events = d.stream("POST", "/v1/checkpoints/v1/restore", {})
        assert events[-1]["type"] == "complete", events
        undo = events[-1]["undo"]
        now = rows()
        assert now["v1"]["is_active"]
        assert not now["v2"]["is_active"]
        assert undo in now
        assert now[undo]["is_auto"]
        assert undo not in {c["id"] for c in d.json("GET", "/v1/checkpoints")[1]}
        assert info("v2")[1]["is_active"] is False

        status, events = d.json("DELETE", "/v1/checkpoints/v2")
        assert status == 200, events
        now = rows()
        assert "v2" not in now
        assert info("v2")[0] == 404
        # v2 gone, only v1 and the undo checkpoint (same layer) hold data.bin now
        assert now["v1"]["unique_bytes"] < 8 * KiB or now[undo]["unique_bytes"] < 8 * KiB
        status, _ = d.json("DELETE", f"/v1/checkpoints/{undo}")
        assert status == 200
        now = rows()
        assert set(now) == {"v0", "v1"}
        assert now["v1"]["unique_bytes"] >= 200 * KiB  # v1 alone holds data.bin now
        assert info("v1")[1] == now["v1"]
    finally:
        stop.set()
        poller.join(30)
    assert polled["n"] > 0
