"""Tests of the FastCDC chunker: C kernel vs Python reference, streaming, golden boundaries."""

from __future__ import annotations

import array
import mmap
import os
import sys
import threading
import time
from typing import TYPE_CHECKING

import pytest
from blake3 import blake3
from hypothesis import given, settings
from hypothesis import strategies as st

from sprite_env import _native
from sprite_env.store import _chunker_ref as ref
from sprite_env.store import chunker as chunker_mod
from sprite_env.store.chunker import (
    DEFAULT_AVG,
    DEFAULT_BLOCK,
    DEFAULT_MAX,
    DEFAULT_MIN,
    Chunker,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from typing_extensions import Buffer

SMALL = (64, 256, 1024)
"""Small parameters (min, avg, max) under which the Python reference is fast."""

PARAM_SETS = [
    SMALL,
    (0, 8, 9),
    (0, 8, 1000),
    (16, 64, 1024),
    (32, 128, 129),
    (200, 256, 300),
    (255, 256, 4096),
    (1000, 1024, 100_000),
]


def stream(label: str, n: int) -> bytes:
    """Returns n pseudo-random bytes: BLAKE3 in XOF mode, fixed forever by the spec."""
    return blake3(b"sprite-env chunker test stream: " + label.encode()).digest(length=n)


def lengths(cuts: list[int]) -> list[int]:
    return [end - start for start, end in zip([0, *cuts], cuts, strict=False)]


def check_invariants(cuts: list[int], n: int, params: tuple[int, int, int], final: bool) -> None:
    min_size, _avg_size, max_size = params
    assert cuts == sorted(set(cuts))
    sizes = lengths(cuts)
    assert all(0 < s <= max_size for s in sizes)
    if final:
        assert cuts[-1:] == ([n] if n else [])
        assert all(s > min_size for s in sizes[:-1])
    else:
        assert all(s > min_size for s in sizes)
        assert n - (cuts[-1] if cuts else 0) < max_size


# --- (1) native == reference -------------------------------------------------------------


def test_gear_table_native_equals_reference() -> None:
    assert _native.gear_table() == ref.GEAR
    assert len(ref.GEAR) == 256
    assert len(set(ref.GEAR)) == 256
    assert _native.GEAR_SEED == ref.GEAR_SEED == int.from_bytes(b"sprite-1", "big")


def test_chunker_module_uses_native() -> None:
    assert chunker_mod.NATIVE


@pytest.mark.parametrize("params", PARAM_SETS)
@pytest.mark.parametrize("seed", range(12))
def test_native_equals_reference_random(params: tuple[int, int, int], seed: int) -> None:
    n = (seed * 7919 + 1) % (params[2] * 12 + 1)
    if seed % 3 == 0:
        data = stream(f"random {seed}", n)
    else:
        # Low-entropy data: few distinct byte values, long repeats.
        raw = stream(f"low entropy {seed}", n)
        data = bytes(b & (0x03 if seed % 3 == 1 else 0x80) for b in raw)
    for final in (True, False):
        expected = ref.cut_points(data, *params, final)
        assert _native.cut_points(data, *params, final) == expected
        check_invariants(expected, n, params, final)


def edge_inputs(params: tuple[int, int, int]) -> Iterator[tuple[str, bytes]]:
    min_size, avg_size, max_size = params
    sizes = {0, 1, 2, 63, 64, 65}
    for k in (min_size, avg_size, max_size, 2 * max_size, 3 * max_size + 5):
        sizes.update(k + d for d in (-2, -1, 0, 1, 2) if k + d >= 0)
    for size in sorted(sizes):
        yield f"random {size}", stream(f"edge {size}", size)
        yield f"zeros {size}", bytes(size)
        yield f"ones {size}", b"\xff" * size
    yield "pattern", b"abc" * max_size
    yield "zeros then random", bytes(2 * max_size) + stream("tail", 3 * max_size)
    yield "random then zeros", stream("head", 3 * max_size) + bytes(3 * max_size)


@pytest.mark.parametrize("params", PARAM_SETS)
def test_native_equals_reference_edge_cases(params: tuple[int, int, int]) -> None:
    for name, data in edge_inputs(params):
        for final in (True, False):
            expected = ref.cut_points(data, *params, final)
            assert _native.cut_points(data, *params, final) == expected, name
            check_invariants(expected, len(data), params, final)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    data=st.binary(max_size=5000),
    min_size=st.integers(0, 300),
    avg_bits=st.integers(3, 9),
    extra=st.integers(1, 2000),
    final=st.booleans(),
)
def test_native_equals_reference_hypothesis(
    data: bytes, min_size: int, avg_bits: int, extra: int, final: bool
) -> None:
    avg_size = 1 << avg_bits
    min_size %= avg_size
    params = (min_size, avg_size, avg_size + extra)
    expected = ref.cut_points(data, *params, final)
    assert _native.cut_points(data, *params, final) == expected
    check_invariants(expected, len(data), params, final)


def test_trivial_inputs() -> None:
    assert _native.cut_points(b"", *SMALL, True) == []
    assert _native.cut_points(b"", *SMALL, False) == []
    assert _native.cut_points(b"x", *SMALL, True) == [1]
    assert _native.cut_points(b"x" * 64, *SMALL, True) == [64]
    assert _native.cut_points(b"x" * 1023, *SMALL, False) == []
    assert _native.cut_points(bytes(1024), *SMALL, False) == [1024]


@pytest.mark.parametrize(
    "params", [SMALL, (DEFAULT_MIN, DEFAULT_AVG, DEFAULT_MAX), (0, 128, 10_000)]
)
def test_zero_runs_cut_at_max_size(params: tuple[int, int, int]) -> None:
    max_size = params[2]
    data = bytes(10 * max_size + 3)
    expected = [max_size * k for k in range(1, 11)]
    assert _native.cut_points(data, *params, False) == expected
    assert _native.cut_points(data, *params, True) == [*expected, len(data)]
    if max_size <= 10_000:
        assert ref.cut_points(data, *params, True) == [*expected, len(data)]


def test_accepts_any_contiguous_buffer(tmp_path: Path) -> None:
    data = stream("buffers", 50_000)
    expected = _native.cut_points(data, *SMALL, True)
    path = tmp_path / "data"
    path.write_bytes(data)
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        assert _native.cut_points(mapped, *SMALL, True) == expected
    words = array.array("I")
    words.frombytes(data)
    buffers: list[Buffer] = [bytearray(data), memoryview(data), words, memoryview(words)]
    for buf in buffers:
        assert _native.cut_points(buf, *SMALL, True) == expected
        assert ref.cut_points(buf, *SMALL, True) == expected
    # Offsets are relative to the start of the buffer.
    assert _native.cut_points(memoryview(data)[100:], *SMALL, True) == ref.cut_points(
        data[100:], *SMALL, True
    )
    assert (
        _native.cut_points(memoryview(data), min_size=64, avg_size=256, max_size=1024, final=True)
        == expected
    )


def test_rejects_non_buffers_and_non_contiguous() -> None:
    with pytest.raises(TypeError):
        _native.cut_points("text", *SMALL, True)  # type: ignore[arg-type]
    with pytest.raises((TypeError, BufferError, ValueError)):
        _native.cut_points(memoryview(bytes(4096))[::2], *SMALL, True)


BAD_PARAMS = [
    (256, 256, 1024),  # min == avg
    (300, 256, 1024),  # min > avg
    (64, 256, 256),  # avg == max
    (64, 255, 1024),  # avg not a power of two
    (64, 384, 1024),
    (0, 4, 1024),  # avg too small for the loose mask
    (-1, 256, 1024),
    (64, 256, -1),
]


@pytest.mark.parametrize("params", BAD_PARAMS)
def test_bad_sizes_raise_value_error(params: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError, match="size"):
        _native.cut_points(b"data", *params, True)
    with pytest.raises(ValueError, match="size"):
        ref.cut_points(b"data", *params, True)
    with pytest.raises(ValueError, match="size"):
        Chunker(*params)


def test_non_final_is_a_prefix_of_final_and_resumable() -> None:
    data = stream("resume", 300_000)
    whole = _native.cut_points(data, *SMALL, True)
    # Feed the data in uneven pieces, carrying the undecided tail, like chunks_of_fd.
    pieces = [1, 5000, 999, 1024, 1023, 40_000, 77, 100_000]
    found: list[int] = []
    base = 0
    pending = b""
    offset = 0
    for size in pieces:
        pending += data[offset : offset + size]
        offset += size
        cuts = _native.cut_points(pending, *SMALL, False)
        assert cuts == ref.cut_points(pending, *SMALL, False)
        found += [base + c for c in cuts]
        if cuts:
            base += cuts[-1]
            pending = pending[cuts[-1] :]
        assert len(pending) < SMALL[2]
    pending += data[offset:]
    found += [base + c for c in _native.cut_points(pending, *SMALL, True)]
    assert found == whole
    non_final = _native.cut_points(data, *SMALL, False)
    assert whole[: len(non_final)] == non_final


# --- (2) streaming -----------------------------------------------------------------------


@pytest.fixture(params=["native", "reference"])
def impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "reference":
        monkeypatch.setattr(chunker_mod, "_cut_points", ref.cut_points)
    return str(request.param)


def read_chunks(chunker: Chunker, path: Path, block: int) -> list[memoryview]:
    fd = os.open(path, os.O_RDONLY)
    try:
        return list(chunker.chunks_of_fd(fd, block))
    finally:
        os.close(fd)


@pytest.mark.parametrize("size", [0, 1, 63, 64, 65, 1023, 1024, 1025, 4096, 10_000, 123_457])
def test_chunks_of_fd_equals_chunks_of_bytes(impl: str, tmp_path: Path, size: int) -> None:
    chunker = Chunker(*SMALL)
    data = stream(f"file {size}", size)
    if size > 5000:
        data = data[:2000] + bytes(5000) + data[7000:]  # a zero run in the middle
    path = tmp_path / "file"
    path.write_bytes(data)
    expected = [bytes(c) for c in chunker.chunks_of_bytes(data)]
    assert b"".join(expected) == data
    if 0 < size <= SMALL[0]:
        assert expected == [data]
    if size == 0:
        assert expected == []
    for block in (1024, 1025, 2048, 3 * 1024 + 7, 65_536, DEFAULT_BLOCK):
        # Keep the views (no copy) until the end: they must stay valid.
        views = read_chunks(chunker, path, block)
        assert [bytes(v) for v in views] == expected, block
        assert all(v.readonly for v in views)


def test_chunks_of_fd_default_params(tmp_path: Path) -> None:
    chunker = Chunker()
    data = stream("default file", 9 * 1024 * 1024 + 12_345)
    path = tmp_path / "file"
    path.write_bytes(data)
    expected = [bytes(c) for c in chunker.chunks_of_bytes(data)]
    assert b"".join(expected) == data
    for block in (DEFAULT_MAX, DEFAULT_MAX + 1, 1_000_000, DEFAULT_BLOCK, 64 * 1024 * 1024):
        assert [bytes(v) for v in read_chunks(chunker, path, block)] == expected


def test_chunks_of_fd_starts_at_current_offset(tmp_path: Path) -> None:
    chunker = Chunker(*SMALL)
    data = stream("offset", 20_000)
    path = tmp_path / "file"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.lseek(fd, 5000, os.SEEK_SET)
        got = b"".join(chunker.chunks_of_fd(fd, 4096))
    finally:
        os.close(fd)
    assert got == data[5000:]


def test_chunks_of_fd_short_reads_from_pipe() -> None:
    chunker = Chunker(*SMALL)
    data = stream("pipe", 200_000)
    expected = [bytes(c) for c in chunker.chunks_of_bytes(data)]
    read_fd, write_fd = os.pipe()

    def writer() -> None:
        with os.fdopen(write_fd, "wb", buffering=0) as w:
            pos = 0
            step = 1
            while pos < len(data):
                pos += w.write(data[pos : pos + step])
                step = step * 3 % 5003 + 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        got = [bytes(c) for c in chunker.chunks_of_fd(read_fd, 1500)]
    finally:
        os.close(read_fd)  # first: a writer blocked on a full pipe then fails instead of hanging
        thread.join()
    assert got == expected


def test_chunks_of_fd_rejects_small_block(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_bytes(b"abc")
    with pytest.raises(ValueError, match="block"):
        read_chunks(Chunker(*SMALL), path, 1023)


def test_chunks_of_bytes_zero_copy_views() -> None:
    data = bytearray(stream("views", 10_000))
    chunks = list(Chunker(*SMALL).chunks_of_bytes(data))
    assert b"".join(chunks) == data
    assert all(c.readonly and c.obj is data for c in chunks)
    words = array.array("H", bytes(data))
    assert [bytes(c) for c in Chunker(*SMALL).chunks_of_bytes(words)] == [bytes(c) for c in chunks]


def test_chunker_attributes() -> None:
    chunker = Chunker()
    assert (chunker.min_size, chunker.avg_size, chunker.max_size) == (16384, 65536, 262144)
    assert repr(chunker) == "Chunker(16384, 65536, 262144)"
    assert chunker.cut_points(b"", True) == []


# --- (3) golden: boundaries must never change ---------------------------------------------

# The first 4 entries of the gear table (splitmix64 from 0x7370726974652d31).
GOLDEN_GEAR_HEAD = (
    0xCFFFF7F084FE2378,
    0x344566614E9D1C37,
    0x50121F72A95D845B,
    0x6866A7A118B224D7,
)
GOLDEN_GEAR_BLAKE3 = "e5a6f8db9d761acf7fac5778e9336b663b6fe1d5d58c5582032d1bf22bfaf6c6"
GOLDEN_INPUT_BLAKE3 = "e4d2ff0f18ed107267b52173856e41aea69c3fa9aa9a25b5a7adf798ef376d83"
# Chunk lengths of golden_input() with the default parameters: 114 chunks.
# fmt: off
GOLDEN_LENGTHS = [
    19532, 66134, 69625, 22918, 73596, 108888, 66692, 30986, 71896, 102365, 99415, 77635,
    69536, 72605, 95185, 85630, 97802, 88400, 49913, 86648, 93128, 88314, 122213, 72459,
    67028, 71278, 96410, 74021, 100053, 68393, 96643, 67325, 98459, 76000, 87573, 67867,
    93366, 77268, 67949, 73782, 21566, 78775, 44267, 93955, 99457, 95637, 82290, 68840,
    34330, 80334, 75072, 44659, 68399, 65746, 84589, 73611, 70896, 72600, 77396, 145729,
    71126, 85050, 26587, 65963, 70972, 72372, 69822, 28836, 75564, 91858, 81177, 82855,
    22150, 70053, 76946, 77451, 87934, 27638, 92470, 103228, 143737, 92068, 68404, 79277,
    79067, 76284, 83922, 69879, 82454, 75972, 46918, 81995, 81302, 37937, 30219, 74645,
    65424, 37128, 66934, 77139, 67088, 75942, 72275, 39037, 80133, 79320, 74058, 65645,
    72821, 21116, 103296, 85278, 86225, 42539,
]
# fmt: on


def golden_input() -> bytes:
    return blake3(b"sprite-env chunker golden v1").digest(length=8 * 1024 * 1024)


def test_golden_gear_table() -> None:
    table = _native.gear_table()
    assert table[:4] == GOLDEN_GEAR_HEAD
    packed = b"".join(x.to_bytes(8, "little") for x in table)
    assert blake3(packed).hexdigest() == GOLDEN_GEAR_BLAKE3


def test_golden_chunk_lengths() -> None:
    """If this fails, chunk boundaries changed: existing checkpoints would stop deduplicating.

    Never update these values; fix the chunker instead.
    """
    data = golden_input()
    assert blake3(data).hexdigest() == GOLDEN_INPUT_BLAKE3
    got = lengths(Chunker().cut_points(data, True))
    assert len(got) == len(GOLDEN_LENGTHS)
    assert got[:8] == GOLDEN_LENGTHS[:8]
    assert got == GOLDEN_LENGTHS


def test_golden_reference_prefix() -> None:
    """The Python reference agrees with the golden lengths on a prefix of the input."""
    data = golden_input()[: 3 * DEFAULT_MAX]
    got = lengths(ref.cut_points(data, DEFAULT_MIN, DEFAULT_AVG, DEFAULT_MAX, False))
    assert len(got) >= 3
    assert got == GOLDEN_LENGTHS[: len(got)]


# --- (4) boundary shift --------------------------------------------------------------------


def common_prefix(a: list[bytes], b: list[bytes]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize(("offset", "inserted"), [(0, b"x"), (1000, b"hello"), (70_000, b"\0" * 7)])
def test_insertion_changes_only_nearby_chunks(offset: int, inserted: bytes) -> None:
    chunker = Chunker()
    data = stream("shift", 4 * 1024 * 1024)
    edited = data[:offset] + inserted + data[offset:]
    before = [bytes(c) for c in chunker.chunks_of_bytes(data)]
    after = [bytes(c) for c in chunker.chunks_of_bytes(edited)]
    assert len(before) > 40
    head = common_prefix(before, after)
    tail = common_prefix(before[::-1], after[::-1])
    # Chunks wholly before the edit are untouched...
    assert sum(map(len, before[:head])) <= offset < sum(map(len, before[: head + 1]))
    # ...and all but one or two after it are the same bytes: same boundaries, shifted.
    assert len(before) - tail - head <= 2
    assert len(after) - tail - head <= 2


# --- (5) statistics ------------------------------------------------------------------------


def test_chunk_size_statistics() -> None:
    data = stream("statistics", 32 * 1024 * 1024)
    sizes = lengths(Chunker().cut_points(data, True))
    assert sum(sizes) == len(data)
    mean = len(data) / len(sizes)
    assert 0.5 * DEFAULT_AVG <= mean <= 1.5 * DEFAULT_AVG
    assert max(sizes) <= DEFAULT_MAX
    assert min(sizes[:-1]) > DEFAULT_MIN


# --- (6) the native scan releases the GIL ---------------------------------------------------


def counter_advances_during(call: Callable[[], object]) -> bool:
    """Tells whether another Python thread ran while ``call`` ran.

    With a huge switch interval the interpreter never forces the GIL away from the
    calling thread, so the ticking thread can only run while the GIL is released.
    """
    ticks = [0]
    stop = threading.Event()

    def ticker() -> None:
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.0005)  # releases the GIL, long enough for the caller to get it

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    thread = threading.Thread(target=ticker, daemon=True)
    try:
        thread.start()
        while ticks[0] < 3:
            time.sleep(0.001)
        before = ticks[0]
        call()
        after = ticks[0]
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(old_interval)
    return after > before


def test_native_scan_releases_the_gil() -> None:
    data = bytes(256 * 1024 * 1024)  # zeros: the slowest input, every byte is hashed

    def scan() -> None:
        _native.cut_points(data, DEFAULT_MIN, DEFAULT_AVG, DEFAULT_MAX, True)

    # A few attempts: the ticking thread only needs to be scheduled once in ~0.1 s.
    assert any(counter_advances_during(scan) for _ in range(5))


def test_gil_probe_detects_a_call_holding_the_gil() -> None:
    data = stream("hold", 40_000)
    assert not counter_advances_during(lambda: ref.cut_points(data, *SMALL, True))
