"""Content-defined chunking: splits byte streams into chunks at content-defined boundaries.

The chunker is FastCDC with normalized chunking (level 2); see ``native/README.md``.
Boundaries depend only on the bytes and the three size parameters, so an edit in a
file changes only the chunks around it and every other chunk deduplicates. They are
part of the storage format: ``tests/store/test_chunker.py`` pins them with a golden
test.

The scan runs in the C extension ``sprite_env._native`` (releasing the GIL) when it
is importable, else in the pure-Python reference ``_chunker_ref`` (same boundaries,
a few hundred times slower). ``NATIVE`` tells which one is in use.

Example::

    chunker = Chunker()
    with open(path, "rb", buffering=0) as f:
        for chunk in chunker.chunks_of_fd(f.fileno()):
            store(bytes(chunk))
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Final

from sprite_env.store import _chunker_ref

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from typing_extensions import Buffer

__all__ = [
    "DEFAULT_AVG",
    "DEFAULT_BLOCK",
    "DEFAULT_MAX",
    "DEFAULT_MIN",
    "NATIVE",
    "Chunker",
]

DEFAULT_MIN: Final = 16 * 1024
"""Default minimum chunk size: 16 KiB."""
DEFAULT_AVG: Final = 64 * 1024
"""Default average chunk size: 64 KiB."""
DEFAULT_MAX: Final = 256 * 1024
"""Default maximum chunk size: 256 KiB."""
DEFAULT_BLOCK: Final = 4 * 1024 * 1024
"""Default read size of ``Chunker.chunks_of_fd``: 4 MiB."""


def _load() -> tuple[Callable[[Buffer, int, int, int, bool], list[int]], bool]:
    try:
        from sprite_env import _native
    except ImportError:
        return _chunker_ref.cut_points, False
    return _native.cut_points, True


_cut_points, NATIVE = _load()
"""The scanning function in use, and whether it is the C extension."""


class Chunker:
    """Splits data into content-defined chunks with fixed size parameters.

    A chunker holds no state between calls; it is safe to share between threads.

    Attributes:
        min_size: Minimum chunk size in bytes (only the last chunk of a stream may
            be shorter).
        avg_size: Target average chunk size in bytes, a power of two.
        max_size: Maximum chunk size in bytes.
    """

    __slots__ = ("avg_size", "max_size", "min_size")

    def __init__(
        self, min_size: int = DEFAULT_MIN, avg_size: int = DEFAULT_AVG, max_size: int = DEFAULT_MAX
    ) -> None:
        """Initializes the chunker.

        Args:
            min_size: Minimum chunk size in bytes.
            avg_size: Target average chunk size in bytes, a power of two.
            max_size: Maximum chunk size in bytes.

        Raises:
            ValueError: Unless 0 <= min_size < avg_size < max_size and avg_size is a
                power of two between 2**3 and 2**62.
        """
        _chunker_ref.validate(min_size, avg_size, max_size)
        self.min_size: Final = min_size
        self.avg_size: Final = avg_size
        self.max_size: Final = max_size

    def __repr__(self) -> str:
        return f"Chunker({self.min_size}, {self.avg_size}, {self.max_size})"

    def cut_points(self, buf: Buffer, final: bool) -> list[int]:
        """Returns the end offsets of the complete chunks found in ``buf``.

        Args:
            buf: A C-contiguous buffer (bytes, bytearray, memoryview, mmap, ...).
            final: Whether ``buf`` ends the stream. If false, scanning stops as soon as
                fewer than ``max_size`` bytes remain, because a chunk there could still
                grow: the caller keeps ``buf[cuts[-1]:]`` (or all of ``buf`` if there is
                no cut), which is shorter than ``max_size``, and scans it again followed
                by more data. If true, the remaining bytes are the last chunk.

        Returns:
            Exclusive end offsets relative to the start of ``buf``, increasing: the
            first chunk is ``buf[0:cuts[0]]`` and chunk ``i`` is
            ``buf[cuts[i - 1]:cuts[i]]``. Empty for an empty ``buf``.
        """
        return _cut_points(buf, self.min_size, self.avg_size, self.max_size, final)

    def chunks_of_bytes(self, data: Buffer) -> Iterator[memoryview]:
        """Yields the chunks of an in-memory buffer, as zero-copy views.

        Args:
            data: The whole stream, a C-contiguous buffer.

        Yields:
            Read-only memoryviews into ``data``, in order; they concatenate to
            ``data``. They share its memory: if ``data`` is mutable, do not change it
            while the chunks are in use (or copy them with ``bytes(chunk)``).
        """
        view = memoryview(data).cast("B").toreadonly()
        start = 0
        for end in self.cut_points(view, True):
            yield view[start:end]
            start = end

    def chunks_of_fd(
        self, fd: int, block: int = DEFAULT_BLOCK, limit: int | None = None
    ) -> Iterator[memoryview]:
        """Reads a file descriptor to its end and yields its chunks, each exactly once.

        The data is read into a fresh buffer of ``block`` bytes plus the carried-over
        tail of the previous one (less than ``max_size`` bytes, the only copy made);
        buffers are never reused, so every yielded chunk stays valid after the
        generator advances. A chunk keeps its whole buffer alive until it is released:
        holding chunks pins up to ``block + max_size`` bytes each, so copy them with
        ``bytes(chunk)`` to keep them for long.

        Reads start at the descriptor's current offset and advance it; short reads
        (pipes, sockets) are handled. A stream shorter than ``min_size`` comes out as a
        single chunk; an empty stream yields nothing.

        Args:
            fd: A readable file descriptor, in blocking mode. Not closed.
            block: Bytes to read per buffer; at least ``max_size``.
            limit: Read at most this many bytes (the stream ends there). A known size also
                keeps buffers no bigger than the data: small files cost small buffers.

        Yields:
            Read-only memoryviews, in stream order; they concatenate to the stream.

        Raises:
            ValueError: If ``block`` is smaller than ``max_size``.
            OSError: If reading fails.
        """
        if block < self.max_size:
            raise ValueError(f"block ({block}) must be at least max_size ({self.max_size})")
        carry: memoryview | None = None
        left = limit if limit is not None else -1  # bytes still to read; -1: to EOF
        while True:
            carried = len(carry) if carry is not None else 0
            want = block if left < 0 else min(block, left)
            buf = bytearray(carried + want)
            filled = carried
            with memoryview(buf) as target:
                if carry is not None:
                    target[:carried] = carry
                    carry = None
                eof = False
                while filled < len(buf):
                    n = os.readv(fd, [target[filled:]])
                    if n == 0:
                        eof = True
                        break
                    filled += n
                if left >= 0:
                    left -= filled - carried
                    eof = eof or left == 0
            data = memoryview(buf).toreadonly()[:filled]
            start = 0
            for end in self.cut_points(data, eof):
                yield data[start:end]
                start = end
            if eof:
                return
            carry = data[start:]
