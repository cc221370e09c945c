"""Typed stub of the C extension ``sprite_env._native`` (see native/_native.c)."""

from typing import Final

from typing_extensions import Buffer

GEAR_SEED: Final[int]

def cut_points(
    buf: Buffer, /, min_size: int, avg_size: int, max_size: int, final: bool
) -> list[int]:
    """Returns the exclusive end offsets of the complete chunks found in ``buf``.

    The GIL is released during the scan. If ``final`` is false, scanning stops once
    fewer than ``max_size`` bytes remain; if true, the remainder is the last chunk.

    Raises:
        ValueError: Unless 0 <= min_size < avg_size < max_size and avg_size is a
            power of two between 2**3 and 2**62.
    """

def gear_table() -> tuple[int, ...]:
    """Returns the kernel's 256-entry gear table."""

def scan_dir(
    fd: int, now_ns: int, racy_ns: int, root_dev: int, /
) -> tuple[bytes, list[bytes], int, int, int, int, bool]:
    """Lists and stats the children of the directory open at ``fd`` (GIL released).

    Returns the signature blob (``dircache.encode_sigs`` format), the subdirectory names,
    the counts of files, their bytes, symlinks and other entries, and whether a socket, a
    mount point or a hard link calls for the slow path.

    Raises:
        OSError: listing or a stat failed (a vanished child is skipped).
    """
