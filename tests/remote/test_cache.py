"""The bounded pack cache of a remote store (store/cache.py), under the real reader, against
the real Swift: a fresh machine reads by fetching only the packs it touches."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from typing import TYPE_CHECKING

import pytest

from sprite_env.ids import ObjectId, PackName
from sprite_env.store import ObjectKind, open_store
from sprite_env.store.cache import PREFETCH_WORKERS, CacheFull, RemotePacks
from sprite_env.store.reader import PackFiles, read_entries
from sprite_env.store.remote import RemoteStoreError, push

if TYPE_CHECKING:
    from sprite_env.store.s3 import S3Storage


def _store_of_many_packs(path: str, storage: S3Storage) -> dict[bytes, bytes]:
    """A pushed store of 40 random objects in packs of ~64 KiB (about ten packs)."""
    objs = [os.urandom(20_000) for _ in range(40)]
    with open_store(path, create=True) as s:
        with s.writer(pack_size=64 << 10) as w:
            ids = [w.put(o, ObjectKind.DATA) for o in objs]
            w.commit()
        push(s, storage)
    return dict(zip(ids, objs, strict=True))


def _read_all(path: str, files: PackFiles) -> dict[bytes, bytes]:
    """Every object, read through ``files`` at the places the store's catalog gives."""
    out = {}
    with open_store(path, writable=False) as s:
        where = s.locate_many(ObjectId(r[0]) for r in s.catalog.query("SELECT id FROM objects"))
    by_pack: dict[str, list] = {}
    for oid, loc in where.items():
        by_pack.setdefault(loc.pack, []).append((oid, loc.entry))
    for pack, items in sorted(by_pack.items()):
        with files.lend(pack) as fd:
            data = read_entries(pack, fd, [e for _, e in items])
        out.update((oid, d) for (oid, _), d in zip(items, data, strict=True))
    return out


def _sizes(path: str) -> dict[str, int]:
    return {f: os.stat(os.path.join(path, f)).st_size for f in os.listdir(path)}


def test_reads_fetch_each_pack_once_then_hit(storage: S3Storage, tmp_path) -> None:
    objs = _store_of_many_packs(str(tmp_path / "a"), storage)
    cache = RemotePacks(storage, str(tmp_path / "cache"))
    files = PackFiles(cache)
    assert _read_all(str(tmp_path / "a"), files) == objs
    packs = len(storage.list("packs/"))
    assert packs >= 5
    assert (cache.stats.fetched, cache.stats.evicted) == (packs, 0)
    files.close()
    # Another process on the same cache: no download at all.
    again = RemotePacks(storage, str(tmp_path / "cache"))
    assert _read_all(str(tmp_path / "a"), PackFiles(again)) == objs
    assert (again.stats.fetched, again.stats.hits) == (0, packs)
    assert all(
        oct(os.stat(tmp_path / "cache" / f).st_mode & 0o777) == "0o600"
        for f in os.listdir(tmp_path / "cache")
    )


def test_the_cache_stays_within_its_bound(storage: S3Storage, tmp_path) -> None:
    objs = _store_of_many_packs(str(tmp_path / "a"), storage)
    biggest = max(storage.list("packs/").values())
    bound = 3 * biggest
    cache = RemotePacks(storage, str(tmp_path / "cache"), max_bytes=bound)
    files = PackFiles(cache, max_idle=0)  # no idle descriptor keeps an evicted file
    assert _read_all(str(tmp_path / "a"), files) == objs
    assert sum(_sizes(str(tmp_path / "cache")).values()) <= bound
    assert cache.stats.evicted >= len(storage.list("packs/")) - 3
    # Evicted packs come back on demand.
    assert _read_all(str(tmp_path / "a"), files) == objs
    assert sum(_sizes(str(tmp_path / "cache")).values()) <= bound


def test_a_reader_keeps_reading_an_evicted_pack(storage: S3Storage, tmp_path) -> None:
    _store_of_many_packs(str(tmp_path / "a"), storage)
    names = sorted(k[len("packs/") : -len(".pack")] for k in storage.list("packs/"))
    cache = RemotePacks(storage, str(tmp_path / "cache"), max_bytes=1)  # keeps only one
    fd = cache.open(names[0])
    try:
        before = os.pread(fd, 1 << 20, 0)
        os.close(cache.open(names[1]))  # evicts the first
        assert not os.path.exists(tmp_path / "cache" / f"{names[0]}.pack")
        assert os.pread(fd, 1 << 20, 0) == before
    finally:
        os.close(fd)


def test_many_threads_missing_one_pack_fetch_it_once(storage: S3Storage, tmp_path) -> None:
    _store_of_many_packs(str(tmp_path / "a"), storage)
    name = min(k[len("packs/") : -len(".pack")] for k in storage.list("packs/"))
    cache = RemotePacks(storage, str(tmp_path / "cache"))
    fds: list[int] = []
    threads = [threading.Thread(target=lambda: fds.append(cache.open(name))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for fd in fds:
        os.close(fd)
    assert (len(fds), cache.stats.fetched, cache.stats.hits) == (8, 1, 7)


def test_a_missing_or_damaged_pack(storage: S3Storage, tmp_path) -> None:
    _store_of_many_packs(str(tmp_path / "a"), storage)
    cache = RemotePacks(storage, str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError, match="not in"):
        cache.open("0" * 64)
    files = PackFiles(cache)
    with pytest.raises(FileNotFoundError):
        files.acquire("0" * 64)
    junk = str(tmp_path / "junk")
    with open(junk, "wb") as f:
        f.write(b"not the pack")
    storage.put_file(f"packs/{'1' * 64}.pack", junk)
    with pytest.raises(RemoteStoreError, match="do not match"):
        cache.open("1" * 64)
    assert os.listdir(tmp_path / "cache") == []  # nothing cached, no partial file


def test_a_pin_over_many_packs_fetches_them_at_once(storage: S3Storage, tmp_path) -> None:
    """A reader of objects in many packs (an export on a fresh machine) has them fetched
    several at a time, not each in turn as it opens them; the bytes are the same."""
    objs = _store_of_many_packs(str(tmp_path / "a"), storage)
    packs = len(storage.list("packs/"))
    lock = threading.Lock()
    running, most = [0], [0]
    real_get = storage.get_file

    def slow_get(name: str, path: str) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            time.sleep(0.2)  # a download long enough for the others to start
            real_get(name, path)
        finally:
            with lock:
                running[0] -= 1

    storage.get_file = slow_get  # type: ignore[method-assign]
    cache = RemotePacks(storage, str(tmp_path / "cache"))
    files = PackFiles(cache)
    with open_store(str(tmp_path / "a"), writable=False) as s:
        ids = [ObjectId(r[0]) for r in s.catalog.query("SELECT id FROM objects")]
        s.pack_files = files  # the fresh machine's reader: every pack from the bucket
        with s.pin(ids) as pin:
            got = dict(zip(ids, pin.read_many(ids), strict=True))
    assert got == objs
    assert cache.stats.fetched == packs
    assert most[0] == min(PREFETCH_WORKERS, packs), most


def test_a_full_disk_under_the_cache_makes_room_or_says_so(storage: S3Storage, tmp_path) -> None:
    """The cache's disk fills before its bound: the oldest entries make room for the pack
    being fetched; a disk too small for one pack is a clear error and leaves no part."""
    objs = _store_of_many_packs(str(tmp_path / "a"), storage)
    biggest = max(storage.list("packs/").values())
    disk = tmp_path / "disk"
    disk.mkdir()
    size = 3 * biggest + (8 << 10)  # room for three packs, not for ten
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)]
    ).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        cache = RemotePacks(storage, str(disk / "cache"))  # a 2 GiB bound: never reached
        files = PackFiles(cache, max_idle=0)
        assert _read_all(str(tmp_path / "a"), files) == objs
        assert cache.stats.evicted > 0
        assert not [f for f in os.listdir(disk / "cache") if f.endswith(".part")]
        files.close()
    finally:
        subprocess.run(["umount", str(disk)], check=True)
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(tiny)], check=True)
    try:
        cache = RemotePacks(storage, str(tiny / "cache"))
        name = PackName(min(k[len("packs/") : -len(".pack")] for k in storage.list("packs/")))
        with pytest.raises(CacheFull, match="full disk"):
            cache.open(name)
        assert os.listdir(tiny / "cache") == []
    finally:
        subprocess.run(["umount", str(tiny)], check=True)
