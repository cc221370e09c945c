"""Without open, the kernel answers a second walk of a checkpoint from its caches.

The view counts the requests it answers (``ViewOperations.requests``); these tests count
them around real walks of a real mount, rather than timing anything.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import random
from typing import TYPE_CHECKING

import pytest

from sprite_env.fuse.operations import NO_OPEN_SUPPORTED
from sprite_env.snapshot.diff import top_entry
from sprite_env.snapshot.tree import decode_chunks, decode_tree
from tests.fuse.mounting import (
    PAGE_CACHE,
    requires_fuse,
    undisturbed_runs,
    wait_until,
)

if TYPE_CHECKING:
    from collections import Counter
    from collections.abc import Callable

    from sprite_env.checkpoints import Engine
    from sprite_env.ids import ObjectId
    from tests.fuse.mounting import Mounted

pytestmark = [pytest.mark.fuse, requires_fuse, PAGE_CACHE]

needs_patch = pytest.mark.skipif(
    not NO_OPEN_SUPPORTED, reason="needs pyfuse3 built with .ci/pyfuse3-no-open.patch"
)
MiB = 1 << 20


def _layer(root: str) -> dict[str, bytes]:
    """A small tree: nested directories, small files, one of 3 MiB, symlinks."""
    rng = random.Random(5)
    files: dict[str, bytes] = {}
    for d in ("a", "a/b", "a/b/c", "d"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
        for i in range(12):
            files[f"{d}/f{i}"] = rng.randbytes(rng.randrange(0, 40_000))
    files["d/big"] = rng.randbytes(3 * MiB)
    for rel, data in files.items():
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
    os.symlink("f1", os.path.join(root, "a/link"))
    os.symlink("../d/big", os.path.join(root, "a/b/up"))
    return files


def _walk(top: str) -> tuple[dict[str, bytes], dict[str, str]]:
    """Every file's bytes and every symlink's target under ``top`` (what ``diff -r
    --no-dereference`` reads)."""
    files: dict[str, bytes] = {}
    links: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, top)
            os.lstat(path)
            if os.path.islink(path):
                links[rel] = os.readlink(path)
            elif name in filenames:
                with open(path, "rb") as f:
                    files[rel] = f.read()
    return files, links


def _in_page_cache(path: str) -> bool:
    """Whether every page of the file is in the kernel's page cache (``mincore`` of a
    shared mapping: it neither faults pages in nor sends the file system a read)."""
    size = os.path.getsize(path)
    if size == 0:
        return True
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    libc.mmap.argtypes += [ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr == ctypes.c_void_p(-1).value:
            raise OSError(ctypes.get_errno(), "mmap")
        try:
            vec = ctypes.create_string_buffer((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE)
            if libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
            return all(b & 1 for b in vec.raw)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def _requests(m: Mounted) -> Counter[str]:
    return m.call(lambda: m.ops.requests.copy())  # type: ignore[no-any-return]


@needs_patch
def test_a_second_walk_is_answered_by_the_kernel(
    root: str, engine: Engine, mount: Callable[..., Mounted]
) -> None:
    files = _layer(root)
    engine.create()
    for _ in undisturbed_runs():
        with mount() as m:
            assert m.ops.no_open
            top = m.path("v0")
            got, links = _walk(top)
            assert got == files
            assert links == {"a/link": "f1", "a/b/up": "../d/big"}
            first = _requests(m)
            # open and opendir were asked once each (answered ENOSYS); no release at all
            assert first["open"] == 1
            assert first["opendir"] <= 1
            assert first["release"] == first["releasedir"] == 0
            assert first["read"] >= 1
            assert first["readdir"] >= 5
            assert first["readlink"] == 2

            assert _walk(top) == (files, links)
            again = _requests(m) - first
    assert not again, f"the second walk reached the view: {dict(again)}"


def test_with_open_a_second_walk_asks_the_view_again(
    root: str, engine: Engine, mount: Callable[..., Mounted]
) -> None:
    """The contrast (a stock pyfuse3, or ``no_open=False``): every open, listing and close
    of the second walk reaches the view, though the file pages stay cached."""
    files = _layer(root)
    engine.create()
    for _ in undisturbed_runs():
        with mount(no_open=False) as m:
            top = m.path("v0")
            _walk(top)
            first = _requests(m)
            assert _walk(top)[0] == files
            again = _requests(m) - first
    assert again["open"] == len(files)
    assert again["opendir"] == 5  # v0, a, a/b, a/b/c, d
    assert again["read"] == 0  # keep_cache


@needs_patch
def test_the_root_follows_checkpoints_though_the_kernel_caches_listings(
    root: str, engine: Engine, mount: Callable[..., Mounted]
) -> None:
    """A long ``list_ttl``: only the view's refresh (what the daemon calls after a job)
    tells the kernel to list the root again, and then at once."""
    for i in range(3):
        with open(os.path.join(root, "f"), "w") as f:
            f.write(str(i))
        engine.create()
    with mount(list_ttl=3600.0) as m:
        for _ in undisturbed_runs():
            assert sorted(os.listdir(m.mountpoint)) == [".checkpoints.json", "v0", "v1", "v2"]
            before = _requests(m)["readdir"]
            assert sorted(os.listdir(m.mountpoint)) == [".checkpoints.json", "v0", "v1", "v2"]
            again = _requests(m)["readdir"] - before
        assert again == 0  # cached by the kernel
        engine.delete("v1")  # neither the newest nor the root's date changes
        m.ops.refresh()
        assert sorted(os.listdir(m.mountpoint)) == [".checkpoints.json", "v0", "v2"]
        engine.create()
        m.ops.refresh()
        assert sorted(os.listdir(m.mountpoint)) == [".checkpoints.json", "v0", "v2", "v3"]
        with open(m.path("v3", "f")) as f:
            assert f.read() == "2"


@needs_patch
def test_a_file_read_before_its_checkpoint_is_deleted_stays_readable_and_then_goes(
    root: str, engine: Engine, mount: Callable[..., Mounted]
) -> None:
    """Without open, a file is pinned at its first read until the kernel forgets it: it
    stays readable across the delete and a prune while open, and its pack is let go once
    it is closed (the view asks the kernel to drop the names of a checkpoint that left)."""
    data = random.Random(3).randbytes(6 * MiB)
    with open(os.path.join(root, "f"), "wb") as f:
        f.write(data)
    engine.create()
    with open(os.path.join(root, "f"), "wb") as f:  # v1 shares nothing with v0
        f.write(b"new")
    engine.create()
    with mount(object_cache_bytes=MiB, readahead_bytes=MiB) as m:
        with open(m.path("v0", "f"), "rb", buffering=0) as f:
            assert f.read(MiB) == data[:MiB]
            assert m.call(lambda: m.ops.open_files) == 1
            engine.delete("v0")
            m.ops.refresh()
            with open("/proc/sys/vm/drop_caches", "w") as dc:
                dc.write("1\n")
            m.call(m.ops.objects.clear)
            assert f.read() == data[MiB:]
        wait_until(lambda: m.source.open_pack_fds == 0, what="the pin to go")  # type: ignore[attr-defined]
        assert m.call(lambda: m.ops.open_files) == 0


@needs_patch
@pytest.mark.parametrize("no_open", [True, False], ids=["no-open", "open"])
def test_small_files_read_ahead_are_handed_to_the_kernel_and_cost_no_read(
    root: str, engine: Engine, mount: Callable[..., Mounted], no_open: bool
) -> None:
    """The first read in a directory loads the small files after it, and the view writes
    them into the kernel's page cache (``pages.py``): reading them then sends no request,
    and every byte read is the file's (a sparse one's hole as zeros)."""
    rng = random.Random(9)
    os.makedirs(os.path.join(root, "many"))
    files = {f"many/f{i:02d}": rng.randbytes(rng.randrange(1, 20_000)) for i in range(40)}
    files["many/f40"] = b""  # empty: nothing to push
    for rel, data in files.items():
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
    with open(os.path.join(root, "many", "f41"), "wb") as f:  # a hole, then data
        f.truncate(100_000)
        f.seek(100_000)
        f.write(b"tail")
    files["many/f41"] = bytes(100_000) + b"tail"
    engine.create()
    pushed = [r for r in sorted(files) if r != "many/f00" and files[r]]
    for _ in undisturbed_runs():
        with mount(no_open=no_open) as m:
            names = sorted(os.listdir(m.path("v0", "many")))  # the kernel learns the inodes
            assert names == sorted(os.path.basename(r) for r in files)
            with open(m.path("v0", "many", "f00"), "rb") as f:
                assert f.read() == files["many/f00"]
            wait_until(lambda: m.call(lambda: m.ops.pages_pushed) >= 40, what="the pushes")
            # Every pushed page is in the kernel's page cache (mincore: no read is sent).
            missing = {r for r in pushed if not _in_page_cache(m.path("v0", r))}
            cost: dict[str, int] = {}
            for rel in sorted(files):
                held = _in_page_cache(m.path("v0", rel))
                before = _requests(m)["read"]
                with open(m.path("v0", rel), "rb") as f:
                    assert f.read() == files[rel], rel
                if held:  # a file whose pages the kernel held must cost no read
                    cost[rel] = _requests(m)["read"] - before
    assert len(missing) <= 2, f"not in the page cache: {missing}"
    assert len(cost) >= len(files) - 3
    assert cost == dict.fromkeys(cost, 0)


def _small_dirs(root: str, names: str, count: int = 10) -> dict[str, bytes]:
    rng = random.Random(11)
    files: dict[str, bytes] = {}
    for d in names:
        os.makedirs(os.path.join(root, d))
        for i in range(count):
            files[f"{d}/f{i}"] = rng.randbytes(rng.randrange(1, 30_000))
    for rel, data in files.items():
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
    return files


def _file_objects(engine: Engine, directory: str) -> set[ObjectId]:
    """The objects of the files of ``directory`` (a child of v0's root)."""
    read = engine.store.read
    top = top_entry(read, engine.info("v0").top_tree)
    d = next(e for e in decode_tree(read(top.subtree)) if e.name == directory.encode())
    return {
        oid
        for e in decode_tree(read(d.subtree))
        for oid, _off, _n in decode_chunks(e.payload)
        if oid is not None
    }


@needs_patch
def test_a_walk_that_reads_has_the_files_of_what_it_lists_pushed_before_it_reads_them(
    root: str, engine: Engine, mount: Callable[..., Mounted]
) -> None:
    """Once a file was read, the end of a directory's listing hands its small files to
    the kernel (no read of theirs reaches the view) and loads the files of the directory
    a depth-first walk lists next (here ``c``, after ``b``) before it is even listed."""
    files = _small_dirs(root, "abc")
    engine.create()
    c_objects = _file_objects(engine, "c")
    for _ in undisturbed_runs():
        with mount() as m:
            assert os.listdir(m.path("v0")) == ["a", "b", "c"]
            assert len(os.listdir(m.path("v0", "a"))) == 10  # nothing read: nothing pushed
            assert m.call(lambda: m.ops.pages_pushed) == 0
            with open(m.path("v0", "a", "f0"), "rb") as f:  # the walk reads
                assert f.read() == files["a/f0"]
            wait_until(lambda: m.call(lambda: m.ops.pages_pushed) >= 9, what="a's pushes")
            before = m.call(lambda: m.ops.pages_pushed)
            assert os.listdir(m.path("v0", "b")) == [f"f{i}" for i in range(10)]
            wait_until(
                lambda n=before + 10: m.call(lambda: m.ops.pages_pushed) >= n, what="b's pushes"
            )
            wait_until(
                lambda: m.call(lambda: all(m.ops.objects.peek(o) is not None for o in c_objects)),
                what="c's files to be loaded ahead",
            )
            cost: dict[str, int] = {}
            for i in range(10):
                rel = f"b/f{i}"
                held = _in_page_cache(m.path("v0", rel))
                reads = _requests(m)["read"]
                with open(m.path("v0", rel), "rb") as f:
                    assert f.read() == files[rel]
                if held:
                    cost[rel] = _requests(m)["read"] - reads
    assert len(cost) >= 8
    assert cost == dict.fromkeys(cost, 0)


@needs_patch
def test_a_walk_that_reads_nothing_loads_no_file(
    root: str, engine: Engine, mount: Callable[..., Mounted]
) -> None:
    """``find`` or ``ls -R`` lists every directory and reads no file: the view loads the
    trees it lists, never a file's objects, and pushes nothing."""
    _small_dirs(root, "abc")
    engine.create()
    with mount() as m:
        for _dirpath, _dirnames, filenames in os.walk(m.path("v0")):
            assert len(filenames) in (0, 10)
        wait_until(lambda: m.call(lambda: m.ops.trees.loading == 0))
        assert m.call(lambda: len(m.ops.objects)) == 0
        assert m.call(lambda: m.ops.pages_pushed) == 0
        assert _requests(m)["read"] == 0
