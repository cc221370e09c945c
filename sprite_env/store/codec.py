"""Object ids and compression: BLAKE3-256 of the raw bytes, zstd per object.

An object is stored compressed only when zstd saves at least 3% (``MIN_SAVING``):
already-compressed data (tarballs, wheels, JPEGs) is stored raw, so reading it back costs
a copy and no decompression. Both libraries release the GIL on large buffers, so callers
may run these functions in worker threads and keep both cores busy.
"""

from __future__ import annotations

import threading
from enum import IntEnum

import blake3
import zstandard

from sprite_env.ids import ObjectId

ZSTD_LEVEL = 3
#: Store raw when compression saves less than this fraction.
MIN_SAVING = 0.03


class Codec(IntEnum):
    """How an object's payload is encoded in its pack (one byte on disk)."""

    RAW = 0
    ZSTD = 1


_local = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    # ZstdCompressor objects are not thread-safe; one per thread reuses its context.
    c: zstandard.ZstdCompressor | None = getattr(_local, "cctx", None)
    if c is None:
        c = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True)
        _local.cctx = c
    return c


def _decompressor() -> zstandard.ZstdDecompressor:
    d: zstandard.ZstdDecompressor | None = getattr(_local, "dctx", None)
    if d is None:
        d = zstandard.ZstdDecompressor()
        _local.dctx = d
    return d


def object_id(data: bytes | memoryview) -> ObjectId:
    """Returns the BLAKE3-256 id of ``data``."""
    return ObjectId(blake3.blake3(data).digest())


def encode(data: bytes | memoryview) -> tuple[Codec, bytes]:
    """Compresses ``data`` unless that saves under ``MIN_SAVING``.

    Returns:
        The codec used and the payload to store.
    """
    n = len(data)
    if n < 64:  # zstd's frame overhead eats any gain on tiny objects
        return Codec.RAW, bytes(data)
    packed = _compressor().compress(data)
    if len(packed) <= n * (1 - MIN_SAVING):
        return Codec.ZSTD, packed
    return Codec.RAW, bytes(data)


def decode(codec: int, payload: bytes | memoryview, raw_len: int) -> bytes:
    """Inverts :func:`encode`.

    Raises:
        ValueError: unknown codec, undecodable payload or wrong length.
    """
    if codec == Codec.RAW:
        out = bytes(payload)
    elif codec == Codec.ZSTD:
        try:
            out = _decompressor().decompress(payload, max_output_size=raw_len)
        except zstandard.ZstdError as e:
            raise ValueError(f"zstd: {e}") from None
    else:
        raise ValueError(f"unknown codec {codec}")
    if len(out) != raw_len:
        raise ValueError(f"decoded {len(out)} bytes, expected {raw_len}")
    return out
