"""``preflight.Verifier``: the check verifies a restore's objects while its plan still walks
(fed by ``plan_needs(verify=)``), reports the first damaged one in the plan's order, keeps
what the restore will read, and keeps again the slices a later difference adds to an
object verified already."""

from __future__ import annotations

import threading

import pytest

from sprite_env.errors import StoreError
from sprite_env.ids import ObjectId
from sprite_env.snapshot.patch import Prefetched
from sprite_env.snapshot.preflight import VERIFY_BATCH, CheckpointDamaged, RestoreNeeds, Verifier


def _oid(i: int) -> ObjectId:
    return ObjectId(i.to_bytes(32, "big"))


class _Store:
    """Object ``i`` is 1,000 bytes of ``i % 251``; ``damaged`` raise as a store would."""

    def __init__(self, damaged: frozenset[ObjectId] = frozenset()) -> None:
        self.damaged = damaged
        self.read: list[ObjectId] = []
        self.batches = 0
        self.started = threading.Event()
        self.go = threading.Event()
        self.go.set()

    def one(self, oid: ObjectId) -> bytes:
        self.read.append(oid)
        if oid in self.damaged:
            raise StoreError(f"object {oid.hex()[:8]} is damaged")
        return bytes([int.from_bytes(oid, "big") % 251]) * 1000

    def many(self, oids: list[ObjectId]) -> list[bytes]:
        self.batches += 1
        self.started.set()
        self.go.wait(10)
        if any(o in self.damaged for o in oids):
            raise StoreError("a damaged object in the batch")
        return [self.one(o) for o in oids]


def _needs(n: int) -> tuple[RestoreNeeds, list[tuple[ObjectId, bytes]]]:
    needs = RestoreNeeds()
    items = [(_oid(i), b"f%d" % i) for i in range(n)]
    needs.objects.update(items)
    return needs, items


def test_a_full_batch_is_read_while_the_plan_goes_on() -> None:
    store = _Store()
    store.go.clear()  # the first batch's read waits until the "plan" says so
    needs, items = _needs(VERIFY_BATCH + 10)
    keep = Prefetched()
    with Verifier(store.one, store.many, needs, "v3", keep) as v:
        v.add(items[:VERIFY_BATCH])
        assert store.started.wait(10)  # begun before the plan handed over anything more
        v.add(items[VERIFY_BATCH:])
        store.go.set()
        v.finish()
    assert sorted(store.read) == sorted(o for o, _ in items)
    assert store.batches == 2
    assert keep.objects[_oid(7)] == bytes([7]) * 1000


def test_the_first_damaged_object_in_the_plans_order_is_named() -> None:
    n = 3 * VERIFY_BATCH
    store = _Store(damaged=frozenset({_oid(n - 5), _oid(VERIFY_BATCH + 3)}))
    needs, items = _needs(n)
    with Verifier(store.one, store.many, needs, "v3", Prefetched()) as v:
        for i in range(0, n, 10):
            v.add(items[i : i + 10])
        with pytest.raises(CheckpointDamaged) as e:
            v.finish()
    assert e.value.path == b"f%d" % (VERIFY_BATCH + 3)
    assert "checkpoint v3 cannot be restored" in str(e.value)


def test_objects_verified_before_are_not_read_again() -> None:
    store = _Store()
    needs, items = _needs(10)
    with Verifier(store.one, None, needs, None, skip={_oid(2), _oid(5)}) as v:
        v.add(items)
        v.finish()
    assert sorted(store.read) == sorted(o for o, _ in items if o not in (_oid(2), _oid(5)))


class _Keep(Prefetched):
    """Says when an object was kept (the verifying threads keep what they verified)."""

    def __init__(self, watched: ObjectId) -> None:
        super().__init__()
        self.watched = watched
        self.kept = threading.Event()

    def keep(self, oid: ObjectId, data: bytes, slices: list[tuple[int, int]] | None) -> None:
        super().keep(oid, data, slices)
        if oid == self.watched:
            self.kept.set()


def test_slices_a_later_difference_adds_are_kept_too() -> None:
    store = _Store()
    needs, items = _needs(VERIFY_BATCH)
    shared, other = _oid(0), _oid(1)
    needs.slices[shared] = [(0, 10)]
    keep = _Keep(shared)
    with Verifier(store.one, store.many, needs, "v3", keep) as v:
        v.add(items)  # a full batch: verified now, with the first patched file's slice
        assert keep.kept.wait(10)
        needs.slices[shared].append((500, 20))  # a second file's, planned later
        v.finish()
    assert keep.pieces[(shared, 0, 10)] == bytes([0]) * 10
    assert keep.pieces[(shared, 500, 20)] == bytes([0]) * 20
    assert keep.objects[other] == bytes([1]) * 1000
    assert store.read.count(shared) == 2  # once verified, once more for the late slice
