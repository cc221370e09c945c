"""Pack format: golden bytes, table, scan and corruption detection."""

import os

import blake3
import pytest

from sprite_env.errors import CorruptPack
from sprite_env.ids import ObjectId
from sprite_env.store import codec
from sprite_env.store.pack import (
    ENTRY,
    FOOTER,
    HEADER,
    TABLE_ROW,
    WRITE_BUFFER,
    ObjectKind,
    PackWriter,
    pack_path,
    read_payload,
    read_table,
    scan_entries,
)


def _write(tmp_path: os.PathLike[str], blobs: list[bytes]) -> tuple[str, str, list[ObjectId]]:
    tmp = os.path.join(tmp_path, "tmp")
    packs = os.path.join(tmp_path, "packs")
    os.makedirs(tmp)
    os.makedirs(packs)
    w = PackWriter(tmp, 0)
    ids = []
    for b in blobs:
        oid = codec.object_id(b)
        c, payload = codec.encode(b)
        w.add(oid, ObjectKind.DATA, c, payload, len(b))
        ids.append(oid)
    name, size = w.finish(packs)
    assert os.listdir(tmp) == []
    path = pack_path(packs, name)
    assert os.path.getsize(path) == size
    return path, name, ids


def _assert_reads_back(path: str, name: str, ids: list[ObjectId], blobs: list[bytes]) -> None:
    """The pack's table names ``ids`` in order, a scan of its entry headers agrees, and
    each object decodes to its blob."""
    fd = os.open(path, os.O_RDONLY)
    try:
        table = read_table(fd, name)
        assert [e.id for e in table] == ids
        assert list(scan_entries(fd, name)) == table
        for e, b in zip(table, blobs, strict=True):
            assert codec.decode(e.codec, read_payload(fd, name, e), e.raw_len) == b
    finally:
        os.close(fd)


def test_layout_sizes_are_fixed() -> None:
    # Changing any of these breaks every existing store.
    assert (HEADER.size, ENTRY.size, TABLE_ROW.size, FOOTER.size) == (16, 48, 52, 52)


def test_golden_pack_bytes(tmp_path: os.PathLike[str]) -> None:
    # Raw-coded objects only, so the bytes do not depend on the zstd library's version.
    noise = blake3.blake3(b"golden").digest(length=300)
    path, name, _ = _write(tmp_path, [b"hello", noise])
    with open(path, "rb") as f:
        data = f.read()
    assert name == blake3.blake3(data).hexdigest()
    assert data[:8] == b"SPRPACK\0"
    assert data[-8:] == b"SPRPEND1"
    assert len(data) == 16 + 48 + 5 + 48 + 300 + 2 * 52 + 52
    # Pinned forever: a change here means existing stores become unreadable.
    assert name == "a054d1adb48546cbdd91ebc8db2938f8ac9dcb27b600d451f4a5bbc40772c895"


def test_table_and_scan_agree(tmp_path: os.PathLike[str]) -> None:
    blobs = [os.urandom(n) for n in (0, 1, 100, 5000)] + [b"z" * 70000]
    path, name, ids = _write(tmp_path, blobs)
    _assert_reads_back(path, name, ids, blobs)


def test_a_pack_larger_than_its_write_buffer_is_written_whole(tmp_path: os.PathLike[str]) -> None:
    # Objects of odd sizes, one larger than the buffer, so that flushes fall inside payloads
    # and headers and the buffer is written several times before the seal.
    sizes = [WRITE_BUFFER - 30, 17, WRITE_BUFFER + 12345, 48, 3, 700_001, 0, 99_999]
    blobs = [blake3.blake3(str(n).encode()).digest(length=n) for n in sizes]
    path, name, ids = _write(tmp_path, blobs)
    with open(path, "rb") as f:
        data = f.read()
    assert len(data) > 2 * WRITE_BUFFER
    assert name == blake3.blake3(data).hexdigest()  # the running hash saw every byte once
    _assert_reads_back(path, name, ids, blobs)


def test_damaged_table_is_detected_but_scan_still_works(tmp_path: os.PathLike[str]) -> None:
    path, name, ids = _write(tmp_path, [b"a" * 1000, b"b" * 1000])
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size - FOOTER.size - 10)  # inside the table
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(CorruptPack, match="table does not match its hash"):
            read_table(fd, name)
        assert [e.id for e in scan_entries(fd, name)] == ids
    finally:
        os.close(fd)


def test_truncated_pack_is_detected(tmp_path: os.PathLike[str]) -> None:
    path, name, _ = _write(tmp_path, [b"a" * 1000])
    os.truncate(path, os.path.getsize(path) - 3)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(CorruptPack, match=name):
            read_table(fd, name)
    finally:
        os.close(fd)


def test_not_a_pack(tmp_path: os.PathLike[str]) -> None:
    p = os.path.join(tmp_path, "x.pack")
    with open(p, "wb") as f:
        f.write(b"PK\x03\x04" + bytes(200))
    fd = os.open(p, os.O_RDONLY)
    try:
        with pytest.raises(CorruptPack, match="bad magic"):
            read_table(fd, "x")
    finally:
        os.close(fd)


def test_abort_leaves_nothing(tmp_path: os.PathLike[str]) -> None:
    w = PackWriter(os.fspath(tmp_path), 1)
    w.add(codec.object_id(b"x"), ObjectKind.TREE, 0, b"x", 1)
    w.abort()
    assert os.listdir(tmp_path) == []
