"""The background uploader in-process (issue 14, point 3), over a real engine and the real
Swift: commits pushed in order, coalesced while a push runs, recorded durable in the store,
resumed after a restart. The daemon's side (API, CLI, SIGKILL, a stopped server retried
while the status says why) is ``test_upload_daemon.py``."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import trio

from sprite_env.checkpoints import Engine
from sprite_env.daemon.uploader import Uploader
from sprite_env.store import check, open_store
from sprite_env.store.remote import durable, durable_checkpoints, generations, pull
from tests.helpers import trees

if TYPE_CHECKING:
    from collections.abc import Callable

    import pytest

    from sprite_env.store.s3 import S3Storage


def _write(root: str, rel: str, data: bytes) -> None:
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


async def _until(what: Callable[[], bool]) -> None:
    """Polls ``what`` every 20 ms, for at most 30 s."""
    for _ in range(1500):
        if what():
            return
        await trio.sleep(0.02)
    raise AssertionError("not within 30 s")


class Slow:
    """The bucket, each pack's PUT held until the test lets it go (to commit meanwhile)."""

    def __init__(self, storage: S3Storage) -> None:
        self.storage = storage
        self.puts: list[str] = []
        self.gate = trio.Event()
        self.token: trio.lowlevel.TrioToken | None = None

    def __repr__(self) -> str:
        return repr(self.storage)

    def put_file(self, name: str, path: str) -> None:
        self.puts.append(name)
        if name.startswith("packs/"):
            assert self.token is not None
            trio.from_thread.run(self.gate.wait, trio_token=self.token)
        self.storage.put_file(name, path)

    def get_file(self, name: str, path: str) -> None:
        self.storage.get_file(name, path)

    def list(self, under: str) -> dict[str, int]:
        return self.storage.list(under)

    def __getattr__(self, name: str) -> Any:  # the rest (the lease's requests) unchanged
        return getattr(self.storage, name)


def test_commits_are_pushed_in_order_coalesced_and_recorded(
    storage: S3Storage, tmp_path: Any
) -> None:
    """v0 is pushed alone; v1 and v2, committed while v0's push waits on a PUT, go in one
    next push; each ends ``remote``, and the store's record says so after a reopen."""
    root, store_dir = str(tmp_path / "layer"), str(tmp_path / "store")
    trees.build_tree(root, trees.sample_spec())
    slow = Slow(storage)

    async def main() -> None:
        slow.token = trio.lowlevel.current_trio_token()
        with Engine(root, store_dir) as e:
            up = Uploader(e, slow)
            async with trio.open_nursery() as n:
                await n.start(up.run)
                await trio.to_thread.run_sync(e.create, "v0")
                up.notify()
                await _until(lambda: up.state == "uploading" and slow.puts != [])
                assert up.storage_of("v0") == "local"  # not durable while its pack waits
                for i in (1, 2):
                    _write(root, f"new/{i}", os.urandom(50_000))
                    await trio.to_thread.run_sync(e.create, f"v{i}")
                    up.notify()
                slow.gate.set()
                await _until(lambda: up.storage_of("v2") == "remote")
                await _until(lambda: up.state == "idle")
                assert [up.storage_of(c) for c in ("v0", "v1", "v2")] == ["remote"] * 3
                assert up.generation == 1
                assert up.last_error is None
                n.cancel_scope.cancel()

    trio.run(main)
    # Two pushes for three commits: the second carried both that came during the first.
    assert [g.number for g in generations(storage)] == [1, 0]
    with open_store(store_dir, writable=False) as s:
        rec = durable(s)
    assert rec is not None
    assert rec.generation == 1
    assert rec.checkpoints == {"v0", "v1", "v2"}
    pulled = str(tmp_path / "pulled")
    pull(storage, pulled)
    with Engine(root, pulled, create=False) as e:
        assert sorted(c.id for c in e.checkpoints(include_auto=True)) == ["v0", "v1", "v2"]
        assert check(e.store, read_data=True).ok
        # A fork's checkpoints are remote only once a generation of its own holds them.
        assert durable_checkpoints(e.store) == frozenset()


def test_a_restart_pushes_what_is_not_remote_and_nothing_when_all_is(
    storage: S3Storage, tmp_path: Any
) -> None:
    root, store_dir = str(tmp_path / "layer"), str(tmp_path / "store")
    trees.build_tree(root, trees.sample_spec())
    with Engine(root, store_dir) as e:
        e.create("v0")  # committed while no uploader ran (a crash, a daemon down)

    async def one_run() -> Uploader:
        with Engine(root, store_dir) as e:
            up = Uploader(e, storage)
            async with trio.open_nursery() as n:
                await n.start(up.run)
                await _until(lambda: up.state == "idle")
                n.cancel_scope.cancel()
        return up

    first = trio.run(one_run)
    assert first.storage_of("v0") == "remote"
    assert first.generation == 0
    second = trio.run(one_run)  # all is remote: no new generation
    assert second.storage_of("v0") == "remote"
    assert second.generation is None
    assert [g.number for g in generations(storage)] == [0]
    with Engine(root, store_dir) as e:
        _write(root, "later", b"v1's")
        e.create("v1")
        e.delete("v0")  # a delete is a commit the bucket must hear of too
    third = trio.run(one_run)
    assert third.generation == 1
    with open_store(store_dir, writable=False) as s:
        assert durable_checkpoints(s) == frozenset({"v1"})


class Pruning(Slow):
    """The bucket, a checkpoint deleted (and its packs pruned) at the first PUT of a push:
    a pack the push's copy names is then gone from disk."""

    def __init__(self, storage: S3Storage, prune: Callable[[], None]) -> None:
        super().__init__(storage)
        self.gate.set()
        self.prune: Callable[[], None] | None = prune

    def put_file(self, name: str, path: str) -> None:
        if self.prune is not None:
            prune, self.prune = self.prune, None
            prune()
        super().put_file(name, path)


def test_a_push_that_raced_a_prune_is_taken_again_at_once(
    storage: S3Storage, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A delete during a push unlinks a pack the push's copy named: that push fails
    (FileNotFoundError, nothing committed) and the next, with a new copy, follows at once,
    with no backoff and no error shown."""
    root, store_dir = str(tmp_path / "layer"), str(tmp_path / "store")
    _write(root, "a", os.urandom(200_000))
    with Engine(root, store_dir) as e:
        e.create("v0")
        os.unlink(os.path.join(root, "a"))
        _write(root, "b", os.urandom(200_000))
        e.create("v1")
        pruning = Pruning(storage, lambda: e.delete("v0"))

        async def main() -> Uploader:
            pruning.token = trio.lowlevel.current_trio_token()
            up = Uploader(e, pruning)
            async with trio.open_nursery() as n:
                await n.start(up.run)
                await _until(lambda: up.state == "idle")
                n.cancel_scope.cancel()
            return up

        with caplog.at_level(logging.INFO, logger="sprite_env.daemon.uploader"):
            up = trio.run(main)
        assert [c.id for c in e.checkpoints(include_auto=True)] == ["v1"]
    assert "raced a prune" in caplog.text  # the race happened, and cost no failure
    assert up.failed_total == 0
    assert up.last_error is None
    assert up.storage_of("v1") == "remote"
    assert [g.number for g in generations(storage)] == [0]  # the failed push committed none
    pulled = str(tmp_path / "pulled")
    pull(storage, pulled)
    with Engine(root, pulled, create=False) as e:
        assert [c.id for c in e.checkpoints(include_auto=True)] == ["v1"]
        assert check(e.store, read_data=True).ok
