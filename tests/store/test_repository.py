"""Opening, locking, writing and reading a store."""

import json
import os
import subprocess
import sys
import threading

import pytest

from sprite_env.errors import NotAStore, ObjectNotFound, StoreError, StoreLocked
from sprite_env.ids import ObjectId
from sprite_env.store import ObjectKind, Store, check, open_store, stats
from sprite_env.store.codec import object_id


def test_create_then_reopen(store_dir: str) -> None:
    with open_store(store_dir, create=True) as s, s.writer() as w:
        oid = w.put(b"persist me")
        w.commit()
    with open_store(store_dir, writable=False) as s:
        assert s.read(oid) == b"persist me"


def test_refuses_a_directory_that_is_not_a_store(tmp_path: os.PathLike[str]) -> None:
    d = os.path.join(tmp_path, "home")
    os.makedirs(d)
    with open(os.path.join(d, "notes.txt"), "w") as f:
        f.write("precious")
    with pytest.raises(NotAStore, match="is not a sprite-env store"):
        open_store(d, create=True)
    assert os.listdir(d) == ["notes.txt"]  # untouched
    with pytest.raises(NotAStore, match="create one first"):
        open_store(os.path.join(tmp_path, "missing"))


def test_refuses_a_newer_format(store_dir: str) -> None:
    open_store(store_dir, create=True).close()
    with open(os.path.join(store_dir, "sprite-store.json"), "w") as f:
        json.dump({"format": 99}, f)
    with pytest.raises(NotAStore, match="format 99, newer than this sprite-env supports"):
        open_store(store_dir)


def test_refuses_a_newer_catalog_schema(store_dir: str) -> None:
    import sqlite3

    open_store(store_dir, create=True).close()
    db = sqlite3.connect(os.path.join(store_dir, "catalog.db"))
    db.execute("PRAGMA user_version=42")
    db.close()
    with pytest.raises(StoreError, match="schema 42 is newer"):
        open_store(store_dir)


def test_second_writer_is_refused_with_the_holders_pid(store_dir: str) -> None:
    open_store(store_dir, create=True).close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from sprite_env.store import open_store\n"
            f"s = open_store({store_dir!r}); print('ready', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "ready\n"
        with pytest.raises(StoreLocked, match=f"is locked by pid {holder.pid}"):
            open_store(store_dir)
        with pytest.raises(StoreLocked):
            open_store(store_dir, writable=False)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()
    open_store(store_dir).close()  # released on exit


def test_put_dedups_within_and_across_commits(store: Store) -> None:
    with store.writer() as w:
        a = w.put(b"a" * 5000)
        assert w.put(b"a" * 5000) == a
        w.commit()
        assert w.stats.objects_new == 1
        assert w.stats.objects_offered == 2
    with store.writer() as w:
        assert w.put(b"a" * 5000) == a
        w.commit()
        assert w.stats.objects_new == 0
    st = stats(store)
    assert st.objects == 1
    assert st.ingested_bytes == 15000
    assert st.raw_bytes == 5000
    assert st.dedup_ratio == 3.0


def test_data_and_metadata_go_to_separate_packs(store: Store) -> None:
    with store.writer() as w:
        w.put(b"data" * 100)
        w.put(b"tree" * 100, ObjectKind.TREE)
        w.put(b"list" * 100, ObjectKind.CHUNKLIST)
        w.commit()
    classes = sorted(p.pack_class for p in store.catalog.packs())
    assert classes == [0, 1]


def test_packs_rotate_at_the_target_size(store: Store) -> None:
    with store.writer(pack_size=256 * 1024) as w:
        for i in range(40):
            w.put(os.urandom(64 * 1024) + bytes([i]))
        w.commit()
    packs = store.catalog.packs()
    assert len(packs) >= 8
    assert all(p.size < 400 * 1024 for p in packs)
    assert check(store, read_data=True).ok


def test_uncommitted_work_is_dropped(store: Store) -> None:
    with store.writer(pack_size=4096) as w:
        for i in range(20):
            oid = w.put(os.urandom(3000) + bytes([i]))
        w.flush()  # packs published, not committed
    assert not store.has(oid)
    assert os.listdir(store.packs_dir) == []
    assert os.listdir(store.tmp_dir) == []


def test_commit_hook_runs_in_the_same_transaction(store: Store) -> None:
    def boom(db: object) -> None:
        raise RuntimeError("hook failed")

    with store.writer() as w:
        oid = w.put(b"x" * 1000)
        with pytest.raises(RuntimeError):
            w.commit(boom)
    assert not store.has(oid)  # rolled back with the hook


def test_unknown_object(store: Store) -> None:
    with pytest.raises(ObjectNotFound, match="00000000"):
        store.read(ObjectId(bytes(32)))


def test_concurrent_puts_from_threads(store: Store) -> None:
    blobs = [os.urandom(20_000) for _ in range(64)]
    with store.writer(pack_size=200_000) as w:

        def work(k: int) -> None:
            for b in blobs[k::4] + blobs:  # overlapping: every blob put several times
                w.put(b)

        ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        w.commit()
        assert w.stats.objects_new == 64
    assert store.catalog.object_count() == 64
    for b in blobs:
        assert store.read(object_id(b)) == b
    assert check(store, read_data=True).ok


def test_worker_error_surfaces_and_nothing_is_committed(store: Store) -> None:
    w = store.writer()
    os.rmdir(store.tmp_dir)  # packs cannot be created any more
    try:
        w.put(b"y" * 1000)
        with pytest.raises(FileNotFoundError):
            w.commit()
    finally:
        w.close()
        os.mkdir(store.tmp_dir)
    assert store.catalog.object_count() == 0


def test_read_only_store_refuses_writers(store_dir: str) -> None:
    open_store(store_dir, create=True).close()
    with open_store(store_dir, writable=False) as s, pytest.raises(StoreError, match="read-only"):
        s.writer()
