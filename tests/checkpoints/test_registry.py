"""Ids, records, the active checkpoint, comments."""

from __future__ import annotations

import os

import pytest

from sprite_env.checkpoints import ActiveCheckpoint, Engine, InvalidCheckpointId, UnknownCheckpoint
from sprite_env.errors import UserError


def _touch(root: str, name: str, data: bytes = b"x") -> None:
    with open(os.path.join(root, name), "wb") as f:
        f.write(data)


def test_ids_are_sequential_and_never_reused(engine: Engine, root: str) -> None:
    ids = []
    for i in range(3):
        _touch(root, f"f{i}")
        ids.append(engine.create(f"c{i}").id)
    assert ids == ["v0", "v1", "v2"]
    engine.delete("v1")
    engine.delete("v0")
    assert engine.create("after deletes").id == "v3"
    assert [c.id for c in engine.checkpoints()] == ["v3", "v2"]


def test_ids_survive_reopening(tmp_path: os.PathLike[str], root: str) -> None:
    store = os.path.join(os.fspath(tmp_path), "store")
    with Engine(root, store) as e:
        e.create()
        e.create()
    with Engine(root, store) as e:
        assert e.create().id == "v2"
        assert e.active() == "v2"


def test_auto_checkpoints_are_hidden_and_take_no_number(engine: Engine, root: str) -> None:
    engine.create("manual")
    a = engine.create(auto=True, created_by="scheduler")
    b = engine.create(auto=True)
    assert a.id.startswith("auto-")
    assert a.is_auto
    assert b.id != a.id  # same second: a suffix keeps them apart
    assert engine.create().id == "v1"
    assert [c.id for c in engine.checkpoints()] == ["v1", "v0"]
    assert len(engine.checkpoints(include_auto=True)) == 4
    assert engine.info(a.id).created_by == "scheduler"


def test_record_fields_and_history(engine: Engine, root: str) -> None:
    _touch(root, "a", b"a" * 100_000)
    v0 = engine.create("first", created_by="agent:claude")
    _touch(root, "b", os.urandom(50_000))
    v1 = engine.create("second")
    assert v0.parent is None
    assert v0.history == []
    assert v1.parent == "v0"
    assert v1.history == ["v0"]
    assert (v1.files, v1.bytes) == (2, 150_000)
    assert v1.bytes_added >= 50_000 > v0.bytes_added  # random data, stored raw
    j = engine.info("v1").to_json(active=engine.active())
    for key in (
        "id",
        "create_time",
        "comment",
        "is_auto",
        "history",
        "created_by",
        "parent",
        "files",
        "bytes",
        "bytes_added",
        "warnings",
    ):
        assert key in j
    assert j["create_time"].endswith("Z")
    assert j["is_active"] is True
    engine.restore("v0")
    v2 = engine.create("from v0")
    assert v2.parent == "v0"
    assert v2.history == ["v0"]
    assert [c.id for c in engine.checkpoints(history="v0")] == ["v2", "v1", "v0"]


def test_active_checkpoint_cannot_be_deleted(engine: Engine, root: str) -> None:
    engine.create()
    engine.create()
    with pytest.raises(ActiveCheckpoint, match="cannot delete active checkpoint"):
        engine.delete("v1")
    engine.restore("v0")
    with pytest.raises(ActiveCheckpoint):
        engine.delete("v0")
    engine.delete("v1")


def test_unknown_and_invalid_ids(engine: Engine) -> None:
    with pytest.raises(UnknownCheckpoint, match="'v9' not found"):
        engine.info("v9")
    for bad in ("v01", "../v1", "v-1", "", "auto-x", "v1; rm -rf /", "x" * 10_000):
        with pytest.raises(InvalidCheckpointId):
            engine.info(bad)
    with pytest.raises(UnknownCheckpoint):
        engine.restore("v3")
    with pytest.raises(UnknownCheckpoint):
        engine.delete("v3")


@pytest.mark.parametrize("comment", ["a\x00b", "line\nbreak", "\x1b[31mred", "x" * 5000])
def test_bad_comments_are_refused(engine: Engine, comment: str) -> None:
    with pytest.raises(UserError):
        engine.create(comment)
    assert engine.checkpoints(include_auto=True) == []


def test_unicode_comment_is_kept(engine: Engine) -> None:
    assert engine.info(engine.create("before 🚀 migration\tv2").id).comment == (
        "before 🚀 migration\tv2"
    )


def test_auto_ids_are_never_reused(engine: Engine, root: str) -> None:
    engine.create("manual")
    second = 1_800_000_000 * 10**9
    ids = []
    for _ in range(3):
        cid = engine.registry.next_auto_id(second)
        c = engine.create(auto=True)
        # Pin the id the registry would give within one second, then delete it.
        ids.append(cid)
        with engine.store.catalog.transaction() as db:
            db.execute("UPDATE checkpoints SET id=? WHERE id=?", (cid, c.id))
            db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('last_auto', ?)", (cid,))
        engine.delete(cid)
    assert ids == [
        "auto-20270115T080000Z",
        "auto-20270115T080000Z-2",
        "auto-20270115T080000Z-3",
    ]
