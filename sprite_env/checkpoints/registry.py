"""The registry of checkpoints: ids, records, the active checkpoint.

Ids: manual checkpoints are ``v0, v1, ...`` from a counter that never goes back, so an id
is never reused after a delete; automatic ones are ``auto-<UTC time>`` (for example
``auto-20261129T081500Z``, with ``-2``, ``-3`` ... if two fall in one second) and take no
v-number. Rows live in the catalog's ``checkpoints`` table (schema in
``store/catalog.py``); each row is repeated in a small JSON META object in the store, so
the registry can be rebuilt from the packs.

This module owns the ``checkpoints`` table: no other module names it in SQL (a test greps
for it, ``tests/store/test_table_owners.py``); its creation is a migration in
``store/catalog.py``, where the whole schema is described. The checkpoint layer's keys of
the catalog's ``meta`` table are declared in :data:`META_KEYS`.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sprite_env.errors import UserError
from sprite_env.ids import ObjectId
from sprite_env.snapshot import dircache
from sprite_env.store.catalog import get_meta
from sprite_env.store.catalog import set_meta as set_catalog_meta
from sprite_env.store.pack import ObjectKind

if TYPE_CHECKING:
    import builtins
    import sqlite3

    from sprite_env.store import Store
    from sprite_env.store.catalog import Catalog

MANUAL_RE = re.compile(r"^v(0|[1-9][0-9]{0,17})$")
AUTO_RE = re.compile(r"^auto-[0-9]{8}T[0-9]{6}Z(-[0-9]{1,6})?$")


class UnknownCheckpoint(UserError):
    def __init__(self, cid: str) -> None:
        super().__init__(f"checkpoint {cid!r} not found")
        self.checkpoint = cid


class InvalidCheckpointId(UserError):
    def __init__(self, cid: str) -> None:
        super().__init__(
            f"invalid checkpoint id {cid[:80]!r}: expected vN or auto-YYYYMMDDTHHMMSSZ"
        )


def validate_id(cid: str) -> str:
    # fullmatch: "$" also matches before a final newline, so match() took "v0\n".
    if not (MANUAL_RE.fullmatch(cid) or AUTO_RE.fullmatch(cid)):
        raise InvalidCheckpointId(cid)
    return cid


@dataclass
class Checkpoint:
    """One checkpoint's record, as the API shows it (plus the tree it points to)."""

    id: str
    seq: int | None
    is_auto: bool
    create_time_ns: int
    comment: str
    created_by: str
    parent: str | None
    history: list[str]
    top_tree: ObjectId
    files: int
    dirs: int
    bytes: int
    bytes_added: int
    warnings: list[dict[str, str]] = field(default_factory=list)
    record: ObjectId | None = None
    #: How the capture found what changed: "journal" (the change journal narrowed the
    #: walk) or "full", with why a full walk. Records older than these fields decode with
    #: the defaults: every capture then walked everything.
    walk: str = "full"
    walk_reason: str = ""

    @property
    def create_time(self) -> str:
        """RFC 3339, UTC, microseconds (what Sprites' API shows)."""
        dt = datetime.fromtimestamp(self.create_time_ns / 1e9, tz=UTC)
        return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def to_json(self, *, active: str | None = None) -> dict[str, Any]:
        return {
            "id": self.id,
            "create_time": self.create_time,
            "comment": self.comment,
            "is_auto": self.is_auto,
            "history": self.history,
            "created_by": self.created_by,
            "parent": self.parent,
            "files": self.files,
            "dirs": self.dirs,
            "bytes": self.bytes,
            "bytes_added": self.bytes_added,
            "warnings": self.warnings,
            "walk": self.walk,
            "walk_reason": self.walk_reason,
            "is_active": self.id == active,
        }

    def record_bytes(self) -> builtins.bytes:
        """The META object that repeats this row (for rebuilding the registry)."""
        d = asdict(self)
        d["top_tree"] = self.top_tree.hex()
        d.pop("record")
        return json.dumps({"checkpoint": d}, sort_keys=True).encode()


_COLUMNS = (
    "id, seq, is_auto, create_time_ns, comment, created_by, parent, history, top_tree, "
    "files, dirs, bytes, bytes_added, warnings, record, walk, walk_reason"
)


def _from_row(r: tuple[Any, ...]) -> Checkpoint:
    return Checkpoint(
        id=r[0],
        seq=r[1],
        is_auto=bool(r[2]),
        create_time_ns=r[3],
        comment=r[4],
        created_by=r[5],
        parent=r[6],
        history=json.loads(r[7]),
        top_tree=ObjectId(bytes(r[8])),
        files=r[9],
        dirs=r[10],
        bytes=r[11],
        bytes_added=r[12],
        warnings=json.loads(r[13]),
        record=ObjectId(bytes(r[14])),
        walk=r[15],
        walk_reason=r[16],
    )


class Registry:
    """Reads and writes checkpoint rows in the catalog."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def get(self, cid: str) -> Checkpoint:
        validate_id(cid)
        rows = self.catalog.query(f"SELECT {_COLUMNS} FROM checkpoints WHERE id=?", (cid,))
        if not rows:
            raise UnknownCheckpoint(cid)
        return _from_row(rows[0])

    def all(self) -> list[Checkpoint]:
        """Every checkpoint, newest first."""
        rows = self.catalog.query(
            f"SELECT {_COLUMNS} FROM checkpoints ORDER BY create_time_ns DESC, rowid DESC"
        )
        return [_from_row(r) for r in rows]

    def active(self) -> str | None:
        return self.catalog.meta("active")

    def next_manual_id(self) -> tuple[str, int]:
        seq = int(self.catalog.meta("next_seq", "0") or 0)
        return f"v{seq}", seq

    def next_auto_id(self, now_ns: int | None = None) -> str:
        """``auto-<UTC second>``, with ``-N`` when that second is taken. Never reused, like
        v-ids: an "undo with: ..." printed earlier must not come to mean another state."""
        now = now_ns if now_ns is not None else time.time_ns()
        base = "auto-" + datetime.fromtimestamp(now / 1e9, tz=UTC).strftime("%Y%m%dT%H%M%SZ")
        taken = {
            r[0]
            for r in self.catalog.query(
                "SELECT id FROM checkpoints WHERE id = ? OR id LIKE ?", (base, base + "-%")
            )
        }
        last = self.catalog.meta("last_auto") or ""
        n = 1
        if last == base:
            n = 2
        elif last.startswith(base + "-") and last[len(base) + 1 :].isdigit():
            n = int(last[len(base) + 1 :]) + 1
        while (f"{base}-{n}" if n > 1 else base) in taken:
            n += 1
        return f"{base}-{n}" if n > 1 else base


def insert(db: sqlite3.Connection, c: Checkpoint) -> None:
    """Inserts a checkpoint row and makes it active (inside the capture's commit)."""
    assert c.record is not None
    db.execute(
        f"INSERT INTO checkpoints({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (
            c.id,
            c.seq,
            int(c.is_auto),
            c.create_time_ns,
            c.comment,
            c.created_by,
            c.parent,
            json.dumps(c.history),
            c.top_tree,
            c.files,
            c.dirs,
            c.bytes,
            c.bytes_added,
            json.dumps(c.warnings),
            c.record,
            c.walk,
            c.walk_reason,
        ),
    )
    if c.seq is not None:
        set_meta(db, "next_seq", str(c.seq + 1))
    if c.is_auto:
        set_meta(db, "last_auto", c.id)


#: The checkpoint layer's keys of the catalog's ``meta`` table, and what each holds.
META_KEYS: dict[str, str] = {
    "next_seq": "the n of the next manual vN (v-numbers are never reused)",
    "last_auto": "the id of the newest automatic checkpoint (for a same-second suffix)",
    "active": "the checkpoint last created or restored (it cannot be deleted)",
    "restore_intent": "JSON, present while a restore is unfinished (Engine.pending_restore)",
    "gc_pending": "1, or JSON {problems, damaged}, while a delete's collection is unfinished",
    "excludes": "JSON list of the patterns captures leave out (saved by --exclude)",
    "cache_root": "the real path of the live tree the files cache describes",
}


def set_meta(db: sqlite3.Connection, key: str, value: str | None) -> None:
    """Sets (None: deletes) one of :data:`META_KEYS` inside an open transaction."""
    if key not in META_KEYS:
        raise ValueError(f"not a meta key of the checkpoint layer: {key!r}")
    set_catalog_meta(db, key, value)


def delete(db: sqlite3.Connection, cid: str) -> None:
    db.execute("DELETE FROM checkpoints WHERE id=?", (cid,))


def recover(store: Store) -> int:
    """Re-inserts checkpoint rows from their META records (after ``rebuild``).

    Rows already present are kept; the v-number counter is raised past every recovered
    one; the files cache is emptied, since the trees it names may be gone. Returns the
    number of rows recovered.
    """
    known = {r[0] for r in store.catalog.query("SELECT id FROM checkpoints")}
    found: list[Checkpoint] = []
    for oid in store.catalog.ids_of_kind(ObjectKind.META):
        try:
            d = json.loads(store.read(oid))["checkpoint"]
            d["top_tree"] = ObjectId(bytes.fromhex(d["top_tree"]))
            cp = Checkpoint(**d, record=oid)
        except (ValueError, KeyError, TypeError):
            continue
        if cp.id not in known and store.has(cp.top_tree):
            found.append(cp)
    next_seq = int(store.catalog.meta("next_seq", "0") or 0)
    with store.catalog.transaction() as db:
        dircache.clear(db)
        for cp in found:
            insert(db, cp)
            if cp.seq is not None:
                next_seq = max(next_seq, cp.seq + 1)
        set_meta(db, "next_seq", str(next_seq))
        if get_meta(db, "active") is None and found:
            newest = max(found, key=lambda c: c.create_time_ns)
            set_meta(db, "active", newest.id)
    return len(found)
