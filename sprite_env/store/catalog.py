"""The catalog: one SQLite database (WAL) that is the store's single source of truth.

Schema (version 6). This is the one place it is described; ``_MIGRATIONS`` creates it.

``meta(key TEXT PRIMARY KEY, value TEXT)``
    ``schema_version``; ``ingested_bytes`` (raw bytes ever offered to the store,
    duplicates included: the numerator of the dedup ratio).
``packs(id INTEGER PRIMARY KEY, name TEXT UNIQUE, class INTEGER, size INTEGER,
objects INTEGER)``
    One row per published pack file ``packs/<name>.pack``; ``class`` 0 = data, 1 = metadata.
``objects(id BLOB PRIMARY KEY, pack INTEGER, offset INTEGER, stored_len INTEGER,
raw_len INTEGER, kind INTEGER, codec INTEGER) WITHOUT ROWID``
    Where each object lives. ``offset`` is that of its entry header in the pack. From
    version 6 a view over two tables of those columns, ``objects_main`` and
    ``objects_new`` (each keyed by ``id``, an id in at most one of them); its
    ``INSTEAD OF`` triggers insert into ``objects_new`` (unless ``objects_main`` has the
    id) and update or delete in both, so SQL that names ``objects`` reads and writes as
    before (SQLite pushes ``WHERE id`` and ``WHERE pack`` terms into both tables).

Objects in two tables (version 6, issue 11). Ids are random, so the rows of a commit land
on every leaf of a big table: a step's 7.1k new objects dirtied all 1.9k pages of the
medium layer's 122k, 7.7 MB of WAL per checkpoint, however small the step. A commit puts
its rows in ``objects_new`` (:func:`insert_pack`), which stays below ``MERGE_ROWS``: the
WAL copier's thread moves them into ``objects_main`` in one transaction of its own after
a commit that passed it, off every commit's path.

The checkpoint layer's tables (version 2; version 3 added ``walk`` and ``walk_reason``,
version 4 the files cache's ``sum``):

``checkpoints(id TEXT PRIMARY KEY, seq INTEGER, is_auto INTEGER, create_time_ns INTEGER,
comment TEXT, created_by TEXT, parent TEXT, history TEXT, top_tree BLOB, record BLOB,
files INTEGER, dirs INTEGER, bytes INTEGER, bytes_added INTEGER, warnings TEXT,
walk TEXT, walk_reason TEXT)``
    One row per checkpoint. ``seq`` is the n of a manual ``vN`` (NULL for ``auto-...``);
    ``history`` is a JSON list of ancestor ids, nearest first; ``top_tree`` is the id of
    the tree holding the root directory as its one entry ``.``; ``record`` is the id of
    the META object that repeats this row, so ``rebuild`` can recover checkpoints from
    packs; ``warnings`` is a JSON list of ``{"path", "message"}``; ``walk`` is how the
    capture found what changed, ``journal`` (narrowed by the change journal) or ``full``,
    and ``walk_reason`` why a full walk (rows older than version 3: ``full``, ``""``).
    The row's insertion is the commit point of a capture.
``dircache(path BLOB PRIMARY KEY, tree BLOB, stat BLOB, sum INTEGER)``
    The files cache, one row per directory of the live tree (path relative to the root,
    ``b""`` for the root): the tree id last captured or restored there, the children's
    (inode, ctime, size, mtime) at that moment, and a checksum of the row (NULL in rows
    written before version 4; see ``snapshot/dircache.py``).
``pagesums(path BLOB PRIMARY KEY, pieces BLOB, key BLOB, sums BLOB, sum BLOB)``
    Version 5: per big file last captured, the digests of its pages (a hint for the next
    capture of a change in place; never rebuilt, it refills itself). Its format is in
    ``snapshot/pagesums.py``, the one module that reads and writes it.
``meta`` keys of this layer: declared, each with what it holds, in
``checkpoints/registry.py`` (``META_KEYS``: ``next_seq``, ``last_auto``, ``active``,
``restore_intent``, ``gc_pending``, ``excludes``, ``cache_root``), and set through
:func:`set_meta`.

Owners: each table belongs to one module, and SQL that names it lives only there (a test
greps the package, ``tests/store/test_table_owners.py``): ``objects``, ``packs`` and
``meta`` to ``store/`` (the checkpoint layer's meta keys go through :func:`set_meta`),
``checkpoints`` to ``checkpoints/registry.py``, ``dircache`` to ``snapshot/dircache.py``,
``pagesums`` to ``snapshot/pagesums.py``. The migrations below create them all.

Damage: SQLite errors that mean a damaged file (``SQLITE_CORRUPT``, ``SQLITE_NOTADB``, a
schema or text that no longer parses) raise :class:`CatalogDamaged`, naming ``store
rebuild-catalog``; other SQLite errors raise :class:`StoreError`. None escapes as a
``sqlite3`` exception. ``integrity_problems`` runs ``PRAGMA integrity_check``, which also
proves every index agrees with its table (``quick_check`` does not).

Invariants: an object row exists only if its pack row exists and the pack file was made
durable before the transaction that inserted both committed. A pack file with no row is
an orphan of a crash and is deleted when the store is opened for writing. Everything here
except ``meta.ingested_bytes`` can be rebuilt from the packs alone (``rebuild``).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sprite_env import privacy
from sprite_env.errors import StoreError
from sprite_env.ids import ObjectId, PackName
from sprite_env.store.known import BUILD_AFTER, KnownIds
from sprite_env.store.pack import Entry

SCHEMA_VERSION = 6
log = logging.getLogger(__name__)

_MIGRATIONS: list[str] = [
    # 0 -> 1
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE packs (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        class INTEGER NOT NULL,
        size INTEGER NOT NULL,
        objects INTEGER NOT NULL
    );
    CREATE TABLE objects (
        id BLOB PRIMARY KEY,
        pack INTEGER NOT NULL REFERENCES packs(id),
        offset INTEGER NOT NULL,
        stored_len INTEGER NOT NULL,
        raw_len INTEGER NOT NULL,
        kind INTEGER NOT NULL,
        codec INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX objects_by_pack ON objects(pack);
    INSERT INTO meta VALUES ('ingested_bytes', '0');
    """,
    # 1 -> 2
    """
    CREATE TABLE checkpoints (
        id TEXT PRIMARY KEY,
        seq INTEGER UNIQUE,
        is_auto INTEGER NOT NULL,
        create_time_ns INTEGER NOT NULL,
        comment TEXT NOT NULL,
        created_by TEXT NOT NULL,
        parent TEXT,
        history TEXT NOT NULL,
        top_tree BLOB NOT NULL,
        record BLOB NOT NULL,
        files INTEGER NOT NULL,
        dirs INTEGER NOT NULL,
        bytes INTEGER NOT NULL,
        bytes_added INTEGER NOT NULL,
        warnings TEXT NOT NULL
    );
    CREATE TABLE dircache (path BLOB PRIMARY KEY, tree BLOB NOT NULL, stat BLOB NOT NULL);
    INSERT INTO meta VALUES ('next_seq', '0');
    """,
    # 2 -> 3
    """
    ALTER TABLE checkpoints ADD COLUMN walk TEXT NOT NULL DEFAULT 'full';
    ALTER TABLE checkpoints ADD COLUMN walk_reason TEXT NOT NULL DEFAULT '';
    """,
    # 3 -> 4 (issue 15.5): rows of older versions keep NULL, and load unchecked
    """
    ALTER TABLE dircache ADD COLUMN sum INTEGER;
    """,
    # 4 -> 5 (issue 11.5): page digests of big files, a hint that starts empty
    """
    CREATE TABLE pagesums (
        path BLOB PRIMARY KEY,
        pieces BLOB NOT NULL,
        key BLOB NOT NULL,
        sums BLOB NOT NULL,
        sum BLOB NOT NULL
    );
    """,
    # 5 -> 6 (issue 11): object rows in two tables behind the view ``objects``
    """
    ALTER TABLE objects RENAME TO objects_main;
    CREATE TABLE objects_new (
        id BLOB PRIMARY KEY,
        pack INTEGER NOT NULL REFERENCES packs(id),
        offset INTEGER NOT NULL,
        stored_len INTEGER NOT NULL,
        raw_len INTEGER NOT NULL,
        kind INTEGER NOT NULL,
        codec INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX objects_new_by_pack ON objects_new(pack);
    CREATE VIEW objects AS
        SELECT id, pack, offset, stored_len, raw_len, kind, codec FROM objects_main
        UNION ALL
        SELECT id, pack, offset, stored_len, raw_len, kind, codec FROM objects_new;
    CREATE TRIGGER objects_insert INSTEAD OF INSERT ON objects BEGIN
        INSERT INTO objects_new(id, pack, offset, stored_len, raw_len, kind, codec)
        SELECT NEW.id, NEW.pack, NEW.offset, NEW.stored_len, NEW.raw_len, NEW.kind, NEW.codec
        WHERE NOT EXISTS (SELECT 1 FROM objects_main WHERE id = NEW.id);
    END;
    CREATE TRIGGER objects_update INSTEAD OF UPDATE ON objects BEGIN
        UPDATE objects_main SET id = NEW.id, pack = NEW.pack, offset = NEW.offset,
            stored_len = NEW.stored_len, raw_len = NEW.raw_len, kind = NEW.kind,
            codec = NEW.codec WHERE id = OLD.id;
        UPDATE objects_new SET id = NEW.id, pack = NEW.pack, offset = NEW.offset,
            stored_len = NEW.stored_len, raw_len = NEW.raw_len, kind = NEW.kind,
            codec = NEW.codec WHERE id = OLD.id;
    END;
    CREATE TRIGGER objects_delete INSTEAD OF DELETE ON objects BEGIN
        DELETE FROM objects_main WHERE id = OLD.id;
        DELETE FROM objects_new WHERE id = OLD.id;
    END;
    """,
]

#: SQLite's primary result codes for a file that is not a sound database.
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26
#: Messages that also mean damage: a flipped byte in the schema's SQL text makes a table's
#: columns vanish or its text undecodable (seen in 25 of 507 flips of a 48 KiB catalog).
_DAMAGE_HINTS = (
    "malformed",
    "no such column",
    "no such table",
    "could not decode",
    "not a database",
)


def _statements(script: str) -> Iterator[str]:
    """The statements of ``script`` one by one (a trigger's body holds semicolons)."""
    stmt = ""
    for part in script.split(";"):
        stmt += part + ";"
        if sqlite3.complete_statement(stmt):
            if stmt.strip(" \n;"):
                yield stmt
            stmt = ""


class CatalogDamaged(StoreError):
    """The catalog file is damaged: SQLite cannot read it as the database it should be."""


def catalog_error(path: str, e: Exception) -> StoreError:
    """The :class:`StoreError` for a SQLite (or text decoding) error on the catalog at
    ``path``: :class:`CatalogDamaged` with the repair command when it means damage."""
    code = getattr(e, "sqlite_errorcode", None)
    damaged = (
        isinstance(e, UnicodeDecodeError)
        or (code is not None and code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB))
        or any(h in str(e).lower() for h in _DAMAGE_HINTS)
    )
    if not damaged:
        return StoreError(f"catalog {path}: {e}")
    store = os.path.dirname(os.path.abspath(path))
    return CatalogDamaged(
        f"catalog {path} is damaged ({e}); the packs hold every object, so rebuild it from "
        f"them: sprite-env store rebuild-catalog --store {store}"
    )


#: What :func:`_guard` translates: every sqlite3 error, and text it cannot decode.
_SQL_ERRORS = (sqlite3.Error, UnicodeDecodeError)


@contextmanager
def _guard(path: str) -> Iterator[None]:
    try:
        yield
    except _SQL_ERRORS as e:
        raise catalog_error(path, e) from None


@dataclass(frozen=True, slots=True)
class PackRow:
    id: int
    name: PackName
    pack_class: int
    size: int
    objects: int


@dataclass(frozen=True, slots=True)
class Located:
    """An object's catalog row: its entry and the name of its pack."""

    pack: PackName
    entry: Entry


#: Idle read connections kept for reuse (more threads than this open and close their own).
_MAX_IDLE_READERS = 8
#: The writer connection's page cache bound, KiB (see ``Catalog.__init__``).
_WRITER_CACHE_KIB = 65536
#: New object rows past which they move into the main table (see the module docstring):
#: 32k rows are about 460 pages, what a commit into a full ``objects_new`` can dirty.
MERGE_ROWS = 32_768


class _WalCopier:
    """Copies the catalog's WAL back into its database file after commits, on a thread and
    a connection of its own (``PRAGMA wal_checkpoint(PASSIVE)``), so that no commit waits
    for it.

    Why this is as safe as SQLite's own automatic checkpoint, which the writer's
    connection no longer runs: a transaction is durable once its COMMIT has fsync'd the
    WAL (``synchronous=FULL``); a checkpoint only copies committed frames, fsyncs the
    database and may then let the next writer restart the WAL, and a kill at any instant
    of it leaves frames SQLite copies again at the next open. A passive checkpoint never
    blocks the writer or the readers, and stops short of frames a reader still needs
    (the next one copies them). Wakes coalesce: many commits, one copy.

    Error handling:
        A failed copy is logged once and retried at the next commit; the WAL then only
        grows (it is copied at the last connection's close in any case).
    """

    def __init__(
        self, uri: str, path: str, merge: Callable[[sqlite3.Connection], None] | None = None
    ) -> None:
        self._uri = uri
        self._path = path
        self._merge = merge  # called first, with this thread's connection
        self._wake = threading.Event()
        self._stop = False
        self._warned = False
        #: Completed copies (tests wait for one with :meth:`settle`).
        self.copies = 0
        self._idle = threading.Condition()
        self._busy = False
        self._thread = threading.Thread(target=self._run, name="catalog-wal-copy", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Asks for a copy (after a commit)."""
        with self._idle:  # both under the lock: the thread's "nothing more asked" sees both
            self._busy = True
            self._wake.set()

    def settle(self, timeout: float = 30.0) -> None:
        """Waits until no copy is asked for or running."""
        with self._idle:
            self._idle.wait_for(lambda: not self._busy, timeout)

    def _run(self) -> None:
        db: sqlite3.Connection | None = None
        try:
            while True:
                self._wake.wait()
                if self._stop:
                    return
                self._wake.clear()
                try:
                    if db is None:
                        db = sqlite3.connect(self._uri, uri=True, timeout=30)
                        db.execute("PRAGMA synchronous=FULL")
                    if self._merge is not None:
                        self._merge(db)
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.copies += 1
                except (*_SQL_ERRORS, StoreError) as e:
                    if not self._warned:
                        self._warned = True
                        log.warning("catalog %s: copying the WAL back failed: %s", self._path, e)
                with self._idle:
                    if not self._wake.is_set():
                        self._busy = False
                        self._idle.notify_all()
        finally:
            if db is not None:
                db.close()
            with self._idle:
                self._busy = False
                self._idle.notify_all()

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join()


class Catalog:
    """Thread-safe access to the catalog database.

    One connection, serialized by a lock: SQLite calls are short, and the writer is the only
    process that writes (the store's flock guarantees it).
    """

    def __init__(self, path: str, *, readonly: bool = False) -> None:
        self.path = path
        self.readonly = readonly
        self._uri = uri = f"file:{path}?mode=ro" if readonly else f"file:{path}"
        self._idle: list[sqlite3.Connection] = []
        self._closed = False
        self._pool_lock = threading.Lock()
        try:
            if not readonly:
                # SQLite would create the file 0644 (less the umask), and it gives the -wal
                # and -shm files the database's mode: made 0600 here, all three are private.
                os.close(privacy.open_file(path, os.O_RDWR))
            self._db = sqlite3.connect(
                uri, uri=True, check_same_thread=False, isolation_level=None, timeout=30
            )
            if not readonly:
                self._db.execute("PRAGMA journal_mode=WAL")
                # The writer's page cache (a bound: pages are taken as they are used). Ids
                # are random, so a step's 7.1k new objects dirty nearly every leaf of the
                # objects table (1.9k pages for the medium layer's 122k objects): with
                # SQLite's default 2 MiB they spilled mid-transaction and were read back
                # (inserts 115-300 ms at load 8; with 64 MiB 35-70 ms, in the same run).
                self._db.execute(f"PRAGMA cache_size=-{_WRITER_CACHE_KIB}")
                # The WAL goes back into the database file in a thread of its own after
                # each commit (_WalCopier), not inside the COMMIT of whoever passed 1,000
                # pages: that copy (read, write, fsync of the database) was 20-40 ms of a
                # step's commit. Durability is the WAL's fsync at COMMIT either way.
                self._db.execute("PRAGMA wal_autocheckpoint=0")
            # FULL: a committed checkpoint survives power loss, not only a crash.
            self._db.execute("PRAGMA synchronous=FULL")
        except _SQL_ERRORS as e:
            raise catalog_error(path, e) from None
        except OSError as e:
            raise StoreError(f"cannot open catalog {path}: {e}") from None
        self._lock = threading.Lock()
        self._pack_names: dict[int, PackName] = {}
        # the in-memory filter before ``has`` (see store/known.py), built lazily
        self._known: KnownIds | None = None
        self._known_lock = threading.Lock()
        self._known_asked = 0
        self._known_buffer: list[bytes] | None = None  # notes while it is being built
        self._copier: _WalCopier | None = None
        try:
            if not readonly:
                self._migrate()
            version = self.schema_version()
        except StoreError:
            self._db.close()
            raise
        if version < SCHEMA_VERSION:  # only read-only: a writable open has migrated
            self._db.close()
            store = os.path.dirname(os.path.abspath(path))
            raise StoreError(
                f"catalog schema {version} is older than this sprite-env's ({SCHEMA_VERSION}) "
                "and a read-only open cannot upgrade it; a writable open does (the daemon's "
                f"start, or: sprite-env store init --store {store}), then retry"
            )
        if version > SCHEMA_VERSION:
            self._db.close()
            raise StoreError(
                f"catalog schema {version} is newer than this sprite-env supports "
                f"({SCHEMA_VERSION}); upgrade sprite-env"
            )
        if not readonly:
            self._copier = _WalCopier(uri, path, self._merge_if_big)

    def close(self) -> None:
        if self._copier is not None:
            self._copier.close()  # before the last connection, which copies what is left
        with self._pool_lock:
            self._closed = True
            for db in self._idle:
                db.close()
            self._idle.clear()
        self._db.close()

    @contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        """A read connection from a small pool: lookups from several threads run in parallel
        (WAL lets readers proceed side by side), never behind the writer's lock, and see
        committed rows only, which is all a lookup needs. A pool rather than one connection
        per thread, because a long-running daemon's thread pools come and go."""
        with self._pool_lock:  # not self._lock: a write transaction holds that one
            db = self._idle.pop() if self._idle else None
        if db is None:
            with _guard(self.path):
                db = sqlite3.connect(self._uri, uri=True, check_same_thread=False, timeout=30)
        try:
            with _guard(self.path):
                yield db
        finally:
            with self._pool_lock:
                if self._closed or len(self._idle) >= _MAX_IDLE_READERS:
                    db.close()
                else:
                    self._idle.append(db)

    def schema_version(self) -> int:
        with _guard(self.path):
            return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def integrity_problems(self) -> list[str]:
        """Runs ``PRAGMA integrity_check`` (every page, every index against its table:
        0.40 s for a 69 MB catalog of 600k objects) and returns its problem lines, ``[]``
        when sound.
        Never raises for damage: an error of the check itself is its one problem line."""
        try:
            with self._reader() as db:
                rows = db.execute("PRAGMA integrity_check").fetchall()
        except StoreError as e:
            return [str(e)]
        lines = [str(r[0]) for r in rows]
        return [] if lines == ["ok"] else lines

    def _migrate(self) -> None:
        version = self.schema_version()
        for i in range(version, len(_MIGRATIONS)):
            with self.transaction() as db:
                for stmt in _statements(_MIGRATIONS[i]):
                    db.execute(stmt)
                db.execute(f"PRAGMA user_version={i + 1}")

    def _merge_if_big(self, db: sqlite3.Connection) -> None:
        """Moves the new object rows into the main table once there are ``MERGE_ROWS`` (on
        the WAL copier's thread, after a commit; ``db`` is its connection, for the count).
        One transaction: a reader sees each row in one table or the other, never in both
        or neither, and a kill leaves them where they were."""
        (n,) = db.execute("SELECT count(*) FROM objects_new").fetchone()
        if n >= MERGE_ROWS:
            self.merge_objects()

    def merge_objects(self) -> None:
        """Moves every row of ``objects_new`` into ``objects_main`` (see the module
        docstring); the writer's next transaction waits for it."""
        with self.transaction() as db:
            db.execute("INSERT INTO objects_main SELECT * FROM objects_new ORDER BY id")
            db.execute("DELETE FROM objects_new")

    # -- transactions ------------------------------------------------------------------

    def transaction(self) -> _Transaction:
        """A context manager: ``BEGIN IMMEDIATE`` ... ``COMMIT`` (or rollback on error)."""
        return _Transaction(self)

    # -- objects -----------------------------------------------------------------------

    def has(self, oid: ObjectId) -> bool:
        known = self._known_filter(1)
        if known is not None and not known.may_have(oid):
            return False
        with self._reader() as db:
            row = db.execute("SELECT 1 FROM objects WHERE id=?", (oid,)).fetchone()
        return row is not None

    def has_many(self, oids: Sequence[ObjectId]) -> set[ObjectId]:
        """Those of ``oids`` the catalog has, in one query per 500 (SQLite allows 32,766
        parameters): about 2 us an id, where :meth:`has` costs 15-20."""
        out: set[ObjectId] = set()
        known = self._known_filter(len(oids))
        if known is not None:
            oids = [o for o in oids if known.may_have(o)]
        with self._reader() as db:
            for i in range(0, len(oids), 500):
                part = oids[i : i + 500]
                marks = ",".join("?" * len(part))
                rows = db.execute(f"SELECT id FROM objects WHERE id IN ({marks})", part)
                out.update(ObjectId(bytes(r[0])) for r in rows)
        return out

    def _known_filter(self, asked: int) -> KnownIds | None:
        """The filter once ``known.BUILD_AFTER`` ids have been asked about; None before."""
        known = self._known
        if known is not None or self.readonly:
            return known
        with self._known_lock:
            self._known_asked += asked
            if self._known_asked < BUILD_AFTER or self._known_buffer is not None:
                return None  # not worth it yet, or another thread builds it
            self._known_buffer = []
        try:
            with self._reader() as db:
                built = KnownIds(bytes(r[0]) for r in db.execute("SELECT id FROM objects"))
        except StoreError:
            with self._known_lock:
                self._known_buffer = None
            return None
        with self._known_lock:
            built.note(self._known_buffer)  # committed while the scan ran
            self._known, self._known_buffer = built, None
        return built

    def note_committed(self, oids: Iterable[bytes]) -> None:
        """Tells the filter which ids a transaction that just committed inserted (the
        writer calls it; see store/known.py for why a missed call costs only space)."""
        with self._known_lock:
            if self._known_buffer is not None:
                self._known_buffer.extend(oids)
            elif self._known is not None:
                self._known.note(oids)

    def locate(self, oid: ObjectId) -> Located | None:
        with self._reader() as db:
            row = db.execute(
                "SELECT pack, offset, stored_len, raw_len, kind, codec FROM objects WHERE id=?",
                (oid,),
            ).fetchone()
        if row is None:
            return None
        pack_id, off, slen, rlen, kind, codec = row
        return Located(self._pack_name(pack_id), Entry(oid, off, slen, rlen, kind, codec))

    def _pack_name(self, pack_id: int) -> PackName:
        name = self._pack_names.get(pack_id)
        if name is None:
            with self._reader() as db:
                r = db.execute("SELECT name FROM packs WHERE id=?", (pack_id,)).fetchone()
            if r is None:
                raise StoreError(f"catalog refers to unknown pack row {pack_id}")
            name = self._pack_names[pack_id] = PackName(r[0])
        return name

    def forget_pack_names(self) -> None:
        """Drops the pack-name cache (after the packs table was rewritten)."""
        with self._lock:
            self._pack_names.clear()

    def objects_in_pack(self, pack_id: int) -> list[Entry]:
        with self._lock, _guard(self.path):
            rows = self._db.execute(
                "SELECT id, offset, stored_len, raw_len, kind, codec FROM objects "
                "WHERE pack=? ORDER BY offset",
                (pack_id,),
            ).fetchall()
        return [Entry(ObjectId(r[0]), r[1], r[2], r[3], r[4], r[5]) for r in rows]

    def packs(self) -> list[PackRow]:
        with self._lock, _guard(self.path):
            rows = self._db.execute(
                "SELECT id, name, class, size, objects FROM packs ORDER BY id"
            ).fetchall()
        return [PackRow(r[0], PackName(r[1]), r[2], r[3], r[4]) for r in rows]

    def object_count(self) -> int:
        with self._lock, _guard(self.path):
            return int(self._db.execute("SELECT count(*) FROM objects").fetchone()[0])

    def query(self, sql: str, params: Iterable[object] = ()) -> list[tuple[Any, ...]]:
        """Runs a read-only query on committed rows (never waits for a write transaction)."""
        with self._reader() as db:
            return list(db.execute(sql, tuple(params)).fetchall())

    def meta(self, key: str, default: str | None = None) -> str | None:
        with self._reader() as db:
            r = db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return default if r is None else str(r[0])

    def meta_items(self) -> list[tuple[str, str]]:
        """Every ``meta`` row (``verify`` proves each value decodes)."""
        with self._reader() as db:
            return [(str(k), str(v)) for k, v in db.execute("SELECT key, value FROM meta")]

    def ids_of_kind(self, kind: int) -> list[ObjectId]:
        """The ids of every object of ``kind`` (an ``ObjectKind``)."""
        with self._reader() as db:
            rows = db.execute("SELECT id FROM objects WHERE kind=?", (kind,)).fetchall()
        return [ObjectId(bytes(r[0])) for r in rows]


class _Transaction:
    def __init__(self, catalog: Catalog) -> None:
        self._c = catalog

    def __enter__(self) -> sqlite3.Connection:
        self._c._lock.acquire()
        try:
            with _guard(self._c.path):
                self._c._db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._c._lock.release()
            raise
        return self._c._db

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        try:
            with _guard(self._c.path):
                if exc_type is None:
                    self._c._db.execute("COMMIT")
                else:
                    self._c._db.execute("ROLLBACK")
        finally:
            self._c._lock.release()
        if exc_type is None and self._c._copier is not None:
            self._c._copier.wake()
        if isinstance(exc, _SQL_ERRORS):  # a statement of the block met a damaged file
            raise catalog_error(self._c.path, exc) from None


def open_for_repair(path: str) -> tuple[Catalog, str | None]:
    """Opens the catalog for ``rebuild``; a damaged one (it fails to open, or SQLite's
    integrity check finds problems) is first renamed aside, never deleted, and a new one
    made, keeping the ``meta`` rows that can still be read (the v-number counter, the
    active checkpoint, an unfinished restore). Every other table comes back from the packs.

    Returns:
        The open catalog, and the path the damaged one was renamed to (None if sound).
    """
    try:
        cat = Catalog(path)
        problems = cat.integrity_problems()
        if not problems:
            return cat, None
        cat.close()
    except CatalogDamaged:
        pass
    meta: list[tuple[str, str]] = []
    try:
        old = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            for key, value in old.execute("SELECT key, value FROM meta"):
                if isinstance(key, str) and isinstance(value, str):
                    meta.append((key, value))
        finally:
            old.close()
    except _SQL_ERRORS:
        pass  # nothing readable: recover() derives the counter and the active checkpoint
    aside = f"{path}.damaged-{int(time.time())}"
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.rename(path + suffix, aside + suffix)
    cat = Catalog(path)
    with cat.transaction() as db:
        db.executemany("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", meta)
    return cat, aside


def insert_pack(
    db: sqlite3.Connection,
    name: PackName,
    pack_class: int,
    size: int,
    entries: list[Entry],
    *,
    replacing: AbstractSet[ObjectId] = frozenset(),
) -> int:
    """Inserts one pack and its objects inside an open transaction; returns the pack row id.

    Objects already in the catalog (a duplicate written by a racing put) keep their old row,
    except those in ``replacing``: fresh copies of objects whose old copy is damaged, whose
    rows move to this pack (the old bytes become garbage of their pack, as after a prune).
    """
    cur = db.execute(
        "INSERT INTO packs(name, class, size, objects) VALUES (?,?,?,?)",
        (name, pack_class, size, len(entries)),
    )
    pack_id = cur.lastrowid
    assert pack_id is not None
    # Into the small table of new rows (see "Objects in two tables" above), in id order, so
    # each of its leaves is visited once, in turn: a step's 7.1k rows into 122k took 23-24
    # ms of CPU so, 31-35 ms in the pack's order (same run, 5 each).
    db.executemany(
        "INSERT OR IGNORE INTO objects_new(id, pack, offset, stored_len, raw_len, kind, codec) "
        "SELECT ?,?,?,?,?,?,? WHERE NOT EXISTS (SELECT 1 FROM objects_main WHERE id = ?)",
        sorted(
            (e.id, pack_id, e.offset, e.stored_len, e.raw_len, e.kind, e.codec, e.id)
            for e in entries
        ),
    )
    if replacing:
        db.executemany(
            "UPDATE objects SET pack=?, offset=?, stored_len=?, raw_len=?, kind=?, codec=? "
            "WHERE id=?",
            (
                (pack_id, e.offset, e.stored_len, e.raw_len, e.kind, e.codec, e.id)
                for e in entries
                if e.id in replacing
            ),
        )
    return int(pack_id)


def delete_packs(db: sqlite3.Connection, pack_ids: Iterable[int]) -> set[ObjectId]:
    """Deletes pack rows and the rows of their objects inside an open transaction (for
    packs whose file is lost); returns the ids of the objects deleted."""
    lost: set[ObjectId] = set()
    for pid in pack_ids:
        rows = db.execute("SELECT id FROM objects WHERE pack=?", (pid,)).fetchall()
        lost.update(ObjectId(bytes(r[0])) for r in rows)
        db.execute("DELETE FROM objects WHERE pack=?", (pid,))
        db.execute("DELETE FROM packs WHERE id=?", (pid,))
    return lost


def delete_objects_past(
    db: sqlite3.Connection, pack_id: int, size: int, header: int
) -> set[ObjectId]:
    """Deletes the rows of a pack's objects whose entry (``header`` bytes, then the stored
    bytes) ends past ``size`` (a truncated pack) inside an open transaction; returns their
    ids."""
    rows = db.execute(
        "SELECT id FROM objects WHERE pack=? AND offset + ? + stored_len > ?",
        (pack_id, header, size),
    ).fetchall()
    db.executemany("DELETE FROM objects WHERE id=?", rows)
    return {ObjectId(bytes(r[0])) for r in rows}


def get_meta(db: sqlite3.Connection, key: str) -> str | None:
    """A ``meta`` value inside an open transaction (None if the key is absent)."""
    r = db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
    return None if r is None else str(r[0])


def set_meta(db: sqlite3.Connection, key: str, value: str | None) -> None:
    """Sets (or, with None, deletes) a ``meta`` key inside an open transaction; the keys
    of the checkpoint layer are declared in ``checkpoints/registry.py``."""
    if value is None:
        db.execute("DELETE FROM meta WHERE key=?", (key,))
    else:
        db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))


def add_meta_counter(db: sqlite3.Connection, key: str, delta: int) -> None:
    db.execute(
        "INSERT INTO meta(key, value) VALUES (?, ?) "
        "ON CONFLICT(key) DO UPDATE SET value = CAST(value AS INTEGER) + ?",
        (key, str(delta), delta),
    )


CommitHook = Callable[[sqlite3.Connection], None]
__all__ = [
    "Catalog",
    "CatalogDamaged",
    "CommitHook",
    "Located",
    "PackRow",
    "add_meta_counter",
    "catalog_error",
    "delete_objects_past",
    "delete_packs",
    "get_meta",
    "insert_pack",
    "open_for_repair",
    "set_meta",
]
