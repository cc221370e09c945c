"""Big files changed in place, found by page digests: exactly what the store comparison finds.

Every case changes a big file in place, then captures the same state twice with the same
files cache: once with the saved page digests, once without (the comparison against the old
version's objects, read back from the store). The top tree ids must be equal, the digest
capture must not have read one old data object, and the checkpoint made from it must
restore the same bytes and leave a store that checks clean.
"""

from __future__ import annotations

import ctypes
import os
import random
from typing import TYPE_CHECKING

import pytest

from sprite_env.checkpoints import Engine
from sprite_env.checkpoints.hashonly import HashOnlySink
from sprite_env.ids import ObjectId
from sprite_env.snapshot import dircache, pagesums
from sprite_env.snapshot.capture import CaptureResult, capture
from sprite_env.snapshot.pagesums import PAGE, SUM_LEN
from sprite_env.snapshot.tree import Kind, decode_chunks, decode_tree
from sprite_env.store import check
from tests.helpers import trees

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = pytest.mark.skipif(not pagesums.NATIVE, reason="the C extension is not built")

SIZE = 4 << 20  # 1024 pages: above IN_PLACE_MIN, quick to write


@pytest.fixture
def root(tmp_path: os.PathLike[str]) -> str:
    r = os.path.join(os.fspath(tmp_path), "layer")
    os.mkdir(r)
    return r


@pytest.fixture
def engine(tmp_path: os.PathLike[str], root: str) -> Iterator[Engine]:
    with Engine(root, os.path.join(os.fspath(tmp_path), "store")) as e:
        yield e


def _db(root: str) -> str:
    return os.path.join(root, "db.bin")


def _write_pages(path: str, pages: list[int], rng: random.Random) -> None:
    with open(path, "r+b") as f:  # in place: the same inode
        for p in pages:
            f.seek(p * PAGE)
            f.write(rng.randbytes(PAGE))


def _capture_live(engine: Engine, sums: bool) -> tuple[CaptureResult, set[ObjectId]]:
    """A capture of the live layer against the committed files cache (nothing stored), and
    the ids of the objects it read from the store."""
    sink = HashOnlySink(engine.store)
    read: set[ObjectId] = set()

    def read_tree(oid: ObjectId) -> bytes:
        read.add(oid)
        return sink.read(oid)

    r = capture(
        engine.root,
        sink,
        read_tree,
        dircache.load(engine.store.catalog),
        excludes=engine.excludes,
        page_sums=pagesums.Lookup(engine.store.catalog) if sums else None,
    )
    return r, read


def _data_ids(engine: Engine, cid: str) -> set[ObjectId]:
    """The data objects of the files of checkpoint ``cid``."""
    out: set[ObjectId] = set()
    top = decode_tree(engine.store.read(engine.info(cid).top_tree))[0]
    for e in decode_tree(engine.store.read(ObjectId(top.payload))):
        if e.kind is Kind.FILE:
            raw = engine.store.read(ObjectId(e.payload)) if e.indirect else e.payload
            out.update(oid for oid, _, _ in decode_chunks(raw) if oid is not None)
    return out


def _same_as_without_sums(engine: Engine, *, used: bool = True, old_reads: int = 0) -> None:
    """The oracle of this module (see its docstring), then a checkpoint of that state that
    restores byte for byte, a restore of the one before, and a clean ``check --read-data``.
    ``old_reads``: how many old data objects the digest capture may read (``used``: check)."""
    before = engine.active()
    assert before is not None
    with_sums, read = _capture_live(engine, sums=True)
    without, _ = _capture_live(engine, sums=False)
    assert with_sums.top_tree == without.top_tree
    if used:
        assert len(read & _data_ids(engine, before)) <= old_reads, "the digests were not used"
    assert b"db.bin" in with_sums.page_sums  # a new vector for next time
    state = trees.snapshot_tree(engine.root)
    cp = engine.create()
    assert cp.top_tree == with_sums.top_tree
    old = engine.info(before)
    engine.restore(old.id)
    engine.restore(cp.id)
    trees.assert_trees_equal(state, trees.snapshot_tree(engine.root))
    assert check(engine.store, read_data=True).ok


def _base(engine: Engine, root: str, rng: random.Random, data: bytes | None = None) -> str:
    path = _db(root)
    with open(path, "wb") as f:
        f.write(data if data is not None else rng.randbytes(SIZE))
    engine.create()
    return path


def test_scattered_page_writes(engine: Engine, root: str) -> None:
    rng = random.Random(1)
    path = _base(engine, root, rng)
    _write_pages(path, sorted(rng.sample(range(SIZE // PAGE), 40)), rng)
    _same_as_without_sums(engine)
    # and again from the digests the last checkpoint saved (pieces now page slices)
    _write_pages(path, [0, 1, 2, 500, 501, 1023], rng)
    _same_as_without_sums(engine)


def test_growth_and_an_unaligned_tail(engine: Engine, root: str) -> None:
    rng = random.Random(2)
    path = _base(engine, root, rng)
    _write_pages(path, [3, 700], rng)
    with open(path, "ab") as f:  # the database grew: the tail is chunked as usual
        f.write(rng.randbytes(3 * PAGE + 123))
    _same_as_without_sums(engine)
    with open(path, "r+b") as f:  # a write across the old end and into the new tail
        f.seek(SIZE - 100)
        f.write(rng.randbytes(500))
    _same_as_without_sums(engine)


@pytest.mark.parametrize("cut", [SIZE // 2, SIZE // 2 + 777], ids=["page-aligned", "unaligned"])
def test_shrink(engine: Engine, root: str, cut: int) -> None:
    rng = random.Random(3)
    path = _base(engine, root, rng)
    _write_pages(path, [10, 11], rng)
    os.truncate(path, cut)
    # cut inside a window: that one piece is compared against its old object
    _same_as_without_sums(engine, old_reads=0 if cut % PAGE == 0 else 1)


def test_holes_appear_and_fill(engine: Engine, root: str) -> None:
    rng = random.Random(4)
    path = _db(root)
    with open(path, "wb") as f:  # sparse: data, a 1 MiB hole, data
        f.write(rng.randbytes(SIZE // 2))
        f.seek(SIZE // 2 + (1 << 20))
        f.write(rng.randbytes(SIZE // 2))
    engine.create()
    with open(path, "r+b") as f:  # fill part of the hole, change a page beside it
        f.seek(SIZE // 2 + 8 * PAGE)
        f.write(rng.randbytes(2 * PAGE))
        f.seek(10 * PAGE)
        f.write(rng.randbytes(PAGE))
    _same_as_without_sums(engine, used=False)  # the filled hole's piece is chunked afresh
    libc = ctypes.CDLL(None, use_errno=True)
    punch = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE
    fd = os.open(path, os.O_RDWR)
    try:  # a new hole where data was
        if libc.fallocate(fd, punch, ctypes.c_long(64 * PAGE), ctypes.c_long(32 * PAGE)):
            pytest.skip("this file system cannot punch holes")
    finally:
        os.close(fd)
    _same_as_without_sums(engine, used=False)


def test_a_write_of_the_same_bytes_keeps_every_piece(engine: Engine, root: str) -> None:
    rng = random.Random(5)
    data = rng.randbytes(SIZE)
    path = _base(engine, root, rng, data)
    v0 = engine.active()
    with open(path, "r+b") as f:
        f.write(data)  # every page rewritten, nothing changed but the mtime
    _same_as_without_sums(engine)
    assert _data_ids(engine, engine.active() or "") == _data_ids(engine, v0 or "")


def _row(engine: Engine, path: bytes) -> tuple[bytes, bytes, bytes]:
    rows = engine.store.catalog.query(
        "SELECT pieces, key, sums FROM pagesums WHERE path=?", (path,)
    )
    return bytes(rows[0][0]), bytes(rows[0][1]), bytes(rows[0][2])


def _put_row(engine: Engine, path: bytes, ps: pagesums.PageSums) -> None:
    with engine.store.catalog.transaction() as db:
        pagesums.save(db, {path: ps}, {})


def test_a_vector_from_another_file_is_not_used(engine: Engine, root: str) -> None:
    rng = random.Random(6)
    path = _base(engine, root, rng)
    with open(os.path.join(root, "other.bin"), "wb") as f:
        f.write(rng.randbytes(SIZE))
    engine.create()
    pieces, key, sums = _row(engine, b"other.bin")
    _put_row(engine, b"db.bin", pagesums.PageSums(key, pieces, sums))  # same length, too
    _write_pages(path, [5, 6, 900], rng)
    _same_as_without_sums(engine, used=False)  # compared against the store instead


def test_a_corrupted_vector_is_detected(
    engine: Engine, root: str, expect_log: Callable[[str], None]
) -> None:
    expect_log("page digests of b'db.bin' failed their checksum")
    rng = random.Random(7)
    path = _base(engine, root, rng)
    with engine.store.catalog.transaction() as db:  # a flipped byte, as on a failing disk
        pieces, key, sums = _row(engine, b"db.bin")
        db.execute(
            "UPDATE pagesums SET sums=? WHERE path=?",
            (sums[:7] + bytes([sums[7] ^ 0x40]) + sums[8:], b"db.bin"),
        )
    _write_pages(path, [17, 18, 19], rng)
    _same_as_without_sums(engine, used=False)


def test_a_wrong_vector_costs_space_never_bytes(engine: Engine, root: str) -> None:
    """Digests that pass their checksum but are wrong (as a bug would write them): a
    window whose digest is wrong looks changed and is stored again; nothing is lost."""
    rng = random.Random(8)
    path = _base(engine, root, rng)
    pieces, key, sums = _row(engine, b"db.bin")
    wrong = bytearray(sums)
    for w in (0, 100, 101):
        wrong[w * SUM_LEN] ^= 1
    _put_row(engine, b"db.bin", pagesums.PageSums(key, pieces, bytes(wrong)))
    _write_pages(path, [50], rng)
    state = trees.snapshot_tree(root)
    v1 = engine.create()
    assert v1.bytes_added < 8 * PAGE + 4096  # pages 0, 50, 100, 101 and the chunk list
    v0 = engine.info(v1.parent or "")
    engine.restore(v0.id)
    engine.restore(v1.id)
    trees.assert_trees_equal(state, trees.snapshot_tree(root))
    assert check(engine.store, read_data=True).ok
    _write_pages(path, [51], rng)  # the vector saved by v1 is right again
    _same_as_without_sums(engine)
