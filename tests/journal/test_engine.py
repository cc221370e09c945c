"""The engine with a journal: which walk each checkpoint took, recorded; restores and
prewarms keep the journal's epochs honest."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from typing import TYPE_CHECKING

import pytest

from sprite_env.checkpoints import Engine
from sprite_env.checkpoints.engine import InvalidComment
from sprite_env.checkpoints.hashonly import HashOnlySink
from sprite_env.checkpoints.registry import Checkpoint
from sprite_env.journal import Journal
from sprite_env.snapshot.capture import capture
from sprite_env.store import open_store
from sprite_env.store.check import check
from tests.helpers.daemon import write_file

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


def _tree(layer: str) -> None:
    for d in ("a/b", "c"):
        for i in range(3):
            write_file(f"{layer}/{d}/f{i}", b"%d" % i * 100)


def _truth(engine: Engine) -> bytes:
    sink = HashOnlySink(engine.store)
    return capture(engine.root, sink, sink.read, {}, excludes=engine.excludes).top_tree


def test_each_checkpoint_records_its_walk(layer: str, tmp_path: os.PathLike[str]) -> None:
    _tree(layer)
    store = os.path.join(os.fspath(tmp_path), "store")
    with Engine(layer, store) as e:
        v0 = e.create("no journal")
        assert (v0.walk, v0.walk_reason) == ("full", "no change journal running")
        with Journal(layer) as j:
            e.journal = j
            v1 = e.create()
            assert v1.walk == "full"
            assert "just started" in v1.walk_reason
            time.sleep(0.06)  # past the racy window, so the hint alone decides
            write_file(f"{layer}/a/b/f1", b"changed")
            v2 = e.create()
            assert (v2.walk, v2.walk_reason) == ("journal", "")
            assert v2.top_tree == _truth(e)
            assert (v2.files, v2.dirs, v2.bytes) == (6, 4, 5 * 100 + 7)
            assert e.info("v2").to_json()["walk"] == "journal"
    with Engine(layer, store) as e:  # the fields are in the row, and in the META record
        assert [(c.id, c.walk) for c in e.checkpoints()] == [
            ("v2", "journal"),
            ("v1", "full"),
            ("v0", "full"),
        ]
        raw = json.loads(e.store.read(e.info("v2").record))["checkpoint"]
        assert raw["walk"] == "journal"


def test_records_without_the_fields_still_decode(tmp_path: os.PathLike[str]) -> None:
    """A catalog of schema 2 (before ``walk``) opens with every old row a full walk, and a
    META record written before the fields existed decodes (``registry.recover``)."""
    path = os.path.join(os.fspath(tmp_path), "store")
    with open_store(path, create=True):
        pass
    db = sqlite3.connect(os.path.join(path, "catalog.db"))
    db.execute("ALTER TABLE checkpoints DROP COLUMN walk")
    db.execute("ALTER TABLE checkpoints DROP COLUMN walk_reason")
    db.execute("ALTER TABLE dircache DROP COLUMN sum")  # schema 4's, see store/catalog.py
    db.execute("DROP TABLE pagesums")  # schema 5's
    db.execute("DROP VIEW objects")  # schema 6's two object tables (its triggers go too)
    db.execute("DROP TABLE objects_new")
    db.execute("ALTER TABLE objects_main RENAME TO objects")
    old = dict(
        id="v0", seq=0, is_auto=0, create_time_ns=1, comment="", created_by="user",
        parent=None, history="[]", top_tree=b"\0" * 32, record=b"\1" * 32, files=1, dirs=1,
        bytes=1, bytes_added=1, warnings="[]",
    )  # fmt: skip
    db.execute(
        f"INSERT INTO checkpoints({','.join(old)}) VALUES ({','.join('?' * len(old))})",
        list(old.values()),
    )
    db.execute("PRAGMA user_version=2")
    db.commit()
    db.close()
    with open_store(path) as s:
        from sprite_env.checkpoints.registry import Registry

        cp = Registry(s.catalog).get("v0")
        assert (cp.walk, cp.walk_reason) == ("full", "")
    d = {k: v for k, v in old.items() if k != "record"}
    d.update(history=[], top_tree=b"\0" * 32, warnings=[], is_auto=False)
    assert Checkpoint(**d).walk == "full"  # type: ignore[arg-type]


def test_restores_and_prewarms_are_seen_by_the_journal(
    layer: str, tmp_path: os.PathLike[str]
) -> None:
    _tree(layer)
    with Engine(layer, os.path.join(os.fspath(tmp_path), "store")) as e, Journal(layer) as j:
        e.journal = j
        e.create()
        time.sleep(0.06)
        write_file(f"{layer}/c/new", b"new")
        os.unlink(f"{layer}/a/b/f0")
        v1 = e.create()
        assert v1.walk == "journal"
        e.restore("v0")  # its undo checkpoint is journal-driven; its writes are events
        time.sleep(0.06)
        v2 = e.create()
        assert v2.walk == "journal"
        assert v2.top_tree == _truth(e) == e.info("v0").top_tree
        write_file(f"{layer}/a/x", b"x")
        e.prewarm()  # an epoch of its own: the create after it builds on it
        time.sleep(0.06)
        os.chmod(f"{layer}/c", 0o700)
        v3 = e.create()
        assert v3.walk == "journal"
        assert v3.top_tree == _truth(e)


def test_a_failed_capture_makes_the_next_walk_full(layer: str, tmp_path: os.PathLike[str]) -> None:
    _tree(layer)
    with Engine(layer, os.path.join(os.fspath(tmp_path), "store")) as e, Journal(layer) as j:
        e.journal = j
        e.create()
        with pytest.raises(InvalidComment):
            e.create("\x00 is not a comment")  # refused before any capture: epoch untouched
        assert e.create().walk == "journal"

        class Boom(Exception):
            pass

        def pause() -> object:
            raise Boom

        with pytest.raises(Boom):
            e.create(pause=pause)  # type: ignore[arg-type]
        # The freeze failed before the frozen pass began its epoch (it begins inside the
        # pause): only the prewarm's epoch ran, and it committed.
        assert e.create().walk == "journal"

        @contextlib.contextmanager
        def thaw_fails() -> Iterator[None]:
            yield
            raise Boom  # after the frozen walk, inside its epoch

        with pytest.raises(Boom):
            e.create(pause=thaw_fails)
        nxt = e.create()
        assert nxt.walk == "full"
        assert "did not finish" in nxt.walk_reason
        assert nxt.top_tree == _truth(e)


def test_the_files_cache_row_by_row(tmp_path: os.PathLike[str]) -> None:
    from sprite_env.snapshot import dircache

    with open_store(os.path.join(os.fspath(tmp_path), "store"), create=True) as s:
        rows = {
            b"": dircache.CachedDir(b"\1" * 32, b""),
            b"a/b": dircache.CachedDir(b"\2" * 32, b"x"),
        }
        with s.catalog.transaction() as db:
            dircache.save(db, rows)  # type: ignore[arg-type]
        view = dircache.CacheView(s.catalog)
        assert view.get(b"a/b") == rows[b"a/b"]
        assert view.get(b"a") is None
        assert b"a" not in view
        assert dict(view) == rows  # iterating reads every row


def test_a_journal_walk_reads_only_the_rows_it_needs(
    layer: str, tmp_path: os.PathLike[str]
) -> None:
    from sprite_env.snapshot import dircache

    for d in range(30):
        write_file(f"{layer}/d{d}/sub/f", b"%d" % d)
    time.sleep(0.06)  # so the first walk's rows are not racy (they would vouch for nothing)
    with Engine(layer, os.path.join(os.fspath(tmp_path), "store")) as e, Journal(layer) as j:
        e.journal = j
        e.create()
        time.sleep(0.06)
        write_file(f"{layer}/d3/sub/f", b"changed")
        plan = j.begin()
        view = dircache.CacheView(e.store.catalog)
        sink = HashOnlySink(e.store)
        r = capture(layer, sink, sink.read, view, excludes=e.excludes, hint=plan.hint)
        assert r.walk == "journal"
        assert r.top_tree == _truth(e)
        assert view._all is None  # never loaded whole
        # the root, its 30 children (each checked, not opened), d3/sub and the names it
        # held (looked up for removed directories): not the 61 rows of the cache
        assert len(view._rows) <= 35
        j.abort(plan)


def _counts(engine: Engine, cp: Checkpoint) -> None:
    sink = HashOnlySink(engine.store)
    full = capture(engine.root, sink, sink.read, {}, excludes=engine.excludes)
    assert cp.top_tree == full.top_tree
    s = full.stats
    assert (cp.files, cp.dirs, cp.bytes) == (s.files, s.dirs, s.bytes)


def test_after_a_restore_the_counts_are_the_layers(layer: str, tmp_path: os.PathLike[str]) -> None:
    """A restore writes the rows of what it restored, newer than the journal's memo (the
    undo checkpoint's walk): the next narrowed checkpoint counts from the rows, and says
    what a full walk says. And the restore sets back directories' own mtimes (events on the
    directories themselves), which do not make their listings be read whole."""
    _tree(layer)
    for i in range(20):
        write_file(f"{layer}/c/wide{i:02}", b"w" * i)
    store = os.path.join(os.fspath(tmp_path), "store")
    with Engine(layer, store) as e, Journal(layer) as j:
        e.journal = j
        e.create("v0")
        e.create("memo")  # the journal's first walk (full); the rest are narrowed
        time.sleep(0.06)
        os.unlink(f"{layer}/c/wide03")
        write_file(f"{layer}/c/new", b"n" * 50)
        write_file(f"{layer}/a/b/f1", b"changed")
        os.makedirs(f"{layer}/a/made/deeper")
        write_file(f"{layer}/a/made/deeper/x", b"x" * 9)
        step = e.create("step")
        assert step.walk == "journal"
        _counts(e, step)
        e.restore("v0")  # back: wide03 again, no new, no made/
        time.sleep(0.06)
        write_file(f"{layer}/c/wide05", b"edit")
        after = e.create("after")
        assert after.walk == "journal"
        _counts(e, after)


def _link_from_outside(layer: str, rel: str) -> None:
    """Links the layer file ``rel`` from a directory beside the layer (the same file
    system) and writes through that name only."""
    outside = os.path.join(os.path.dirname(layer), "outside")
    os.makedirs(outside, exist_ok=True)
    second = os.path.join(outside, os.path.basename(rel))
    os.link(os.path.join(layer, rel), second)
    with open(second, "ab") as f:
        f.write(b"through the other name")


def test_a_link_from_outside_the_layer_keeps_the_journal_through_the_engine(
    layer: str, tmp_path: os.PathLike[str]
) -> None:
    """Through the engine and its files cache in the catalog (read row by row, then
    searched by inode): a layer file linked from outside the layer and written through
    that name only is captured exactly, by a journal walk; the restore of the checkpoint
    before gives back the old bytes, and the store checks whole."""
    _tree(layer)
    with Engine(layer, os.path.join(os.fspath(tmp_path), "store")) as e, Journal(layer) as j:
        e.journal = j
        e.create("before")  # the journal's first walk: full
        time.sleep(0.06)
        _link_from_outside(layer, "a/b/f2")
        time.sleep(0.06)
        cp = e.create("linked")
        assert (cp.walk, cp.walk_reason) == ("journal", "")
        assert cp.top_tree == _truth(e)
        e.restore("v0")
        with open(f"{layer}/a/b/f2", "rb") as f:
            assert f.read() == b"2" * 100
        assert check(e.store, read_data=True).ok


def test_a_damaged_row_where_a_linked_file_is_named_makes_the_walk_full(
    layer: str, tmp_path: os.PathLike[str], expect_log: Callable[[str], None]
) -> None:
    """The row that holds the linked file's name fails its checksum when the search finds
    it: the file's names cannot all be given, so the walk is full, says why, and is exact."""
    _tree(layer)
    store = os.path.join(os.fspath(tmp_path), "store")
    with Engine(layer, store) as e, Journal(layer) as j:
        e.journal = j
        e.create("before")
        time.sleep(0.06)
        _link_from_outside(layer, "a/b/f1")
        with contextlib.closing(sqlite3.connect(os.path.join(store, "catalog.db"))) as db:
            db.execute("UPDATE dircache SET sum = sum + 1 WHERE path = ?", (b"a/b",))
            db.commit()
        time.sleep(0.06)
        expect_log(r"1 rows failed their checksum and were dropped \(first b'a/b'\)")
        cp = e.create("linked")
        assert cp.walk == "full"
        assert "failed their checksum" in cp.walk_reason
        assert cp.top_tree == _truth(e)
