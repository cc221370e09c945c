"""The checkpoint engine: the Python API that the CLI, the daemon and the FUSE view call.

An :class:`Engine` owns a layer root and a store (held open, so it is the one writer).
``create`` captures the root into a checkpoint; ``restore`` makes the root equal to one
(after an automatic checkpoint of what it replaces, so every restore can be undone);
``delete`` removes one and frees its space at once; ``preview`` and ``diff`` compare.

Crash safety: a checkpoint exists once its row committed (with its objects and the
files cache, in one transaction). A restore writes its intent first; an engine that opens
with an intent pending finishes that restore before anything else. A delete marks a
collection pending in the same transaction that removes the row; the next open finishes
it. A collection that damage keeps from finishing never fails the delete or an open: it is
reported and stays pending for a later delete (see :meth:`Engine.collect`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import time
import unicodedata
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sprite_env.checkpoints import registry
from sprite_env.checkpoints.gc import reach
from sprite_env.checkpoints.hashonly import HashOnlySink
from sprite_env.checkpoints.registry import Checkpoint, Registry
from sprite_env.errors import SnapshotError, SpriteError, StoreError, UserError
from sprite_env.journal import Journal, open_epoch
from sprite_env.snapshot import dircache
from sprite_env.snapshot.capture import CaptureResult, CaptureStats, Excludes, capture
from sprite_env.snapshot.diff import Change, Difference, diff_trees
from sprite_env.snapshot.restore import RestoreResult, RestoreStats, restore
from sprite_env.snapshot.tree import decode_tree, encode_tree
from sprite_env.store import ObjectKind, Store, open_store
from sprite_env.store.faults import crashpoint
from sprite_env.store.prune import PruneReport, plan_prune

#: The command a damaged store's messages point to.
CHECK_HINT = "sprite-env store check --read-data"

if TYPE_CHECKING:
    from sprite_env.ids import ObjectId

MAX_COMMENT = 4096
log = logging.getLogger("sprite_env.engine")

#: Called with a phase name ("capture", "restore", "prune") and its running counters.
Progress = Callable[[str, Any], None]
#: Holds the layer still while entered (writers frozen). A create given one captures twice:
#: first with everything running (storing nearly all the data and refreshing the files
#: cache), then inside the pause, where only what changed meanwhile is read again.
Pause = Callable[[], AbstractContextManager[object]]


class ActiveCheckpoint(UserError):
    def __init__(self, cid: str) -> None:
        super().__init__(f"cannot delete active checkpoint {cid}")
        self.checkpoint = cid


class InvalidComment(UserError):
    code = "invalid_comment"


def check_comment(comment: str) -> str:
    if len(comment) > MAX_COMMENT:
        raise InvalidComment(f"comment too long ({len(comment)} characters; at most {MAX_COMMENT})")
    bad = [c for c in comment if unicodedata.category(c) == "Cc" and c not in "\t"]
    if bad:
        raise InvalidComment(f"comment contains control characters ({bad[0]!r})")
    # A lone surrogate (JSON "\ud800") has no UTF-8 form: the commit would fail after
    # the whole capture.
    lone = [c for c in comment if unicodedata.category(c) == "Cs"]
    if lone:
        raise InvalidComment(f"comment contains a lone surrogate ({lone[0]!r})")
    return comment


@dataclass
class DeleteReport:
    ids: list[str]
    bytes_freed: int
    objects_removed: int
    packs_deleted: int
    packs_written: int
    #: Why space was not (fully) freed: the damage the collection met (issue 15). The
    #: checkpoints are deleted all the same.
    problems: list[str] = field(default_factory=list)

    @property
    def id(self) -> str | None:
        return self.ids[0] if len(self.ids) == 1 else None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, **self.__dict__}


@dataclass
class CollectReport:
    """What :meth:`Engine.collect` freed, and what kept it from freeing everything."""

    prune: PruneReport
    #: One line per problem, naming the checkpoint, object or pack; empty when it finished.
    problems: list[str] = field(default_factory=list)


@dataclass
class RestoreReport:
    id: str | None  # None for a reset
    undo: str | None  # the automatic checkpoint of the replaced state
    stats: RestoreStats
    warnings: list[str] = field(default_factory=list)
    resumed: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "undo": self.undo,
            "resumed": self.resumed,
            "warnings": self.warnings,
            **self.stats.__dict__,
        }


@dataclass
class Preview:
    """What a restore would do: counts, and the paths."""

    target: str
    differences: list[Difference]

    def counts(self) -> dict[str, int]:
        # A restore undoes the live changes: what was added since is removed, and so on.
        out = {"create": 0, "change": 0, "remove": 0}
        for d in self.differences:
            if d.change is Change.ADDED:
                out["remove"] += 1
            elif d.change is Change.REMOVED:
                out["create"] += 1
            else:
                out["change"] += 1
        return out


class Engine:
    """Checkpoints of one layer root in one store. Not thread-safe: one job at a time.

    Args:
        root: the layer to capture and restore.
        store_dir: the store (created if missing).
        excludes: fnmatch patterns of paths (relative to root) never captured or touched.
            Given, they replace the store's saved list; None uses the saved list, so every
            command agrees on what a checkpoint holds.
        exclude_dirs: directories left out wherever they are (the store itself always is).
    """

    #: The change journal of the layer (the daemon's): captures that write the files cache
    #: walk only what it names. None: every capture walks the whole layer.
    journal: Journal | None = None

    def __init__(
        self,
        root: str,
        store_dir: str,
        *,
        excludes: list[str] | None = None,
        exclude_dirs: list[str] | None = None,
        resume: bool = True,
        progress: Progress | None = None,
    ) -> None:
        self.root = root
        self.store: Store = open_store(store_dir, create=True)
        try:
            self.registry = Registry(self.store.catalog)
            if excludes is None:
                excludes = json.loads(self.store.catalog.meta("excludes", "[]") or "[]")
            elif excludes != json.loads(self.store.catalog.meta("excludes", "[]") or "[]"):
                with self.store.catalog.transaction() as db:
                    registry.set_meta(db, "excludes", json.dumps(excludes))
            self.excludes = Excludes([p.encode() for p in excludes or []])
            for d in [store_dir, *(exclude_dirs or [])]:
                self.excludes.add_dir(d)
            self._bind_cache_to_root()
            self._forget_lost()
            if resume:
                self.resume_pending(progress)
        except BaseException:
            self.store.close()
            raise

    def close(self) -> None:
        self.store.close()

    def _bind_cache_to_root(self) -> None:
        # The files cache describes one live tree; used with another root it would only
        # cost re-reads (inodes differ), but a clean slate is clearer.
        here = os.path.realpath(self.root)
        if self.store.catalog.meta("cache_root") != here:
            with self.store.catalog.transaction() as db:
                db.execute("DELETE FROM dircache")
                registry.set_meta(db, "cache_root", here)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading ---------------------------------------------------------------------------

    def checkpoints(
        self, *, include_auto: bool = False, history: str | None = None
    ) -> list[Checkpoint]:
        """Checkpoints, newest first; ``history`` keeps those descending from that id."""
        out = self.registry.all()
        if not include_auto:
            out = [c for c in out if not c.is_auto]
        if history is not None:
            registry.validate_id(history)
            out = [c for c in out if c.id == history or history in c.history]
        return out

    def info(self, cid: str) -> Checkpoint:
        return self.registry.get(cid)

    def active(self) -> str | None:
        return self.registry.active()

    # -- create ----------------------------------------------------------------------------

    def create(
        self,
        comment: str = "",
        *,
        created_by: str = "user",
        auto: bool = False,
        progress: Progress | None = None,
        pause: Pause | None = None,
    ) -> Checkpoint:
        """Captures the root into a new checkpoint and makes it the active one."""
        cp = self._create(comment, created_by, auto, progress, skip_unchanged=False, pause=pause)
        assert cp is not None
        return cp

    def create_if_changed(
        self,
        comment: str = "",
        *,
        created_by: str = "scheduler",
        auto: bool = True,
        progress: Progress | None = None,
        pause: Pause | None = None,
    ) -> Checkpoint | None:
        """Like :meth:`create`, but returns None (and stores no checkpoint) when the layer
        equals the active checkpoint: what a timer wants, so an idle layer costs nothing."""
        return self._create(comment, created_by, auto, progress, skip_unchanged=True, pause=pause)

    def _create(
        self,
        comment: str,
        created_by: str,
        auto: bool,
        progress: Progress | None,
        *,
        skip_unchanged: bool,
        pause: Pause | None = None,
    ) -> Checkpoint | None:
        check_comment(comment)
        self._forget_lost()  # before the files cache is loaded: it must not reuse lost data
        prewarmed = self.prewarm(progress) if pause is not None else 0
        cache = dircache.load(self.store.catalog)
        parent = self.registry.active()
        history: list[str] = []
        parent_tree: ObjectId | None = None
        if parent is not None:
            try:
                pcp = self.registry.get(parent)
                history, parent_tree = [parent, *pcp.history], pcp.top_tree
            except registry.UnknownCheckpoint:
                history = [parent]
        with open_epoch(self.journal) as ep, self.store.writer() as w:
            with pause() if pause is not None else contextlib.nullcontext():
                r = capture(
                    self.root,
                    w,
                    self.store.read,
                    cache,
                    excludes=self.excludes,
                    progress=(lambda s: progress("capture", s)) if progress else None,
                    hint=ep.hint,
                    reread=ep.reread,
                )
                w.flush()
            walk = ep.walked(r)
            if skip_unchanged and r.top_tree == parent_tree:
                w.commit(lambda db: _save_cache(db, r))
                return None
            now = time.time_ns()
            if auto:
                cid, seq = self.registry.next_auto_id(now), None
            else:
                cid, seq = self.registry.next_manual_id()
            added = prewarmed + w.stats.bytes_stored
            cp = _checkpoint(cid, seq, auto, now, comment, created_by, parent, history, r, added)
            cp.walk, cp.walk_reason = walk
            cp.record = w.put(cp.record_bytes(), ObjectKind.META)

            def commit(db: Any) -> None:
                registry.insert(db, cp)
                registry.set_meta(db, "active", cid)
                _save_cache(db, r)

            w.commit(commit)
        return cp

    def prewarm(self, progress: Progress | None = None) -> int:
        """A capture whose objects and files cache are kept but which makes no checkpoint:
        the first of the two passes of a paused create (see ``Pause``), and what a host
        runs before taking its environment down for a restore, so that the undo
        checkpoint taken while it is down reads only what changed since. Returns the
        bytes it stored."""
        self._forget_lost()
        with open_epoch(self.journal) as ep, self.store.writer() as w:
            r = capture(
                self.root,
                w,
                self.store.read,
                dircache.load(self.store.catalog),
                excludes=self.excludes,
                progress=(lambda s: progress("prewarm", s)) if progress else None,
                hint=ep.hint,
                reread=ep.reread,
            )
            w.flush()
            ep.walked(r)
            w.commit(lambda db: _save_cache(db, r))
            return w.stats.bytes_stored

    # -- compare ---------------------------------------------------------------------------

    def _capture_live(self) -> tuple[CaptureResult, HashOnlySink]:
        sink = HashOnlySink(self.store)
        r = capture(
            self.root, sink, sink.read, dircache.load(self.store.catalog), excludes=self.excludes
        )
        return r, sink

    def diff(self, a: str, b: str | None = None) -> list[Difference]:
        """Changes from checkpoint ``a`` to checkpoint ``b`` (default: the live tree)."""
        ca = self.registry.get(a)
        if b is not None:
            cb = self.registry.get(b)
            return list(diff_trees(self.store.read, ca.top_tree, cb.top_tree))
        live, sink = self._capture_live()
        return list(diff_trees(sink.read, ca.top_tree, live.top_tree))

    def preview(self, cid: str) -> Preview:
        """What ``restore(cid)`` would create, change and remove, without doing it."""
        target = self.registry.get(cid)
        live, sink = self._capture_live()
        return Preview(cid, list(diff_trees(sink.read, target.top_tree, live.top_tree)))

    # -- restore ---------------------------------------------------------------------------

    def restore(
        self, cid: str, *, created_by: str = "user", progress: Progress | None = None
    ) -> RestoreReport:
        """Makes the root equal to checkpoint ``cid``; see the module docstring."""
        target = self.registry.get(cid)
        undo = self.create(
            f"before restore to {cid}", created_by=created_by, auto=True, progress=progress
        )
        self._write_intent({"target": cid, "undo": undo.id})
        res = self._restore_to(target.top_tree, target.id, undo.top_tree, self.store.read, progress)
        return RestoreReport(cid, undo.id, res.stats, res.warnings)

    def reset(self, *, created_by: str = "user", progress: Progress | None = None) -> RestoreReport:
        """Empties the layer (back to the base image below it), keeping every checkpoint;
        an automatic checkpoint of what it removes comes first, so it can be undone."""
        undo = self.create("before reset", created_by=created_by, auto=True, progress=progress)
        self._write_intent({"target": None, "undo": undo.id})
        empty = self._empty_top(undo.top_tree)
        res = self._restore_to(empty, None, undo.top_tree, self.store.read, progress)
        return RestoreReport(None, undo.id, res.stats, res.warnings)

    def _empty_top(self, top: ObjectId) -> ObjectId:
        """A top tree whose root keeps the metadata of ``top``'s root and holds nothing.
        Its objects belong to no checkpoint (a later prune drops them), so it is rebuilt,
        not remembered, when an interrupted reset resumes."""
        (dot,) = decode_tree(self.store.read(top))
        with self.store.writer() as w:
            inner = w.put(encode_tree([]), ObjectKind.TREE)
            out = w.put(encode_tree([replace(dot, payload=bytes(inner))]), ObjectKind.TREE)
            w.commit()
        return out

    def _write_intent(self, intent: dict[str, Any]) -> None:
        with self.store.catalog.transaction() as db:
            registry.set_meta(
                db, "restore_intent", json.dumps({**intent, "time_ns": time.time_ns()})
            )
        crashpoint("restore-after-intent")

    def _restore_to(
        self,
        target_top: ObjectId,
        target_id: str | None,
        live_top: ObjectId,
        read_tree: Callable[[ObjectId], bytes],
        progress: Progress | None,
    ) -> RestoreResult:
        res = restore(
            self.root,
            read_tree,
            self.store.read,
            live_top,
            target_top,
            excludes=self.excludes,
            progress=(lambda s: progress("restore", s)) if progress else None,
        )
        crashpoint("restore-before-commit")
        with self.store.catalog.transaction() as db:
            dircache.save(db, res.cache_changed, removed_trees=res.cache_removed)
            registry.set_meta(db, "active", target_id)
            registry.set_meta(db, "restore_intent", None)
        return res

    def pending_restore(self) -> dict[str, Any] | None:
        raw = self.store.catalog.meta("restore_intent")
        return json.loads(raw) if raw else None

    def resume_pending(self, progress: Progress | None = None) -> RestoreReport | None:
        """Finishes an interrupted delete's collection and an interrupted restore."""
        pending_gc = self.store.catalog.meta("gc_pending")
        if pending_gc:
            self._resume_collection(pending_gc)
        intent = self.pending_restore()
        if intent is None:
            return None
        try:
            if intent["target"] is None:  # a reset
                top = self._empty_top(self.registry.get(intent["undo"]).top_tree)
            else:
                top = self.registry.get(intent["target"]).top_tree
        except registry.UnknownCheckpoint:
            raise SnapshotError(
                f"an interrupted restore needs {intent['target'] or intent['undo']}, which is gone"
            ) from None
        live, sink = self._capture_live()  # the half-restored tree as it is now
        res = self._restore_to(top, intent["target"], live.top_tree, sink.read, progress)
        return RestoreReport(intent["target"], intent.get("undo"), res.stats, res.warnings, True)

    def export(self, cid: str, dest: str, *, progress: Progress | None = None) -> RestoreStats:
        """Writes checkpoint ``cid`` into the empty directory ``dest`` (root untouched)."""
        target = self.registry.get(cid)
        if os.listdir(dest):
            raise UserError(f"{dest} is not empty")
        try:
            res = restore(
                dest,
                self.store.read,
                self.store.read,
                None,
                target.top_tree,
                progress=(lambda s: progress("restore", s)) if progress else None,
                refresh_cache=False,
            )
        except StoreError as e:  # lost or damaged objects: say whose
            raise StoreError(f"checkpoint {cid} is damaged: {e} (see: {CHECK_HINT})") from None
        return res.stats

    # -- delete ----------------------------------------------------------------------------

    def delete(self, cid: str) -> DeleteReport:
        """Deletes a checkpoint and frees the space only it used."""
        return self.delete_many([cid])

    def delete_many(self, cids: list[str], progress: Progress | None = None) -> DeleteReport:
        """Deletes checkpoints in one transaction and one collection (a retention sweep)."""
        active = self.registry.active()
        for cid in cids:
            self.registry.get(cid)
            if cid == active:
                raise ActiveCheckpoint(cid)
        with self.store.catalog.transaction() as db:
            for cid in cids:
                registry.delete(db, cid)
            registry.set_meta(db, "gc_pending", "1")
        crashpoint("delete-after-row")
        rep = self.collect(progress)
        p = rep.prune
        return DeleteReport(
            list(cids),
            p.bytes_freed,
            p.objects_removed,
            p.packs_deleted,
            p.packs_written,
            rep.problems,
        )

    def collect(self, progress: Progress | None = None) -> CollectReport:
        """Removes every object no checkpoint needs, as far as the store's state allows.

        Error handling:
            Damage never makes it raise (issue 15): a delete has already committed, and
            the next open must work. An object marking cannot read keeps everything (see
            below); a pack the prune cannot copy is kept and the rest goes on; an error
            of the whole catalog abandons the prune (it rolls back). Each problem is in
            the report and logged, and the collection stays pending (``gc_pending``
            holds them) for the next delete to retry; opening does not retry it.
        """
        report = PruneReport()
        problems: list[str] = []
        try:
            remaining = self.registry.all()
            found = reach(self.store.read, [(c.id, c.top_tree) for c in remaining])
            problems = found.problems()
            if not found.complete:
                # An unreadable tree's children are unknown: any object in the store may
                # be one of them, so none is provably dead. Objects of other kinds cannot
                # be told apart by the catalog either (a chunk is a chunk), so nothing is
                # deleted at all until the damaged checkpoints are deleted or repaired.
                problems.append("nothing was deleted: what the unreadable objects name is unknown")
            else:
                live = found.live | {c.record for c in remaining if c.record is not None}
                with self.store.catalog.transaction() as db:
                    dircache.purge_unreachable(db, live)
                plan = plan_prune(self.store, live)
                report = plan.execute(
                    self.store,
                    progress=(lambda d, t: progress("prune", (d, t))) if progress else None,
                    skip_damaged=True,
                )
                problems += [f"pack {n} kept: {why}" for n, why in report.damaged_packs.items()]
        except (SpriteError, sqlite3.DatabaseError, OSError) as e:
            problems.append(f"the collection stopped: {e}")
        self._end_collection(problems)
        return CollectReport(report, problems)

    def _end_collection(self, problems: list[str]) -> None:
        """Clears ``gc_pending``, or records why the collection could not finish."""
        value = None
        if problems:
            damaged = sorted(o.hex() for o in frozenset(self.store.damaged))
            value = json.dumps({"problems": problems, "damaged": damaged})
            log.warning("%s", self._collection_warning(problems))
        try:
            with self.store.catalog.transaction() as db:
                registry.set_meta(db, "gc_pending", value)
        except (SpriteError, sqlite3.DatabaseError) as e:  # still pending ("1"): retried
            log.warning("store %s: cannot record the collection's end: %s", self.store.path, e)

    def _collection_warning(self, problems: list[str]) -> str:
        return (
            f"store {self.store.path}: space not freed, the store is damaged: "
            + "; ".join(problems)
            + f". Run: {CHECK_HINT} --store {self.store.path}. A later delete retries the "
            "collection; it finishes once the damage is gone (delete the damaged checkpoints "
            "named; a damaged catalog is repaired by sprite-env store rebuild-catalog, run "
            "while no daemon has the store open)"
        )

    def _resume_collection(self, pending: str) -> None:
        """At open: finishes a collection a crash interrupted (``gc_pending`` is ``1``).

        One that damage stopped (a JSON record of its problems) is not retried here: that
        would cost a full marking at every open and fail the same way. It is reported, and
        the objects it found damaged are not deduplicated against (see ``_forget_lost``);
        the next delete retries it.
        """
        try:
            record = json.loads(pending)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            self.collect()
            return
        from sprite_env.ids import ObjectId  # (imported for type checking only at the top)

        for h in record.get("damaged", []):
            with contextlib.suppress(ValueError, TypeError):
                self.store.damaged.add(ObjectId(bytes.fromhex(h)))
        log.warning("%s", self._collection_warning([str(p) for p in record.get("problems", [])]))

    #: Damaged objects whose files-cache rows :meth:`_forget_lost` already dropped.
    _cache_purged: frozenset[ObjectId] = frozenset()

    def _forget_lost(self) -> None:
        """Keeps a capture from deduplicating against data that is gone (issue 15).

        Objects of packs whose file is missing or truncated leave the catalog (the store
        logs what was lost), and the files-cache rows that would make a capture reuse those
        objects, or objects a read found damaged, are dropped in the same transaction: the
        next capture reads those directories afresh and stores the data again. Run at
        open and before each capture; when nothing is lost it costs one query and a
        ``stat`` per pack.
        """
        lost = self.store.lost_packs()
        damaged = frozenset(self.store.damaged) - self._cache_purged
        if not lost and not damaged:
            return

        def purge(db: sqlite3.Connection, gone: set[ObjectId]) -> None:
            n = dircache.purge_referencing(db, self.store.read, gone | damaged)
            if n:
                log.info("files cache: %d directories will be read afresh", n)

        if lost:
            self.store.forget_lost(lost, purge)
        else:
            with self.store.catalog.transaction() as db:
                purge(db, set())
        self._cache_purged = self._cache_purged | damaged


def _save_cache(db: Any, r: CaptureResult) -> None:
    dircache.save(db, r.cache_changed, r.cache_removed, removed_trees=r.cache_removed_trees)


def _checkpoint(
    cid: str,
    seq: int | None,
    auto: bool,
    now: int,
    comment: str,
    created_by: str,
    parent: str | None,
    history: list[str],
    r: CaptureResult,
    bytes_added: int,
) -> Checkpoint:
    s: CaptureStats = r.stats
    return Checkpoint(
        id=cid,
        seq=seq,
        is_auto=auto,
        create_time_ns=now,
        comment=comment,
        created_by=created_by,
        parent=parent,
        history=history,
        top_tree=r.top_tree,
        files=s.files,
        dirs=s.dirs,
        bytes=s.bytes,
        bytes_added=bytes_added,
        warnings=[w.to_json() for w in r.warnings],
    )
