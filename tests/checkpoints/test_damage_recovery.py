"""A damaged store stays usable (issue 15, points 3 and 4).

A delete whose collection meets damage still deletes, the store still opens and serves
its healthy checkpoints, and the damage is named; a pack that is lost leaves the catalog
and the files cache, so the next checkpoint stores that data again and is restorable.
Damage is injected as the outside audit did: flipped bytes in a pack, a wrong catalog
row, a pack file deleted.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from typing import TYPE_CHECKING

import pytest

from sprite_env.checkpoints import Engine
from sprite_env.checkpoints.verify import verify_store
from sprite_env.errors import StoreError
from sprite_env.ids import ObjectId
from sprite_env.snapshot.tree import decode_tree
from sprite_env.store import check
from sprite_env.store.pack import ENTRY, pack_path
from tests.helpers import trees
from tests.helpers.cli import run_cli

if TYPE_CHECKING:
    from collections.abc import Callable

    from sprite_env.store import Store


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def _subtree(store: Store, top: ObjectId, name: bytes) -> ObjectId:
    """The tree id of the root's directory ``name`` in the checkpoint whose top is ``top``."""
    (dot,) = decode_tree(store.read(top))
    (entry,) = [e for e in decode_tree(store.read(dot.subtree)) if e.name == name]
    return entry.subtree


def _corrupt_object(store: Store, oid: ObjectId) -> str:
    """Flips a byte in the middle of an object's stored bytes; returns its pack's name."""
    loc = store.catalog.locate(oid)
    assert loc is not None
    _flip(
        pack_path(store.packs_dir, loc.pack),
        loc.entry.offset + ENTRY.size + loc.entry.stored_len // 2,
    )
    return loc.pack


def _export(engine: Engine, cid: str, dest: str) -> None:
    os.mkdir(dest)
    engine.export(cid, dest)


def _store_check(store_dir: str, *, read_data: bool = True) -> dict[str, object]:
    """``sprite-env store check --json`` as a user runs it (exit 0 or 3, never a traceback)."""
    r = run_cli("store", "check", "--store", store_dir, "--json", *(["--read-data"] * read_data))
    assert r.returncode in (0, 3), r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    out: dict[str, object] = json.loads(r.stdout)
    assert out["ok"] == (r.returncode == 0)
    return out


def _problems(store: Store) -> list[str]:
    """What ``store check --read-data`` says of an open store."""
    return verify_store(store, read_data=True).errors


# -- point 3: a collection that cannot finish --------------------------------------------


def _three_with_a_damaged_middle(engine: Engine, root: str) -> tuple[trees.Snapshot, ObjectId]:
    """v0 {keep}, v1 {keep, bad}, v2 {keep, other}; the tree of v1's ``bad`` is corrupt.
    Returns the layer as v2 holds it, and the corrupt tree's id."""
    trees.build_tree(root, {"keep/a": trees.File(os.urandom(50_000)), "keep/b": trees.File(b"b")})
    engine.create("v0")
    trees.build_tree(root, {"bad/x": trees.File(os.urandom(40_000)), "bad/y": trees.File(b"y")})
    v1 = engine.create("v1")
    for name in ("x", "y"):
        os.unlink(os.path.join(root, "bad", name))
    os.rmdir(os.path.join(root, "bad"))
    trees.build_tree(root, {"other/z": trees.File(os.urandom(30_000))})
    engine.create("v2")
    bad = _subtree(engine.store, v1.top_tree, b"bad")
    _corrupt_object(engine.store, bad)
    return trees.snapshot_tree(root), bad


def test_delete_beside_a_corrupt_tree_deletes_and_the_store_stays_usable(
    engine: Engine, root: str, tmp_path: os.PathLike[str], expect_log: Callable[[str], None]
) -> None:
    expect_log("space not freed, the store is damaged")
    base = os.fspath(tmp_path)
    store_dir = engine.store.path
    v2_tree, bad = _three_with_a_damaged_middle(engine, root)
    before = engine.store.catalog.object_count()

    rep = engine.delete("v0")  # on main: CorruptPack, and every later open failed

    assert [c.id for c in engine.checkpoints()] == ["v2", "v1"]
    assert rep.bytes_freed == 0
    assert rep.objects_removed == 0
    assert any("checkpoint v1" in p and bad.hex()[:16] in p for p in rep.problems), rep.problems
    assert any("nothing was deleted" in p for p in rep.problems)
    assert rep.to_json()["problems"] == rep.problems
    # Nothing v1 might need is gone: its subtree's children are unknown.
    assert engine.store.catalog.object_count() == before
    engine.close()

    with Engine(root, store_dir) as again:  # opens, and does not retry the doomed marking
        assert [c.id for c in again.checkpoints()] == ["v2", "v1"]
        assert again.info("v2").comment == "v2"
        _export(again, "v2", os.path.join(base, "out"))
        trees.assert_trees_equal(v2_tree, os.path.join(base, "out"), check_root_meta=False)
        with pytest.raises(StoreError, match="checkpoint v1 is damaged"):
            _export(again, "v1", os.path.join(base, "out1"))

    report = _store_check(store_dir)
    assert not report["ok"]
    errors = "\n".join(map(str, report["errors"]))  # type: ignore[call-overload]
    assert "checkpoint v1" in errors
    assert "checkpoint v2" not in errors


def test_deleting_the_damaged_checkpoint_lets_the_collection_finish(
    engine: Engine, root: str, expect_log: Callable[[str], None]
) -> None:
    expect_log("space not freed, the store is damaged")
    _three_with_a_damaged_middle(engine, root)
    assert engine.delete("v0").problems
    rep = engine.delete("v1")  # the corrupt tree was only v1's
    assert rep.problems == []
    assert rep.bytes_freed > 40_000  # v0's and v1's unique data went at last
    assert engine.store.catalog.meta("gc_pending") is None
    report = check(engine.store, read_data=True)
    assert report.ok, report.errors
    assert verify_store(engine.store).affected == []


def test_a_collection_interrupted_then_blocked_by_damage_does_not_fail_the_open(
    engine: Engine, root: str, expect_log: Callable[[str], None]
) -> None:
    """A kill between the delete's row removal and its collection leaves ``gc_pending``;
    the next open finishes it, and damage met then is reported, not raised."""
    expect_log("space not freed, the store is damaged")
    store_dir = engine.store.path
    _three_with_a_damaged_middle(engine, root)
    from sprite_env.checkpoints import registry

    with engine.store.catalog.transaction() as db:  # what delete_many commits first
        registry.delete(db, "v0")
        registry.set_meta(db, "gc_pending", "1")
    engine.close()
    with Engine(root, store_dir) as again:
        assert [c.id for c in again.checkpoints()] == ["v2", "v1"]
        pending = json.loads(again.store.catalog.meta("gc_pending") or "")
        assert any("checkpoint v1" in p for p in pending["problems"])


def test_a_wrong_catalog_row_keeps_its_pack_and_the_rest_is_collected(
    engine: Engine, root: str, tmp_path: os.PathLike[str], expect_log: Callable[[str], None]
) -> None:
    """An object row pointing at the wrong offset (a damaged index) in a pack the prune
    rewrites: that pack is kept, the delete and every later open work, and the next create
    stores the object afresh, which repairs the checkpoints that use it."""
    expect_log("space not freed, the store is damaged")
    base = os.fspath(tmp_path)
    store_dir = engine.store.path
    shared = os.urandom(100_000)
    trees.build_tree(root, {"a.bin": trees.File(os.urandom(300_000)), "s.bin": trees.File(shared)})
    engine.create("v0")
    os.unlink(os.path.join(root, "a.bin"))
    trees.build_tree(root, {"b.bin": trees.File(os.urandom(200_000))})
    v1 = engine.create("v1")
    v1_tree = trees.snapshot_tree(root)
    (dot,) = decode_tree(engine.store.read(v1.top_tree))
    (s_entry,) = [e for e in decode_tree(engine.store.read(dot.subtree)) if e.name == b"s.bin"]
    from sprite_env.snapshot.tree import decode_chunks

    chunk = decode_chunks(s_entry.payload)[0][0]
    assert chunk is not None
    loc = engine.store.catalog.locate(chunk)
    assert loc is not None
    others = [
        e
        for e in engine.store.catalog.objects_in_pack(
            next(p.id for p in engine.store.catalog.packs() if p.name == loc.pack)
        )
        if e.id != chunk
    ]
    with engine.store.catalog.transaction() as db:  # the row now names another object's place
        db.execute("UPDATE objects SET offset=? WHERE id=?", (others[0].offset, chunk))

    rep = engine.delete("v0")  # on main: CorruptPack "object header does not match"

    assert any(f"pack {loc.pack} kept" in p for p in rep.problems), rep.problems
    assert [c.id for c in engine.checkpoints()] == ["v1"]
    engine.close()
    with Engine(root, store_dir) as again:
        assert [c.id for c in again.checkpoints()] == ["v1"]
        v2 = again.create("over the same layer")  # stores the damaged chunk afresh
        _export(again, v2.id, os.path.join(base, "v2"))
        trees.assert_trees_equal(v1_tree, os.path.join(base, "v2"), check_root_meta=False)
        _export(again, "v1", os.path.join(base, "v1"))  # repaired by the fresh copy
        trees.assert_trees_equal(v1_tree, os.path.join(base, "v1"), check_root_meta=False)
        assert again.delete("v1").problems == []  # now the collection finishes
    report = _store_check(store_dir)
    assert report["ok"], report


def _flip_index_entry(catalog: str, oid: bytes, pack: int, to: int) -> None:
    """Rewrites one entry of the ``objects_by_pack`` index in the database file so that it
    names pack ``to`` (the table row still says ``pack``): one bad index byte, which
    ``store check`` without an integrity check does not see. The entry is the record
    (pack, id): header size 3, serial types 1 (a one-byte integer) and 76 (a 32-byte
    blob), then the values (SQLite's record format)."""
    db = sqlite3.connect(catalog)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    with open(catalog, "r+b") as f:
        raw = f.read()
        at = raw.find(b"\x03\x01\x4c" + bytes([pack]) + oid)
        assert at > 0, "index entry not found"
        f.seek(at + 3)
        f.write(bytes([to]))


def _names_catalog_damage(problem: str) -> bool:
    stopped = problem.startswith("the collection stopped: ") and "catalog" in problem
    kept = re.fullmatch(
        r"pack [0-9a-f]{64} kept: the catalog lists \d+ live objects, planned \d+", problem
    )
    return stopped or kept is not None


def test_a_damaged_catalog_index_does_not_stop_the_store(
    engine: Engine, root: str, tmp_path: os.PathLike[str], expect_log: Callable[[str], None]
) -> None:
    expect_log("space not freed, the store is damaged")
    base = os.fspath(tmp_path)
    store_dir = engine.store.path
    trees.build_tree(root, {"a.bin": trees.File(os.urandom(300_000)), "s.bin": trees.File(b"s")})
    engine.create("v0")
    os.unlink(os.path.join(root, "a.bin"))
    trees.build_tree(root, {"b.bin": trees.File(os.urandom(200_000))})
    engine.create("v1")
    v1_tree = trees.snapshot_tree(root)
    packs = [p.id for p in engine.store.catalog.packs()]
    # Pack ids 2..127: stored as one-byte integers (0 and 1 have serial types of their own).
    oid, pack = engine.store.catalog.query(
        "SELECT id, pack FROM objects WHERE kind = 0 AND pack BETWEEN 2 AND 127"
    )[0]
    engine.close()
    catalog = os.path.join(store_dir, "catalog.db")
    _flip_index_entry(catalog, bytes(oid), pack, next(p for p in packs if 2 <= p != pack))

    with Engine(root, store_dir) as e:
        rep = e.delete("v0")  # on main: StoreError, then again at every open
        assert rep.problems, rep.problems
        # Which of the prune's catalog queries meets the bad entry first depends on the
        # packs the random data made: the plan's totals (the whole collection stops) or
        # one pack's object list (that pack is kept). Either names the damage and frees
        # nothing it cannot prove dead.
        assert all(_names_catalog_damage(p) for p in rep.problems), rep.problems
    with Engine(root, store_dir) as e:
        assert [c.id for c in e.checkpoints()] == ["v1"]
        _export(e, "v1", os.path.join(base, "v1"))
        trees.assert_trees_equal(v1_tree, os.path.join(base, "v1"), check_root_meta=False)
    r = run_cli("store", "rebuild-catalog", "--store", store_dir)  # what the warning says
    assert r.returncode == 0, r.stderr
    with Engine(root, store_dir) as e:
        e.create("v2")
        assert e.delete("v1").problems == []  # the retried collection finishes
        assert e.store.catalog.meta("gc_pending") is None
    assert _store_check(store_dir)["ok"]


# -- point 4: lost packs -----------------------------------------------------------------


def _layer(root: str) -> None:
    trees.build_tree(
        root,
        {
            "big.bin": trees.File(os.urandom(400_000)),
            "d/small": trees.File(b"hello"),
            "d/e/deeper": trees.File(os.urandom(70_000)),
        },
    )


def _pack_of_class(store: Store, cls: int) -> str:
    (name,) = [p.name for p in store.catalog.packs() if p.pack_class == cls]
    return name


def test_a_lost_data_pack_is_stored_again_by_the_next_create(
    engine: Engine, root: str, tmp_path: os.PathLike[str], expect_log: Callable[[str], None]
) -> None:
    expect_log(r"pack \w+ is missing")
    base = os.fspath(tmp_path)
    _layer(root)
    layer = trees.snapshot_tree(root)
    engine.create("v0")
    lost = _pack_of_class(engine.store, 0)
    os.unlink(pack_path(engine.store.packs_dir, lost))  # while the engine is open

    v1 = engine.create("v1")  # the same unchanged layer: on main it deduplicated to nothing

    assert v1.bytes_added > 400_000
    assert engine.store.lost_packs() == []  # (the same bytes make the same pack name)
    _export(engine, "v1", os.path.join(base, "v1"))
    trees.assert_trees_equal(layer, os.path.join(base, "v1"), check_root_meta=False)
    assert _problems(engine.store) == []  # v0's chunks are the same objects: whole again


def test_a_lost_metadata_pack_found_at_open(
    engine: Engine, root: str, tmp_path: os.PathLike[str], expect_log: Callable[[str], None]
) -> None:
    """The trees' pack lost while no engine is open: the next open forgets it, list and
    info work, an export of the damaged checkpoint names it, and a create is restorable."""
    expect_log(r"pack \w+ is missing")
    base = os.fspath(tmp_path)
    store_dir = engine.store.path
    _layer(root)
    layer = trees.snapshot_tree(root)
    v0 = engine.create("v0")
    loc = engine.store.catalog.locate(v0.top_tree)
    assert loc is not None
    meta = loc.pack  # the trees' pack (the checkpoint's record may be in another)
    engine.close()
    os.unlink(pack_path(os.path.join(store_dir, "packs"), meta))

    with Engine(root, store_dir) as again:
        assert meta not in {p.name for p in again.store.catalog.packs()}
        assert [c.id for c in again.checkpoints()] == ["v0"]
        assert again.info("v0").files == 3
        with pytest.raises(StoreError, match="checkpoint v0 is damaged"):
            _export(again, "v0", os.path.join(base, "v0"))
        again.create("v1")
        _export(again, "v1", os.path.join(base, "v1"))
        trees.assert_trees_equal(layer, os.path.join(base, "v1"), check_root_meta=False)
    report = _store_check(store_dir)
    assert report["ok"], report  # v1 stored the same trees again, so v0 is whole too


def test_a_lost_pack_of_an_old_checkpoint_is_reported_and_the_new_one_is_healthy(
    engine: Engine, root: str, tmp_path: os.PathLike[str], expect_log: Callable[[str], None]
) -> None:
    """Data only an old checkpoint had is lost for good: that one is reported damaged by
    ``store check``, the new one is healthy, and deletes still work."""
    expect_log(r"pack \w+ is missing")
    expect_log("space not freed, the store is damaged")
    base = os.fspath(tmp_path)
    trees.build_tree(root, {"gone.bin": trees.File(os.urandom(200_000))})
    engine.create("v0")
    lost = _pack_of_class(engine.store, 0)
    os.unlink(os.path.join(root, "gone.bin"))
    _layer(root)
    layer = trees.snapshot_tree(root)
    os.unlink(pack_path(engine.store.packs_dir, lost))
    engine.create("v1")
    _export(engine, "v1", os.path.join(base, "v1"))
    trees.assert_trees_equal(layer, os.path.join(base, "v1"), check_root_meta=False)
    errors = _problems(engine.store)
    assert len(errors) == 1, errors
    assert errors[0] == "checkpoint v0: 1 paths need damaged or missing objects: gone.bin"
    engine.create("v2")
    assert engine.delete("v1").problems == []  # v0's trees are fine: marking completes
    assert [c.id for c in engine.checkpoints()] == ["v2", "v0"]


def test_a_truncated_pack_loses_only_what_is_past_its_end(
    engine: Engine, root: str, tmp_path: os.PathLike[str], expect_log: Callable[[str], None]
) -> None:
    expect_log(r"pack \w+ is truncated")
    base = os.fspath(tmp_path)
    _layer(root)
    layer = trees.snapshot_tree(root)
    engine.create("v0")
    data = _pack_of_class(engine.store, 0)
    path = pack_path(engine.store.packs_dir, data)
    os.truncate(path, os.path.getsize(path) // 2)

    v1 = engine.create("v1")  # the same layer: on main it referenced the lost chunks

    assert v1.bytes_added > 100_000  # the lost half, stored again
    _export(engine, "v1", os.path.join(base, "v1"))
    trees.assert_trees_equal(layer, os.path.join(base, "v1"), check_root_meta=False)
    _export(engine, "v0", os.path.join(base, "v0"))  # the same chunks: whole again
    trees.assert_trees_equal(layer, os.path.join(base, "v0"), check_root_meta=False)
    assert verify_store(engine.store).affected == []
    errors = check(engine.store).errors  # the truncated pack itself is still reported
    assert errors
    assert all(data in e for e in errors), errors


def test_a_create_does_not_dedup_against_an_object_a_read_found_corrupt(
    engine: Engine, root: str, tmp_path: os.PathLike[str], expect_log: Callable[[str], None]
) -> None:
    """A pack present but with a corrupt object: once a read met it, the next create
    stores that object afresh (and the files cache does not reuse it)."""
    expect_log("space not freed, the store is damaged")
    base = os.fspath(tmp_path)
    trees.build_tree(root, {"d/f": trees.File(os.urandom(20_000)), "g": trees.File(b"g")})
    layer = trees.snapshot_tree(root)
    v0 = engine.create("v0")
    d = _subtree(engine.store, v0.top_tree, b"d")
    _corrupt_object(engine.store, d)
    engine.create("v1")  # the same layer: reuses v0's tree ids
    assert engine.delete("v0").problems  # marking v1 reads the corrupt tree: now known
    v2 = engine.create("v2")
    assert d not in engine.store.damaged
    _export(engine, v2.id, os.path.join(base, "v2"))
    trees.assert_trees_equal(layer, os.path.join(base, "v2"), check_root_meta=False)
    assert engine.delete("v1").problems == []
    assert check(engine.store, read_data=True).ok
    assert verify_store(engine.store).affected == []


# -- the daemon --------------------------------------------------------------------------


def test_the_daemon_starts_and_serves_after_damage(daemon_factory: Callable[..., object]) -> None:
    from tests.helpers.daemon import DaemonProcess, write_file

    d = daemon_factory()
    assert isinstance(d, DaemonProcess)
    write_file(os.path.join(d.root, "keep/a"), os.urandom(50_000))
    d.create("v0")
    write_file(os.path.join(d.root, "bad/x"), os.urandom(40_000))
    d.create("v1")
    os.unlink(os.path.join(d.root, "bad/x"))
    os.rmdir(os.path.join(d.root, "bad"))
    d.create("v2")
    assert d.stop() == 0

    store_dir = os.path.join(d.state, "store")
    from sprite_env.store import open_store

    with open_store(store_dir) as s:
        top = ObjectId(
            bytes(s.catalog.query("SELECT top_tree FROM checkpoints WHERE id='v1'")[0][0])
        )
        _corrupt_object(s, _subtree(s, top, b"bad"))
    d.start()
    status, body = d.json("DELETE", "/v1/checkpoints/v0")
    assert status == 200, body
    assert any("checkpoint v1" in p for p in body["problems"]), body
    assert d.stop() == 0

    d.start()  # on main the pending collection failed here, at every start
    status, listed = d.json("GET", "/v1/checkpoints")
    assert status == 200
    assert [c["id"] for c in listed] == ["v2", "v1"]
    assert "space not freed, the store is damaged" in d.log()
    assert CHECK in d.log()


CHECK = "sprite-env store check --read-data"


def test_the_offline_cli_deletes_and_lists_a_damaged_store(engine: Engine, root: str) -> None:
    """What a user sees: the delete says it happened and why space was not freed; a later
    list works and warns with the command to run."""
    store_dir = engine.store.path
    _three_with_a_damaged_middle(engine, root)
    engine.close()
    where = ("--root", root, "--store", store_dir)
    r = run_cli(*where, "checkpoints", "delete", "v0")
    assert r.returncode == 0, r.stderr
    assert "Deleted v0" in r.stdout
    assert "space not fully freed, the store is damaged: checkpoint v1: object" in r.stdout
    r = run_cli(*where, "checkpoints", "list", "--json")
    assert r.returncode == 0, r.stderr
    assert [c["id"] for c in json.loads(r.stdout)] == ["v2", "v1"]
    assert "space not freed" in r.stderr
    assert CHECK in r.stderr


def test_a_restore_whose_quota_delete_meets_damage_completes(
    daemon_factory: Callable[..., object],
) -> None:
    """A restore makes room for its undo checkpoint by deleting the oldest automatic one;
    on main that delete's collection met the corrupt tree (of v1, which no restore here
    reads) and the restore failed."""
    from tests.helpers.daemon import DaemonProcess, write_file

    d = daemon_factory("--max-checkpoints", "4")
    assert isinstance(d, DaemonProcess)
    write_file(os.path.join(d.root, "keep/a"), os.urandom(50_000))
    d.create("v0")
    write_file(os.path.join(d.root, "bad/x"), os.urandom(40_000))
    d.create("v1")
    os.unlink(os.path.join(d.root, "bad/x"))
    os.rmdir(os.path.join(d.root, "bad"))
    assert d.stop() == 0
    from sprite_env.store import open_store

    with open_store(os.path.join(d.state, "store")) as s:
        top = s.catalog.query("SELECT top_tree FROM checkpoints WHERE id='v1'")[0][0]
        _corrupt_object(s, _subtree(s, ObjectId(bytes(top)), b"bad"))
    d.start()
    for i in range(3):  # each takes an undo checkpoint; the third deletes one to make room
        write_file(os.path.join(d.root, f"junk{i}"), b"changed since v0")
        status, evs = d.stream("POST", "/v1/checkpoints/v0/restore")
        assert evs[-1]["type"] == "complete", json.dumps(evs)
        assert not os.path.exists(os.path.join(d.root, f"junk{i}"))
    status, cps = d.json("GET", "/v1/checkpoints?include_auto=true")
    assert status == 200
    assert len(cps) == 4
    assert {"v0", "v1"} <= {c["id"] for c in cps}
    assert "space not freed, the store is damaged" in d.log()
