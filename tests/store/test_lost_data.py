"""The store's side of damage (issue 15): a prune keeps a pack it cannot copy and goes on,
lost packs leave the catalog, and a damaged object is stored afresh by the next write."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from sprite_env.errors import CorruptPack
from sprite_env.store import Store, check, plan_prune
from sprite_env.store.pack import ENTRY, pack_path
from tests.store.test_prune import SMALL, TARGET, _fill, _half

if TYPE_CHECKING:
    from collections.abc import Callable

    from sprite_env.ids import ObjectId


def _break_header(store: Store, oid: ObjectId) -> str:
    loc = store.catalog.locate(oid)
    assert loc is not None
    with open(pack_path(store.packs_dir, loc.pack), "r+b") as f:
        f.seek(loc.entry.offset + 10)  # inside the id in the entry header
        f.write(b"\xff")
    return loc.pack


def test_skip_damaged_keeps_the_pack_it_cannot_copy_and_prunes_the_rest(store: Store) -> None:
    a = _fill(store, "a", 40)
    b = _fill(store, "b", 40)
    live_a, _ = _half(a)
    live_b, _ = _half(b)
    bad = sorted(live_a)[3]
    bad_pack = _break_header(store, bad)
    plan = plan_prune(store, live_a | live_b, target_pack_size=TARGET, small_pack=SMALL)
    assert {u.pack.name for u in plan.rewrite} >= {bad_pack}

    report = plan.execute(store, skip_damaged=True)  # without it: CorruptPack, nothing done

    assert list(report.damaged_packs) == [bad_pack]
    assert "header" in report.damaged_packs[bad_pack]
    assert bad in store.damaged
    assert bad_pack in {p.name for p in store.catalog.packs()}  # kept, with its live rows
    assert report.packs_deleted >= 1
    assert store.catalog.object_count() == len(live_a) + len(live_b)  # the dead rows went
    for oid in live_b | (live_a - {bad}):
        assert store.read(oid) in (a.get(oid), b.get(oid))
    with pytest.raises(CorruptPack):
        store.read(bad)
    errors = check(store, read_data=True).errors
    assert errors
    assert all(bad_pack in e for e in errors), errors


def test_a_damaged_object_is_stored_afresh_and_its_row_moves(store: Store) -> None:
    objs = _fill(store, "a", 10)
    oid = sorted(objs)[4]
    old = store.catalog.locate(oid)
    assert old is not None
    _break_header(store, oid)
    with pytest.raises(CorruptPack):
        store.read(oid)
    assert oid in store.damaged
    with store.writer() as w:  # a put of the same bytes is not deduplicated any more
        assert w.put(objs[oid]) == oid
        w.commit()
        assert w.stats.objects_new == 1
    new = store.catalog.locate(oid)
    assert new is not None
    assert new.pack != old.pack
    assert store.read(oid) == objs[oid]
    assert oid not in store.damaged
    with store.writer() as w:  # and once sound again, it is deduplicated as before
        w.put(objs[oid])
        w.drain()  # the catalog is asked on an encoding thread
        assert w.stats.objects_new == 0


def test_lost_packs_leave_the_catalog_with_their_objects(
    store: Store, expect_log: Callable[[str], None]
) -> None:
    expect_log(r"pack \w+ is (missing|truncated)")
    first = _fill(store, "a", 30)
    second = _fill(store, "b", 30)
    packs = store.catalog.packs()
    gone, short = packs[0], packs[-1]
    os.unlink(pack_path(store.packs_dir, gone.name))
    short_path = pack_path(store.packs_dir, short.name)
    keep = short.size // 2
    os.truncate(short_path, keep)
    in_gone = {e.id for e in store.catalog.objects_in_pack(gone.id)}
    past_end = {
        e.id
        for e in store.catalog.objects_in_pack(short.id)
        if e.offset + ENTRY.size + e.stored_len > keep
    }
    before_end = {e.id for e in store.catalog.objects_in_pack(short.id)} - past_end
    assert in_gone
    assert past_end
    assert before_end

    lost = store.lost_packs()
    assert {(lp.pack.name, lp.size) for lp in lost} == {(gone.name, None), (short.name, keep)}
    seen: list[set[ObjectId]] = []

    def hook(db: object, ids: set[ObjectId]) -> None:
        seen.append(set(ids))

    assert store.forget_lost(lost, hook) == in_gone | past_end

    assert seen == [in_gone | past_end]
    assert gone.name not in {p.name for p in store.catalog.packs()}
    assert not any(store.has(o) for o in in_gone | past_end)
    for oid in before_end:  # what is still on disk still reads
        assert store.read(oid) == {**first, **second}[oid]
    # The truncated pack is still short (check reports it) but has nothing more to lose.
    assert [lp.pack.name for lp in store.lost_packs()] == [short.name]
    assert store.forget_lost(store.lost_packs()) == set()
    assert check(store).errors
