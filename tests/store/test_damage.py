"""A damaged store is reported precisely (pack and offset) and repaired where possible."""

import os

import pytest

from sprite_env.errors import CorruptPack
from sprite_env.ids import ObjectId
from sprite_env.store import Store, check, rebuild
from sprite_env.store.pack import ENTRY, pack_path


def _fill(store: Store, n: int = 30) -> list[tuple[ObjectId, bytes]]:
    out = []
    with store.writer(pack_size=64 * 1024) as w:
        for i in range(n):
            data = (b"%d-" % i) * 2000 + os.urandom(2000)
            out.append((w.put(data), data))
        w.commit()
    return out


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def test_flipped_payload_byte_names_pack_and_offset(store: Store) -> None:
    objs = _fill(store)
    oid, _ = objs[5]
    loc = store.catalog.locate(oid)
    assert loc is not None
    _flip(pack_path(store.packs_dir, loc.pack), loc.entry.offset + ENTRY.size + 7)

    with pytest.raises(CorruptPack) as info:
        store.read(oid)
    assert info.value.pack == loc.pack
    assert info.value.offset == loc.entry.offset
    assert f"pack {loc.pack} at offset {loc.entry.offset}" in str(info.value)

    assert check(store).ok  # the table and catalog still agree; only the data is bad
    report = check(store, read_data=True)
    assert not report.ok
    assert any(f"pack {loc.pack} at offset {loc.entry.offset}" in e for e in report.errors)
    assert any("do not match its name" in e for e in report.errors)
    # every other object still reads
    for other, data in objs:
        if other != oid:
            assert store.read(other) == data


def test_flipped_header_byte_is_reported(store: Store) -> None:
    objs = _fill(store)
    loc = store.catalog.locate(objs[3][0])
    assert loc is not None
    _flip(pack_path(store.packs_dir, loc.pack), loc.entry.offset + 10)  # inside the id
    report = check(store, read_data=True)
    assert any(f"at offset {loc.entry.offset}" in e and "header" in e for e in report.errors)


def test_truncated_pack_is_reported(store: Store) -> None:
    _fill(store)
    p = store.catalog.packs()[0]
    os.truncate(pack_path(store.packs_dir, p.name), p.size // 2)
    report = check(store)
    assert not report.ok
    assert any(p.name in e and "truncated" in e for e in report.errors)


def test_missing_pack_is_reported_and_rebuild_drops_its_objects(store: Store) -> None:
    objs = _fill(store)
    p = store.catalog.packs()[0]
    lost = {e.id for e in store.catalog.objects_in_pack(p.id)}
    os.unlink(pack_path(store.packs_dir, p.name))
    report = check(store)
    assert any(f"pack {p.name}: missing" in e for e in report.errors)
    with pytest.raises(CorruptPack, match="missing"):
        store.read(next(iter(lost)))
    r = rebuild(store)
    assert r.objects == len(objs) - len(lost)
    assert check(store, read_data=True).ok


def test_rebuild_from_packs_alone_restores_every_object(store: Store) -> None:
    objs = _fill(store, 60)
    before = sorted(store.catalog.query("SELECT id, offset, raw_len FROM objects"))
    with store.catalog.transaction() as db:  # lose the catalog's store tables entirely
        db.execute("DELETE FROM objects")
        db.execute("DELETE FROM packs")
    r = rebuild(store)
    assert r.objects == 60
    assert not r.damaged_packs
    assert sorted(store.catalog.query("SELECT id, offset, raw_len FROM objects")) == before
    for oid, data in objs:
        assert store.read(oid) == data
    assert check(store, read_data=True).ok


def test_rebuild_salvages_a_pack_with_a_damaged_table(store: Store) -> None:
    objs = _fill(store, 10)
    p = store.catalog.packs()[0]
    path = pack_path(store.packs_dir, p.name)
    _flip(path, os.path.getsize(path) - 60)  # in the table
    assert not check(store).ok
    r = rebuild(store)
    assert r.damaged_packs == [p.name]
    for oid, data in objs:
        assert store.read(oid) == data
