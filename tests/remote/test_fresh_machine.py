"""A fresh machine on a bucket another store pushed to (issue 14, point 5): empty state,
``--store s3://...``; the catalog comes from the newest complete generation, the packs are
fetched as they are read (a fork shares the parent's objects, it does not copy them).
Through the real daemon, against the real Swift."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from sprite_env.store import ObjectKind, open_store
from sprite_env.store.backend import RemoteConfig, open_backed_store
from sprite_env.store.pack import read_header
from sprite_env.store.remote import generations, push
from tests.helpers import trees
from tests.helpers.cli import run_cli

if TYPE_CHECKING:
    from sprite_env.store.s3 import S3Storage


def _objects(storage: S3Storage) -> dict[str, object]:
    """Each object's ETag and time: a re-upload or an overwrite would show."""
    pages = storage.client.get_paginator("list_objects_v2").paginate(Bucket=storage.url.bucket)
    return {o["Key"]: (o["ETag"], o["LastModified"]) for p in pages for o in p.get("Contents", [])}


def _packs(d: str) -> set[str]:
    return {f for f in os.listdir(d) if f.endswith(".pack")} if os.path.isdir(d) else set()


def _data_packs(d: str) -> set[str]:
    """The packs of file data in ``d`` (class 0 in their header)."""
    out = set()
    for f in _packs(d):
        fd = os.open(os.path.join(d, f), os.O_RDONLY)
        try:
            if read_header(fd, f) == ObjectKind.DATA.pack_class:
                out.add(f)
        finally:
            os.close(fd)
    return out


def test_a_fresh_machine_lists_restores_exactly_and_forks(
    daemon_factory: Any, storage: S3Storage, tmp_path: Any
) -> None:
    url = repr(storage)
    a = daemon_factory(
        "--store", url, "--no-view", root=str(tmp_path / "a/root"), state=str(tmp_path / "a/st")
    )
    spec = trees.sample_spec()
    trees.build_tree(a.root, spec)
    with open(os.path.join(a.root, "big"), "wb") as f:
        f.write(os.urandom(2 << 20))
    assert a.create("v0", wait_remote=True)["checkpoint"]["storage"] == "remote"
    v0 = trees.snapshot_tree(a.root)
    os.unlink(os.path.join(a.root, "big"))
    os.chmod(os.path.join(a.root, "etc"), 0o750)
    assert a.create("v1", wait_remote=True)["checkpoint"]["storage"] == "remote"
    assert a.stop() == 0
    parent = _objects(storage)
    parent_packs = {k for k in parent if k.startswith(f"{storage.url.prefix}packs/")}

    b_root, b_state = str(tmp_path / "b/root"), str(tmp_path / "b/st")
    b = daemon_factory("--store", url, "--no-view", root=b_root, state=b_state)
    status, listed = b.json("GET", "/v1/checkpoints")
    assert status == 200
    assert sorted(c["id"] for c in listed) == ["v0", "v1"]
    store = os.path.join(b_state, "store")
    # The catalog came down, and only the tree packs the listing read (its sizes walk the
    # trees): no file data was copied.
    assert _packs(os.path.join(store, "packs")) == set()
    assert _data_packs(os.path.join(store, "cache")) == set()

    status, evs = b.stream("POST", "/v1/checkpoints/v0/restore")
    assert evs[-1]["type"] == "complete", evs
    trees.assert_trees_equal(v0, trees.snapshot_tree(b_root))
    fetched = {f"{storage.url.prefix}packs/{f}" for f in _packs(os.path.join(store, "cache"))}
    assert _data_packs(os.path.join(store, "cache"))
    # Every cached pack is the parent's, or b's own: the background upload of the
    # restore's undo checkpoint moves the packs it made into the cache once durable.
    own = set(_objects(storage)) - set(parent)
    assert fetched <= parent_packs | own, fetched - parent_packs - own

    # Its own checkpoint, its own history from there: a generation under another writer,
    # the parent's packs neither sent again nor touched.
    with open(os.path.join(b_root, "mine"), "wb") as f:
        f.write(b"the fork's own file")
    made = b.create("on b", wait_remote=True)
    assert made["checkpoint"]["storage"] == "remote"
    assert made["id"] == "v2"
    after = _objects(storage)
    assert all(after[k] == v for k, v in parent.items())
    sizes = storage.list("packs/")
    new_packs = {k for k in sizes if f"{storage.url.prefix}{k}" not in parent_packs}
    assert new_packs  # the new file, the trees of "on b" and of the restore's undo point
    # ... and not v0's 2 MiB of random data again: the fork deduplicated against it.
    assert sum(sizes[k] for k in new_packs) < 512 << 10
    writers = {g.writer for g in generations(storage)}
    assert len(writers) == 2


def test_a_lazy_open_fetches_only_the_packs_it_reads(storage: S3Storage, tmp_path) -> None:
    """In-process: a store opened on a fresh directory holds the generation's catalog and
    no pack; reading one object fetches its pack alone."""
    from sprite_env.ids import ObjectId

    with open_store(str(tmp_path / "a"), create=True) as s:
        with s.writer(pack_size=64 << 10) as w:
            ids = [w.put(os.urandom(20_000), ObjectKind.DATA) for _ in range(40)]
            w.commit()
        push(s, storage)
        total = len(s.catalog.packs())
    remote = RemoteConfig(storage.url)
    with open_backed_store(str(tmp_path / "b"), remote, storage=storage) as s:
        assert len(s.catalog.packs()) == total
        assert _packs(s.packs_dir) == set()
        s.read(ObjectId(ids[0]))
        assert len(_packs(os.path.join(s.path, "cache"))) == 1
        assert s.lost_packs() == []


def test_an_interrupted_lazy_pull_is_taken_again(storage: S3Storage, tmp_path) -> None:
    """A local store that holds nothing and never pushed (``store init``, or a pull cut
    before its catalog's rename) is not pushed over the bucket as an empty generation: the
    next open pulls the newest generation into it."""
    root = str(tmp_path / "root")
    trees.build_tree(root, trees.sample_spec())
    with open_store(str(tmp_path / "a"), create=True):
        pass
    r = run_cli("--root", root, "--store", str(tmp_path / "a"), "checkpoints", "create")
    assert r.returncode == 0, r.stderr
    with open_store(str(tmp_path / "a")) as s:
        push(s, storage)
    fresh = str(tmp_path / "b")
    with open_store(fresh, create=True):
        pass  # as an interrupted pull leaves it: the marker, an empty catalog
    with open_backed_store(fresh, RemoteConfig(storage.url), storage=storage) as s:
        assert [r[0] for r in s.catalog.query("SELECT id FROM checkpoints")] == ["v0"]
    r = run_cli("--root", root, "--store", repr(storage), "checkpoints", "list", "--json")
    assert r.returncode == 0, r.stderr
    assert [c["id"] for c in json.loads(r.stdout)] == ["v0"]
