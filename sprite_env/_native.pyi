"""Typed stub of the C extension ``sprite_env._native`` (see native/_native.c)."""

from collections.abc import Sequence
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

def scan_tree(
    fd: int,
    now_ns: int,
    racy_ns: int,
    root_dev: int,
    rows: dict[bytes, bytes],
    exclude_inodes: Sequence[tuple[int, int]],
    patterns: Sequence[bytes],
    threads: int,
    /,
) -> tuple[list[bytes], dict[bytes, tuple[int, int, int, int, int]]]:
    """Walks the whole tree below ``fd`` on ``threads`` threads (GIL released), comparing
    each directory's ``scan_dir`` blob with ``rows[path]`` (``b""`` the root).

    Mount points, excluded inodes ``(st_dev, st_ino)`` and paths matching a pattern
    without ``[`` (``fnmatchcase`` over the relative path) are not descended into.

    Returns:
        The directories that differ from their row or cannot be vouched for (no row, a
        socket, a mount point, a hard link, a racy or excluded child, an error), and for
        every directory with none of those at or below it, its subtree's counts (files,
        dirs, symlinks, specials, bytes of files).

    Raises:
        OSError: the root could not be read (any other problem makes a directory dirty).
        TypeError: rows not bytes to bytes, a pattern not bytes.
    """

def sig_diff(new_blob: Buffer, old_blob: Buffer, /) -> tuple[list[bytes], list[bytes]]:
    """The names of ``new_blob`` whose signature row differs from ``old_blob``'s (or is
    poisoned, or new), and the names only in ``old_blob``; both sorted (treesplice.c).

    Raises:
        ValueError: a malformed blob.
    """

def tree_splice(old_tree: Buffer, blob: Buffer, added: list[bytes], /) -> bytes:
    """The tree naming exactly the children of the signature ``blob``: the entry of
    ``added`` (encoded, sorted by name) where there is one, else ``old_tree``'s, copied.

    Raises:
        ValueError: ``old_tree`` is malformed or lacks an unchanged child, or ``added``
            names a child the blob does not (or is out of order).
    """

def tree_find(tree: Buffer, name: Buffer, /) -> bytes | None:
    """The encoded entry called ``name`` in ``tree``, or None.

    Raises:
        ValueError: a malformed tree.
    """
