"""The bounded pack cache of a remote store (store/cache.py), under the real reader, against
the real Swift: a fresh machine reads by fetching only the packs it touches, and of a pack
it reads a few objects of, only their byte ranges."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from typing import TYPE_CHECKING

import pytest

from sprite_env.errors import CorruptPack
from sprite_env.ids import ObjectId, PackName
from sprite_env.store import ObjectKind, open_store
from sprite_env.store.cache import PREFETCH_WORKERS, RANGE_READS, CacheFull, RemotePacks
from sprite_env.store.pack import ENTRY
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


def _store_of_one_big_pack(path: str, storage: S3Storage) -> dict[bytes, bytes]:
    """A pushed store of 60 random objects of 20 kB, in one data pack of ~1.2 MB."""
    objs = [os.urandom(20_000) for _ in range(60)]
    with open_store(path, create=True) as s:
        with s.writer(pack_size=4 << 20) as w:
            ids = [w.put(o, ObjectKind.DATA) for o in objs]
            w.commit()
        push(s, storage)
    return dict(zip(ids, objs, strict=True))


def test_a_pin_of_a_few_objects_fetches_only_their_ranges(storage: S3Storage, tmp_path) -> None:
    """One object of a pack not cached (a small file of a remote-only checkpoint): one
    ranged GET of its bytes, nothing cached or left on disk; a pin of the whole pack, or
    the pack read by range RANGE_READS times, fetches it whole into the cache."""
    objs = _store_of_one_big_pack(str(tmp_path / "a"), storage)
    [(key, size)] = storage.list("packs/").items()
    cache = RemotePacks(storage, str(tmp_path / "cache"))
    ids = list(objs)
    with open_store(str(tmp_path / "a"), writable=False) as s:
        s.pack_files = PackFiles(cache)  # the fresh machine's reader: the bucket's packs
        with s.pin([ids[7]]) as pin:
            assert pin.read_many([ids[7]]) == [objs[ids[7]]]
            assert os.listdir(tmp_path / "cache") == []  # a private, unlinked file
        assert (cache.stats.fetched, cache.stats.ranged) == (0, 1)
        assert 20_000 <= cache.stats.bytes_ranged < 21_000  # the object and its header
        # Two objects far apart in the pack: two ranges; one pin, one read.
        with s.pin([ids[1], ids[50]]) as pin:
            assert pin.read_many([ids[50], ids[1]]) == [objs[ids[50]], objs[ids[1]]]
        assert (cache.stats.fetched, cache.stats.ranged) == (0, 3)
        # Most of the pack: the whole pack is worth one GET and a cache entry.
        with s.pin(ids[:40]) as pin:
            assert pin.read_many(ids[:40]) == [objs[i] for i in ids[:40]]
        assert cache.stats.fetched == 1
        assert os.listdir(tmp_path / "cache") == [key[len("packs/") :]]
        assert cache.cached_bytes() == size
        # Once cached (and open), reads use it, never a range again.
        with s.pin([ids[9]]) as pin:
            assert pin.read_many([ids[9]]) == [objs[ids[9]]]
        assert (cache.stats.fetched, cache.stats.ranged) == (1, 3)
    again = RemotePacks(storage, str(tmp_path / "cache"))  # another process, same cache
    with open_store(str(tmp_path / "a"), writable=False) as s:
        s.pack_files = PackFiles(again)
        with s.pin([ids[9]]) as pin:
            assert pin.read_many([ids[9]]) == [objs[ids[9]]]
        assert (again.stats.fetched, again.stats.ranged, again.stats.hits) == (0, 0, 1)

    fresh = RemotePacks(storage, str(tmp_path / "cache2"))
    with open_store(str(tmp_path / "a"), writable=False) as s:
        s.pack_files = PackFiles(fresh)
        for i in range(RANGE_READS):
            with s.pin([ids[i]]) as pin:
                assert pin.read_many([ids[i]]) == [objs[ids[i]]]
        assert (fresh.stats.fetched, fresh.stats.ranged) == (0, RANGE_READS)
        with s.pin([ids[30]]) as pin:  # read often: fetched whole, and cached
            assert pin.read_many([ids[30]]) == [objs[ids[30]]]
        assert fresh.stats.fetched == 1
    assert fresh.open_entries(PackName("0" * 64), [(0, 100)]) is None  # not in the bucket


def test_a_damaged_range_is_caught_by_the_objects_hash(storage: S3Storage, tmp_path) -> None:
    """Bytes read by range are not verified against the pack's name: the reader's hash
    of each object is what catches damage in the bucket (CorruptPack, with its offset)."""
    objs = _store_of_one_big_pack(str(tmp_path / "a"), storage)
    [key] = storage.list("packs/")
    junk = str(tmp_path / "junk")
    storage.get_file(key, junk)
    with open(junk, "r+b") as f:  # every payload byte flipped, the headers kept
        data = bytearray(f.read())
    ids = list(objs)
    with open_store(str(tmp_path / "a"), writable=False) as s:
        loc = s.locate_many([ids[3]])[ids[3]]
        start = loc.entry.offset + ENTRY.size
        for i in range(start, start + loc.entry.stored_len):
            data[i] ^= 0xFF
        with open(junk, "wb") as f:
            f.write(data)
        storage.put_file(key, junk)  # damage in the bucket (never done by sprite-env)
        s.pack_files = PackFiles(RemotePacks(storage, str(tmp_path / "cache")))
        with s.pin([ids[3]]) as pin, pytest.raises(CorruptPack) as err:
            pin.read_many([ids[3]])
        assert err.value.offset == loc.entry.offset
        with s.pin([ids[4]]) as pin:  # its neighbour, untouched, reads fine
            assert pin.read_many([ids[4]]) == [objs[ids[4]]]
