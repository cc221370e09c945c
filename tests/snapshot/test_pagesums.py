"""Page digests: the C kernel against the Python blake3, and the table's checks."""

from __future__ import annotations

import os
import random
from array import array
from typing import TYPE_CHECKING

import blake3
import pytest

from sprite_env.ids import ObjectId
from sprite_env.snapshot import pagesums
from sprite_env.snapshot.dircache import CachedDir, encode_sigs
from sprite_env.snapshot.pagesums import PAGE, SUM_LEN, PageSums
from sprite_env.store import open_store

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from sprite_env.store import Store

native = pytest.mark.skipif(not pagesums.NATIVE, reason="the C extension is not built")


def _reference(data: bytes, start: int, key: bytes) -> list[bytes]:
    """Each window of ``data`` (at file offset ``start``) hashed on its own."""
    out = []
    pos = start
    while pos < start + len(data):
        end = min(start + len(data), (pos // PAGE + 1) * PAGE)
        out.append(blake3.blake3(data[pos - start : end - start], key=key).digest(SUM_LEN))
        pos = end
    return out


def test_windows_cut_at_page_multiples_of_the_file() -> None:
    assert pagesums.windows(0, 0) == 0
    assert pagesums.windows(0, PAGE) == 1
    assert pagesums.windows(1, PAGE) == 2
    assert pagesums.windows(PAGE - 1, 2) == 2
    assert pagesums.windows(100, 3 * PAGE) == 4
    assert pagesums.window_bounds(100, 3 * PAGE, 0) == (100, PAGE)
    assert pagesums.window_bounds(100, 3 * PAGE, 3) == (3 * PAGE, 3 * PAGE + 100)
    pieces = [(b"a" * 32, 0, 5000), (None, 0, PAGE), (b"b" * 32, 0, 100)]
    assert pagesums.window_count(pieces) == 2 + 1  # the hole has none


@native
def test_native_digests_are_keyed_blake3_of_each_window() -> None:
    rng = random.Random(7)
    for _ in range(60):
        key = rng.randbytes(32)
        start = rng.choice([0, PAGE, rng.randrange(1 << 30)])
        data = rng.randbytes(rng.choice([0, 1, PAGE - 1, PAGE, rng.randrange(300_000)]))
        got = pagesums.digests(data, start, key)
        assert got == b"".join(_reference(data, start, key))
        assert got == pagesums.digests_ref(data, start, key)


@native
def test_native_file_pass_and_comparison_match_the_reference(tmp_path: os.PathLike[str]) -> None:
    rng = random.Random(8)
    data = rng.randbytes(3_000_000)
    path = os.path.join(os.fspath(tmp_path), "f")
    with open(path, "wb") as f:
        f.write(data)
    key = rng.randbytes(32)
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(12):
            ranges = array("Q")
            pos = rng.randrange(10_000)
            while pos < len(data) - 300_000:  # pieces like a chunk list's, a few gaps
                n = rng.randrange(1, 200_000)
                ranges.extend([pos, n])
                pos += n + (rng.randrange(9_000) if rng.random() < 0.1 else 0)
            pairs = list(zip(ranges[::2], ranges[1::2], strict=True))
            want = b"".join(b"".join(_reference(data[a : a + n], a, key)) for a, n in pairs)
            assert pagesums.digests_of_fd(fd, pairs, key) == want  # on two threads
            wrong = bytearray(want)
            for _ in range(rng.randrange(40)):
                wrong[rng.randrange(len(wrong))] ^= 1
            new, runs = pagesums.compare_fd(fd, ranges, key, bytes(wrong))
            assert new == want
            pagesums.NATIVE = False  # the pure-Python reference of the same comparison
            try:
                assert pagesums.compare_fd(fd, ranges, key, bytes(wrong)) == (new, runs)
            finally:
                pagesums.NATIVE = True
            for r, start, chunk in runs:  # each run: the bytes of changed windows of a piece
                a, n = pairs[r]
                assert a <= start < start + len(chunk) <= a + n
                assert chunk == data[start : start + len(chunk)]
        with pytest.raises(OSError, match="No data") as e:  # past the end: it shrank
            pagesums.digests_of_fd(fd, [(len(data) - 10, 20)], key)
        assert e.value.errno == 61
    finally:
        os.close(fd)


@pytest.fixture
def store(tmp_path: os.PathLike[str]) -> Iterator[Store]:
    s = open_store(os.path.join(os.fspath(tmp_path), "store"), create=True)
    yield s
    s.close()


def test_a_row_failing_its_checksum_is_dropped_not_used(
    store: Store, expect_log: Callable[[str], None]
) -> None:
    expect_log("page digests of b'd/db' failed their checksum and were dropped")
    ps = PageSums(os.urandom(32), os.urandom(32), os.urandom(SUM_LEN * 10))
    with store.catalog.transaction() as db:
        pagesums.save(db, {b"d/db": ps}, {})
    assert pagesums.Lookup(store.catalog)(b"d/db") == ps
    with store.catalog.transaction() as db:  # one flipped byte, as a failing disk would
        bad = bytes([ps.sums[0] ^ 1]) + ps.sums[1:]
        db.execute("UPDATE pagesums SET sums=? WHERE path=?", (bad, b"d/db"))
    assert pagesums.Lookup(store.catalog)(b"d/db") is None
    assert store.catalog.query("SELECT count(*) FROM pagesums")[0][0] == 0


def test_rows_of_files_gone_are_dropped(store: Store) -> None:
    def ps() -> PageSums:
        return PageSums(os.urandom(32), os.urandom(32), os.urandom(SUM_LEN))

    with store.catalog.transaction() as db:
        pagesums.save(db, {b"a/x": ps(), b"a/y": ps(), b"b/z": ps(), b"c/d/w": ps()}, {})
    row = CachedDir(ObjectId(bytes(32)), encode_sigs({b"x": (1, 2, 3, 4)}))
    with store.catalog.transaction() as db:  # a/ read again without y; b gone; c removed
        pagesums.save(db, {}, {b"a": row}, removed=[b"b"], removed_trees=[b"c"])
    left = sorted(bytes(p) for (p,) in store.catalog.query("SELECT path FROM pagesums"))
    assert left == [b"a/x"]
