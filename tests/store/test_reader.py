"""The store's reader (``store/reader.py``): ``read_many`` and ``pin`` against ``read``, across
a prune, on damaged and truncated packs, and the shared pack descriptors."""

from __future__ import annotations

import os
import random
from typing import TYPE_CHECKING

import pytest

from sprite_env.errors import CorruptPack, ObjectNotFound
from sprite_env.ids import ObjectId, PackName
from sprite_env.store import ObjectKind, check, plan_prune, reader, repository
from sprite_env.store.catalog import Located
from sprite_env.store.pack import ENTRY, pack_path

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sprite_env.store import Store

PACK = 256 << 10  # small packs: a batch spans several


def _fill(store: Store, n: int, seed: int = 1) -> dict[ObjectId, bytes]:
    """``n`` objects of 1-40 kB, half random (stored raw), half text (zstd)."""
    rng = random.Random(seed)
    out = {}
    with store.writer(pack_size=PACK) as w:
        for i in range(n):
            size = rng.randrange(1_000, 40_000)
            data = rng.randbytes(size) if i % 2 else (b"line %d of %d\n" % (i, size)) * (size // 20)
            out[w.put(data)] = data
        w.commit()
    return out


def _fds_of(store: Store) -> set[str]:
    """The pack files (deleted ones too) this process has open."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(store.packs_dir):
            out.add(target)
    return out


def test_read_many_equals_read_in_any_order_and_batch(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = _fill(store, 200)
    oids = list(objs)
    assert len(store.catalog.packs()) > 3
    codecs = {loc.entry.codec for loc in store.locate_many(oids).values()}
    assert codecs == {0, 1}  # stored raw and compressed
    monkeypatch.setattr(repository, "LOCATE_BATCH", 7)  # several catalog queries
    rng = random.Random(5)
    for n in (1, 2, 17, 200):
        batch = [rng.choice(oids) for _ in range(n)]  # repeats, any order, several packs
        assert store.read_many(batch) == [objs[o] for o in batch]
        assert store.read_many(batch) == [store.read(o) for o in batch]
    assert store.read_many([]) == []
    assert store.pack_files.held() == 0  # each call let go of its packs


def test_neighbours_in_a_pack_are_read_with_one_call(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = _fill(store, 60)
    by_pack: dict[PackName, list[tuple[int, ObjectId]]] = {}
    for oid, loc in store.locate_many(objs).items():
        by_pack.setdefault(loc.pack, []).append((loc.entry.offset, oid))
    pack, rows = max(by_pack.items(), key=lambda kv: len(kv[1]))
    in_pack = [oid for _off, oid in sorted(rows)]
    assert len(in_pack) >= 5
    calls: list[int] = []
    real_preadv, real_pread = os.preadv, os.pread

    def preadv(fd: int, bufs: list[memoryview], offset: int) -> int:
        calls.append(offset)
        return real_preadv(fd, bufs, offset)

    def pread(fd: int, n: int, offset: int) -> bytes:
        calls.append(offset)
        return real_pread(fd, n, offset)

    monkeypatch.setattr(reader.os, "preadv", preadv)
    monkeypatch.setattr(reader.os, "pread", pread)
    got = store.read_many(list(reversed(in_pack)))
    assert got == [objs[o] for o in reversed(in_pack)]
    assert len(calls) == 1  # the whole pack's objects lie together: one run
    calls.clear()
    assert store.read_many(in_pack[::2]) == [objs[o] for o in in_pack[::2]]
    assert len(calls) == 1  # gaps under MAX_GAP are read through
    calls.clear()
    monkeypatch.setattr(reader, "MAX_GAP", 0)
    assert store.read_many(in_pack[::2]) == [objs[o] for o in in_pack[::2]]
    assert len(calls) == len(in_pack[::2])  # no gap allowed: one read per object


def test_a_missing_object_fails_and_holds_nothing(store: Store) -> None:
    objs = _fill(store, 10)
    with pytest.raises(ObjectNotFound):
        store.read_many([*objs, ObjectId(bytes(32))])
    with pytest.raises(ObjectNotFound):
        store.pin([*objs, ObjectId(bytes(32))])
    assert store.pack_files.held() == 0
    with store.pin(list(objs)[:3]) as pin, pytest.raises(ObjectNotFound):
        pin.read(list(objs)[5])  # not among the pinned ones


def test_a_pin_reads_across_a_prune_that_deleted_its_pack(store: Store) -> None:
    keep = _fill(store, 40, seed=1)
    doomed = _fill(store, 40, seed=2)
    doomed_packs = {loc.pack for loc in store.locate_many(doomed).values()}
    pin = store.pin(doomed)
    try:
        assert store.pack_files.held() == len(doomed_packs)
        report = plan_prune(store, keep.keys()).execute(store)
        assert report.packs_deleted >= len(doomed_packs)
        assert not any(store.has(o) for o in doomed)
        for p in doomed_packs:
            assert not os.path.exists(pack_path(store.packs_dir, p))
        order = list(doomed)[::-1]
        assert pin.read_many(order) == [doomed[o] for o in order]
        with pytest.raises(ObjectNotFound):
            store.read(order[0])  # the store itself no longer has it
        assert any(t.endswith("(deleted)") for t in _fds_of(store))
    finally:
        pin.close()
    pin.close()  # idempotent
    assert store.pack_files.held() == 0
    # the deleted packs' descriptors closed with the pin: their disk space is free
    assert not any(t.endswith("(deleted)") for t in _fds_of(store))
    assert store.read_many(list(keep)) == list(keep.values())
    with pytest.raises(CorruptPack, match="read after close"):
        pin.read_many(order[:1])


def test_a_pack_moved_between_lookup_and_open_is_looked_up_once_more(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = _fill(store, 30)
    oids = list(objs)
    real = store.locate_many
    stale = PackName("f" * 64)  # a pack a prune unlinked after the lookup
    moves = [1]

    def locate_many(ids: Iterable[ObjectId]) -> dict[ObjectId, Located]:
        where = real(ids)
        if moves[0]:
            moves[0] -= 1
            return {o: Located(stale, loc.entry) for o, loc in where.items()}
        return where

    monkeypatch.setattr(store, "locate_many", locate_many)
    assert store.read_many(oids[:5]) == [objs[o] for o in oids[:5]]
    moves[0] = 2  # still gone at the second lookup: lost, not moved
    with pytest.raises(CorruptPack, match="pack file is missing") as e:
        store.read_many(oids[:5])
    assert e.value.offset is None
    assert not store.damaged  # a missing pack is not damage of an object
    assert store.pack_files.held() == 0


def _flip(store: Store, oid: ObjectId, at: int) -> Located:
    loc = store.catalog.locate(oid)
    assert loc is not None
    with open(pack_path(store.packs_dir, loc.pack), "r+b") as f:
        f.seek(loc.entry.offset + at)
        b = f.read(1)
        f.seek(loc.entry.offset + at)
        f.write(bytes([b[0] ^ 0x40]))
    return loc


def test_a_damaged_object_fails_alone_and_is_marked(store: Store) -> None:
    objs = _fill(store, 30)
    oids = list(objs)
    bad = oids[10]
    loc = _flip(store, bad, ENTRY.size + 7)  # in the payload
    # its neighbours in the same run read fine, before and after it
    ok = [o for o in oids if o != bad]
    assert store.read_many(ok) == [objs[o] for o in ok]
    with pytest.raises(CorruptPack) as e:
        store.read_many(oids)
    assert e.value.offset == loc.entry.offset
    assert bad in store.damaged
    with store.pin(oids) as pin, pytest.raises(CorruptPack):
        pin.read_many([bad])
    report = check(store, read_data=True)  # the oracle agrees, and names only it
    assert set(report.damaged) == {bad}


def test_a_damaged_header_is_caught(store: Store) -> None:
    objs = _fill(store, 10)
    bad = list(objs)[3]
    _flip(store, bad, 12)  # in the id of the entry header
    with pytest.raises(CorruptPack, match="object header does not match the catalog"):
        store.read(bad)


def test_a_truncated_pack_fails_only_past_its_end(store: Store) -> None:
    objs = _fill(store, 30)
    where = store.locate_many(objs)
    pack = max(
        {loc.pack for loc in where.values()},
        key=lambda p: sum(1 for loc in where.values() if loc.pack == p),
    )
    rows = sorted((loc.entry.offset, o) for o, loc in where.items() if loc.pack == pack)
    cut_at = rows[-2][0] + 10  # inside the second-to-last object
    os.truncate(pack_path(store.packs_dir, pack), cut_at)
    in_pack = [o for _off, o in rows]
    assert store.read_many(in_pack[:-2]) == [objs[o] for o in in_pack[:-2]]
    with pytest.raises(CorruptPack, match="truncated object") as e:
        store.read_many(in_pack)
    assert e.value.offset == rows[-2][0]
    assert in_pack[-2] in store.damaged


def test_idle_descriptors_are_bounded_and_forgotten(store: Store) -> None:
    files = reader.PackFiles(reader.LocalPacks(store.packs_dir), max_idle=2)
    objs = _fill(store, 100)
    names = sorted({loc.pack for loc in store.locate_many(objs).values()})
    assert len(names) >= 4
    slots = [files.acquire(n) for n in names]
    assert files.held() == len(names)  # in use: none is closed, whatever the bound
    for s in slots:
        files.release(s)
    assert files.held() == 0
    assert len(files._slots) == 2  # the two most recently used stay open
    kept = list(files._slots)
    files.forget(kept[0])
    assert list(files._slots) == kept[1:]
    with pytest.raises(FileNotFoundError):
        files.acquire(PackName("0" * 64))
    files.close()


def test_a_descriptor_of_a_pack_unlinked_elsewhere_closes_when_let_go(store: Store) -> None:
    """Another process's prune never calls our ``forget``: the last user closes it."""
    objs = _fill(store, 10, seed=3)
    name = next(iter(store.locate_many(objs).values())).pack
    slot = store.pack_files.acquire(name)
    os.unlink(pack_path(store.packs_dir, name))
    store.pack_files.release(slot)
    assert not any(t.endswith("(deleted)") for t in _fds_of(store))
    assert name not in store.pack_files._slots


def test_pinned_reads_of_tree_objects_and_data_in_one_batch(store: Store) -> None:
    """Objects of both pack classes (data, metadata) in one batch."""
    with store.writer() as w:
        t = w.put(b"tree bytes" * 50, ObjectKind.TREE)
        d = w.put(b"data bytes" * 50)
        w.commit()
    assert store.read_many([t, d, t]) == [b"tree bytes" * 50, b"data bytes" * 50] + [
        b"tree bytes" * 50
    ]
    assert len({loc.pack for loc in store.locate_many([t, d]).values()}) == 2
