"""A file's content as a list of chunk references.

The file is cut by the content-defined chunker; each chunk is stored as a DATA object,
except chunks of all zero bytes, which become holes (``ChunkRef.oid is None``): they cost
nothing in the store and are written back as holes, so sparse files stay sparse.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sprite_env.store import ObjectKind, Store, StoreWriter

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sprite_env.ids import ObjectId
    from sprite_env.store.chunker import Chunker

_ZEROS = bytes(1 << 20)


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """One piece of a file: an object, or ``length`` zero bytes when ``oid`` is None."""

    oid: ObjectId | None
    length: int


def is_zero(data: bytes | memoryview) -> bool:
    """True if every byte is zero (memcmp against a zero buffer, no allocation)."""
    n = len(data)
    if n <= len(_ZEROS):
        return data == memoryview(_ZEROS)[:n]
    return all(is_zero(memoryview(data)[i : i + len(_ZEROS)]) for i in range(0, n, len(_ZEROS)))


def store_fd(fd: int, writer: StoreWriter, chunker: Chunker) -> list[ChunkRef]:
    """Chunks the file open at ``fd`` (from its current offset) into ``writer``."""
    refs: list[ChunkRef] = []
    for chunk in chunker.chunks_of_fd(fd):
        if is_zero(chunk):
            refs.append(ChunkRef(None, len(chunk)))
        else:
            refs.append(ChunkRef(writer.put(bytes(chunk), ObjectKind.DATA), len(chunk)))
    return refs


def store_file(path: str | bytes, writer: StoreWriter, chunker: Chunker) -> list[ChunkRef]:
    """Like :func:`store_fd` for a path (never follows a final symlink)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return store_fd(fd, writer, chunker)
    finally:
        os.close(fd)


def read_chunks(store: Store, refs: list[ChunkRef]) -> Iterator[bytes]:
    """Yields a file's content chunk by chunk (holes as zero bytes)."""
    for ref in refs:
        yield bytes(ref.length) if ref.oid is None else store.read(ref.oid)
