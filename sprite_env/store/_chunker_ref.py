"""Pure-Python reference of the FastCDC chunker in ``native/fastcdc.c``.

This module is the test oracle for the C kernel and the fallback when the
``sprite_env._native`` extension is not built. It implements exactly the same
algorithm, bit for bit, and is a few hundred times slower: use it on small
inputs only.

The algorithm (FastCDC with normalized chunking, level 2):

* A chunk is never shorter than ``min_size + 1`` bytes unless the data ends,
  and never longer than ``max_size``.
* From byte ``min_size`` of the chunk on, a gear hash is rolled:
  ``hash = (hash << 1) + GEAR[byte]`` modulo 2**64, starting from 0.
* The chunk ends right after the first byte at which ``hash & mask == 0``,
  where ``mask`` is the strict mask (``log2(avg_size) + 2`` high bits) for
  bytes before offset ``avg_size`` and the loose mask (``log2(avg_size) - 2``
  high bits) from there on.
* The masks take the most significant bits because, with a left-shifting gear
  hash, bit ``j`` only depends on the last ``j + 1`` bytes: only the high bits
  depend on the whole 64-byte window.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterator

    from typing_extensions import Buffer

__all__ = [
    "GEAR",
    "GEAR_SEED",
    "cut",
    "cut_points",
    "gear_table",
    "splitmix64",
    "validate",
]

_MASK64: Final = (1 << 64) - 1

GEAR_SEED: Final = 0x7370726974652D31
"""Seed of the splitmix64 stream of the gear table: the ASCII bytes ``sprite-1``."""

MIN_AVG_BITS: Final = 3
MAX_AVG_BITS: Final = 62


def splitmix64(seed: int) -> Iterator[int]:
    """Yields the successive outputs of Vigna's splitmix64 generator.

    Args:
        seed: The initial 64-bit state.

    Yields:
        64-bit unsigned integers, forever.
    """
    state = seed & _MASK64
    while True:
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        yield z ^ (z >> 31)


def gear_table() -> tuple[int, ...]:
    """Returns the 256-entry gear table: the first 256 splitmix64 outputs from GEAR_SEED.

    Returns:
        A tuple of 256 unsigned 64-bit integers, equal to the C kernel's table.
    """
    gen = splitmix64(GEAR_SEED)
    return tuple(next(gen) for _ in range(256))


GEAR: Final = gear_table()


def validate(min_size: int, avg_size: int, max_size: int) -> None:
    """Checks chunking parameters, like ``fastcdc_validate`` in C.

    Args:
        min_size: Minimum chunk size in bytes.
        avg_size: Target average chunk size in bytes, a power of two.
        max_size: Maximum chunk size in bytes.

    Raises:
        ValueError: If the sizes are out of order, negative, or avg_size is not a
            power of two between 2**3 and 2**62.
    """
    if min(min_size, avg_size, max_size) < 0:
        raise ValueError("chunk sizes must not be negative")
    if not min_size < avg_size < max_size:
        raise ValueError("chunk sizes must satisfy 0 <= min_size < avg_size < max_size")
    bits = avg_size.bit_length() - 1
    if avg_size & (avg_size - 1) or not MIN_AVG_BITS <= bits <= MAX_AVG_BITS:
        raise ValueError("avg_size must be a power of two between 2**3 and 2**62")


def _high_mask(k: int) -> int:
    return (_MASK64 << (64 - k)) & _MASK64


def cut(data: bytes, start: int, end: int, min_size: int, avg_size: int, max_size: int) -> int:
    """Returns the length of the next chunk of ``data[start:end]``, like ``fastcdc_cut``.

    Args:
        data: The bytes to scan.
        start: Offset of the first byte of the chunk.
        end: Offset just past the last available byte.
        min_size: Minimum chunk size (validated by the caller).
        avg_size: Average chunk size, a power of two (validated by the caller).
        max_size: Maximum chunk size (validated by the caller).

    Returns:
        ``end - start`` if that is at most ``min_size``; otherwise the chunk length,
        at most ``min(end - start, max_size)``.
    """
    n = min(end - start, max_size)
    if n <= min_size:
        return n
    bits = avg_size.bit_length() - 1
    mask_s = _high_mask(bits + 2)
    mask_l = _high_mask(bits - 2)
    normal = min(avg_size, n)
    gear = GEAR
    h = 0
    for i in range(start + min_size, start + normal):
        h = ((h << 1) + gear[data[i]]) & _MASK64
        if not h & mask_s:
            return i - start + 1
    for i in range(start + normal, start + n):
        h = ((h << 1) + gear[data[i]]) & _MASK64
        if not h & mask_l:
            return i - start + 1
    return n


def cut_points(
    buf: Buffer, /, min_size: int, avg_size: int, max_size: int, final: bool
) -> list[int]:
    """Returns the end offsets of the complete chunks in ``buf``, like the C binding.

    Args:
        buf: Any C-contiguous buffer; its bytes are scanned.
        min_size: Minimum chunk size in bytes.
        avg_size: Average chunk size in bytes, a power of two.
        max_size: Maximum chunk size in bytes.
        final: Whether ``buf`` ends the stream. If false, scanning stops once fewer
            than ``max_size`` bytes remain (that tail may still grow); if true, the
            remaining bytes form the last chunk.

    Returns:
        Exclusive end offsets relative to the start of ``buf``, increasing.

    Raises:
        ValueError: If the sizes are invalid (see ``validate``).
    """
    validate(min_size, avg_size, max_size)
    with memoryview(buf) as view:
        data = view.tobytes()
    length = len(data)
    pos = 0
    cuts: list[int] = []
    while pos < length:
        if not final and length - pos < max_size:
            break
        pos += cut(data, pos, length, min_size, avg_size, max_size)
        cuts.append(pos)
    return cuts
