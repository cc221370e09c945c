"""Page digests of the previous version: the undo of a step keeps big files on the digest path.

Undoing an agent step restores the checkpoint before it, which brings the database's previous
chunk list back; the next change of it in place must be compared with the vector of that
version (kept beside the newest one, ``pagesums.py``), not against the store.
"""

from __future__ import annotations

import os
import random
from typing import TYPE_CHECKING

import pytest

from sprite_env.checkpoints import Engine
from sprite_env.ids import ObjectId
from sprite_env.snapshot import pagesums
from sprite_env.snapshot.pagesums import SUM_LEN, PageSums
from sprite_env.snapshot.tree import decode_tree
from sprite_env.store import Store, open_store
from sprite_env.store.codec import object_id
from tests.snapshot.test_in_place_sums import _base, _same_as_without_sums, _write_pages

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = pytest.mark.skipif(not pagesums.NATIVE, reason="the C extension is not built")


@pytest.fixture
def root(tmp_path: os.PathLike[str]) -> str:
    r = os.path.join(os.fspath(tmp_path), "layer")
    os.mkdir(r)
    return r


@pytest.fixture
def engine(tmp_path: os.PathLike[str], root: str) -> Iterator[Engine]:
    with Engine(root, os.path.join(os.fspath(tmp_path), "store")) as e:
        yield e


def _db_pieces(engine: Engine, cid: str) -> bytes:
    """The id of the chunk list of ``db.bin`` in checkpoint ``cid`` (the vector's key)."""
    top = decode_tree(engine.store.read(engine.info(cid).top_tree))[0]
    (e,) = [e for e in decode_tree(engine.store.read(ObjectId(top.payload))) if e.name == b"db.bin"]
    return e.payload if e.indirect else object_id(e.payload)


def test_a_change_after_the_undo_of_a_step_uses_the_previous_vector(
    engine: Engine, root: str
) -> None:
    rng = random.Random(7)
    path = _base(engine, root, rng)
    v0 = engine.active()
    assert v0 is not None
    _write_pages(path, [5, 6, 300, 900], rng)
    step = engine.create()  # its vector is now the newest; v0's is kept before it
    found = pagesums.Lookup(engine.store.catalog)
    assert found.find(b"db.bin", _db_pieces(engine, step.id)) is not None
    assert found.find(b"db.bin", _db_pieces(engine, v0)) is not None
    engine.restore(v0)  # the undo: v0's chunk list is the live one again
    _write_pages(path, [10, 11, 700], rng)
    _same_as_without_sums(engine)  # without v0's vector: compared against the store


def test_the_vector_compared_against_is_the_one_kept(tmp_path: os.PathLike[str]) -> None:
    """The row before the newest is the capture's base, else the newest it replaced."""
    store: Store = open_store(os.path.join(os.fspath(tmp_path), "store"), create=True)
    try:

        def ps(base: PageSums | None = None) -> PageSums:
            return PageSums(os.urandom(32), os.urandom(32), os.urandom(SUM_LEN * 3), base)

        found = pagesums.Lookup(store.catalog)
        a, b = ps(), ps()
        with store.catalog.transaction() as db:
            pagesums.save(db, {b"d/db": a}, {})
        with store.catalog.transaction() as db:  # read fresh: the newest it replaces stays
            pagesums.save(db, {b"d/db": b}, {})
        assert (found(b"d/db"), found.find(b"d/db", a.pieces)) == (b, a)
        c = ps(base=a)  # compared against a (after an undo): a stays, b goes
        with store.catalog.transaction() as db:
            pagesums.save(db, {b"d/db": c}, {})
        assert found(b"d/db") == c
        assert found.find(b"d/db", a.pieces) == a
        assert found.find(b"d/db", b.pieces) is None
        assert found.find(b"d/db", c.pieces) == c
        with store.catalog.transaction() as db:  # the file gone: both rows go
            pagesums.save(db, {}, {}, removed=[b"d"])
        assert store.catalog.query("SELECT count(*) FROM pagesums")[0][0] == 0
    finally:
        store.close()


def test_a_previous_row_failing_its_checksum_is_dropped(
    tmp_path: os.PathLike[str], expect_log: Callable[[str], None]
) -> None:
    expect_log("page digests of b'd/db' failed their checksum and were dropped")
    store = open_store(os.path.join(os.fspath(tmp_path), "store"), create=True)
    try:
        a = PageSums(os.urandom(32), os.urandom(32), os.urandom(SUM_LEN * 3))
        b = PageSums(os.urandom(32), os.urandom(32), os.urandom(SUM_LEN * 3), a)
        with store.catalog.transaction() as db:
            pagesums.save(db, {b"d/db": b}, {})
        with store.catalog.transaction() as db:  # a row moved to the newest's key is caught
            db.execute("UPDATE pagesums SET sums=? WHERE path=?", (b.sums[::-1], b"d/db\0"))
        assert pagesums.Lookup(store.catalog).find(b"d/db", a.pieces) is None
        assert pagesums.Lookup(store.catalog).find(b"d/db", b.pieces) == b
        assert store.catalog.query("SELECT count(*) FROM pagesums")[0][0] == 1
    finally:
        store.close()
