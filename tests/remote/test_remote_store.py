"""A store whose packs live in the bucket (issue 14): ``Store(remote=...)`` reads the packs
it does not hold in ``packs/`` through the bounded cache, a pushed pack moves into that
cache (so the bound applies to it), and lost packs, the orphan sweep, prune and ``check``
ask the bucket before calling a pack gone. Against the real Swift."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

import pytest

from sprite_env.checkpoints import Engine
from sprite_env.errors import StoreError
from sprite_env.snapshot.dircache import RACY_NS
from sprite_env.store import ObjectKind, check, open_store, rebuild
from sprite_env.store.backend import RemoteConfig, open_backed_store
from sprite_env.store.remote import push
from tests.helpers import trees

if TYPE_CHECKING:
    from sprite_env.ids import ObjectId
    from sprite_env.store.repository import Store
    from sprite_env.store.s3 import S3Storage


def _open(path: str, storage: S3Storage, cache_bytes: int = 2 << 30, **kw: bool) -> Store:
    return open_backed_store(
        path, RemoteConfig(storage.url, cache_bytes), create=True, storage=storage, **kw
    )


def _fill(s: Store, n: int = 40) -> dict[ObjectId, bytes]:
    """``n`` random objects of 20 kB in packs of ~64 KiB (about n/4 packs), committed."""
    objs = [os.urandom(20_000) for _ in range(n)]
    with s.writer(pack_size=64 << 10) as w:
        ids = [w.put(o, ObjectKind.DATA) for o in objs]
        w.commit()
    return dict(zip(ids, objs, strict=True))


def _files(d: str) -> set[str]:
    return {f for f in os.listdir(d) if f.endswith(".pack")}


def _stamps(storage: S3Storage) -> dict[str, object]:
    """Each object's ETag and time: a rewrite or a delete would show."""
    pages = storage.client.get_paginator("list_objects_v2").paginate(Bucket=storage.url.bucket)
    return {o["Key"]: (o["ETag"], o["LastModified"]) for p in pages for o in p.get("Contents", [])}


def test_a_pushed_pack_moves_into_the_bounded_cache_and_reads_back(
    storage: S3Storage, tmp_path
) -> None:
    path = str(tmp_path / "store")
    bound = 150_000  # two of these ~80 kB packs
    with _open(path, storage, bound) as s:
        objs = _fill(s)
        packs = {f"{p.name}.pack" for p in s.catalog.packs()}
        assert len(packs) >= 8
        # Captured, not yet durable remotely: in packs/, out of the cache's bound.
        assert _files(s.packs_dir) == packs
        assert s.read_many(list(objs)) == list(objs.values())
        assert _files(s.packs_dir) == packs
        push(s, storage)
        cache = os.path.join(path, "cache")
        assert _files(s.packs_dir) == set()
        kept = _files(cache)
        assert kept
        assert kept < packs
        assert sum(os.stat(os.path.join(cache, f)).st_size for f in kept) <= bound
        assert s.lost_packs() == []
        before = _stamps(storage)
        # Every object reads back: the evicted packs are fetched from the bucket again.
        assert s.read_many(list(objs)) == list(objs.values())
        assert s.remote.stats.fetched >= len(packs) - len(kept)  # type: ignore[union-attr]
        assert check(s).ok
        assert check(s, read_data=True).ok
    assert _stamps(storage) == before  # reads change nothing in the bucket


def test_a_reopened_store_sweeps_only_local_files(storage: S3Storage, tmp_path) -> None:
    """The orphan sweep of a writable open: packs the catalog names that are in the bucket
    only are neither lost nor deleted; a local file no row names goes; the bucket's
    objects are all there, unchanged."""
    path = str(tmp_path / "store")
    with _open(path, storage, 1) as s:  # a bound of 1 byte keeps only the newest entry
        objs = _fill(s)
        push(s, storage)
    before = _stamps(storage)
    stray = os.path.join(path, "packs", "0" * 64 + ".pack")
    fd = os.open(stray, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"not a pack the catalog names")
    os.close(fd)
    with _open(path, storage, 1) as s:
        assert not os.path.exists(stray)
        assert s.lost_packs() == []
        assert s.forget_lost(s.lost_packs()) == set()
        assert s.read_many(list(objs)) == list(objs.values())
    assert _stamps(storage) == before


def test_a_pack_neither_local_nor_in_the_bucket_is_lost(
    storage: S3Storage, tmp_path, expect_log
) -> None:
    expect_log("is missing: its 4 objects are lost")
    path = str(tmp_path / "store")
    with _open(path, storage, 1) as s:
        objs = _fill(s, 16)
        push(s, storage)
        cached = {n for n in s.remote.cached()}  # type: ignore[union-attr]
        victim = next(p for p in s.catalog.packs() if p.name not in cached)
        storage.client.delete_object(
            Bucket=storage.url.bucket, Key=f"{storage.url.prefix}packs/{victim.name}.pack"
        )
        lost = s.lost_packs()
        assert [lp.pack.name for lp in lost] == [victim.name]
        gone = s.forget_lost(lost)
        assert len(gone) == 4
        assert gone < set(objs)
        assert s.lost_packs() == []


def _age() -> None:
    time.sleep(RACY_NS / 1e9 * 1.5)  # past the racy window, so the files cache can vouch


def test_delete_and_prune_on_a_bucket_store_free_local_space_only(
    storage: S3Storage, tmp_path
) -> None:
    """A prune reads the packs it rewrites through the cache, drops local copies, and
    deletes nothing in the bucket (freeing remote space is the remote's own collection);
    what is left restores exactly and checks."""
    root, path = str(tmp_path / "layer"), str(tmp_path / "store")
    trees.build_tree(root, trees.sample_spec())
    remote = RemoteConfig(storage.url, 1)
    with Engine(root, path, remote=remote) as e:
        e.create("v0")
        with open(os.path.join(root, "big"), "wb") as f:
            f.write(os.urandom(3 << 20))
        e.create("v1")
        v1 = trees.snapshot_tree(root)
        os.unlink(os.path.join(root, "big"))
        _age()
        e.create("v2")
        push(e.store, e.store.storage)
        before = _stamps(storage)
        assert _files(e.store.packs_dir) == set()
        e.restore("v1")  # reads "big" back through the cache: its pack was evicted
        trees.assert_trees_equal(v1, trees.snapshot_tree(root))
        e.delete("v2")
        e.delete("v0")
        assert e.store.lost_packs() == []
        assert check(e.store, read_data=True).ok
        os.unlink(os.path.join(root, "big"))
        _age()
        e.restore("v1")
        trees.assert_trees_equal(v1, trees.snapshot_tree(root))
    after = _stamps(storage)
    assert set(before) <= set(after)  # nothing deleted, nothing rewritten
    assert all(after[k] == v for k, v in before.items())


def test_rebuild_catalog_of_a_bucket_store_is_refused(storage: S3Storage, tmp_path) -> None:
    """Its packs are mostly in the bucket only: a catalog rebuilt from packs/ would lose
    them. Refused, nothing changed (the catalog lists every pack after)."""
    path = str(tmp_path / "store")
    with _open(path, storage, 1) as s:
        _fill(s, 16)
        push(s, storage)
        packs = s.catalog.packs()
    with open_store(path, repair=True) as s, pytest.raises(StoreError, match="nothing was changed"):
        rebuild(s)
    with _open(path, storage, 1) as s:
        assert s.catalog.packs() == packs
        assert s.lost_packs() == []


def test_a_smaller_bound_is_applied_at_the_next_open(storage: S3Storage, tmp_path) -> None:
    path = str(tmp_path / "store")
    with _open(path, storage) as s:
        objs = _fill(s)
        push(s, storage)
        assert len(_files(os.path.join(path, "cache"))) == len(s.catalog.packs())
    with _open(path, storage, 150_000) as s:
        cache = os.path.join(path, "cache")
        assert 1 <= len(_files(cache)) <= 2
        assert s.remote.cached_bytes() <= 150_000  # type: ignore[union-attr]
        assert s.read_many(list(objs)) == list(objs.values())


def test_one_object_of_a_pack_not_cached_is_read_by_range(storage: S3Storage, tmp_path) -> None:
    """A bucket store (``--store s3://``) reading one object of a pack neither in
    ``packs/`` nor in the cache fetches just its bytes (a ranged GET), caching nothing."""
    path = str(tmp_path / "store")
    with _open(path, storage) as s:
        data = [os.urandom(20_000) for _ in range(40)]
        with s.writer(pack_size=4 << 20) as w:  # one pack: an object is 1/40 of it
            objs = {w.put(o, ObjectKind.DATA): o for o in data}
            w.commit()
        push(s, storage)
    cache = os.path.join(path, "cache")
    for f in _files(cache):  # as on a machine that never read it
        os.unlink(os.path.join(cache, f))
    with _open(path, storage) as s:
        assert _files(s.packs_dir) == set()
        oid = next(iter(objs))
        assert s.read_many([oid]) == [objs[oid]]
        stats = s.remote.stats  # type: ignore[union-attr]
        assert (stats.fetched, stats.ranged) == (0, 1), stats
        assert stats.bytes_ranged < 2 * len(objs[oid])
        assert _files(cache) == set()
