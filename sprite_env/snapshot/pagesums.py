"""Page digests of big files: what a change in place touched, without the old bytes.

A big file changed in place (a database: issue 11, point 5) is compared with its previous
version in windows: its previous pieces (``tree.Piece``) cut at every multiple of ``PAGE``
of the file's offsets. Without digests that means reading the previous version's objects
back from the store. With them the file is read once, its windows hashed in C on both
cores (``native/pagesum.c``, GIL released), and each digest compared with the one the
previous capture recorded: an equal window stays a slice of the old object, unread.

A vector (:class:`PageSums`) holds one digest per window of the data pieces of one chunk
list, in order (holes have none), with the key it was made with. It describes that chunk
list's bytes and nothing else, so it is used only for a file whose previous entry has that
exact chunk list (``pieces``: the BLAKE3 id of the encoded list, which is the chunk list
object's id when the list is stored apart); the path is only where to look for it. It is a
hint: a vector that is missing, of another chunk list, of the wrong length or failing its
checksum is not used, and the capture compares against the store as it did before and
builds a new one. The capture makes every digest from the very bytes it stores or keeps (a
kept window keeps its old digest, which its old bytes had), so a vector always describes
its chunk list, even for a file that changed while it was read.

Why 16 bytes of keyed BLAKE3 is safe: an equal digest keeps the old bytes, so a collision
would silently keep stale data. The key is 32 random bytes drawn for each file's first
vector (kept as long as the file is changed in place), stored in the root-only catalog
and never shown: whoever writes the file does not know it, and for them keyed BLAKE3 is a
pseudorandom function, so two different windows collide with probability 2^-128 whatever
their content. A birthday search needs the key. At 53k windows a capture, a collision
anywhere within 2^40 such captures has a chance below 2^-72. (Unkeyed, 16 bytes would
allow a 2^64 birthday search by content alone.) 16 bytes, not 32, halve what each
checkpoint writes: 850 KB for the 215 MB database of the benchmark.

Table ``pagesums`` (catalog schema 5; created by ``store/catalog.py``, read and written
only here), up to two rows per big file last captured with a vector::

    pagesums(path BLOB PRIMARY KEY, pieces BLOB, key BLOB, sums BLOB, sum BLOB)

``path`` relative to the root for the newest vector, and the same followed by a NUL byte
(which no path holds) for the one before it: the vector the newest was compared against,
that of the file's previous version. That one is what a change made after undoing a step
needs (restore the previous checkpoint, change the file again): the restore brings back
the previous chunk list, which the newest vector does not describe, and without the
previous vector the next capture compared the 215 MB database of the benchmark against
the store (1.3-1.9 s instead of 0.2-0.5 s under load 6-9). ``pieces`` the 32-byte id of
the chunk list the vector describes; ``key`` 32 bytes; ``sums`` ``SUM_LEN`` bytes per
window; ``sum`` the first 16 bytes of BLAKE3 of ``len(path):u32 path pieces key sums``.
SQLite proves its pages sound, not a value's bytes: a flipped byte in ``key`` would make
every window look changed and store the whole file again, one in ``sums`` would cost one
window. A row whose ``sum`` fails is dropped when read (the capture then compares
against the store and writes a good one). Cost: one query and 0.3 ms of checking for the
benchmark's database; saving reads the newest row back only when the capture did not
compare against it.
"""

from __future__ import annotations

import logging
import os
import struct
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import blake3

from sprite_env.errors import SpriteError

if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Iterable, Mapping, Sequence

    from typing_extensions import Buffer

    from sprite_env.snapshot.dircache import CachedDir
    from sprite_env.snapshot.tree import Piece
    from sprite_env.store.catalog import Catalog

log = logging.getLogger(__name__)

PAGE = 4096
SUM_LEN = 16
KEY_LEN = 32
#: Threads hashing one file (the machine's two cores; more only queue behind them).
THREADS = 2
#: The catalog schema that has the table (a read-only open of an older catalog lacks it).
SCHEMA = 5
_HEAD = struct.Struct("<I")

try:
    from sprite_env._native import page_sums, page_sums_compare, page_sums_diff, page_sums_fd

    NATIVE = True
except ImportError:  # not built: captures compare against the store, as without vectors
    NATIVE = False


@dataclass(frozen=True, slots=True)
class PageSums:
    """The digests of one chunk list's windows (see the module docstring).

    ``base``: for a vector a capture made, the vector it compared the file against (that
    of its previous version), kept beside it by :func:`save`; not part of the value.
    """

    key: bytes
    pieces: bytes
    sums: bytes
    base: PageSums | None = field(default=None, compare=False, repr=False)


def _previous(path: bytes) -> bytes:
    """The key of the row holding the vector before the newest one of ``path``."""
    return path + b"\0"


def new_key() -> bytes:
    """A fresh random key for a file's first vector."""
    return os.urandom(KEY_LEN)


def windows(pos: int, n: int) -> int:
    """How many windows ``[pos, pos + n)`` of a file has (cut at multiples of ``PAGE``)."""
    return 0 if n <= 0 else (pos + n - 1) // PAGE - pos // PAGE + 1


def window_count(pieces: Iterable[Piece]) -> int:
    """The windows of a chunk list's data pieces (the length of its vector, in digests)."""
    total = pos = 0
    for oid, _, n in pieces:
        if oid is not None:
            total += windows(pos, n)
        pos += n
    return total


def window_bounds(pos: int, n: int, j: int) -> tuple[int, int]:
    """The file offsets ``[start, end)`` of window ``j`` of ``[pos, pos + n)``."""
    first = pos // PAGE
    start = pos if j == 0 else (first + j) * PAGE
    return start, min(pos + n, (first + j + 1) * PAGE)


def digests_ref(buf: Buffer, start: int, key: bytes) -> bytes:
    """The reference: the digests of ``buf``'s windows, ``buf`` holding a file's bytes
    from offset ``start``, with the Python blake3 (the oracle of the C kernel)."""
    view = memoryview(buf).cast("B")
    out = []
    pos, end = start, start + len(view)
    while pos < end:
        e = min(end, (pos // PAGE + 1) * PAGE)
        out.append(blake3.blake3(view[pos - start : e - start], key=key).digest(SUM_LEN))
        pos = e
    return b"".join(out)


def digests(buf: Buffer, start: int, key: bytes) -> bytes:
    """:func:`digests_ref`, in C when built (GIL released)."""
    if NATIVE:
        return page_sums(buf, start, key)
    return digests_ref(buf, start, key)


def digests_of_fd(fd: int, ranges: Sequence[tuple[int, int]], key: bytes) -> bytes:
    """The digests of the windows of ``ranges`` (``(start, length)``) of the file open at
    ``fd``, range after range, read with ``pread`` and hashed on ``THREADS`` threads.

    Raises:
        OSError: a read failed; ``ENODATA`` if the file ended before a range did.
    """
    if NATIVE:
        flat = array("Q")
        for start, n in ranges:
            flat.append(start)
            flat.append(n)
        return page_sums_fd(fd, flat, key, THREADS)
    out = []
    for start, n in ranges:
        data = os.pread(fd, n, start)
        if len(data) != n:
            raise OSError(61, "file shorter than expected")  # ENODATA
        out.append(digests_ref(data, start, key))
    return b"".join(out)


def compare_fd(
    fd: int, ranges: array[int], key: bytes, expected: bytes
) -> tuple[bytes, list[tuple[int, int, bytes]]]:
    """The digests of the windows of ``ranges`` (flat ``start, length`` pairs) of the file
    open at ``fd``, compared with ``expected`` (as many), on ``THREADS`` threads.

    Returns:
        The digests, and the runs of changed windows, each within one range: ``(range
        index, file offset, bytes)``, the bytes those digests were computed from.

    Raises:
        OSError: a read failed; ``ENODATA`` if the file ended before a range did.
        ValueError: ``expected`` has another length.
    """
    if NATIVE:
        return page_sums_compare(fd, ranges, key, expected, THREADS)
    new = digests_of_fd(fd, list(zip(ranges[::2], ranges[1::2], strict=True)), key)
    if len(new) != len(expected):
        raise ValueError("expected digests of another length")
    runs: list[tuple[int, int, bytes]] = []
    w = 0
    for r in range(len(ranges) // 2):
        pos, n = ranges[2 * r], ranges[2 * r + 1]
        run: tuple[int, int, bytes] | None = None
        for j in range(windows(pos, n)):
            a, b = window_bounds(pos, n, j)
            if new[w * SUM_LEN : (w + 1) * SUM_LEN] != expected[w * SUM_LEN : (w + 1) * SUM_LEN]:
                data = os.pread(fd, b - a, a)  # (a reference: the C copies what it hashed)
                run = (r, run[1], run[2] + data) if run else (r, a, data)
            elif run:
                runs.append(run)
                run = None
            w += 1
        if run:
            runs.append(run)
    return new, runs


def changed(a: bytes, b: bytes) -> list[int]:
    """The indices of the digests that differ between two vectors of the same length."""
    if NATIVE:
        return page_sums_diff(a, b)
    return [
        i // SUM_LEN for i in range(0, len(a), SUM_LEN) if a[i : i + SUM_LEN] != b[i : i + SUM_LEN]
    ]


def row_sum(path: bytes, ps: PageSums) -> bytes:
    """The checksum of one row (see the module docstring)."""
    h = blake3.blake3(_HEAD.pack(len(path)))
    for part in (path, ps.pieces, ps.key, ps.sums):
        h.update(part)
    return h.digest(16)


class Lookup:
    """The vector last saved for a path, for a capture (thread-safe: each lookup is one
    query on the catalog's reader pool, on committed rows)."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        # asked once: a statement on the writer's connection waits behind the encoder
        self._present = catalog.schema_version() >= SCHEMA

    def __call__(self, path: bytes) -> PageSums | None:
        """The newest vector of ``path``, or None."""
        return self._get(path, [path], None)

    def find(self, path: bytes, pieces: bytes) -> PageSums | None:
        """The vector of ``path`` that describes chunk list ``pieces`` (the newest or the
        one before it), or None."""
        return self._get(path, [path, _previous(path)], pieces)

    def paths(self) -> list[bytes]:
        """The paths that have a vector: the big files captured before (a capture starts
        reading those changed in place before its walk reaches them)."""
        if not self._present:
            return []
        try:
            rows = self._catalog.query("SELECT path FROM pagesums")
        except SpriteError as e:
            log.warning("page digests not listed: %s", e)
            return []
        return [p for p in (bytes(r[0]) for r in rows) if b"\0" not in p]

    def _get(self, path: bytes, keys: list[bytes], pieces: bytes | None) -> PageSums | None:
        if not self._present:
            return None
        marks = ",".join("?" * len(keys))
        try:
            rows = self._catalog.query(
                f"SELECT path, pieces, key, sums, sum FROM pagesums WHERE path IN ({marks})",
                tuple(keys),
            )
        except SpriteError as e:  # a hint: without it the capture compares against the store
            log.warning("page digests of %r not read: %s", path, e)
            return None
        for row in rows:
            at, got, key, sums, total = (bytes(v) if v is not None else b"" for v in row)
            if pieces is not None and got != pieces:
                continue  # another version's: not checked, not used
            ps = PageSums(key, got, sums)
            if len(key) != KEY_LEN or len(sums) % SUM_LEN or total != row_sum(at, ps):
                log.warning(
                    "page digests of %r failed their checksum and were dropped; the file is "
                    "compared against the store",
                    path,
                )
                self._drop(at, total)
                return None
            return ps
        return None

    def _drop(self, path: bytes, total: bytes) -> None:
        if self._catalog.readonly:
            return
        try:
            with self._catalog.transaction() as db:
                db.execute("DELETE FROM pagesums WHERE path=? AND sum IS ?", (path, total))
        except SpriteError as e:
            log.warning("page digests of %r not dropped: %s", path, e)


def save(
    db: sqlite3.Connection,
    changed_sums: Mapping[bytes, PageSums],
    dirs: Mapping[bytes, CachedDir],
    removed: Iterable[bytes] = (),
    removed_trees: Iterable[bytes] = (),
) -> None:
    """Writes a capture's new vectors inside an open transaction, and drops those of files
    it found gone: in a directory it read again (``dirs``, the files cache's new rows) that
    no longer names them, or below a directory that is gone.

    Each new vector replaces the newest of its path; the one before it becomes the vector
    the capture compared the file against (``PageSums.base``), else the newest it replaces
    if that describes another chunk list (see the module docstring).

    Args:
        db: the open transaction.
        changed_sums: the new vectors by path.
        dirs: the directories whose files-cache rows the capture rewrote.
        removed: directories that are gone (their own files).
        removed_trees: directories gone with everything below them.
    """
    rows = []
    for p, s in changed_sums.items():
        before = s.base if s.base is not None and s.base.pieces != s.pieces else None
        if before is None:
            before = _newest(db, p)
            if before is not None and before.pieces == s.pieces:
                before = None  # the same version's: the one before it stays
        if before is not None:
            rows.append((_previous(p), before))
        rows.append((p, s))
    db.executemany(
        "INSERT OR REPLACE INTO pagesums(path, pieces, key, sums, sum) VALUES (?,?,?,?,?)",
        ((p, s.pieces, s.key, s.sums, row_sum(p, s)) for p, s in rows),
    )
    gone_dirs = set(removed)
    trees = [t + b"/" for t in removed_trees]
    if not dirs and not gone_dirs and not trees:
        return
    stale = []
    names: dict[bytes, frozenset[bytes]] = {}
    for (raw,) in db.execute("SELECT path FROM pagesums"):  # two rows per big file: few
        key = bytes(raw)
        path = key.split(b"\0", 1)[0]
        if path in changed_sums:
            continue
        parent, _, name = path.rpartition(b"/")
        if parent in gone_dirs or any(path.startswith(t) for t in trees):
            stale.append(key)
        elif parent in dirs:
            if parent not in names:
                names[parent] = dirs[parent].names()
            if name not in names[parent]:
                stale.append(key)
    db.executemany("DELETE FROM pagesums WHERE path=?", ((p,) for p in stale))


def _newest(db: sqlite3.Connection, path: bytes) -> PageSums | None:
    """The newest vector of ``path`` in the open transaction, if its checksum holds."""
    row = db.execute("SELECT pieces, key, sums, sum FROM pagesums WHERE path=?", (path,)).fetchone()
    if row is None:
        return None
    ps = PageSums(bytes(row[1]), bytes(row[0]), bytes(row[2]))
    return ps if bytes(row[3]) == row_sum(path, ps) else None


__all__ = [
    "KEY_LEN",
    "NATIVE",
    "PAGE",
    "SUM_LEN",
    "Lookup",
    "PageSums",
    "changed",
    "compare_fd",
    "digests",
    "digests_of_fd",
    "digests_ref",
    "new_key",
    "row_sum",
    "save",
    "window_bounds",
    "window_count",
    "windows",
]
