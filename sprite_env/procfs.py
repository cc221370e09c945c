"""Reading files of ``/proc``, which the kernel makes up as they are read."""

from __future__ import annotations

import os


def read(path: str | bytes) -> bytes:
    """The file whole, ``b""`` if it cannot be read (the process exited, or is not ours
    to look at). Raw reads: a buffered ``open`` costs twice as much for a short file
    (a process's ``maps``: 70 processes read in 1.2 ms against 2.6)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    chunks = []
    try:
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    except OSError:
        return b""
    finally:
        os.close(fd)
    return b"".join(chunks)
