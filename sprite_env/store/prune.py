"""Garbage collection of the store: :func:`plan_prune`, then :meth:`PrunePlan.execute`.

The store knows nothing of trees, so the caller (the snapshot layer, which marks over its
trees) passes the set of object ids that are still reachable. Everything else in the catalog
is dead.

Planning reads only the catalog, never pack data, and changes nothing: a plan is a free dry
run. It sorts the packs into three lists, one class at a time:

- **delete**: no live object left in the pack.
- **rewrite**: at least ``repack_threshold`` of the pack's bytes are garbage (dead objects,
  their table rows, or entries the catalog never listed), or the pack is smaller than
  ``small_pack`` and there is another small pack (or a rewrite) of its class to merge with.
  The live objects are copied into new packs of the same class, up to
  ``target_pack_size`` each: the entry header and compressed payload are copied verbatim
  (no decompression, no recompression), after checking the header against the catalog.
- **keep**: untouched. Dead objects in kept packs lose their catalog row (so ``has`` is
  false and a later ``put`` stores them afresh) but their bytes stay on disk until the
  pack crosses the threshold at a later prune. (A ``rebuild`` from the packs would bring
  such objects back as dead objects; the next prune drops them again.)

Execution, in this order, so that a SIGKILL at any instant leaves the old state or the new
one and ``check(read_data=True)`` clean after reopening:

1. Write the new packs (``tmp/``, fsync, rename into ``packs/``, fsync the directory).
   A kill here leaves packs the catalog does not list: orphans, deleted by the next
   writable open.
2. One catalog transaction: delete the rows of the deleted and rewritten packs, insert the
   new packs' rows (with ids above every existing one, so a cached id -> name can never
   point at a different pack), repoint the moved objects to their new pack and offset, and
   delete the dead objects' rows. A kill before ``COMMIT`` rolls it all back.
3. After the commit, unlink the old pack files and fsync ``packs/``. A kill here leaves old
   packs the catalog no longer lists: orphans again, deleted by the next writable open.

Readers and deleted packs: on Linux, unlinking a file that a process has open does not
disturb it; the open fd keeps reading the old bytes until it is closed. So a reader that
opened an old pack before the prune deleted it keeps working, and
:meth:`~sprite_env.store.repository.Store.forget_pack` only drops the store's cached fd of
a deleted pack once no read is using it. A reader that looked an object up in the catalog
*before* the commit but opens the pack only *after* the unlink finds it missing
(``CorruptPack``); one that needs to survive a concurrent prune (the FUSE view) must either
open the pack fd before the prune commits or look the object up again on that error.
Looking up after the commit always gives the new location.

The live set must be computed against the state being pruned: no writer may commit between
computing it and executing the plan (a ``put`` of an object the store already has stores
nothing, so a snapshot written in between could refer to an object the plan thinks dead).
``execute`` refuses a plan whose catalog changed since it was made, but it cannot see a
commit that only re-referenced existing objects; the caller serializes prune and writes.

Damage (issue 15): a pack to rewrite that cannot be copied (missing, truncated, an entry
header that disagrees with the catalog, or catalog rows that disagree with each other)
stops the prune before any change, unless ``execute`` is given ``skip_damaged``: then that
pack is kept as it is (its dead rows are still dropped, as for any kept pack), the object
that failed is added to ``Store.damaged`` (so the next write stores it afresh), the pack is
named in ``PruneReport.damaged_packs``, and the rest of the plan goes on. Errors that
concern the whole catalog (a plan gone stale, row counts that disagree at the commit)
still raise, after rolling back: nothing is changed then.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Collection
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from sprite_env.errors import CorruptPack, StoreError
from sprite_env.ids import ObjectId, PackName
from sprite_env.store.faults import crashpoint
from sprite_env.store.pack import (
    ENTRY,
    FOOTER,
    HEADER,
    TABLE_ROW,
    TARGET_PACK_SIZE,
    Entry,
    PackWriter,
    _fsync_dir,
    pack_path,
    read_payload,
)

if TYPE_CHECKING:
    from sprite_env.store.catalog import CommitHook, PackRow
    from sprite_env.store.repository import Store

#: Packs smaller than this are merged when there is something to merge them with.
SMALL_PACK = 8 * 1024 * 1024
#: Rows fetched per catalog query while planning (keyset pagination on the primary key).
_BATCH = 50_000

#: Why ``execute`` refuses: the catalog does not match the plan. A caller that serializes
#: prunes and writes (the engine does) only sees this from a damaged catalog (issue 15:
#: a bad byte in the ``objects_by_pack`` index makes its queries disagree).
_STALE = (
    "the catalog does not match the prune's plan: the store changed since it was planned "
    "(plan again), or the catalog is damaged (see sprite-env store check)"
)

LiveSet = Collection[ObjectId] | Callable[[ObjectId], bool]
Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class PackUsage:
    """How much of one pack is still live, from the catalog alone.

    Byte counts include each object's entry header. ``garbage`` is every byte a pack holding
    only the live objects would not need: dead objects, their table rows, and entries the
    catalog does not list (duplicates of a racing write).
    """

    pack: PackRow
    live_objects: int
    live_bytes: int
    dead_objects: int
    dead_bytes: int

    @property
    def garbage(self) -> int:
        needed = self.live_bytes + TABLE_ROW.size * self.live_objects + HEADER.size + FOOTER.size
        return max(0, self.pack.size - needed)

    @property
    def garbage_ratio(self) -> float:
        return self.garbage / self.pack.size if self.pack.size else 1.0


@dataclass
class PrunePlan:
    """What a prune would do; :meth:`execute` does it. See the module docstring."""

    delete: list[PackUsage]
    rewrite: list[PackUsage]
    keep: list[PackUsage]
    #: Dead object ids, by the catalog id of the pack they are in.
    dead_by_pack: dict[int, list[ObjectId]] = field(repr=False)
    objects_dead: int
    #: Stored bytes of the dead objects, entry headers included.
    bytes_dead: int
    #: Pack bytes on disk that executing the plan should free (deleted packs, plus the
    #: rewritten packs minus their estimated replacements). Dead objects in kept packs
    #: are not counted: their bytes stay on disk.
    bytes_freed_estimate: int
    #: Live bytes (entry headers included) that will be copied into new packs.
    bytes_to_copy: int
    packs_deleted: int
    packs_rewritten: int
    packs_written_estimate: int
    #: Live ids (when given as a collection) that the catalog does not have: a sign of a
    #: damaged store or a stale live set. None when ``live`` was a predicate.
    live_missing: int | None
    target_pack_size: int
    _objects_total: int = field(repr=False)
    _packs_seen: tuple[tuple[int, str], ...] = field(repr=False)

    @property
    def dead(self) -> list[ObjectId]:
        """Every dead object id (built on demand)."""
        return [oid for ids in self.dead_by_pack.values() for oid in ids]

    @property
    def nothing_to_do(self) -> bool:
        return not (self.objects_dead or self.delete or self.rewrite)

    def execute(
        self,
        store: Store,
        progress: Progress | None = None,
        hook: CommitHook | None = None,
        *,
        skip_damaged: bool = False,
    ) -> PruneReport:
        """Carries the plan out; see :func:`execute_prune`."""
        return execute_prune(store, self, progress, hook, skip_damaged=skip_damaged)


@dataclass
class PruneReport:
    """What a prune did. Pack byte totals come from the catalog's pack sizes."""

    objects_removed: int = 0
    #: Old pack files removed: the entirely dead ones and the rewritten ones.
    packs_deleted: int = 0
    packs_written: int = 0
    new_packs: list[PackName] = field(default_factory=list)
    bytes_copied: int = 0
    pack_bytes_before: int = 0
    pack_bytes_after: int = 0
    seconds: float = 0.0
    #: Packs the plan would have rewritten but that could not be read (``skip_damaged``):
    #: kept as they are. Name -> why.
    damaged_packs: dict[PackName, str] = field(default_factory=dict)

    @property
    def bytes_freed(self) -> int:
        return self.pack_bytes_before - self.pack_bytes_after


def _live_predicate(live: LiveSet) -> tuple[Callable[[ObjectId], bool], int | None]:
    if callable(live):
        return live, None
    live_set = live if isinstance(live, AbstractSet) else frozenset(live)
    return live_set.__contains__, len(live_set)


def plan_prune(
    store: Store,
    live: LiveSet,
    *,
    repack_threshold: float = 0.10,
    small_pack: int = SMALL_PACK,
    target_pack_size: int = TARGET_PACK_SIZE,
) -> PrunePlan:
    """Decides what a prune of ``store`` would do, reading only the catalog.

    Args:
        store: the store (read-only is enough for a dry run).
        live: the ids still reachable: a collection (a set is used as is) or a predicate.
        repack_threshold: rewrite a pack once this fraction of its bytes is garbage.
        small_pack: packs below this size are merged with each other (per class).
        target_pack_size: rewritten packs are closed once they reach this size.
    """
    if not 0.0 < repack_threshold <= 1.0:
        raise ValueError(f"repack_threshold must be in (0, 1], got {repack_threshold}")
    if target_pack_size <= 0:
        raise ValueError(f"target_pack_size must be positive, got {target_pack_size}")
    cat = store.catalog
    is_live, live_len = _live_predicate(live)
    packs = cat.packs()
    totals = {
        int(p): (int(n), int(s))
        for p, n, s in cat.query(
            "SELECT pack, count(*), sum(stored_len) FROM objects GROUP BY pack"
        )
    }
    objects_total = sum(n for n, _ in totals.values())

    # One streaming pass over the object ids, a batch at a time (the catalog lock is held
    # only per batch). Only dead rows cost more than a set lookup.
    dead_by_pack: dict[int, list[ObjectId]] = {}
    dead_stored: dict[int, int] = {}
    last = b""
    while True:
        rows = cat.query(
            "SELECT id, pack, stored_len FROM objects WHERE id > ? ORDER BY id LIMIT ?",
            (last, _BATCH),
        )
        if not rows:
            break
        for oid, pack, slen in rows:
            if not is_live(oid):
                ids = dead_by_pack.get(pack)
                if ids is None:
                    ids = dead_by_pack[pack] = []
                    dead_stored[pack] = 0
                ids.append(oid)
                dead_stored[pack] += slen
        last = rows[-1][0]

    usages: list[PackUsage] = []
    for p in packs:
        n, stored = totals.get(p.id, (0, 0))
        nd = len(dead_by_pack.get(p.id, ()))
        sd = dead_stored.get(p.id, 0)
        usages.append(
            PackUsage(
                pack=p,
                live_objects=n - nd,
                live_bytes=(stored - sd) + ENTRY.size * (n - nd),
                dead_objects=nd,
                dead_bytes=sd + ENTRY.size * nd,
            )
        )

    delete: list[PackUsage] = []
    rewrite: list[PackUsage] = []
    keep: list[PackUsage] = []
    for cls in sorted({u.pack.pack_class for u in usages}):
        in_class = [u for u in usages if u.pack.pack_class == cls]
        c_delete = [u for u in in_class if u.live_objects == 0]
        c_rewrite = [u for u in in_class if u.live_objects and u.garbage_ratio >= repack_threshold]
        decided = {u.pack.id for u in c_delete + c_rewrite}
        rest = [u for u in in_class if u.pack.id not in decided]
        small = [u for u in rest if u.pack.size < small_pack]
        if len(small) >= 2 or (small and c_rewrite):
            c_rewrite += small
            merged = {u.pack.id for u in small}
            rest = [u for u in rest if u.pack.id not in merged]
        c_rewrite.sort(key=lambda u: u.pack.id)  # oldest first: keeps write order locality
        delete += c_delete
        rewrite += c_rewrite
        keep += rest

    packs_written = 0
    new_bytes = 0
    for cls in {u.pack.pack_class for u in rewrite}:
        live_bytes = sum(u.live_bytes for u in rewrite if u.pack.pack_class == cls)
        live_objects = sum(u.live_objects for u in rewrite if u.pack.pack_class == cls)
        n_packs = max(1, math.ceil(live_bytes / target_pack_size))
        packs_written += n_packs
        new_bytes += (
            live_bytes + TABLE_ROW.size * live_objects + n_packs * (HEADER.size + FOOTER.size)
        )
    removed_bytes = sum(u.pack.size for u in delete + rewrite)
    objects_dead = sum(len(ids) for ids in dead_by_pack.values())
    return PrunePlan(
        delete=delete,
        rewrite=rewrite,
        keep=keep,
        dead_by_pack=dead_by_pack,
        objects_dead=objects_dead,
        bytes_dead=sum(dead_stored.values()) + ENTRY.size * objects_dead,
        bytes_freed_estimate=max(0, removed_bytes - new_bytes),
        bytes_to_copy=sum(u.live_bytes for u in rewrite),
        packs_deleted=len(delete),
        packs_rewritten=len(rewrite),
        packs_written_estimate=packs_written,
        live_missing=None if live_len is None else live_len - (objects_total - objects_dead),
        target_pack_size=target_pack_size,
        _objects_total=objects_total,
        _packs_seen=tuple((p.id, p.name) for p in packs),
    )


@dataclass
class _NewPack:
    name: PackName
    pack_class: int
    size: int
    entries: list[Entry]


def _pack_bytes(store: Store) -> int:
    return int(store.catalog.query("SELECT coalesce(sum(size), 0) FROM packs")[0][0])


def _check_current(store: Store, plan: PrunePlan) -> None:
    seen = tuple((p.id, p.name) for p in store.catalog.packs())
    if seen != plan._packs_seen or store.catalog.object_count() != plan._objects_total:
        raise StoreError(_STALE)


def _live_entries(
    store: Store, u: PackUsage, dead: AbstractSet[ObjectId]
) -> list[tuple[Entry, bytes]]:
    """A rewritten pack's live objects with their stored payloads, each checked against its
    catalog row. All are read before any is copied, so a pack that fails part-way adds
    nothing to the new packs (``skip_damaged`` keeps it whole); a pack is ~32 MiB, so this
    holds at most about that much.

    Raises:
        CorruptPack: the pack is missing or an object is not where the catalog says
            (that object is added to ``store.damaged``).
    """
    live = [e for e in store.catalog.objects_in_pack(u.pack.id) if e.id not in dead]
    if len(live) != u.live_objects:
        # Two catalog queries disagree about this pack (a damaged index, or a writer).
        raise CorruptPack(
            u.pack.name,
            None,
            f"the catalog lists {len(live)} live objects, planned {u.live_objects}",
        )
    try:
        slot = store.pack_files.acquire(u.pack.name)
    except FileNotFoundError:
        raise CorruptPack(u.pack.name, None, "pack file is missing") from None
    try:
        out = []
        for e in live:
            try:
                # strict: the header is copied verbatim, so it must agree in every field
                out.append((e, read_payload(slot.fd, u.pack.name, e, strict=True)))
            except CorruptPack:
                store.damaged.add(e.id)
                raise
        return out
    finally:
        store.pack_files.release(slot)


def _write_new_packs(
    store: Store, plan: PrunePlan, progress: Progress | None, skip_damaged: bool
) -> tuple[list[_NewPack], dict[int, str]]:
    """Copies the live objects of the rewritten packs into new published packs.

    Returns:
        The new packs, and the rewritten packs skipped as damaged (catalog id -> why).
    """
    written: list[_NewPack] = []
    skipped: dict[int, str] = {}
    w: PackWriter | None = None
    copied = 0

    def finish(w: PackWriter) -> None:
        name, size = w.finish(store.packs_dir)
        written.append(_NewPack(name, w.pack_class, size, w.entries))

    try:
        for cls in sorted({u.pack.pack_class for u in plan.rewrite}):
            for u in (u for u in plan.rewrite if u.pack.pack_class == cls):
                dead = set(plan.dead_by_pack.get(u.pack.id, ()))
                try:
                    live = _live_entries(store, u, dead)
                except CorruptPack as err:
                    if not skip_damaged:
                        raise
                    skipped[u.pack.id] = err.reason
                    continue
                for e, payload in live:
                    if w is None:
                        w = PackWriter(store.tmp_dir, cls)
                    w.add(e.id, e.kind, e.codec, payload, e.raw_len)
                    copied += ENTRY.size + e.stored_len
                    if w.size >= plan.target_pack_size:
                        finish(w)
                        w = None
                    if progress:
                        progress(copied, plan.bytes_to_copy)
            if w is not None:
                finish(w)
                w = None
    except BaseException:
        if w is not None:
            w.abort()
        _discard(store, written)
        raise
    return written, skipped


def _discard(store: Store, written: list[_NewPack]) -> None:
    """Unlinks new packs the catalog does not list (a failed prune's leftovers).

    A new pack can be byte-identical to a listed one (a rewrite that reproduces a pack),
    in which case the file is that pack's and stays.
    """
    listed = {p.name for p in store.catalog.packs()}
    for np in written:
        if np.name not in listed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(pack_path(store.packs_dir, np.name))


def _commit(store: Store, plan: PrunePlan, written: list[_NewPack], hook: CommitHook | None) -> int:
    """The one catalog transaction; returns the number of object rows deleted."""
    old_ids = [u.pack.id for u in plan.delete + plan.rewrite]
    moved = sum(len(np.entries) for np in written)
    with store.catalog.transaction() as db:
        base = int(db.execute("SELECT coalesce(max(id), 0) FROM packs").fetchone()[0])
        # Old rows first: a new pack may be byte-identical (same name) to an old one.
        db.executemany("DELETE FROM packs WHERE id=?", ((i,) for i in old_ids))
        repointed = 0
        for k, np in enumerate(written):
            pack_id = base + 1 + k
            db.execute(
                "INSERT INTO packs(id, name, class, size, objects) VALUES (?,?,?,?,?)",
                (pack_id, np.name, np.pack_class, np.size, len(np.entries)),
            )
            # The two tables behind the view ``objects`` (catalog.py), each by itself: the
            # counts that prove the plan still holds are those of real rows (the view's
            # triggers report none).
            for table in _OBJECT_TABLES:
                cur = db.executemany(
                    f"UPDATE {table} SET pack=?, offset=? WHERE id=?",
                    ((pack_id, e.offset, e.id) for e in np.entries),
                )
                repointed += cur.rowcount
        crashpoint("prune-mid-commit")
        removed = 0
        for table in _OBJECT_TABLES:
            for i in old_ids:  # what is left in the old packs is dead
                removed += db.execute(f"DELETE FROM {table} WHERE pack=?", (i,)).rowcount
            for u in plan.keep:
                ids = plan.dead_by_pack.get(u.pack.id)
                if ids:
                    cur = db.executemany(
                        f"DELETE FROM {table} WHERE id=? AND pack=?",
                        ((oid, u.pack.id) for oid in ids),
                    )
                    removed += cur.rowcount
        if repointed != moved or removed != plan.objects_dead:
            # raising rolls the transaction back
            raise StoreError(_STALE)
        if hook is not None:
            hook(db)
    return removed


#: The tables behind the catalog's view ``objects`` (schema 6, ``store/catalog.py``).
_OBJECT_TABLES = ("objects_main", "objects_new")


def execute_prune(
    store: Store,
    plan: PrunePlan,
    progress: Progress | None = None,
    hook: CommitHook | None = None,
    *,
    skip_damaged: bool = False,
) -> PruneReport:
    """Carries out a plan made by :func:`plan_prune` on the same, unchanged store.

    Args:
        store: the store, open for writing.
        plan: the plan.
        progress: called with (bytes copied, bytes to copy) while writing the new packs.
        hook: called with the open transaction's connection, to change rows that must
            commit together with the prune (e.g. drop cache rows naming dead trees). It is
            not called when the plan has nothing to do.
        skip_damaged: keep a pack to rewrite that cannot be copied, and go on (see the
            module docstring); its name and why are in the report's ``damaged_packs``.

    Raises:
        StoreError: the store is read-only, or it changed since the plan was made, or the
            catalog's row counts disagree at the commit; nothing is changed.
        CorruptPack: (without ``skip_damaged``) an object to copy is not where the catalog
            says; nothing is changed.
    """
    if not store.writable:
        raise StoreError("prune needs the store open for writing")
    t0 = time.monotonic()
    _check_current(store, plan)
    report = PruneReport()
    report.pack_bytes_before = report.pack_bytes_after = _pack_bytes(store)
    if plan.nothing_to_do:
        report.seconds = time.monotonic() - t0
        return report

    written, skipped = _write_new_packs(store, plan, progress, skip_damaged)
    if skipped:  # the damaged packs stay: as kept packs, only their dead rows go
        plan = replace(
            plan,
            rewrite=[u for u in plan.rewrite if u.pack.id not in skipped],
            keep=plan.keep + [u for u in plan.rewrite if u.pack.id in skipped],
        )
        report.damaged_packs = {
            u.pack.name: skipped[u.pack.id] for u in plan.keep if u.pack.id in skipped
        }
    crashpoint("prune-after-write")
    try:
        removed = _commit(store, plan, written, hook)
    except BaseException:
        _discard(store, written)
        raise
    crashpoint("prune-after-commit")
    store.catalog.forget_pack_names()

    new_names = {np.name for np in written}
    old = [u.pack.name for u in plan.delete + plan.rewrite]
    for name in old:
        store.forget_pack(name)
        if name in new_names:  # rewritten into an identical pack: the file is the new one
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(pack_path(store.packs_dir, name))
        crashpoint("prune-mid-unlink")
    _fsync_dir(store.packs_dir)

    report.objects_removed = removed
    report.packs_deleted = len(old)
    report.packs_written = len(written)
    report.new_packs = [np.name for np in written]
    report.bytes_copied = sum(ENTRY.size + e.stored_len for np in written for e in np.entries)
    report.pack_bytes_after = _pack_bytes(store)
    report.seconds = time.monotonic() - t0
    return report


__all__ = [
    "SMALL_PACK",
    "PackUsage",
    "PrunePlan",
    "PruneReport",
    "execute_prune",
    "plan_prune",
]
