"""Typed stub of the C extension ``sprite_env._native`` (see native/_native.c)."""

import os
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

def blake3_256(data: Buffer, /) -> bytes:
    """``blake3.blake3(data).digest()``; the GIL is kept for up to 16 KiB."""

def gear_table() -> tuple[int, ...]:
    """Returns the kernel's 256-entry gear table."""

def page_sums(buf: Buffer, start: int, key: Buffer, /) -> bytes:
    """The digests of the windows of ``buf``, a file's bytes from offset ``start``: 16
    bytes of keyed BLAKE3 (``key``: 32 bytes) per window, the windows cut at every
    multiple of 4096 of the file's offsets (``snapshot/pagesums.py``). GIL released.

    Raises:
        ValueError: the key is not 32 bytes.
    """

def page_sums_fd(fd: int, ranges: Buffer, key: Buffer, threads: int, /) -> bytes:
    """``page_sums`` of each range of the file open at ``fd``, concatenated: ``ranges`` is
    native u64 ``(start, length)`` pairs (``array('Q')``), read with ``pread`` and hashed
    on up to ``threads`` threads, the GIL released.

    Raises:
        OSError: a read failed; ``ENODATA`` if the file ended before a range did.
        ValueError: a bad key, ranges or thread count.
    """

def page_sums_compare(
    fd: int, ranges: Buffer, key: Buffer, expected: Buffer, threads: int, /
) -> tuple[bytes, list[tuple[int, int, bytes]]]:
    """``page_sums_fd``, compared with the digests ``expected`` (as many): returns the
    digests and the maximal runs of changed windows within one range, each ``(range index,
    file offset, the bytes those windows were hashed from)``.

    Raises:
        OSError: as ``page_sums_fd``.
        ValueError: as ``page_sums_fd``, or ``expected`` of another length.
    """

def page_sums_diff(a: Buffer, b: Buffer, /) -> list[int]:
    """The indices of the 16-byte digests that differ between ``a`` and ``b``.

    Raises:
        ValueError: unequal lengths, or not a multiple of 16.
    """

def scan_dir(
    fd: int, now_ns: int, racy_ns: int, root_dev: int, /
) -> tuple[bytes, list[bytes], int, int, int, int, bool]:
    """Lists and stats the children of the directory open at ``fd`` (GIL released past
    256 entries: below, taking it back would cost more than the scan).

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

def scan_listing(
    fd: int,
    root_dev: int,
    exclude_inodes: Sequence[tuple[int, int]],
    patterns: Sequence[bytes],
    threads: int,
    /,
) -> dict[bytes, list[tuple[bytes, os.stat_result]]]:
    """Walks the whole tree below ``fd`` as :func:`scan_tree` does (the same subtrees left
    out), GIL released, and returns every directory's children with their lstat, sorted by
    name, by path (``b""`` the root). Excluded children, sockets and mount points are in
    it; a directory that could not be listed, or with a child that could not be stat'ed
    (other than vanished), is not.

    Raises:
        OSError: the root could not be read.
        TypeError: a pattern not bytes.
    """

def sig_diff(new_blob: Buffer, old_blob: Buffer, /) -> tuple[list[bytes], list[bytes]]:
    """The names of ``new_blob`` whose signature row differs from ``old_blob``'s (or is
    poisoned, or new), and the names only in ``old_blob``; both sorted (treesplice.c).

    Raises:
        ValueError: a malformed blob.
    """

def sig_splice(old_blob: Buffer, patch: Buffer, gone: list[bytes], /) -> bytes:
    """``old_blob`` with each row of ``patch`` (signature rows, sorted) in place of its row of
    that name or added, and the rows named in ``gone`` (sorted) left out (treesplice.c): the
    row of a directory of which only some children were stat'ed.

    Raises:
        ValueError: a malformed blob, or ``patch`` or ``gone`` out of order or naming one
            child in both.
    """

def tree_counts(tree: Buffer, /) -> tuple[int, int, int, int, list[bytes]]:
    """What a tree object holds directly (treesplice.c): its regular files, their bytes, its
    symlinks, its other non-directories, and its subdirectories' names, in order.

    Raises:
        ValueError: a malformed tree.
    """

def tree_spans(tree: Buffer, /) -> dict[bytes, bytes]:
    """A tree object's entries by name, each left encoded (``tree.entry_spans``, in C).

    Raises:
        ValueError: a malformed tree (bad magic, truncated, trailing bytes).
    """

def tree_splice(old_tree: Buffer, blob: Buffer, added: list[bytes], /) -> bytes:
    """The tree naming exactly the children of the signature ``blob``: the entry of
    ``added`` (encoded, sorted by name) where there is one, else ``old_tree``'s, copied.

    Raises:
        ValueError: ``old_tree`` is malformed or lacks an unchanged child, or ``added``
            names a child the blob does not (or is out of order).
    """

def touch_captured(
    dirfd: int, items: list[tuple[bytes, int, int, int, int, int, int, int]], /
) -> list[int]:
    """Sets back the mtime of files whose only change is their mtime: each of ``items``,
    ``(name, st_mode, uid, gid, nlink, mtime_ns, size, new_mtime_ns)``, is opened in the
    directory open at ``dirfd`` (``O_RDONLY | O_NONBLOCK | O_NOFOLLOW``) and, if its
    ``fstat`` shows exactly that ``st_mode`` (type and permission bits), owner, group, link
    count, mtime and size, gets atime and mtime ``new_mtime_ns`` through that descriptor.
    The GIL is released for the whole batch (filewrite_py.c).

    Returns:
        The indices of the items left as they were (another inode, or an error).

    Raises:
        ValueError: a name that is not bytes without NUL or slash.
    """

def write_files(
    files: list[tuple[int, bytes, int, int, int, int, bytes]],
    objects: dict[bytes, bytes],
    /,
    *,
    owner: tuple[int, int] | None = None,
    umask: int = -1,
    xattrs: bool = True,
) -> list[int]:
    """Creates and writes each file of ``files``, ``(dirfd, name, mode, uid, gid, mtime_ns,
    chunks)``: ``chunks`` a chunk list as tree objects encode it, the pieces' bytes taken
    from ``objects`` (an all-zero id is a hole, never written); owner, mode and times set
    (``O_CREAT | O_EXCL | O_NOFOLLOW``, big files without holes preallocated). The GIL is
    released while the files are written, in order (filewrite.c).

    Steps known to be no-ops are skipped: ``owner`` is the ``(uid, gid)`` a new file gets
    here (no ``fchown`` for a file of that owner; None: always), ``umask`` the process's (a
    file whose mode is plain permission bits the umask keeps is created with it, no
    ``fchmod``; -1: always), ``xattrs`` false when no directory here hands down extended
    attributes (no ``flistxattr``; nothing is then returned).

    Returns:
        The indices of the files created with extended attributes (inherited: the caller
        makes them exact).

    Raises:
        OSError: the first file that failed (with its name; it is removed, and nothing
            after it is written).
        ValueError: a malformed chunk list, an object not given or shorter than its piece,
            a name with a slash.
    """

def tree_find(tree: Buffer, name: Buffer, /) -> bytes | None:
    """The encoded entry called ``name`` in ``tree``, or None.

    Raises:
        ValueError: a malformed tree.
    """

def tree_find_many(tree: Buffer, names: list[bytes], /) -> list[bytes | None]:
    """:func:`tree_find` of each of ``names`` (any order, repeats allowed), in one pass
    over the tree.

    Raises:
        ValueError: a malformed tree.
        TypeError: a name that is not bytes.
    """

def open_at(dirfd: int, name: bytes, flags: int, /) -> int:
    """``os.open(name, flags, dir_fd=dirfd)`` (``O_CLOEXEC`` added; no ``O_CREAT``) with the
    GIL kept.

    Raises:
        OSError: as ``os.open``, with the name.
        ValueError: a name with a NUL, or ``O_CREAT`` / ``O_TMPFILE`` in ``flags``.
    """

def set_mtime(fd: int, ns: int, /) -> None:
    """``os.utime(fd, ns=(ns, ns))`` with the GIL kept.

    Raises:
        OSError: as ``os.utime``.
    """

def handle_at(path: bytes, /) -> bytes:
    """The file handle of what ``path`` names (``name_to_handle_at``, not following a last
    symlink) as fanotify reports one: ``handle_type`` (int32) then ``f_handle``.

    Raises:
        OSError: as ``os.lstat`` would, with the path (and EOPNOTSUPP, EOVERFLOW).
        ValueError: a path with a NUL.
    """

def close_fd(fd: int, /) -> None:
    """``os.close(fd)`` with the GIL kept (for a descriptor whose close cannot wait).

    Raises:
        OSError: as ``os.close``.
    """

def lstat_names(dirfd: int, names: list[bytes], /) -> list[tuple[int, ...] | None]:
    """The 19 ``os.stat_result`` fields of each of ``names`` in the directory open at
    ``dirfd`` (symlinks not followed), None for a name that does not exist; the GIL is kept
    for up to 256 names.

    Raises:
        OSError: any other error (with the name).
        ValueError: a name with a NUL byte.
    """

def read_start(
    dirfd: int,
    names: list[bytes],
    limit: int,
    min_size: int,
    avg_size: int,
    max_size: int,
    threads: int,
    lazy: bool = False,
    /,
) -> object:
    """Starts reading, chunking and hashing the files ``names`` of the directory open at
    ``dirfd`` (the batch duplicates it) on up to ``threads`` threads of a pool, which
    never take the GIL, and returns the batch at once, for :func:`read_finish`
    (bulkread.c). The caller keeps the GIL meanwhile. ``lazy``: a pool thread is woken
    only if none is awake, and the pool wakes the rest itself (for many batches started
    in a row and waited for later: each wake costs the caller a futex call).

    Raises:
        ValueError: bad chunking parameters, or a name that is not bytes without NUL.
        OSError: the batch could not be started.
    """

def read_finish(
    batch: object, /
) -> list[tuple[tuple[int, ...], bytes, list[int], bytes, int] | None]:
    """Waits (GIL released, unless it is done already) for a batch of :func:`read_start`.
    Per file: None when it is not plain (not a regular file of one link and at most
    ``limit`` bytes, holes, changed while read, any error), else the 19 fields of its
    ``os.stat_result`` after the read, its bytes, the chunks' exclusive ends, their
    BLAKE3-256 ids (32 bytes each, concatenated), and its descriptor if it may have xattrs
    (the caller reads and closes it), else -1.

    Raises:
        ValueError: the batch was finished already.
    """

def read_files(
    dirfd: int,
    names: list[bytes],
    limit: int,
    min_size: int,
    avg_size: int,
    max_size: int,
    threads: int,
    /,
) -> list[tuple[tuple[int, ...], bytes, list[int], bytes, int] | None]:
    """``read_finish(read_start(...))``: the same results, waited for."""
