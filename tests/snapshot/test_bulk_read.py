"""The native batch read of small files (native/bulkread.c, issue 12.2) against the general
path it stands in for: the same top tree and byte for byte the same stored objects for the
same tree, whatever the tree holds (empty files, holes, hard links, xattrs, sizes at the
chunker's boundaries, big files, a directory of more files than the batches in flight),
the chunks and ids of the streaming chunker, and no torn reading of a file that changes
while it is read."""

from __future__ import annotations

import errno
import os
import random
import threading
import time
from typing import TYPE_CHECKING

import blake3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sprite_env.snapshot import capture as capture_mod
from sprite_env.snapshot.capture import BULK_FILES, BULK_GROUPS, IN_PLACE_MIN, capture
from sprite_env.snapshot.dircache import RACY_NS
from sprite_env.snapshot.fsmeta import O_DIR
from sprite_env.store import pack
from sprite_env.store.chunker import DEFAULT_MAX, DEFAULT_MIN, Chunker
from sprite_env.store.repository import open_store
from tests.helpers import strategies, trees

if TYPE_CHECKING:
    from sprite_env.ids import ObjectId

native = pytest.importorskip("sprite_env._native")

#: sizes at the chunker's and the batch's edges
EDGES = [0, 1, 63, 64, DEFAULT_MIN - 1, DEFAULT_MIN, DEFAULT_MIN + 1, 65536, DEFAULT_MAX]
EDGES += [DEFAULT_MAX + 1, 3 * DEFAULT_MAX, IN_PLACE_MIN - 1, IN_PLACE_MIN, IN_PLACE_MIN + 1]
LIMIT = IN_PLACE_MIN - 1
CDC = (DEFAULT_MIN, 65536, DEFAULT_MAX)


def _objects(store_dir: str) -> dict[ObjectId, tuple[int, int, int, bytes]]:
    """Every stored object: id -> (kind, codec, raw length, payload as stored)."""
    out = {}
    packs = os.path.join(store_dir, "packs")
    for f in os.listdir(packs):
        name = f.removesuffix(".pack")
        fd = os.open(os.path.join(packs, f), os.O_RDONLY)
        try:
            for e in pack.read_table(fd, name):
                out[e.id] = (e.kind, e.codec, e.raw_len, pack.read_payload(fd, name, e))
        finally:
            os.close(fd)
    return out


def _capture(root: str, store_dir: str, bulk: bool) -> ObjectId:
    saved = capture_mod._read_start
    if not bulk:
        capture_mod._read_start = None  # the general path alone, as before the batch read
    try:
        with open_store(store_dir, create=True) as s, s.writer() as w:
            top = capture(root, w, s.read).top_tree
            w.commit()
            return top
    finally:
        capture_mod._read_start = saved


def _same_both_ways(root: str, work: str) -> None:
    a, b = os.path.join(work, "bulk"), os.path.join(work, "general")
    assert _capture(root, a, True) == _capture(root, b, False)
    assert _objects(a) == _objects(b)


def _edge_files(root: str, rng: random.Random, sizes: list[int]) -> None:
    os.makedirs(os.path.join(root, "edges"), exist_ok=True)
    for i, size in enumerate(sizes):
        # half of them compressible (zstd stores those compressed), one a copy (dedup)
        body = rng.randbytes(size) if i % 2 else (b"sprite " * (size // 7 + 1))[:size]
        with open(os.path.join(root, "edges", f"f{i:03d}"), "wb") as f:
            f.write(body)
    with open(os.path.join(root, "edges", "copy"), "wb") as f:
        f.write(b"sprite " * 3000)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    spec=strategies.trees(max_entries=30),
    sizes=st.lists(st.sampled_from(EDGES), max_size=12),
    seed=st.integers(0, 2**32),
)
def test_the_same_objects_as_the_general_path(
    tmp_path_factory: pytest.TempPathFactory,
    spec: dict[bytes, trees.Node],
    sizes: list[int],
    seed: int,
) -> None:
    work = os.fspath(tmp_path_factory.mktemp("bulk"))
    root = os.path.join(work, "layer")
    trees.build_tree(root, spec)
    _edge_files(root, random.Random(seed), sizes)
    _same_both_ways(root, work)


def test_a_directory_of_more_files_than_the_batches_in_flight(tmp_path: os.PathLike[str]) -> None:
    work = os.fspath(tmp_path)
    root = os.path.join(work, "layer")
    os.makedirs(os.path.join(root, "many", "sub"))
    rng = random.Random(7)
    n = BULK_FILES * (BULK_GROUPS + 2) + 5
    for i in range(n):  # subdirectories between them: groups are started before each walk
        d = os.path.join(root, "many") if i % 97 else os.path.join(root, "many", f"d{i}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i:05d}"), "wb") as f:
            f.write(rng.randbytes(rng.randrange(0, 3000)))
    with open(os.path.join(root, "many", "sparse"), "wb") as f:
        f.truncate(200_000)  # a hole only: the general path records it
        f.seek(100_000)
        f.write(b"x")
    os.link(os.path.join(root, "many", "f00001"), os.path.join(root, "many", "sub", "link"))
    os.setxattr(os.path.join(root, "many", "f00002"), b"user.note", b"kept")
    _same_both_ways(root, work)


def test_the_batch_reads_only_plain_files(tmp_path: os.PathLike[str]) -> None:
    """Plain files come back read, chunked as the streaming chunker cuts and hashed; the rest
    (a hole, a second link, too big, not a regular file, missing) is the general path's."""
    d = os.fspath(tmp_path)
    rng = random.Random(3)
    bodies = {b"empty": b"", b"one": b"1", b"three-chunks": rng.randbytes(3 * DEFAULT_MAX)}
    bodies[b"limit"] = rng.randbytes(LIMIT)
    for name, body in bodies.items():
        with open(os.path.join(d.encode(), name), "wb") as f:
            f.write(body)
    with open(os.path.join(d, "big"), "wb") as f:
        f.write(rng.randbytes(LIMIT + 1))
    with open(os.path.join(d, "holey"), "wb") as f:
        f.truncate(3 * 4096)
        f.seek(4096)
        f.write(b"data")
    os.link(os.path.join(d, "one"), os.path.join(d, "one-again"))
    os.symlink("one", os.path.join(d, "symlink"))
    os.mkfifo(os.path.join(d, "fifo"))
    os.mkdir(os.path.join(d, "dir"))
    os.setxattr(os.path.join(d, "limit"), b"user.a", b"b")
    names = [*bodies, b"big", b"holey", b"one-again", b"symlink", b"fifo", b"dir", b"gone"]
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        got = dict(zip(names, native.read_files(fd, names, LIMIT, *CDC, 4), strict=True))
    finally:
        os.close(fd)
    for name in (b"big", b"holey", b"one", b"one-again", b"symlink", b"fifo", b"dir", b"gone"):
        if name in got:
            assert got[name] is None, name  # "one" has two links now: it falls back too
    chunker = Chunker()
    for name in (b"empty", b"three-chunks", b"limit"):
        r = got[name]
        assert r is not None, name
        fields, data, ends, ids, xattr_fd = r
        st_ = os.stat_result(fields)
        real = os.stat(os.path.join(d.encode(), name))
        assert (st_.st_ino, st_.st_size, st_.st_mtime_ns, st_.st_ctime_ns, st_.st_mode) == (
            real.st_ino,
            real.st_size,
            real.st_mtime_ns,
            real.st_ctime_ns,
            real.st_mode,
        )
        assert data == bodies[name]
        assert ends == chunker.cut_points(data, True)
        starts = [0, *ends][: len(ends)]
        want = b"".join(
            blake3.blake3(data[a:b]).digest() for a, b in zip(starts, ends, strict=True)
        )
        assert ids == want
        if name == b"limit":  # it has an xattr: its descriptor is the caller's to read
            assert xattr_fd >= 0
            assert os.getxattr(xattr_fd, "user.a") == b"b"
            os.close(xattr_fd)
        else:
            assert xattr_fd == -1


def test_read_finish_done_at_once_or_waited_for(tmp_path: os.PathLike[str]) -> None:
    """A batch done before read_finish is collected with the GIL kept; one still being read
    after the short hold lets other threads run while it waits. Both give the reads."""
    d = os.fsencode(tmp_path)
    rng = random.Random(5)
    bodies = {b"f%02d" % i: rng.randbytes(LIMIT - i) for i in range(64)}
    for name, body in bodies.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(body)
    ticks = 0
    stop = threading.Event()

    def tick() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    t = threading.Thread(target=tick)
    t.start()
    try:
        small = native.read_start(fd, [b"f00"], LIMIT, *CDC, 1)
        time.sleep(0.2)  # done long before it is collected
        (r,) = native.read_finish(small)
        assert r is not None
        assert r[1] == bodies[b"f00"]
        with pytest.raises(ValueError, match="already finished"):
            native.read_finish(small)
        # 64 MiB to read, cut and hash on 2 threads: far longer than read_finish's hold
        big = native.read_start(fd, list(bodies), LIMIT, *CDC, 2)
        before = ticks
        reads = native.read_finish(big)
        assert ticks > before  # the GIL was let go while the batch was read
    finally:
        stop.set()
        t.join()
        os.close(fd)
    assert [r[1] if r is not None else None for r in reads] == list(bodies.values())


def test_lazy_batches_started_in_a_row_are_all_read(tmp_path: os.PathLike[str]) -> None:
    """A plan starts many lazy batches in a row (the caller wakes a pool thread only if
    none is awake; the pool wakes the rest): every file of every batch is read, as the
    eager batch reads it, however many threads each batch may use, while other batches
    keep the pool busy."""
    d = os.fsencode(tmp_path)
    rng = random.Random(11)
    dirs: dict[bytes, dict[bytes, bytes]] = {}
    for i in range(40):
        sub = b"d%02d" % i
        os.mkdir(os.path.join(d, sub))
        dirs[sub] = {b"f%d" % k: rng.randbytes(rng.choice(EDGES[:9])) for k in range(i % 7 + 1)}
        for name, body in dirs[sub].items():
            with open(os.path.join(d, sub, name), "wb") as f:
                f.write(body)
    fds = {sub: os.open(os.path.join(d, sub), os.O_RDONLY | os.O_DIRECTORY) for sub in dirs}
    try:
        started = [
            (sub, native.read_start(fd, list(dirs[sub]), LIMIT, *CDC, 1 + n % 8, True))
            for n, (sub, fd) in enumerate(fds.items())
        ]
        for sub, batch in reversed(started):  # waited for in any order
            lazy = native.read_finish(batch)
            eager = native.read_files(fds[sub], list(dirs[sub]), LIMIT, *CDC, 4)
            assert [r[1] for r in lazy] == list(dirs[sub].values())
            assert [(r[1], r[2], r[3]) for r in lazy] == [(r[1], r[2], r[3]) for r in eager]
    finally:
        for fd in fds.values():
            os.close(fd)


def test_a_file_changing_while_read_is_never_torn(tmp_path: os.PathLike[str]) -> None:
    """A writer rewrites a file in place between two versions (truncate, write) every 5 ms;
    every reading the batch returns is one whole version (the empty file between the two
    steps is one) with the size its stat says: a reading across a rewrite saw the file's
    times move and falls back to the general path's retries. (Rewrites closer together
    than the file system's timestamp granularity, ~4 ms, cannot be told apart by stat, by
    this path or the general one.)"""
    d = os.fspath(tmp_path)
    a, b = b"a" * 200_000, b"b" * 150_000
    path = os.path.join(d, "f")
    with open(path, "wb") as f:
        f.write(a)
    stop = threading.Event()

    def rewrite() -> None:
        fd = os.open(path, os.O_WRONLY)
        try:
            while not stop.is_set():
                for body in (b, a):
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, body, 0)
                    stop.wait(0.005)
        finally:
            os.close(fd)

    t = threading.Thread(target=rewrite)
    t.start()
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    seen = {"a": 0, "b": 0, "empty": 0, "fallback": 0}
    try:
        for _ in range(300):
            (r,) = native.read_files(dfd, [b"f"], LIMIT, *CDC, 2)
            if r is None:
                seen["fallback"] += 1
                continue
            fields, data, _ends, _ids, xattr_fd = r
            assert xattr_fd == -1
            assert data in (a, b, b"")
            assert len(data) == os.stat_result(fields).st_size
            seen["a" if data == a else "b" if data == b else "empty"] += 1
            time.sleep(0.001)
    finally:
        stop.set()
        t.join()
        os.close(dfd)
    assert sum(seen.values()) == 300


def test_the_small_files_are_read_by_the_batch(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only what the batch cannot read plainly (here a big file and a sparse one) reaches the
    one-file-at-a-time path."""
    work = os.fspath(tmp_path)
    root = os.path.join(work, "layer")
    os.makedirs(os.path.join(root, "d"))
    for i in range(50):
        with open(os.path.join(root, "d", f"f{i}"), "wb") as f:
            f.write(os.urandom(i * 100))
    with open(os.path.join(root, "big"), "wb") as f:
        f.write(os.urandom(IN_PLACE_MIN + 1))
    with open(os.path.join(root, "d", "sparse"), "wb") as f:
        f.truncate(1 << 16)
    # Past the racy window: a big file changed within RACY_NS of the capture's start is
    # read again after its early read (capture._EarlyRead), rightly, and counted twice.
    time.sleep(RACY_NS / 1e9 * 1.5)
    one_by_one: list[bytes] = []
    general = capture_mod.Capturer._file

    def counted(self: capture_mod.Capturer, dirfd: int, rel: bytes, *a: object) -> object:
        one_by_one.append(rel)
        return general(self, dirfd, rel, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(capture_mod.Capturer, "_file", counted)
    with open_store(os.path.join(work, "store"), create=True) as s, s.writer() as w:
        r = capture(root, w, s.read)
        w.commit()
    assert r.stats.files == 52
    assert r.stats.files_read == 52
    assert sorted(one_by_one) == [b"big", b"d/sparse"]


@pytest.mark.parametrize("count", [3, 300])
def test_lstat_names_is_os_stat(tmp_path: os.PathLike[str], count: int) -> None:
    """``lstat_names`` (GIL kept up to 256 names, released past that) gives what
    ``os.stat(follow_symlinks=False)`` gives, None for a missing name."""
    d = os.fsencode(tmp_path)
    names = []
    for i in range(count):
        name = b"n%03d" % i
        p = os.path.join(d, name)
        if i % 3 == 0:
            os.mkdir(p)
        elif i % 3 == 1:
            os.symlink(b"nowhere", p)
        else:
            with open(p, "wb") as f:
                f.write(b"x" * i)
        names.append(name)
    names.insert(1, b"missing")
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        got = native.lstat_names(fd, names)
        with pytest.raises(NotADirectoryError, match="n002/x"):
            native.lstat_names(fd, [b"n000", b"n002/x"])
    finally:
        os.close(fd)
    assert got[1] is None
    for name, fields in zip(names, got, strict=True):
        if name != b"missing":
            assert fields is not None
            assert os.stat_result(fields) == os.lstat(os.path.join(d, name)), name


def test_open_at_and_close_fd_are_os_open_and_close(tmp_path: os.PathLike[str]) -> None:
    top = os.fspath(tmp_path)
    os.mkdir(os.path.join(top, "d"))
    os.symlink("d", os.path.join(top, "link"))
    dfd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = native.open_at(dfd, b"d", O_DIR)
        assert os.path.samestat(os.fstat(fd), os.stat(os.path.join(top, "d")))
        assert not os.get_inheritable(fd)  # O_CLOEXEC, as os.open gives
        native.close_fd(fd)
        with pytest.raises(OSError, match="Bad file descriptor"):
            os.fstat(fd)
        with pytest.raises(OSError, match="Bad file descriptor"):
            native.close_fd(fd)
        with pytest.raises(FileNotFoundError) as gone:
            native.open_at(dfd, b"nope", O_DIR)
        assert gone.value.filename == b"nope"
        with pytest.raises(OSError, match="link") as link:  # O_NOFOLLOW: refused, not followed
            native.open_at(dfd, b"link", O_DIR)
        assert link.value.errno in (errno.ELOOP, errno.ENOTDIR)
        with pytest.raises(ValueError, match="NUL"):
            native.open_at(dfd, b"d\0x", O_DIR)
        for creating in (os.O_CREAT | os.O_WRONLY, os.O_TMPFILE | os.O_WRONLY):
            with pytest.raises(ValueError, match="O_CREAT"):
                native.open_at(dfd, b"new", creating)
        assert set(os.listdir(top)) == {"d", "link"}  # nothing created
    finally:
        os.close(dfd)


@pytest.mark.parametrize("ns", [1_700_000_000_123_456_789, 0, -1, -1_500_000_000_000_000_001])
def test_set_mtime_is_utime_to_the_nanosecond(tmp_path: os.PathLike[str], ns: int) -> None:
    path = os.path.join(tmp_path, "f")
    with open(path, "wb"):
        pass
    fd = os.open(path, os.O_RDONLY)
    try:
        native.set_mtime(fd, ns)
        st = os.stat(path)
        assert (st.st_mtime_ns, st.st_atime_ns) == (ns, ns)
    finally:
        os.close(fd)
    with pytest.raises(OSError, match="Bad file descriptor"):
        native.set_mtime(fd, ns)
