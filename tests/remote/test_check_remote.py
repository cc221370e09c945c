"""``store check --read-data`` of a store in object storage (issue 14, point 3): every pack
downloaded from the bucket and read whole, not only the cached ones, so damage in the
bucket is reported by name even where the local cache holds a sound copy. Against the
real Swift."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import pytest

from sprite_env.fuse import mounts
from sprite_env.store import ObjectKind, check, open_store
from sprite_env.store.backend import RemoteConfig, open_backed_store
from sprite_env.store.pack import ENTRY
from sprite_env.store.remote import push
from tests.fuse.mounting import requires_fuse
from tests.helpers import trees
from tests.helpers.cli import run_cli

if TYPE_CHECKING:
    from sprite_env.store.s3 import S3Storage


def _damage_in_bucket(storage: S3Storage, pack: str, offset: int) -> None:
    """Flips one byte of the bucket's copy of ``pack``, inside the object at ``offset``."""
    key = f"{storage.url.prefix}packs/{pack}.pack"
    data = bytearray(storage.client.get_object(Bucket=storage.url.bucket, Key=key)["Body"].read())
    data[offset + ENTRY.size + 3] ^= 0xFF
    storage.client.put_object(Bucket=storage.url.bucket, Key=key, Body=bytes(data))


def test_read_data_reads_the_bucket_not_the_cache(storage: S3Storage, tmp_path) -> None:
    """In-process: the cache holds every pack, sound; the bucket's copy of one is damaged.
    A check without read_data passes (sizes match, the cached copies are sound); with it,
    the bucket's damaged object is named (pack, offset, the bucket)."""
    path = str(tmp_path / "store")
    with open_backed_store(path, RemoteConfig(storage.url), create=True, storage=storage) as s:
        with s.writer(pack_size=64 << 10) as w:
            ids = [w.put(os.urandom(20_000), ObjectKind.DATA) for _ in range(12)]
            w.commit()
        push(s, storage)
        assert s.read_many(ids)  # sound copies of every pack in the cache now
        loc = s.locate_many([ids[5]])[ids[5]]
        _damage_in_bucket(storage, loc.pack, loc.entry.offset)
        assert check(s).ok
        r = check(s, read_data=True)
        assert not r.ok
        named = [e for e in r.errors if f"at offset {loc.entry.offset}" in e]
        assert named, r.errors
        assert named[0].startswith(f"{storage!r}: corrupt pack {loc.pack}")
        assert any(f"pack {loc.pack}: contents do not match its name" in e for e in r.errors)
        assert set(r.damaged) == {ids[5]}
        assert s.read(ids[5])  # the local copy is still sound: nothing was cached from check


def test_the_command_names_the_damaged_object_in_the_bucket(storage: S3Storage, tmp_path) -> None:
    """``sprite-env --store s3://... store check --read-data`` on a fresh machine (nothing
    cached): exit 3, the damaged pack and offset named, the checkpoint that needs it too."""
    root, store = str(tmp_path / "layer"), str(tmp_path / "store")
    trees.build_tree(root, trees.sample_spec())
    r = run_cli("--root", root, "--store", store, "store", "init")
    assert r.returncode == 0, r.stderr
    r = run_cli("--root", root, "--store", store, "checkpoints", "create")
    assert r.returncode == 0, r.stderr
    with open_store(store) as s:
        push(s, storage)
        pack, offset = s.catalog.query(
            "SELECT p.name, o.offset FROM objects o JOIN packs p ON p.id = o.pack "
            "WHERE o.kind = ? ORDER BY o.offset LIMIT 1",
            (int(ObjectKind.DATA),),
        )[0]
    url = f"s3://{storage.url.bucket}/{storage.url.prefix}"
    fresh = str(tmp_path / "fresh")
    os.makedirs(fresh)
    r = run_cli("--root", fresh, "--store", url, "store", "check", "--read-data")
    assert r.returncode == 0, r.stdout + r.stderr
    _damage_in_bucket(storage, pack, offset)
    r = run_cli("--root", fresh, "--store", url, "store", "check")
    assert r.returncode == 0, r.stdout + r.stderr  # sizes and the cached copies are sound
    r = run_cli("--root", fresh, "--store", url, "store", "check", "--read-data", "--json")
    assert r.returncode == 3, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert any(
        e.startswith(f"{url}: corrupt pack {pack} at offset {offset}") for e in report["errors"]
    ), report["errors"]
    assert "Traceback" not in r.stderr


@pytest.mark.fuse
@requires_fuse
def test_an_offline_mount_reads_from_the_bucket(storage: S3Storage, tmp_path) -> None:
    """``--store s3://... checkpoints mount`` on a fresh machine (the background server is
    started with the same URL): a checkpoint's file reads back through the cache."""
    root, store = str(tmp_path / "layer"), str(tmp_path / "store")
    os.makedirs(os.path.join(root, "etc"))
    with open(os.path.join(root, "etc", "hosts"), "w") as f:
        f.write("127.0.0.1 localhost\n")
    assert run_cli("--root", root, "--store", store, "store", "init").returncode == 0
    assert run_cli("--root", root, "--store", store, "checkpoints", "create").returncode == 0
    with open_store(store) as s:
        push(s, storage)
    url = f"s3://{storage.url.bucket}/{storage.url.prefix}"
    fresh = str(tmp_path / "fresh")
    os.makedirs(fresh)
    mnt = os.path.join(fresh, ".sprite", "checkpoints")
    r = run_cli("--root", fresh, "--store", url, "--json", "checkpoints", "mount")
    assert r.returncode == 0, r.stderr
    try:
        with open(os.path.join(mnt, "v0", "etc", "hosts")) as f:
            assert f.read() == "127.0.0.1 localhost\n"
    finally:
        if any(m.mountpoint == mnt for m in mounts()):
            assert run_cli("--root", fresh, "checkpoints", "unmount").returncode == 0
