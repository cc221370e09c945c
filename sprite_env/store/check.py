"""Store maintenance: ``check`` (the oracle of every reliability test), ``rebuild`` of the
catalog from the packs alone, and ``stats``.

``check`` without ``read_data`` proves that every catalog row points into an existing pack
file of the recorded size whose table (verified by its hash) lists that object at that
offset; with ``read_data`` it also re-hashes every pack file against its name and every
object against its id. Either way it reports a store the group or others may read.

It first runs SQLite's ``integrity_check`` on the catalog (every page, and every index
against its table), and it never raises for a damaged catalog: each problem is a line in
``errors``, and ``rebuild_helps`` says when the catalog (not the packs) is at fault, so that
``store rebuild-catalog`` would repair it. The objects whose bytes cannot be read as the
catalog says are in ``damaged``, for the checkpoint layer to name what needs them
(``checkpoints/verify.py``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import blake3

from sprite_env import privacy
from sprite_env.errors import CorruptPack, StoreError
from sprite_env.ids import ObjectId, PackName
from sprite_env.store.catalog import Catalog, insert_pack
from sprite_env.store.pack import (
    ENTRY,
    Entry,
    ObjectKind,
    pack_path,
    read_header,
    read_table,
    scan_entries,
)
from sprite_env.store.reader import MAX_RUN, read_entries

if TYPE_CHECKING:
    from sprite_env.store.repository import Store

Progress = Callable[[int, int], None]


@dataclass
class CheckReport:
    """What ``check`` found. ``ok`` only when ``errors`` is empty."""

    packs: int = 0
    objects: int = 0
    bytes_read: int = 0
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: Objects the catalog lists whose bytes cannot be read as it says: id -> why.
    damaged: dict[ObjectId, str] = field(default_factory=dict)
    #: Every object the catalog lists in a pack row (damaged ones included).
    listed: set[ObjectId] = field(default_factory=set)
    #: Objects the tables of orphan packs hold (``rebuild-catalog`` would adopt them).
    in_orphans: set[ObjectId] = field(default_factory=set)
    #: The catalog itself is damaged or wrong where the packs are sound.
    rebuild_helps: bool = False
    #: The catalog could not even be read to the end: the rest of the check was skipped.
    catalog_unreadable: bool = False

    @property
    def ok(self) -> bool:
        return not self.errors


def _hash_file(fd: int) -> str:
    h = blake3.blake3()
    off = 0
    while chunk := os.pread(fd, 8 << 20, off):
        h.update(chunk)
        off += len(chunk)
    return h.hexdigest()


def check(
    store: Store, *, read_data: bool = False, progress: Progress | None = None
) -> CheckReport:
    """Verifies the store against its catalog; see the module docstring.

    Never raises for damage it finds: every problem becomes a line in ``errors`` naming the
    pack and offset.
    """
    report = CheckReport()
    _check_privacy(store, report)
    problems = store.catalog.integrity_problems()
    if problems:
        report.rebuild_helps = True
        more = f" (and {len(problems) - 5} more)" if problems[5:] else ""
        shown = "; ".join(problems[:5]) + more
        report.errors.append(f"catalog: SQLite integrity check failed: {shown}")
    try:
        _check_packs(store, read_data, progress, report)
    except StoreError as e:  # the catalog cannot be read further (CatalogDamaged)
        report.rebuild_helps = report.catalog_unreadable = True
        report.errors.append(str(e))
    return report


def _check_packs(
    store: Store, read_data: bool, progress: Progress | None, report: CheckReport
) -> None:
    packs = store.catalog.packs()
    known = {p.name for p in packs}
    if store.remote is not None:
        store.remote.refresh()  # the bucket as it is now, not as this process first saw it
    for fname in sorted(os.listdir(store.packs_dir)):
        if fname.endswith(".pack") and fname[:-5] not in known:
            report.warnings.append(f"pack {fname[:-5]} is not in the catalog (orphan)")
            _orphan_table(store, PackName(fname[:-5]), report)
    dangling = store.catalog.query(
        "SELECT count(*) FROM objects WHERE pack NOT IN (SELECT id FROM packs)"
    )[0][0]
    if dangling:
        report.rebuild_helps = True
        report.errors.append(f"{dangling} catalog objects refer to no pack")
    for i, p in enumerate(packs):
        report.packs += 1
        rows = store.catalog.objects_in_pack(p.id)
        report.objects += len(rows)
        report.listed.update(r.id for r in rows)
        _check_pack(store, p.name, p.size, p.pack_class, rows, read_data, report)
        if progress:
            progress(i + 1, len(packs))


def _orphan_table(store: Store, name: PackName, report: CheckReport) -> None:
    try:
        fd = os.open(pack_path(store.packs_dir, name), os.O_RDONLY)
    except OSError:
        return
    try:
        read_header(fd, name)
        report.in_orphans.update(e.id for e in read_table(fd, name))
    except (CorruptPack, OSError):
        pass  # a damaged orphan: rebuild would scan it, but vouches for nothing here
    finally:
        os.close(fd)


def _check_privacy(store: Store, report: CheckReport) -> None:
    """An error if the group or others may use anything in the store (0700 directories
    and 0600 files expected; see ``sprite_env/privacy.py``): a pack holds every captured
    byte, whatever the file's own mode was. Read-only, so it only says how to fix it."""
    try:
        found = privacy.exposed(store.path)
    except OSError as e:
        report.errors.append(f"store {store.path}: cannot check its permissions: {e}")
        return
    if not found:
        return
    dirs = sum(p.is_dir for p in found)
    report.errors.append(
        f"store {store.path} is not private: {dirs} directories and {len(found) - dirs} "
        f"files have group or other permissions (e.g. {found[0].path} "
        f"{found[0].mode:04o}), so users other than its owner may be able to read the "
        f"checkpoints' data. Fix: chmod -R go= {store.path} (opening the store for "
        "writing, as the daemon does when it starts, makes it private too)"
    )


def _check_pack(
    store: Store,
    name: PackName,
    size: int,
    pack_class: int,
    rows: list[Entry],
    read_data: bool,
    report: CheckReport,
) -> None:
    remote = store.remote
    path = pack_path(store.packs_dir, name)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        fd = -1
    if fd >= 0:
        try:
            _check_copy(name, fd, size, pack_class, rows, read_data, store.damaged, report, "")
        finally:
            os.close(fd)
    if remote is None:
        if fd < 0:
            _missing(name, rows, report, "")
        return
    # A store in object storage: the bucket's copy is the one that lasts. Without
    # read_data its listed size is checked (and the cached copy, if no local file was);
    # with it every pack the bucket holds is downloaded afresh and read whole, so damage
    # in the bucket is found even where the cache holds a sound copy.
    where = f"{remote.storage!r}: "
    try:
        listed = remote.size(name) if read_data or fd < 0 else None
    except StoreError as e:
        report.errors.append(f"{where}cannot list pack {name}: {e}")
        return
    if fd >= 0 and not read_data:
        return
    cached = pack_path(remote.dir, name)
    if not read_data:
        try:
            fd = os.open(cached, os.O_RDONLY)
        except FileNotFoundError:
            if listed is None:
                _missing(name, rows, report, where)
            elif listed != size:
                report.errors.append(f"{where}pack {name}: size {listed}, catalog says {size}")
            return
        try:
            _check_copy(name, fd, size, pack_class, rows, False, store.damaged, report, "")
        finally:
            os.close(fd)
        return
    if listed is None and fd >= 0:
        return  # captured here and not uploaded yet: the local copy was the one to read
    tmp = os.path.join(store.tmp_dir, f"check-{name}.pack")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    try:
        remote.download(name, tmp)
    except FileNotFoundError:
        _missing(name, rows, report, where)
        return
    except StoreError as e:
        report.errors.append(f"{where}pack {name}: cannot download it: {e}")
        return
    try:
        fd = os.open(tmp, os.O_RDONLY)
        os.unlink(tmp)  # read through the descriptor; nothing left behind
        try:
            _check_copy(name, fd, size, pack_class, rows, True, store.damaged, report, where)
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _missing(name: PackName, rows: list[Entry], report: CheckReport, where: str) -> None:
    report.errors.append(f"{where}pack {name}: missing ({len(rows)} objects lost)")
    for r in rows:
        report.damaged[r.id] = f"pack {name} is missing"


def _check_copy(
    name: PackName,
    fd: int,
    size: int,
    pack_class: int,
    rows: list[Entry],
    read_data: bool,
    damaged: set[ObjectId],
    report: CheckReport,
    where: str,
) -> None:
    """Checks one copy of a pack (``where`` prefixes what it finds: the bucket's, or ""
    for the local file) against the catalog's rows."""
    actual = os.fstat(fd).st_size
    if actual != size:
        report.errors.append(f"{where}pack {name}: size {actual}, catalog says {size} (truncated?)")
        for r in rows:
            if r.offset + ENTRY.size + r.stored_len > actual:
                report.damaged[r.id] = f"pack {name} ends before it ({actual} bytes)"
    try:
        if read_header(fd, name) != pack_class:
            report.errors.append(f"{where}pack {name}: class differs from the catalog")
        table = {e.id: e for e in read_table(fd, name)}
    except CorruptPack as e:
        report.errors.append(f"{where}{e}")
        table = {}
    for r in rows:
        t = table.get(r.id)
        if table and t != r:
            # the pack's table verified by its hash, so the catalog's row is what is wrong
            report.rebuild_helps = True
            report.damaged[r.id] = f"not where the catalog says in pack {name}"
            report.errors.append(
                f"{where}pack {name} at offset {r.offset}: object {r.id.hex()[:16]} is "
                "not where the catalog says"
            )
    if read_data:
        if _hash_file(fd) != name:
            report.errors.append(f"{where}pack {name}: contents do not match its name (hash)")
        report.bytes_read += actual
        for oid, err in _read_all(name, fd, rows, damaged).items():
            report.damaged.setdefault(oid, f"{where}{err}")
            report.errors.append(f"{where}{err}")


def _read_all(
    name: PackName, fd: int, entries: list[Entry], damaged: set[ObjectId] | None
) -> dict[ObjectId, CorruptPack]:
    """Reads and re-hashes every object of ``entries`` through the store's reader, in
    offset order and batches of about ``MAX_RUN`` raw bytes (a pack's objects all at once
    could be ~100 MiB decoded); returns the objects that fail, with why."""
    bad: dict[ObjectId, CorruptPack] = {}
    batch: list[Entry] = []
    size = 0
    for e in sorted(entries, key=lambda e: e.offset):
        batch.append(e)
        size += e.raw_len
        if size >= MAX_RUN:
            read_entries(name, fd, batch, damaged=damaged, errors=bad)
            batch, size = [], 0
    if batch:
        read_entries(name, fd, batch, damaged=damaged, errors=bad)
    return bad


@dataclass
class RebuildReport:
    packs: int = 0
    objects: int = 0
    duplicates: int = 0
    damaged_packs: list[str] = field(default_factory=list)


def rebuild(store: Store) -> RebuildReport:
    """Rebuilds the catalog's store tables from the pack files alone.

    Each pack's table is used when its hash verifies; a pack with a damaged table is
    scanned entry by entry and every object in it re-hashed, keeping only sound ones. The
    new tables replace the old ones in one transaction. Needs the store open for writing.
    """
    if not store.writable:
        raise StoreError("rebuild needs the store open for writing")
    cache = os.path.join(store.path, "cache")  # backend.CACHE_DIR
    if store.remote is not None or os.path.isdir(cache):
        # Its packs are in the bucket, most of them nowhere here: a catalog rebuilt from
        # packs/ alone would forget every checkpoint that needs them.
        raise StoreError(
            f"{store.path} keeps its packs in object storage: a catalog rebuilt from the "
            "local packs alone would lose the rest, so nothing was changed. Its catalog "
            "comes from the bucket: move this directory aside, and the next open with the "
            "same --store s3://BUCKET/PREFIX pulls the newest generation's"
        )
    report = RebuildReport()
    found: list[tuple[PackName, int, int, list[Entry]]] = []
    for fname in sorted(os.listdir(store.packs_dir)):
        if not fname.endswith(".pack"):
            continue
        name = PackName(fname[:-5])
        fd = os.open(os.path.join(store.packs_dir, fname), os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            try:
                cls = read_header(fd, name)
            except CorruptPack:
                report.damaged_packs.append(name)
                continue
            try:
                entries = read_table(fd, name)
            except CorruptPack:
                report.damaged_packs.append(name)
                scanned = list(scan_entries(fd, name))
                bad = _read_all(name, fd, scanned, None)
                entries = [e for e in scanned if e.id not in bad]
        finally:
            os.close(fd)
        found.append((name, cls, size, entries))
    cat: Catalog = store.catalog
    with cat.transaction() as db:
        # The view's tables themselves: through its trigger a row at a time (catalog.py).
        db.execute("DELETE FROM objects_main")
        db.execute("DELETE FROM objects_new")
        db.execute("DELETE FROM packs")
        seen: set[bytes] = set()
        for name, cls, size, entries in found:
            unique = [e for e in entries if e.id not in seen]
            report.duplicates += len(entries) - len(unique)
            seen.update(e.id for e in unique)
            insert_pack(db, name, cls, size, unique)
            report.packs += 1
            report.objects += len(unique)
    cat.forget_pack_names()
    return report


@dataclass
class Stats:
    objects: int
    objects_by_kind: dict[str, int]
    packs: int
    pack_bytes: int
    raw_bytes: int
    stored_bytes: int
    ingested_bytes: int
    #: The file system holding the store: its size and what is free (``statvfs``).
    fs_total_bytes: int = 0
    fs_free_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            **self.__dict__,
            "compression_ratio": self.compression_ratio,
            "dedup_ratio": self.dedup_ratio,
        }

    @property
    def compression_ratio(self) -> float:
        return self.raw_bytes / self.stored_bytes if self.stored_bytes else 1.0

    @property
    def dedup_ratio(self) -> float:
        return self.ingested_bytes / self.raw_bytes if self.raw_bytes else 1.0


def stats(store: Store) -> Stats:
    """Counts objects and bytes; ratios are derived properties."""
    q = store.catalog.query
    by_kind = {
        ObjectKind(k).name.lower(): int(n)
        for k, n in q("SELECT kind, count(*) FROM objects GROUP BY kind")
    }
    objects, raw, stored = q(
        "SELECT count(*), coalesce(sum(raw_len), 0), coalesce(sum(stored_len), 0) FROM objects"
    )[0]
    packs, pack_bytes = q("SELECT count(*), coalesce(sum(size), 0) FROM packs")[0]
    fs = os.statvfs(store.path)
    return Stats(
        objects=int(objects),
        objects_by_kind=by_kind,
        packs=int(packs),
        pack_bytes=int(pack_bytes),
        raw_bytes=int(raw),
        stored_bytes=int(stored),
        ingested_bytes=int(store.catalog.meta("ingested_bytes", "0") or 0),
        fs_total_bytes=fs.f_blocks * fs.f_frsize,
        fs_free_bytes=fs.f_bavail * fs.f_frsize,
    )
