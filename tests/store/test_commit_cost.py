"""What a commit does on the disk (issue 11): one fsync of ``packs/`` for all the packs it
publishes, and the catalog's WAL copied back into the database after the commit, by a
thread of its own, not inside the COMMIT of whoever passed SQLite's 1,000 pages."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from typing import TYPE_CHECKING

import blake3

import sprite_env.store.catalog as catalog_mod
import sprite_env.store.pack as pack_mod
import sprite_env.store.writer as writer_mod
from sprite_env.checkpoints import Engine
from sprite_env.checkpoints.verify import verify_store
from sprite_env.ids import ObjectId, PackName
from sprite_env.store import open_store
from sprite_env.store.catalog import Catalog, insert_pack
from sprite_env.store.pack import Entry

if TYPE_CHECKING:
    from collections.abc import Callable

    import pytest

    from sprite_env.store import Store


def _blob(i: int) -> bytes:  # incompressible
    return blake3.blake3(b"%d" % i).digest(length=8000)


def _count_dir_fsyncs(monkeypatch: pytest.MonkeyPatch, packs_dir: str) -> list[str]:
    """Records every fsync of ``packs_dir`` (and still makes it: a spy, not a stand-in)."""
    seen: list[str] = []
    real = pack_mod._fsync_dir

    def spy(path: str) -> None:
        if os.path.abspath(path) == os.path.abspath(packs_dir):
            seen.append(path)
        real(path)

    monkeypatch.setattr(pack_mod, "_fsync_dir", spy)
    monkeypatch.setattr(writer_mod, "_fsync_dir", spy)
    return seen


def test_one_directory_fsync_for_all_the_packs_of_a_commit(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _count_dir_fsyncs(monkeypatch, store.packs_dir)
    with store.writer(pack_size=50_000) as w:
        ids = [w.put(_blob(i)) for i in range(60)]  # 480 kB: about ten packs
        names = w.commit()
    assert len(names) >= 8
    assert len(seen) == 1  # was one per pack
    assert [store.read(i) for i in ids] == [_blob(i) for i in range(60)]
    assert verify_store(store, read_data=True).ok


def test_a_create_fsyncs_packs_once(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = os.path.join(os.fspath(tmp_path), "layer")
    os.makedirs(root)
    for i in range(20):
        with open(os.path.join(root, f"f{i}"), "wb") as f:
            f.write(_blob(i) * 3)
    with Engine(root, os.path.join(os.fspath(tmp_path), "store")) as e:
        seen = _count_dir_fsyncs(monkeypatch, e.store.packs_dir)
        cp = e.create("v0")
        packs = len(e.store.catalog.packs())
        assert packs == 3  # data, trees, and the record in a pack of its own
        assert len(seen) == 1  # was 3: one per pack
        assert e.store.read(cp.top_tree)


def test_the_wal_is_copied_back_after_the_commit_not_in_it(store: Store) -> None:
    copier = store.catalog._copier
    assert copier is not None
    # SQLite's automatic copy is off on the writer's connection: no COMMIT pays for it.
    assert store.catalog._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    with store.writer() as w:
        ids = [w.put(os.urandom(64)) for _ in range(30_000)]  # > 1,000 pages of rows
        w.commit()
    copier.settle()
    assert copier.copies >= 1
    # Copied in full: a checkpoint finds every frame of the WAL already in the database,
    # and the database file alone (no WAL beside it) holds the new rows.
    probe = sqlite3.connect(store.catalog.path)
    try:
        busy, frames, done = probe.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    finally:
        probe.close()
    assert busy == 0
    assert frames == done
    alone = os.path.join(store.path, "alone.db")
    shutil.copy(store.catalog.path, alone)
    db = sqlite3.connect(alone)
    try:
        (n,) = db.execute("SELECT count(*) FROM objects").fetchone()
    finally:
        db.close()
    assert n == len(set(ids))


def test_a_reopened_store_has_what_was_committed_while_the_copier_ran(store_dir: str) -> None:
    with open_store(store_dir, create=True) as s:
        for round_ in range(5):
            with s.writer() as w:
                for i in range(500):
                    w.put(b"%d-%d" % (round_, i) * 20)
                w.commit()
    with open_store(store_dir, writable=False) as s:
        assert s.catalog.object_count() == 2500
        assert verify_store(s, read_data=True).ok


FAILING_WRITER = r"""
import errno, os, sys
from sprite_env.store import open_store
with open_store(sys.argv[1], create=True) as s:
    with s.writer() as w:
        for i in range(3):
            w.put(b"object %d " % i * 100)
        try:
            w.commit()
            print("committed")
        except OSError as e:
            print("failed", errno.errorcode[e.errno])
    print(len(os.listdir(s.packs_dir)), len(os.listdir(s.tmp_dir)), s.catalog.object_count())
"""


def test_a_pack_that_cannot_be_made_durable_fails_its_commit_and_leaves_nothing(
    store_dir: str,
) -> None:
    # The commit's one pack is published on a thread of its own while the transaction is
    # filled; its fsync failing (ENOSPC, injected) must roll the rows back, not commit them.
    env = dict(os.environ, SPRITE_ENV_CRASH_AT="pack-before-fsync:1:ENOSPC")
    r = subprocess.run(
        [sys.executable, "-c", FAILING_WRITER, store_dir],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["failed ENOSPC", "0 0 0"]  # no pack, no temp, no row
    env.pop("SPRITE_ENV_CRASH_AT")
    r = subprocess.run(
        [sys.executable, "-c", FAILING_WRITER, store_dir],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.stdout.split("\n")[:2] == ["committed", "1 0 3"]
    with open_store(store_dir, writable=False) as s:
        assert verify_store(s, read_data=True).ok


def _rows(n: int, seed: bytes) -> list[Entry]:
    return [
        Entry(ObjectId(blake3.blake3(seed + b"%d" % i).digest()), 16 + 100 * i, 50, 60, 0, 0)
        for i in range(n)
    ]


def _wal_frames_of(cat: Catalog, write: Callable[[sqlite3.Connection], None]) -> int:
    """The WAL frames (pages) one transaction writes: the WAL is copied back in full first,
    so the transaction starts it over and is all it holds."""
    assert cat._copier is not None
    cat._copier.settle()
    with cat.transaction() as db:
        write(db)
    cat._copier.settle()
    probe = sqlite3.connect(cat.path)
    try:
        _, frames, _ = probe.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    finally:
        probe.close()
    return int(frames)


def test_new_object_rows_dirty_pages_in_proportion_to_them(tmp_path: os.PathLike[str]) -> None:
    cat = Catalog(os.path.join(os.fspath(tmp_path), "catalog.db"))
    try:
        with cat.transaction() as db:
            insert_pack(db, PackName("a" * 64), 0, 1, _rows(60_000, b"old"))
        cat.merge_objects()  # 60k rows in the main table: about 850 leaves
        new = _rows(2_000, b"new")
        frames = _wal_frames_of(cat, lambda db: insert_pack(db, PackName("b" * 64), 0, 1, new))
        # The same rows straight into the main table, as before schema 6: nearly every leaf.
        control = _wal_frames_of(
            cat,
            lambda db: db.executemany(
                "INSERT INTO objects_main VALUES (?,?,?,?,?,?,?)",
                [(e.id, 1, e.offset + 1, 1, 1, 0, 0) for e in _rows(2_000, b"control")],
            ),
        )
        assert frames < 120
        assert control > 500
        assert cat.object_count() == 64_000
        assert cat.has(new[7].id)
        assert cat.has_many([e.id for e in new[:600]]) == {e.id for e in new[:600]}
        loc = cat.locate(new[3].id)
        assert loc is not None
        assert loc.pack == "b" * 64
    finally:
        cat.close()


def test_new_rows_move_to_the_main_table_after_a_commit_and_stay_unique(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(catalog_mod, "MERGE_ROWS", 500)
    cat = Catalog(os.path.join(os.fspath(tmp_path), "catalog.db"))
    try:
        first = _rows(400, b"x")
        with cat.transaction() as db:
            insert_pack(db, PackName("a" * 64), 0, 1, first)
        assert cat._copier is not None
        cat._copier.settle()
        assert cat.query("SELECT count(*) FROM objects_new") == [(400,)]  # under the bound
        with cat.transaction() as db:  # 200 more, 100 of them known already: ignored
            insert_pack(db, PackName("b" * 64), 0, 1, first[300:] + _rows(100, b"y"))
        cat._copier.settle()
        assert cat.query("SELECT count(*) FROM objects_new") == [(0,)]  # moved
        assert cat.query("SELECT count(*) FROM objects_main") == [(500,)]
        assert cat.object_count() == 500  # each id once
        loc = cat.locate(first[350].id)
        assert loc is not None
        assert loc.pack == "a" * 64  # the first row of an id stays
        with cat.transaction() as db:  # the view's triggers reach both tables
            insert_pack(db, PackName("c" * 64), 0, 1, _rows(10, b"z"))
            db.execute("UPDATE objects SET offset = 7 WHERE id = ?", (first[0].id,))
            db.execute(
                "DELETE FROM objects WHERE pack = (SELECT id FROM packs WHERE name = ?)",
                ("c" * 64,),
            )
        assert cat.object_count() == 500
        loc = cat.locate(first[0].id)
        assert loc is not None
        assert loc.entry.offset == 7
    finally:
        cat.close()
