"""The lease against two writers on one prefix (issue 14, point 5), against the real Swift:
a second writer is refused naming the holder; two at once end with one holder; stale and
leftover locks are taken over; and two writers forced past the lease lose nothing."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import TYPE_CHECKING

import pytest

from sprite_env.checkpoints import Engine
from sprite_env.store import check, open_store
from sprite_env.store.lease import (
    LOCKS,
    Lease,
    LeaseHeld,
    LeaseLost,
    LeasePolicy,
    holders,
    open_lease,
)
from sprite_env.store.remote import generations, heads, pull, push, writer_id
from tests.helpers import trees

if TYPE_CHECKING:
    from collections.abc import Callable

    from sprite_env.store.s3 import S3Storage

QUICK = LeasePolicy(stale_after=30, refresh_every=10, settle=0.2)


def _write(root: str, rel: str, data: bytes) -> None:
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _locks(storage: S3Storage) -> list[str]:
    return sorted(storage.list(LOCKS))


def test_a_second_writer_is_refused_naming_the_holder(storage: S3Storage, tmp_path) -> None:
    """A holds the prefix (as a daemon does, renewed); B's push is refused before it sends
    anything, with A named; once A lets go, B pushes."""
    root_a, root_b = str(tmp_path / "a"), str(tmp_path / "b")
    trees.build_tree(root_a, trees.sample_spec())
    trees.build_tree(root_b, trees.sample_spec())
    _write(root_b, "only-b", os.urandom(5000))
    with Engine(root_a, str(tmp_path / "sa")) as a, Engine(root_b, str(tmp_path / "sb")) as b:
        a.create("a0")
        b.create("b0")
        wa = writer_id(a.store)
        with open_lease(storage, wa, QUICK) as lease:
            push(a.store, storage, lease=lease)
            before = sorted(storage.list(""))
            with pytest.raises(LeaseHeld) as err:
                push(b.store, storage)
            assert f"is held by writer {wa} on host {os.uname().nodename}" in str(err.value)
            assert f"(pid {os.getpid()})" in str(err.value)
            assert err.value.exit_code == 4
            assert sorted(storage.list("")) == before  # not a pack, not a lock left behind
            assert [h.writer for h in holders(storage)] == [wa]
        assert _locks(storage) == []  # released
        assert push(b.store, storage).generation.number == 1


def test_two_writers_at_once_end_with_one_holder(storage: S3Storage) -> None:
    """Write, wait, list, read back: both see both locks, the older stays."""
    for _ in range(3):
        start = threading.Barrier(2)
        got: dict[str, object] = {}

        def take(writer: str, start: threading.Barrier = start, got: dict = got) -> None:
            start.wait()
            try:
                got[writer] = Lease.acquire(storage, writer, QUICK)
            except LeaseHeld as e:
                got[writer] = e

        threads = [threading.Thread(target=take, args=(w,)) for w in ("a" * 12, "b" * 12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        won = [v for v in got.values() if isinstance(v, Lease)]
        lost = [v for v in got.values() if isinstance(v, LeaseHeld)]
        assert (len(won), len(lost)) == (1, 1)
        assert lost[0].holder.writer == won[0].writer
        assert _locks(storage) == [won[0].key]  # the loser removed its own
        won[0].release()
        assert _locks(storage) == []


def test_a_stale_lock_is_taken_over(storage: S3Storage) -> None:
    """A holder that died (its lock never renewed) blocks the prefix until its lock is
    ``stale_after`` old by the server's clock, no longer (its ``Date`` header counts
    whole seconds, so an age may read up to 1 s short: on the safe side)."""
    policy = LeasePolicy(stale_after=1.5, refresh_every=1, settle=0.1)
    dead = Lease.acquire(storage, "d" * 12, policy)  # never renewed nor released: "killed"
    with pytest.raises(LeaseHeld, match="writer dddddddddddd"):
        Lease.acquire(storage, "e" * 12, policy)
    # Until the dead lock is stale by the server's clock (what acquire reads): polled,
    # not slept for to a bound with a margin (3 s before).
    deadline = time.monotonic() + 30
    while holders(storage, policy):
        assert time.monotonic() < deadline, holders(storage, policy)
        time.sleep(0.1)
    taken = Lease.acquire(storage, "e" * 12, policy)
    assert _locks(storage) == [taken.key]  # the stale one removed
    assert dead.key not in _locks(storage)
    taken.release()


def test_a_leftover_of_this_writer_is_removed_and_renewal_replaces_the_lock(
    storage: S3Storage,
) -> None:
    """A lock of this writer on this host by another (dead) process is a leftover; a
    renewed lease has exactly one lock, under a new name."""
    leftover = f"{LOCKS}{'f' * 12}-{'0' * 16}"
    body = {"writer": "f" * 12, "host": os.uname().nodename, "pid": 1, "time": 0}
    storage.put_bytes(leftover, json.dumps(body).encode())
    lease = Lease.acquire(storage, "f" * 12, LeasePolicy(stale_after=30, refresh_every=0.3))
    try:
        assert _locks(storage) == [lease.key]
        first = lease.key
        lease.keep_renewed()
        deadline = time.monotonic() + 10
        while lease.key == first and time.monotonic() < deadline:  # renewed (every 0.3 s)
            time.sleep(0.05)
        assert lease.key != first
        # A renewal writes the new lock before it deletes the old one: between the two
        # (three requests) a listing sees both; once it is done, one alone.
        deadline = time.monotonic() + 10
        one = False
        while not one and time.monotonic() < deadline:
            locks = _locks(storage)
            one = len(locks) == 1 and first not in locks
            time.sleep(0.05)
        assert one, _locks(storage)
        lease.check()
    finally:
        lease.release()
    assert _locks(storage) == []
    with pytest.raises(LeaseLost, match="released"):
        lease.check()


def test_a_lapsed_lease_commits_nothing(
    storage: S3Storage, tmp_path, expect_log: Callable[[str], None]
) -> None:
    """A holder that could not renew for half the stale time stops before the generation's
    PUT: another writer might have taken the prefix meanwhile."""
    expect_log("lost: the lease was not renewed for")
    root = str(tmp_path / "layer")
    trees.build_tree(root, trees.sample_spec())
    with Engine(root, str(tmp_path / "store")) as e:
        e.create("v0")
        lease = Lease.acquire(storage, writer_id(e.store), LeasePolicy(stale_after=1, settle=0.1))
        time.sleep(0.6)  # no renewal thread: as if every renewal failed
        with pytest.raises(LeaseLost, match="not renewed for"):
            push(e.store, storage, lease=lease)
        lease.release()
    assert generations(storage) == []


def test_a_removed_lock_loses_the_lease_at_renewal_and_at_the_commit(
    storage: S3Storage, tmp_path, expect_log: Callable[[str], None]
) -> None:
    """A holder whose lock another writer removed (forced past it, or by hand) finds out at
    its next renewal, naming the new holder, and a push under it stops before the
    generation's PUT; a lost lease stays lost, and ``on_lost`` hears it once."""
    expect_log("lost: its lock .* was removed from the bucket")
    root = str(tmp_path / "layer")
    trees.build_tree(root, trees.sample_spec())
    with Engine(root, str(tmp_path / "store")) as e:
        e.create("v0")
        lease = Lease.acquire(storage, writer_id(e.store), QUICK)
        heard: list[str] = []
        lease.on_lost = heard.append
        storage.delete(lease.key)  # removed: the push's read-back at the commit sees it
        with pytest.raises(LeaseLost, match="was removed from the bucket"):
            push(e.store, storage, lease=lease)
        assert generations(storage) == []
        assert len(heard) == 1
        lease.release()

        lease = Lease.acquire(storage, writer_id(e.store), QUICK)
        lease.on_lost = heard.append
        first = lease.key
        storage.delete(first)
        other = Lease.acquire(storage, "b" * 12, QUICK)  # the prefix looks free: taken
        try:
            with pytest.raises(LeaseLost, match="held by writer bbbbbbbbbbbb"):
                lease.renew()
            assert len(heard) == 2
            assert "was removed" in heard[1]
            assert lease.lost == heard[1]
            with pytest.raises(LeaseLost, match="was removed"):  # for good
                lease.renew()
            with pytest.raises(LeaseLost, match="was removed"):
                lease.check()
            lease.release()
            assert _locks(storage) == [other.key]  # its renewal's lock went with it
        finally:
            other.release()


def test_a_lease_not_renewed_in_time_stays_lost(
    storage: S3Storage, expect_log: Callable[[str], None]
) -> None:
    """Past half the stale time without a renewal, another writer may soon call the lock
    stale: a renewal then writes nothing (the server answering again proves nothing about
    who holds the prefix now), and the lease must be taken again."""
    expect_log("lost: the lease was not renewed for")
    # (2 s: an acquire's own requests on 2 loaded cores stay well inside the 1 s bound)
    policy = LeasePolicy(stale_after=2, refresh_every=0.2, settle=0.1)
    lease = Lease.acquire(storage, "c" * 12, policy)
    heard: list[str] = []
    lease.on_lost = heard.append
    time.sleep(1.2)  # no renewal thread: as if every renewal failed
    before = _locks(storage)
    with pytest.raises(LeaseLost, match="not renewed for"):
        lease.renew()
    assert _locks(storage) == before  # no new lock written
    with pytest.raises(LeaseLost, match="not renewed for"):
        lease.check()
    assert len(heard) == 1
    lease.release()
    again = Lease.acquire(storage, "c" * 12, policy)
    again.check()
    again.release()
    assert _locks(storage) == []


def test_two_writers_forced_past_the_lease_lose_nothing(storage: S3Storage, tmp_path) -> None:
    """A and its fork B push at the same time, three rounds, bypassing the lease. Every
    generation of both stays complete and passes check; each writer's head holds exactly
    its own history, restorable byte for byte; pull(writer=) picks either."""
    root_a, root_b = str(tmp_path / "a/layer"), str(tmp_path / "b/layer")
    store_a, store_b = str(tmp_path / "a/store"), str(tmp_path / "b/store")
    trees.build_tree(root_a, trees.sample_spec())
    with Engine(root_a, store_a) as a:
        a.create("v0")
        push(a.store, storage)
    pull(storage, store_b)
    os.makedirs(root_b)
    with Engine(root_a, store_a, create=False) as a, Engine(root_b, store_b, create=False) as b:
        b.restore("v0")
        for i in range(3):
            _write(root_a, f"a/{i}", os.urandom(50_000))
            a.create(f"a{i}")
            _write(root_b, f"b/{i}", os.urandom(50_000))
            b.create(f"b{i}")
            errors: list[BaseException] = []

            def go(e: Engine, errors: list[BaseException] = errors) -> None:
                try:
                    push(e.store, storage, bypass_lease=True)
                except BaseException as x:  # reported below, not lost in the thread
                    errors.append(x)

            ts = [threading.Thread(target=go, args=(e,)) for e in (a, b)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            assert errors == []
        ids = {
            writer_id(a.store): sorted(c.id for c in a.checkpoints(include_auto=True)),
            writer_id(b.store): sorted(c.id for c in b.checkpoints(include_auto=True)),
        }
        wanted = {writer_id(a.store): trees.snapshot_tree(root_a)}
        wanted[writer_id(b.store)] = trees.snapshot_tree(root_b)
    gens = generations(storage)
    assert len(gens) == 7  # v0's, then two per round: none lost, even at one number
    for g in gens:
        pulled = str(tmp_path / f"g-{g.number}-{g.writer}")
        pull(storage, pulled, generation=g)
        with open_store(pulled, writable=False) as s:
            assert check(s, read_data=True).ok
    h = heads(storage)
    assert set(h) == set(ids)
    for writer, head in h.items():
        pulled = str(tmp_path / f"head-{writer}")
        assert pull(storage, pulled, writer=writer).generation == head
        other = str(tmp_path / f"root-{writer}")
        os.makedirs(other)
        with Engine(other, pulled, create=False) as e:
            assert sorted(c.id for c in e.checkpoints(include_auto=True)) == ids[writer]
            e.restore("v3")  # the same id names different states in A's and B's histories
            trees.assert_trees_equal(wanted[writer], trees.snapshot_tree(other))


def test_lease_settings_from_the_environment() -> None:
    from sprite_env.store.s3 import BadRemoteSetting

    p = LeasePolicy.from_env({"SPRITE_ENV_LEASE_STALE": "200", "SPRITE_ENV_LEASE_SETTLE": "0.5"})
    assert (p.stale_after, p.refresh_every, p.settle) == (200, 60, 0.5)
    assert LeasePolicy.from_env({}) == LeasePolicy()
    with pytest.raises(BadRemoteSetting, match="shorter than half its stale time"):
        LeasePolicy.from_env({"SPRITE_ENV_LEASE_STALE": "60"})  # renewals every 60 s
    with pytest.raises(BadRemoteSetting, match="SPRITE_ENV_LEASE_SETTLE='soon'"):
        LeasePolicy.from_env({"SPRITE_ENV_LEASE_SETTLE": "soon"})
