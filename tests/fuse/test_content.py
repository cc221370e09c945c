"""File contents through the mount: large, sparse, concurrent, changed in place, deleted."""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import blake3
import pytest

from sprite_env.snapshot.diff import top_entry
from sprite_env.snapshot.tree import decode_chunks, decode_tree
from tests.fuse.mounting import PAGE_CACHE, requires_fuse, wait_until

if TYPE_CHECKING:
    from collections.abc import Callable

    from sprite_env.checkpoints import Engine
    from sprite_env.ids import ObjectId
    from tests.fuse.mounting import Mounted

pytestmark = [pytest.mark.fuse, requires_fuse, PAGE_CACHE]

MiB = 1 << 20


def _drop_page_cache() -> None:
    """So that reads reach the file system, not the pages the kernel kept."""
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1\n")


def _digest(path: str, block: int = MiB) -> str:
    h = blake3.blake3()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def _file_objects(engine: Engine, cid: str, path: bytes) -> set[ObjectId]:
    """The data objects of the file at ``path`` in checkpoint ``cid``."""
    read = engine.store.read
    entry = top_entry(read, engine.info(cid).top_tree)
    for name in path.split(b"/"):
        entry = next(e for e in decode_tree(read(entry.subtree)) if e.name == name)
    payload = read(entry.payload) if entry.indirect else entry.payload  # type: ignore[arg-type]
    return {oid for oid, _o, _n in decode_chunks(payload) if oid is not None}


def test_large_sparse_and_hard_linked_files_compare_equal(
    root: str, engine: Engine, mount: Callable[..., Mounted]
) -> None:
    big = os.path.join(root, "big")
    with open(big, "wb") as f:
        f.write(random.Random(1).randbytes(20 * MiB))
    with open(os.path.join(root, "sparse"), "wb") as f:
        f.truncate(64 * MiB)
        f.seek(33 * MiB + 5)
        f.write(b"an island in a sea of holes")
    os.link(big, os.path.join(root, "big-link"))
    engine.create()
    with mount() as m:
        for name in ("big", "sparse", "big-link"):
            subprocess.run(["cmp", os.path.join(root, name), m.path("v0", name)], check=True)
        assert os.stat(m.path("v0", "big")).st_ino == os.stat(m.path("v0", "big-link")).st_ino


def test_random_reads_return_the_right_bytes(
    root: str, engine: Engine, mount: Callable[..., Mounted]
) -> None:
    data = random.Random(2).randbytes(6 * MiB) + b"text line\n" * 300_000
    with open(os.path.join(root, "f"), "wb") as f:
        f.write(data)
    engine.create()
    rng = random.Random(3)
    with mount() as m:
        fd = os.open(m.path("v0", "f"), os.O_RDONLY)
        try:
            for _ in range(300):
                off = rng.randrange(len(data) + 10)
                n = rng.choice([1, 100, 4096, 65536, 200_000, 3 * MiB])
                assert os.pread(fd, n, off) == data[off : off + n], (off, n)
        finally:
            os.close(fd)


def test_eight_concurrent_readers(root: str, engine: Engine, mount: Callable[..., Mounted]) -> None:
    rng = random.Random(4)
    expected = {}
    for i in range(4):
        data = rng.randbytes(4 * MiB + i)
        with open(os.path.join(root, f"f{i}"), "wb") as f:
            f.write(data)
        expected[f"f{i}"] = blake3.blake3(data).hexdigest()
    engine.create()
    with mount() as m:
        names = [f"f{i % 4}" for i in range(8)]  # two readers per file
        barrier = threading.Barrier(8)

        def read(name: str) -> str:
            barrier.wait()
            return _digest(m.path("v0", name), block=rng.choice([4096, 128 << 10, MiB]))

        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(read, names))
        assert got == [expected[n] for n in names]
        hits, misses = m.call(lambda: (m.ops.objects.hits, m.ops.objects.misses))
        data_objects = engine.store.catalog.query("SELECT count(*) FROM objects WHERE kind=0")
        assert misses <= data_objects[0][0], "an object was decompressed twice"
        assert hits > 0


def test_a_file_changed_in_place_reads_right_in_both_checkpoints(
    root: str, engine: Engine, mount: Callable[..., Mounted]
) -> None:
    path = os.path.join(root, "db")
    old = random.Random(5).randbytes(4 * MiB)
    with open(path, "wb") as f:
        f.write(old)
    engine.create()
    new = bytearray(old)
    rng = random.Random(6)
    with open(path, "r+b") as f:  # pages rewritten in place: same inode
        for _ in range(30):
            page = rng.randrange(len(old) // 4096) * 4096
            patch = rng.randbytes(4096)
            f.seek(page)
            f.write(patch)
            new[page : page + 4096] = patch
        f.write(b"and a tail")
        new[f.tell() - 10 : f.tell()] = b"and a tail"
    v1 = engine.create()
    assert v1.bytes_added < 1 * MiB  # pieces of v1 are slices of v0's objects
    assert _file_objects(engine, "v0", b"db") & _file_objects(engine, "v1", b"db")
    with mount() as m:
        for cid, want in (("v0", old), ("v1", bytes(new))):
            with open(m.path(cid, "db"), "rb") as f:
                assert f.read() == want, cid
            with open(m.path(cid, "db"), "rb") as f:  # and by odd-sized pieces
                f.seek(4095)
                assert f.read(12289) == want[4095 : 4095 + 12289]


def test_a_file_open_when_its_checkpoint_is_deleted_stays_readable(
    root: str, engine: Engine, mount: Callable[..., Mounted]
) -> None:
    path = os.path.join(root, "f")
    data = random.Random(7).randbytes(24 * MiB)
    with open(path, "wb") as f:
        f.write(data)
    engine.create()
    with open(path, "wb") as f:  # v1 shares nothing with v0: deleting v0 frees it all
        f.write(random.Random(8).randbytes(MiB))
    engine.create()
    doomed = _file_objects(engine, "v0", b"f")
    packs_before = set(os.listdir(engine.store.packs_dir))
    with mount(object_cache_bytes=2 * MiB, readahead_bytes=MiB) as m:
        half = len(data) // 2
        reader_ready, deleted = threading.Event(), threading.Event()
        got = bytearray()

        def read_across_the_delete() -> None:
            with open(m.path("v0", "f"), "rb", buffering=0) as f:
                while len(got) < half:
                    got.extend(f.read(MiB))
                reader_ready.set()
                assert deleted.wait(30)
                while chunk := f.read(MiB):
                    got.extend(chunk)

        reader = threading.Thread(target=read_across_the_delete)
        reader.start()
        try:
            assert reader_ready.wait(30)
            engine.delete("v0")
            m.ops.refresh()
            _drop_page_cache()
            m.call(m.ops.objects.clear)
        finally:
            deleted.set()
            reader.join(30)
        assert bytes(got) == data
        # the objects really were gone from the store, and their packs unlinked
        assert not any(engine.store.has(oid) for oid in doomed)
        assert packs_before - set(os.listdir(engine.store.packs_dir))
        # the view let go of the deleted packs when the file was closed (RELEASE comes
        # after close() returned)
        wait_until(lambda: m.source.open_pack_fds == 0, what="the pins to go")  # type: ignore[attr-defined]
        assert m.call(lambda: m.ops.open_files) == 0
        wait_until(lambda: not os.path.exists(m.path("v0")), timeout=5, what="v0 to go")
        with pytest.raises(FileNotFoundError):
            os.stat(m.path("v0", "f"))


def test_small_files_open_when_their_checkpoint_is_deleted_stay_readable(
    root: str, engine: Engine, mount: Callable[..., Mounted]
) -> None:
    """A small file's handle may keep its bytes instead of pinning them: either way the
    delete cannot take them away while it is open (with open: without, a file is pinned
    at its first read, see the next test)."""
    rng = random.Random(9)
    os.mkdir(os.path.join(root, "d"))
    contents = {f"f{i}": rng.randbytes(20_000 + i) for i in range(20)}
    for name, data in contents.items():
        with open(os.path.join(root, "d", name), "wb") as f:
            f.write(data)
    engine.create()
    for name in contents:  # v1 shares nothing with v0
        with open(os.path.join(root, "d", name), "wb") as f:
            f.write(rng.randbytes(100))
    engine.create()
    doomed = _file_objects(engine, "v0", b"d/f3") | _file_objects(engine, "v0", b"d/f11")
    with mount(no_open=False) as m, contextlib.ExitStack() as stack:
        # f3 is read ahead with the files after it and its handle holds its bytes; f11
        # comes before f3 in the directory, so it was not read ahead: it is pinned
        f3 = stack.enter_context(open(m.path("v0", "d", "f3"), "rb", buffering=0))
        f11 = stack.enter_context(open(m.path("v0", "d", "f11"), "rb", buffering=0))
        assert f3.read(10) == contents["f3"][:10]
        assert m.source.open_pack_fds == 1  # type: ignore[attr-defined]
        engine.delete("v0")
        m.ops.refresh()
        _drop_page_cache()
        m.call(m.ops.objects.clear)
        assert not any(engine.store.has(oid) for oid in doomed)
        assert f3.read() == contents["f3"][10:]
        assert f11.read() == contents["f11"]
        stack.close()
        # the kernel sends RELEASE after close() returns
        wait_until(lambda: m.source.open_pack_fds == 0, what="the pins to go")  # type: ignore[attr-defined]


def test_a_sequential_read_does_not_fill_the_shared_cache(
    root: str, engine: Engine, mount: Callable[..., Mounted]
) -> None:
    """Read-ahead's objects are dropped once read (the kernel keeps the pages): a long
    read leaves the cache to the other files, and nothing is decompressed twice."""
    data = random.Random(12).randbytes(24 * MiB)
    with open(os.path.join(root, "f"), "wb") as f:
        f.write(data)
    engine.create()
    objects = _file_objects(engine, "v0", b"f")
    with mount() as m:
        assert _digest(m.path("v0", "f"), block=128 << 10) == blake3.blake3(data).hexdigest()
        wait_until(lambda: m.call(lambda: m.ops.objects.loading) == 0, what="the read-aheads")
        cached, misses = m.call(lambda: (m.ops.objects.bytes, m.ops.objects.misses))
        assert misses <= len(objects)
        assert cached <= 2 * MiB  # what open loaded (the first MiB) stays


def test_objects_a_file_repeats_are_kept_for_their_next_use(
    root: str, engine: Engine, mount: Callable[..., Mounted]
) -> None:
    block = random.Random(13).randbytes(3 * MiB)
    with open(os.path.join(root, "f"), "wb") as f:
        f.write(block * 8)
    engine.create()
    objects = _file_objects(engine, "v0", b"f")
    assert len(objects) < 100  # the chunker found the repeats: most pieces share objects
    with mount() as m:
        assert _digest(m.path("v0", "f"), block=128 << 10) == blake3.blake3(block * 8).hexdigest()
        assert m.call(lambda: m.ops.objects.misses) <= len(objects)
