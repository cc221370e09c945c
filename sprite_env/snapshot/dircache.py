"""The files cache: per directory, what was last captured or restored there.

One row per directory of the live tree (table ``dircache``, created by a migration in
``store/catalog.py``; this module owns it, and no other names it in SQL):
the directory's tree id and, for each child, the signature ``(inode, ctime_ns, size,
mtime_ns)`` it had then. A capture that finds a child with the same signature reuses its
previous entry without opening it (restic's rule: size, mtime, ctime and inode; st_dev is
ignored, because it changes across reboots and snapshots of the disk). A directory whose
own signature and every child's are unchanged, and whose subdirectories all kept their tree
ids, keeps its tree id without being read or re-encoded.

The racy-timestamp rule (borg 2, bup, git): a timestamp may be coarser than the clock, so
a file changed twice within one tick keeps the same mtime and ctime. A child whose mtime or
ctime is within ``RACY_NS`` of the moment its signature is taken is stored with a signature
that never matches, so the next capture reads it again.

Stat blob format: ``(name_len:u16 name ino:u64 ctime_ns:i64 size:u64 mtime_ns:i64)*``
sorted by name.

Row checksum (column ``sum``, catalog schema 4, issue 15.5): the CRC-32 of
``len(path):u32 len(tree):u32 len(stat):u32 path tree stat``. SQLite's own checks prove
its pages and indexes sound, not the bytes of a value, and a flipped byte in ``tree`` would
make a capture reuse a tree id the directory never had. CRC-32 catches every error of up
to 32 consecutive bits, so every one-byte flip. A row whose checksum fails is dropped when
loaded (deleted at once when the catalog is writable), so the next capture reads that
directory afresh; a row written before schema 4 has ``NULL`` and loads as before. The cost:
:func:`load` of 18k rows of 400-byte signatures takes 47 ms with the checks, 37 without.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sprite_env.errors import SpriteError
from sprite_env.ids import ObjectId
from sprite_env.snapshot.tree import Kind, decode_chunks, decode_tree

_sig_diff: Callable[[bytes, bytes], tuple[list[bytes], list[bytes]]] | None
try:
    from sprite_env._native import sig_diff as _sig_diff
except ImportError:  # no extension built: decode_sigs
    _sig_diff = None

if TYPE_CHECKING:
    import os
    import sqlite3
    from collections.abc import Callable, Collection, Iterable, Iterator
    from collections.abc import Set as AbstractSet

    from sprite_env.store.catalog import Catalog

#: Timestamps this close to the signature time count as changed. Linux timestamps come
#: from the coarse clock (one tick: 4 ms at HZ=250, 10 ms at HZ=100); 50 ms is a margin.
RACY_NS = 50_000_000
_ROW = struct.Struct("<HQqQq")
_INO = struct.Struct("<Q")
#: Up to this many inodes :func:`names_of` has SQLite search a view's rows (21-29 ms for
#: one in the medium layer's, about 19 ms more for each other) rather than load and
#: decode every row (0.16-0.32 s).
_SQL_INODES = 4
_SUM_HEAD = struct.Struct("<III")
#: Paths per ``IN (...)`` query of :meth:`CacheView.prefetch` (SQLite allows 32,766).
_BATCH = 500
log = logging.getLogger(__name__)
Sig = tuple[int, int, int, int]  # ino, ctime_ns, size, mtime_ns
#: ctime of a poisoned signature: matches no stat, but the inode is kept (a file changed in
#: place is recognized by its inode even while it is being written).
_RACY = -1


def sig_of(st: os.stat_result, now_ns: int) -> Sig:
    """The signature of a stat result, poisoned if a timestamp is racy."""
    if st.st_mtime_ns >= now_ns - RACY_NS or st.st_ctime_ns >= now_ns - RACY_NS:
        return (st.st_ino, _RACY, 0, _RACY)
    return (st.st_ino, st.st_ctime_ns, st.st_size, st.st_mtime_ns)


def poisoned(st: os.stat_result) -> Sig:
    """A signature of ``st``'s inode that vouches for nothing (the next capture reads it)."""
    return (st.st_ino, _RACY, 0, _RACY)


def vanished() -> Sig:
    """The signature of a name a directory's tree has and the directory no longer holds
    (another process removed it): it matches no stat, and a capture that lists the
    directory without the name finds it removed, so the tree is never kept with it."""
    return (0, _RACY, 0, _RACY)


def is_racy(sig: Sig) -> bool:
    """True for a poisoned signature (it vouches for nothing)."""
    return sig[1] == _RACY


def encode_sigs(sigs: dict[bytes, Sig]) -> bytes:
    out = []
    for name in sorted(sigs):
        ino, ctime, size, mtime = sigs[name]
        out.append(_ROW.pack(len(name), ino, ctime, max(size, 0), mtime) + name)
    return b"".join(out)


def decode_sigs(blob: bytes) -> dict[bytes, Sig]:
    out: dict[bytes, Sig] = {}
    off = 0
    while off < len(blob):
        nlen, ino, ctime, size, mtime = _ROW.unpack_from(blob, off)
        off += _ROW.size
        name = blob[off : off + nlen]
        off += nlen
        out[name] = (ino, ctime, size, mtime)
    return out


def row_sum(path: bytes, tree: bytes, stat: bytes) -> int:
    """The checksum of one row (see the module docstring)."""
    return zlib.crc32(b"".join((_SUM_HEAD.pack(len(path), len(tree), len(stat)), path, tree, stat)))


def _sound(path: bytes, tree: bytes, stat: bytes, total: int | None) -> bool:
    return total is None or total == row_sum(path, tree, stat)


def _rows(
    catalog: Catalog, where: str = "", params: tuple[bytes, ...] = (), schema: int | None = None
) -> list[Any]:
    """``(path, tree, stat, sum)`` rows; ``sum`` is NULL in a catalog opened read-only
    before a writable open migrated it to schema 4. ``schema``: the catalog's version if
    the caller knows it (asking costs a statement on the writer's connection, which waits
    while the encoder thread inserts: 0.56 s over 60k lookups in one capture)."""
    if schema is None:
        schema = catalog.schema_version()
    total = "sum" if schema >= 4 else "NULL"
    return catalog.query(f"SELECT path, tree, stat, {total} FROM dircache {where}", params)


def bad_rows(catalog: Catalog) -> list[bytes]:
    """The paths of rows whose checksum fails (for ``store check``; reads every row)."""
    rows = _rows(catalog)
    return sorted(bytes(p) for p, t, s, n in rows if not _sound(bytes(p), bytes(t), bytes(s), n))


def _drop(catalog: Catalog, bad: list[tuple[bytes, int]]) -> None:
    """Deletes rows that failed their checksum (each only if it is still that row)."""
    log.warning(
        "files cache of %s: %d rows failed their checksum and were dropped (first %r); "
        "those directories are read afresh",
        catalog.path,
        len(bad),
        bad[0][0],
    )
    if catalog.readonly:
        return
    with catalog.transaction() as db:
        db.executemany("DELETE FROM dircache WHERE path=? AND sum=?", bad)


@dataclass(slots=True)
class CachedDir:
    tree: ObjectId
    stat: bytes  # encoded; decoded lazily, only for directories that changed

    def sigs(self) -> dict[bytes, Sig]:
        return decode_sigs(self.stat)

    def names(self) -> frozenset[bytes]:
        """The names the row has signatures for (natively where built: the rows of big
        files' directories, decoded whole to ask about one name, were 16 ms of the medium
        step's commit)."""
        if _sig_diff is not None:
            # every name differs from none; a malformed blob (ValueError): what the Python
            # decoder makes of it
            with contextlib.suppress(ValueError):
                return frozenset(_sig_diff(self.stat, b"")[0])
        return frozenset(decode_sigs(self.stat))


def clear(db: sqlite3.Connection) -> None:
    """Empties the files cache inside an open transaction (the next capture reads every
    file: after a ``rebuild``, whose trees may be gone, or for another live tree)."""
    db.execute("DELETE FROM dircache")


def purge_unreachable(db: sqlite3.Connection, live: Collection[bytes]) -> int:
    """Drops rows whose tree is not in ``live`` (before a prune removes those trees).

    A row that outlived its tree would make the next capture reuse a tree id the store no
    longer has, so this must commit before the prune does.
    """
    stale = [p for p, t in db.execute("SELECT path, tree FROM dircache") if bytes(t) not in live]
    db.executemany("DELETE FROM dircache WHERE path=?", ((p,) for p in stale))
    return len(stale)


def purge_referencing(
    db: sqlite3.Connection, read: Callable[[ObjectId], bytes], bad: AbstractSet[bytes]
) -> int:
    """Drops rows that would make a capture reuse an object in ``bad`` (lost with its pack,
    or damaged): a row whose tree is bad, or whose tree names a bad subtree, chunk list or
    chunk, or whose tree (or a chunk list in it) cannot be read. The directory is then
    read afresh by the next capture, which stores that data again (issue 15). A dropped
    directory's parents need nothing: its tree id comes out of that capture anew. Reads
    each cached tree once (one per directory of the layer: 69 ms for 2,041 directories).

    Returns:
        The number of rows dropped.
    """
    if not bad:
        return 0

    def refers(tree: ObjectId) -> bool:
        if tree in bad:
            return True
        try:
            for e in decode_tree(read(tree)):
                if e.kind is Kind.DIR and e.payload in bad:
                    return True
                if e.kind is Kind.FILE:
                    if e.indirect and e.payload in bad:
                        return True
                    raw = read(ObjectId(e.payload)) if e.indirect else e.payload
                    if any(oid in bad for oid, _, _ in decode_chunks(raw) if oid is not None):
                        return True
        except SpriteError:
            return True  # cannot vouch for it: the capture re-reads the directory
        return False

    stale = [p for p, t in db.execute("SELECT path, tree FROM dircache") if refers(ObjectId(t))]
    db.executemany("DELETE FROM dircache WHERE path=?", ((p,) for p in stale))
    return len(stale)


class CacheView(Mapping[bytes, CachedDir]):
    """The files cache read row by row, for a walk that visits few directories (one the
    change journal narrowed): about 18 us a row, where :func:`load` takes 41 ms for 18k
    rows. Rows are read as of the last commit; iterating (or ``len``) loads them all."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._schema = catalog.schema_version()
        self._rows: dict[bytes, CachedDir | None] = {}
        self._all: dict[bytes, CachedDir] | None = None
        #: rows this view found failing their checksum (dropped: see the module docstring)
        self.dropped = 0

    def prefetch(self, paths: Iterable[bytes]) -> None:
        """Reads the rows of ``paths`` (those not read yet) in a few queries: a walk that
        knows which directories it will look up (the journal's dirty ones and their
        subdirectories) pays about 2 us a row instead of 18."""
        if self._all is not None:
            return
        want = [p for p in paths if p not in self._rows]
        for i in range(0, len(want), _BATCH):
            part = want[i : i + _BATCH]
            marks = ",".join("?" * len(part))
            q = _rows(self._catalog, f"WHERE path IN ({marks})", tuple(part), self._schema)
            self._take(part, q)

    def _take(self, asked: list[bytes], q: list[Any]) -> None:
        bad = []
        for p, t, s, total in q:
            path, tree, stat = bytes(p), bytes(t), bytes(s)
            if _sound(path, tree, stat, total):
                self._rows[path] = CachedDir(ObjectId(tree), stat)
            else:
                self._rows[path] = None
                bad.append((path, total))
        for path in asked:
            self._rows.setdefault(path, None)
        if bad:
            self.dropped += len(bad)
            _drop(self._catalog, bad)

    def containing(self, needles: Collection[bytes]) -> list[bytes]:
        """The paths of the rows whose signature blob holds one of ``needles`` (searched by
        SQLite, ``instr`` on the blobs: no row is decoded or checked that holds none; the
        rows found are then read as :meth:`prefetch` reads them)."""
        if self._all is not None:
            return [p for p, row in self._all.items() if any(n in row.stat for n in needles)]
        found: list[bytes] = []
        wanted = list(needles)
        for i in range(0, len(wanted), _BATCH):
            part = wanted[i : i + _BATCH]
            where = "WHERE " + " OR ".join(["instr(stat, ?) > 0"] * len(part))
            q = _rows(self._catalog, where, tuple(part), self._schema)
            paths = [bytes(r[0]) for r in q]
            self._take(paths, q)
            found += [p for p in paths if self._rows.get(p) is not None]
        return found

    def __getitem__(self, path: bytes) -> CachedDir:
        if self._all is not None:
            return self._all[path]
        if path not in self._rows:
            self._take([path], _rows(self._catalog, "WHERE path=?", (path,), self._schema))
        row = self._rows[path]
        if row is None:
            raise KeyError(path)
        return row

    def _load(self) -> dict[bytes, CachedDir]:
        if self._all is None:
            bad: list[bytes] = []
            self._all = load(self._catalog, bad)
            self.dropped += len(bad)
        return self._all

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())


def names_of(cache: Mapping[bytes, CachedDir], inodes: AbstractSet[int]) -> dict[bytes, set[bytes]]:
    """Where the files cache saw each of ``inodes``: per directory, the names whose
    signature has one of them (what the last capture found; an inode reused since only
    names one more entry to stat).

    Raises:
        DamagedRows: a row failed its checksum: the inodes may have a name there that
            this cannot give (the caller walks everything instead).

    In the medium layer's 17k rows (6.7 MB of blobs, this VM): for up to
    ``_SQL_INODES``, SQLite searches a :class:`CacheView`'s blobs for each inode's 8 bytes
    and only the rows found are decoded (21-29 ms for one inode, about 19 ms more for
    each other); else every row is loaded and decoded (0.16-0.32 s for 16 to 200 inodes).
    """
    out: dict[bytes, set[bytes]] = {}
    if not inodes:
        return out
    dropped = cache.dropped if isinstance(cache, CacheView) else 0
    paths: Iterable[bytes]
    if isinstance(cache, CacheView) and len(inodes) <= _SQL_INODES:
        paths = cache.containing([_INO.pack(i) for i in inodes])
    else:
        paths = list(cache)
    for path in paths:
        for name, sig in decode_sigs(cache[path].stat).items():
            if sig[0] in inodes:  # a hit inside a time or a size is no name of it
                out.setdefault(path, set()).add(name)
    if isinstance(cache, CacheView) and cache.dropped != dropped:
        n = cache.dropped - dropped
        raise DamagedRows(f"{n} rows of the files cache failed their checksum")
    return out


class DamagedRows(SpriteError):
    """Rows of the files cache failed their checksum while a search needed them."""


def load(catalog: Catalog, dropped: list[bytes] | None = None) -> dict[bytes, CachedDir]:
    """Reads the whole cache (one query: cheaper than one lookup per directory), without
    the rows whose checksum fails (see the module docstring; their paths are added to
    ``dropped``)."""
    out: dict[bytes, CachedDir] = {}
    bad: list[tuple[bytes, int]] = []
    for p, t, s, total in _rows(catalog):
        path, tree, stat = bytes(p), bytes(t), bytes(s)
        if _sound(path, tree, stat, total):
            out[path] = CachedDir(ObjectId(tree), stat)
        else:
            bad.append((path, total))
    if bad:
        if dropped is not None:
            dropped.extend(p for p, _ in bad)
        _drop(catalog, bad)
    return out


def save(
    db: sqlite3.Connection,
    changed: dict[bytes, CachedDir],
    removed: Iterable[bytes] = (),
    *,
    removed_trees: Iterable[bytes] = (),
) -> None:
    """Writes changed rows inside an open transaction.

    Args:
        db: the open transaction.
        changed: rows to insert or replace.
        removed: directories that are gone (their rows only).
        removed_trees: directories removed with everything below them.
    """
    db.executemany("DELETE FROM dircache WHERE path=?", ((p,) for p in removed))
    for p in removed_trees:
        # a range of the primary key's index, not substr() over every row: paths are BLOBs
        # (memcmp order), so what lies below p is exactly [p + "/", p + "0"): "0" is the
        # byte after "/". 17k rows of 400-byte signatures (the medium layer's), in memory:
        # 6.6 ms a removed tree with substr(), 0.02 ms with the range
        db.execute("DELETE FROM dircache WHERE path = ?", (p,))
        db.execute("DELETE FROM dircache WHERE path >= ? AND path < ?", (p + b"/", p + b"0"))
    db.executemany(
        "INSERT OR REPLACE INTO dircache(path, tree, stat, sum) VALUES (?,?,?,?)",
        ((p, c.tree, c.stat, row_sum(p, c.tree, c.stat)) for p, c in changed.items()),
    )
