"""Object ids and compression: BLAKE3-256 of the raw bytes, zstd per object.

An object is stored compressed only when zstd saves at least 3% (``MIN_SAVING``):
already-compressed data (tarballs, wheels, JPEGs) is stored raw, so reading it back costs
a copy and no decompression. Both libraries release the GIL on large buffers, so callers
may run these functions in worker threads and keep both cores busy.
"""

from __future__ import annotations

import threading
from enum import IntEnum
from typing import TYPE_CHECKING

import blake3
import zstandard

from sprite_env.ids import ObjectId

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

_b3: Callable[[bytes | memoryview], bytes] | None
try:
    from sprite_env._native import blake3_256 as _b3
except ImportError:
    _b3 = None

ZSTD_LEVEL = 3
#: Objects shorter than this are stored raw: zstd's frame overhead eats any gain.
TINY = 64
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
    """Returns the BLAKE3-256 id of ``data``.

    The extension's ``blake3_256`` where it is built: it keeps the GIL for inputs up to 16
    KiB, where the ``blake3`` package lets go of it, and taking it back beside a busy
    Python thread cost more than the hash (the trees of a step's dirty directories are
    hashed on the capture's walk thread: ``object_id`` was the top of its samples in the
    medium undo's check, py-spy).
    """
    return ObjectId(_b3(data) if _b3 is not None else blake3.blake3(data).digest())


def encode(data: bytes | memoryview) -> tuple[Codec, bytes]:
    """Compresses ``data`` unless that saves under ``MIN_SAVING``.

    Returns:
        The codec used and the payload to store.
    """
    n = len(data)
    if n < TINY:
        return Codec.RAW, bytes(data)
    return _pick(data, _compressor().compress(data))


def encode_many(datas: Sequence[bytes]) -> list[tuple[Codec, bytes]]:
    """:func:`encode` of each of ``datas``, the same bytes, compressed in one call.

    zstandard's ``multi_compress_to_buffer`` releases the GIL once for the whole batch
    (``threads=0``: on the calling thread; the store's encoders are the parallelism), where
    one ``compress`` per object takes the GIL back beside the capture's thread after each:
    for the writer's batches of 64 objects this made the medium layer's step checkpoint
    0.80-0.85x (bench_capture_step, 3 rounds, load 1.5).
    """
    sized: list[bytes | bytearray | memoryview] = [d for d in datas if len(d) >= TINY]
    packed = iter(_compressor().multi_compress_to_buffer(sized, threads=0) if sized else ())
    return [
        (Codec.RAW, bytes(d)) if len(d) < TINY else _pick(d, next(packed).tobytes()) for d in datas
    ]


def _pick(data: bytes | memoryview, packed: bytes) -> tuple[Codec, bytes]:
    if len(packed) <= len(data) * (1 - MIN_SAVING):
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
