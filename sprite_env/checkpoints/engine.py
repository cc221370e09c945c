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
import errno
import json
import logging
import os
import shlex
import sqlite3
import stat
import time
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import blake3

from sprite_env.checkpoints import registry, usage
from sprite_env.checkpoints.gc import reach
from sprite_env.checkpoints.hashonly import HashOnlySink
from sprite_env.checkpoints.registry import Checkpoint, Registry
from sprite_env.errors import SnapshotError, SpriteError, StoreError, UserError
from sprite_env.journal import ChangeJournal, Epoch, open_epoch
from sprite_env.overlay.merge import MergedTrees
from sprite_env.snapshot import dircache, pagesums, plan, preflight
from sprite_env.snapshot.capture import CaptureResult, CaptureStats, Excludes, capture
from sprite_env.snapshot.diff import (
    Change,
    Counted,
    Difference,
    TreeMemo,
    count_changes,
    prefetch_trees,
)
from sprite_env.snapshot.frees import Frees, wait_released
from sprite_env.snapshot.patch import Prefetched
from sprite_env.snapshot.paths import (
    InvalidPath,
    Parts,
    PathNotFound,
    graft,
    lookup,
    minimal,
    parse_path,
    show,
)
from sprite_env.snapshot.restore import PATCH_MIN, RestoreResult, RestoreStats, restore
from sprite_env.snapshot.tree import Kind, TreeEntry, decode_chunks, decode_tree, encode_tree
from sprite_env.store import ObjectKind, Store
from sprite_env.store.backend import open_backed_store
from sprite_env.store.codec import object_id
from sprite_env.store.faults import crashpoint
from sprite_env.store.prune import PruneReport, plan_prune
from sprite_env.store.remote import durable_checkpoints

#: The command a damaged store's messages point to.
CHECK_HINT = "sprite-env store check --read-data"

if TYPE_CHECKING:
    from sprite_env.ids import ObjectId
    from sprite_env.store.backend import RemoteConfig

MAX_COMMENT = 4096
log = logging.getLogger("sprite_env.engine")

#: Called with a phase name ("capture", "restore", "prune") and its running counters.
Progress = Callable[[str, Any], None]
#: Holds the layer still while entered (writers frozen). A create given one captures twice:
#: first with everything running (storing nearly all the data and refreshing the files
#: cache), then inside the pause, where only what changed meanwhile is read again.
Pause = Callable[[], AbstractContextManager[object]]
#: Reads an object (a tree, a chunk list, data) by its id.
ReadObject = Callable[["ObjectId"], bytes]


class ActiveCheckpoint(UserError):
    def __init__(self, cid: str) -> None:
        super().__init__(f"cannot delete active checkpoint {cid}")
        self.checkpoint = cid


class InvalidComment(UserError):
    code = "invalid_comment"


class RestoreFailed(SnapshotError):
    """A restore (or reset) that stopped after it began changing the layer.

    The layer is then partly restored: some paths are as in the target, the others as
    before (the undo checkpoint holds that state whole). The intent stays recorded with the
    failure, so the daemon reports it (``/v1/status``) and keeps serving; another restore,
    to the target (finish) or to the undo checkpoint (roll back), replaces it.
    """

    exit_code = 6

    def __init__(
        self,
        target: str | None,
        undo: str | None,
        cause: BaseException,
        paths: list[str] | None = None,
    ) -> None:
        full = isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT)
        self.code = "no_space" if full else "restore_failed"
        what = f"restore to {target}" if target else "reset"
        if paths:
            what = f"restore of {', '.join(show(os.fsencode(p)) for p in paths)} from {target}"
        if isinstance(cause, OSError) and not isinstance(cause, SpriteError):
            shown = cause.strerror or str(cause)
            if cause.filename is not None:
                shown += f": {os.fsdecode(cause.filename)}"
        else:
            shown = str(cause)
        super().__init__(
            f"{what} failed part-way ({shown}): the layer is partly restored. "
            + resume_hint(target, undo, paths)
        )
        self.target = target
        self.undo = undo
        self.paths = paths


def resume_hint(target: str | None, undo: str | None, paths: list[str] | None = None) -> str:
    """How to finish or roll back a restore (of ``paths`` only, if given) that did not
    finish."""
    finish = f"sprite-env restore {target} --yes" if target else "sprite-env reset --yes"
    if paths:
        finish += "".join(f" --path {shlex.quote(show(os.fsencode(p)))}" for p in paths)
    back = f"; or roll back with: sprite-env restore {undo} --yes" if undo else ""
    return f"Finish it (once the cause is fixed) with: {finish}{back}"


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
    dry_run: bool = False  # only planned (``delete --dry-run``): nothing was deleted

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
    noop: bool = False  # the layer already was the target: nothing was done
    #: The paths restored (``restore_paths``); empty: the whole layer.
    paths: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "undo": self.undo,
            "resumed": self.resumed,
            "noop": self.noop,
            "paths": self.paths,
            "warnings": self.warnings,
            **self.stats.__dict__,
        }


@dataclass
class Preview:
    """What a restore would do, in its own words (``snapshot.plan``): per path, the change
    since the target and the action that undoes it, each counted in entries."""

    target: str
    items: list[Counted]

    @property
    def differences(self) -> list[Difference]:
        """The changes since the target (the live tree's side), one per path."""
        return [it.difference for it in self.items]

    def counts(self) -> dict[str, int]:
        """Entries per action, as the restore will report them; ``remove`` is the old
        name of ``delete``, kept for clients of the API."""
        c = plan.counts(self.items)
        return {**c, "remove": c["delete"]}

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.target,
            "counts": self.counts(),
            "changes": [plan.step_json(it) for it in self.items],
        }


class Engine:
    """Checkpoints of one layer root in one store. Not thread-safe: one job at a time.

    Args:
        root: the layer to capture and restore.
        store_dir: the store.
        create: create the store if it is missing (the daemon, in its state directory);
            False: a missing store is :class:`NotAStore` and nothing is created (offline
            commands: only ``store init`` creates one, issue 10).
        excludes: fnmatch patterns of paths (relative to root) never captured or touched.
            Given, they replace the store's saved list; None uses the saved list, so every
            command agrees on what a checkpoint holds.
        exclude_dirs: directories left out wherever they are (the store itself always is).
        remote: the store's packs and catalog in object storage (``--store s3://...``):
            ``store_dir`` is then its local copy and cache (``store/backend.py``).
    """

    #: The change journal of the layer (the daemon's): captures that write the files cache
    #: walk only what it names. None: every capture walks the whole layer.
    journal: ChangeJournal | None = None

    def __init__(
        self,
        root: str,
        store_dir: str,
        *,
        excludes: list[str] | None = None,
        exclude_dirs: list[str] | None = None,
        resume: bool = True,
        progress: Progress | None = None,
        create: bool = True,
        remote: RemoteConfig | None = None,
    ) -> None:
        self.root = root
        self.store: Store = open_backed_store(store_dir, remote, create=create)
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
            self._usage = usage.Usage()  # unique_bytes, kept up to date between calls
            self._bind_cache_to_root()
            self._forget_lost()
            #: Why a restore interrupted by a crash could not be finished at this open
            #: (it stays recorded, see :meth:`interrupted_restore`), or None.
            self.resume_error: RestoreFailed | None = None
            self._verified: set[ObjectId] = set()
            #: A restore's decoded trees (its check's, its preflight's, its own: one diff,
            #: decoded once) and the plan its check made, for that diff: (live, target).
            self._trees: TreeMemo = {}
            self._checked: tuple[ObjectId, ObjectId, preflight.RestoreNeeds] | None = None
            #: The bytes the check read and verified, kept for its restore (which then
            #: reads nothing while the environment is down).
            self._kept = Prefetched()
            if resume:
                try:
                    self.resume_pending(progress)
                except RestoreFailed as e:
                    self.resume_error = e
                    log.error("%s", e)
        except BaseException:
            self.store.close()
            raise

    def close(self) -> None:
        wait_released()  # a restore's frees still running (see _restore_to)
        self.store.close()

    def _bind_cache_to_root(self) -> None:
        # The files cache describes one live tree; used with another root it would only
        # cost re-reads (inodes differ), but a clean slate is clearer.
        here = os.path.realpath(self.root)
        if self.store.catalog.meta("cache_root") != here:
            with self.store.catalog.transaction() as db:
                dircache.clear(db)
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
            self.registry.get(history)  # an unknown id is not found, not an empty list
            out = [c for c in out if c.id == history or history in c.history]
        return out

    def info(self, cid: str) -> Checkpoint:
        return self.registry.get(cid)

    def listing(
        self, *, include_auto: bool = False, history: str | None = None
    ) -> list[dict[str, Any]]:
        """The JSON rows of :meth:`checkpoints` (what list answers, online and offline),
        each with ``unique_bytes``: what deleting that checkpoint alone would free, and
        ``storage``: ``remote`` once a generation this store pushed holds it, else
        ``local`` (issue 14; always ``local`` for a store never pushed)."""
        active = self.registry.active()
        unique = self.unique_bytes()
        remote = durable_checkpoints(self.store)
        return [
            {
                **c.to_json(active=active),
                "unique_bytes": unique.get(c.id),
                "storage": "remote" if c.id in remote else "local",
            }
            for c in self.checkpoints(include_auto=include_auto, history=history)
        ]

    def info_json(self, cid: str) -> dict[str, Any]:
        """One checkpoint's JSON (info), with ``unique_bytes`` and ``storage`` as in
        :meth:`listing`."""
        c = self.registry.get(cid)
        return {
            **c.to_json(active=self.registry.active()),
            "unique_bytes": self.unique_bytes()[cid],
            "storage": "remote" if cid in durable_checkpoints(self.store) else "local",
        }

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
        auto_id: str | None = None,
        skip_if: ObjectId | None = None,
    ) -> Checkpoint | None:
        check_comment(comment)
        self._forget_lost()  # before the files cache is loaded: it must not reuse lost data
        prewarmed = self.prewarm(progress) if pause is not None else 0
        parent = self.registry.active()
        history: list[str] = []
        parent_tree: ObjectId | None = None
        if parent is not None:
            try:
                pcp = self.registry.get(parent)
                history, parent_tree = [parent, *pcp.history], pcp.top_tree
            except registry.UnknownCheckpoint:
                history = [parent]
        # The epoch begins inside the pause: its hint then names every directory changed up
        # to the moment the writers stopped (during the first pass, what the prewarm did not
        # see), so the frozen walk reads only those. Begun before the pause, a change made
        # between the two would be left to the next epoch: the checkpoint would miss it.
        # The packs are finished after the pause: the writers need not wait for the disk.
        with open_epoch(self.journal, deferred=True) as ep, self.store.writer() as w:
            with pause() if pause is not None else contextlib.nullcontext():
                ep.begin()
                r = capture(
                    self.root,
                    w,
                    self.store.read,
                    _files_cache(self.store, ep),
                    excludes=self.excludes,
                    progress=(lambda s: progress("capture", s)) if progress else None,
                    hint=ep.hint,
                    reread=ep.reread,
                    page_sums=pagesums.Lookup(self.store.catalog),
                    read_many=self.store.read_many,
                )
            # The record goes in a pack of its own (a lost trees' pack must not take it
            # along), so the capture's packs are finished here; the one fsync of packs/
            # that makes all their names durable is the commit's.
            w.flush(durable=False)
            walk = ep.walked(r)
            if (skip_unchanged and r.top_tree == parent_tree) or r.top_tree == skip_if:
                w.commit(lambda db: _save_cache(db, r))
                return None
            now = time.time_ns()
            if auto and auto_id is not None:
                cid, seq = auto_id, None
            elif auto:
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
        return self._store_live(progress)[1]

    def _store_live(
        self, progress: Progress | None, trees_out: dict[ObjectId, bytes] | None = None
    ) -> tuple[CaptureResult, int]:
        """:meth:`prewarm`'s capture: journal-driven where a journal runs, its trees and
        data stored (so its top tree can be read and diffed like a checkpoint's until the
        next collection), its files cache committed. Returns it and the bytes it stored;
        ``trees_out`` receives the trees it read and wrote (``capture``'s)."""
        self._forget_lost()
        with open_epoch(self.journal) as ep, self.store.writer() as w:
            r = capture(
                self.root,
                w,
                self.store.read,
                _files_cache(self.store, ep),
                excludes=self.excludes,
                progress=(lambda s: progress("prewarm", s)) if progress else None,
                hint=ep.hint,
                reread=ep.reread,
                page_sums=pagesums.Lookup(self.store.catalog),
                read_many=self.store.read_many,
                trees_out=trees_out,
            )
            r.walk, r.walk_reason = ep.walked(r)
            w.commit(lambda db: _save_cache(db, r))  # publishes the packs as it fills its rows
            return r, w.stats.bytes_stored

    # -- compare ---------------------------------------------------------------------------

    def _capture_live(self) -> tuple[CaptureResult, HashOnlySink]:
        sink = HashOnlySink(self.store)
        r = capture(
            self.root,
            sink,
            sink.read,
            dircache.load(self.store.catalog),
            excludes=self.excludes,
            page_sums=pagesums.Lookup(self.store.catalog),  # read only: its new ones are not saved
        )
        return r, sink

    def diff(self, a: str, b: str | None = None, *, base_image: str | None = None) -> list[Counted]:
        """Changes from checkpoint ``a`` to checkpoint ``b`` (default: the live tree),
        each counted in entries.

        Args:
            base_image: LOWER of the overlay whose UPPER this engine's root is: compare
                the merged views (what a user sees in MERGED), not UPPER's whiteouts.
        """
        ca = self.registry.get(a)
        if b is not None:
            cb = self.registry.get(b)
            return self._compare(self.store.read, ca.top_tree, cb.top_tree, base_image)
        live, sink = self._capture_live()
        return self._compare(sink.read, ca.top_tree, live.top_tree, base_image)

    def preview(self, cid: str, *, base_image: str | None = None) -> Preview:
        """What ``restore(cid)`` would delete, create, change and fix, without doing it
        (``base_image``: as in :meth:`diff`)."""
        target = self.registry.get(cid)
        live, sink = self._capture_live()
        return Preview(cid, self._compare(sink.read, target.top_tree, live.top_tree, base_image))

    def compare_tops(
        self, old: ObjectId, new: ObjectId, *, base_image: str | None = None
    ) -> list[Counted]:
        """:meth:`diff` of two top trees in the store (a checkpoint's, or a live side a
        check stored: ``check_restore``'s ``beside``). Safe beside a job's check: it reads
        the store only, and none of the memo the check fills."""
        return self._compare(self.store.read, old, new, base_image, memo={})

    def _compare(
        self,
        read_tree: Callable[[ObjectId], bytes],
        old: ObjectId,
        new: ObjectId,
        base_image: str | None,
        *,
        memo: TreeMemo | None = None,
    ) -> list[Counted]:
        """``memo``: the merged diff's trees; None: a copy of the check's (``_trees``)."""
        if base_image is None:
            return list(count_changes(read_tree, old, new))
        # UPPER's trees where the two differ, read ahead one level at a time (one
        # ``read_many`` a level): read one by one as the merged diff came to them, they
        # were 65 of the 101 samples of an overlay undo's count of the medium step (py-spy,
        # 2,200 trees, a catalog lookup and a pack pin each). Those a restore's check just
        # read are taken from its memo (a copy: a preview may run beside a job).
        if memo is None:
            memo = dict(self._trees)
        if read_tree == self.store.read:
            prefetch_trees(self.store.read_many, old, new, memo)
        merged = MergedTrees(read_tree, base_image, memo)
        tops = merged.top(old), merged.top(new)
        items = list(count_changes(merged.read, *tops, pair=merged.read_pair))
        return [c for it in items if (c := self._copy_up(merged, it)) is not None]

    def _copy_up(self, merged: MergedTrees, it: Counted) -> Counted | None:
        """A base-image file against its copy in UPPER: a content change only if the bytes
        differ (a chmod copies the file up unchanged: that is metadata, or nothing)."""
        d = it.difference
        a, b = d.old, d.new
        if (
            d.change is not Change.MODIFIED
            or a is None
            or b is None
            or a.kind is not Kind.FILE
            or b.kind is not Kind.FILE
            or a.size != b.size
            or merged.from_lower(a) == merged.from_lower(b)
        ):
            return it

        def digest(e: TreeEntry) -> bytes:
            try:
                return merged.digest(e, self.store.read)
            except StoreError:  # the live side's data is hashed, not stored: read UPPER
                h = blake3.blake3()
                with open(os.path.join(os.fsencode(self.root), d.path), "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        h.update(block)
                return h.digest()

        try:
            same = digest(a) == digest(b)
        except OSError:  # changed or gone since the capture: keep "change"
            return it
        if not same:
            return it
        if a.same_meta(b):
            return None
        meta = Difference(d.path, Change.META, a, b)
        return Counted(meta, ((Change.META, 1),))

    # -- restore ---------------------------------------------------------------------------

    def restore(
        self,
        cid: str,
        *,
        created_by: str = "user",
        progress: Progress | None = None,
        undo_id: str | None = None,
    ) -> RestoreReport:
        """Makes the root equal to checkpoint ``cid``; see the module docstring.

        Args:
            cid: the checkpoint to restore.
            created_by: who asks (recorded on the undo checkpoint).
            progress: the progress callback.
            undo_id: the id for the undo checkpoint, reserved beforehand (with
                :meth:`reserve_auto_id`) so that a caller whose session the restore ends
                could be told it first.

        A restore to the state the layer is already in changes nothing and takes no undo
        checkpoint (``RestoreReport.noop``): the capture that would have been the undo
        checkpoint shows it, and is then not committed as one.
        """
        target = self.registry.get(cid)
        undo = self._create(
            f"before restore to {cid}",
            created_by,
            True,
            progress,
            skip_unchanged=False,
            auto_id=undo_id,
            skip_if=target.top_tree,
        )
        if undo is None:  # the layer already is the target
            self.set_active(cid)
            return RestoreReport(cid, None, RestoreStats(), noop=True)
        try:
            self._preflight(cid, target.top_tree, undo.top_tree, self.store.read)
            self._write_intent({"target": cid, "undo": undo.id})
            res = self._restore_to(
                target.top_tree, target.id, undo.top_tree, self.store.read, progress, undo.id
            )
        finally:
            self._forget_checks()
        return RestoreReport(cid, undo.id, res.stats, res.warnings)

    def reserve_auto_id(self) -> str:
        """The id the next automatic checkpoint will get, for ``restore(undo_id=...)``."""
        return self.registry.next_auto_id()

    def set_active(self, cid: str) -> None:
        """Makes ``cid`` the checkpoint the layer is on (it must equal it)."""
        if self.registry.active() != cid:
            with self.store.catalog.transaction() as db:
                registry.set_meta(db, "active", cid)

    def check_restore(
        self,
        cid: str,
        progress: Progress | None = None,
        *,
        beside: Callable[[ObjectId], object] | None = None,
    ) -> bool:
        """Checks, changing nothing on the layer nor in the checkpoints, that
        ``restore(cid)`` can be done now: room on the layer's file system, and every object
        it will read present and intact (those are remembered, so the restore that follows
        does not read them again).

        The live side is a :meth:`prewarm`: journal-driven where a journal runs, so the
        check walks only the directories changed since the last capture and reads only the
        files changed there; what it stores makes the undo checkpoint of the restore that
        follows read only what changed after it (a host takes its environment down in
        between). The diff with the target skips equal subtrees, so the check, like the
        restore, costs in proportion to the difference (issue 11, point 6).

        ``beside``: called with the live side's top tree, on a thread of its own, while the
        plan and the verifying run (the verifying's threads wait for reads and
        decompression, with the interpreter free); the check returns once it returned, and
        what it raises is the caller's (a host counts there what its restore will report:
        :meth:`compare_tops`).

        Returns:
            False when the layer already equals ``cid`` (the restore would change nothing).

        Raises:
            UnknownCheckpoint: no such checkpoint.
            preflight.RestoreWontFit: too little room (code ``no_space``).
            preflight.CheckpointDamaged: a damaged object, named with its path.
        """
        target = self.registry.get(cid)
        self._forget_checks()  # a check not followed by its restore left its own
        # The trees the capture read and wrote are both sides of the plan's diff where the
        # files cache was the target's (an undo: its rows are the last checkpoint's), so
        # the plan reads none of them again: the medium undo's plan read ~2.2k trees from
        # the store (0.2 s of its 0.28 s, py-spy).
        seen: dict[ObjectId, bytes] = {}
        live, _ = self._store_live(progress, trees_out=seen)
        if live.top_tree == target.top_tree:
            return False
        if beside is None:
            self._preflight(cid, target.top_tree, live.top_tree, self.store.read, seen=seen)
            return True
        with ThreadPoolExecutor(1, thread_name_prefix="check-beside") as pool:
            done = pool.submit(beside, live.top_tree)
            self._preflight(cid, target.top_tree, live.top_tree, self.store.read, seen=seen)
            done.result()
        return True

    def _forget_checks(self) -> None:
        """Ends what a check and its restore share (see ``_trees``)."""
        self._verified.clear()
        self._trees = {}
        self._checked = None
        self._kept.clear()

    def _preflight(
        self,
        cid: str,
        target_top: ObjectId,
        live_top: ObjectId,
        read_tree: Callable[[ObjectId], bytes],
        *,
        seen: Mapping[ObjectId, bytes] | None = None,
    ) -> None:
        """Plans the restore of ``target_top`` over ``live_top``: the room it needs and
        every object it reads, verified. ``seen``: trees by id that were just read from the
        store or made (a capture's ``trees_out``); the plan takes them from there."""

        def read_verified(oid: ObjectId) -> bytes:
            data = self.store.read(oid)
            self._verified.add(oid)
            return data

        def read_many_verified(oids: list[ObjectId]) -> list[bytes]:
            datas = self.store.read_many(oids)
            self._verified.update(oids)
            return datas

        checked = self._checked
        if checked is not None and checked[:2] == (live_top, target_top):
            # The undo checkpoint found the layer as the check did: the same diff, so the
            # same plan (1 s of an undo's downtime on the medium layer); only the room is
            # looked at again, and its objects were verified by the check.
            needs = checked[2]
        else:
            # both sides in the store (a resume's live side is hash-only: not there)
            read_many: Callable[[list[ObjectId]], list[bytes]] | None = (
                self.store.read_many if read_tree == self.store.read else None
            )
            if seen:
                read_tree, read_many = _reading_first(seen, read_tree, read_many)
            try:
                block = os.statvfs(self.root).f_frsize or 4096
                needs = preflight.plan_needs(
                    read_tree,
                    read_verified,
                    live_top,
                    target_top,
                    block=block,
                    patch_min=PATCH_MIN,
                    memo=self._trees,
                    read_many=read_many,
                )
            except SpriteError as e:  # a damaged tree or chunk list of the target
                raise preflight.CheckpointDamaged(cid, b".", e) from None
            self._checked = (live_top, target_top, needs)
        preflight.check_space(self.root, needs, what=f"restoring {cid}")
        needs.objects = {o: p for o, p in needs.objects.items() if o not in self._verified}
        preflight.verify_objects(
            read_verified, needs, cid, keep=self._kept, read_many=read_many_verified
        )

    def reset(self, *, created_by: str = "user", progress: Progress | None = None) -> RestoreReport:
        """Empties the layer (back to the base image below it), keeping every checkpoint;
        an automatic checkpoint of what it removes comes first, so it can be undone."""
        undo = self.create("before reset", created_by=created_by, auto=True, progress=progress)
        self._write_intent({"target": None, "undo": undo.id})
        empty = self._empty_top(undo.top_tree)
        res = self._restore_to(empty, None, undo.top_tree, self.store.read, progress, undo.id)
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
        undo: str | None,
        *,
        paths: list[str] | None = None,
    ) -> RestoreResult:
        """Runs the restore and commits it. ``paths``: a restore of those paths only (the
        layer is then on no checkpoint it was not on before, so the active one stays)."""
        # The inodes the restore removes are freed once it is committed, in the background
        # (snapshot/frees.py: their evictions were most of an undo's removals).
        # Its own events are resolved once it is committed (Journal.quiet): not beside it.
        quiet = self.journal.quiet() if self.journal is not None else contextlib.nullcontext()
        with Frees() as frees, quiet:
            try:
                res = restore(
                    self.root,
                    read_tree,
                    self.store.read,
                    live_top,
                    target_top,
                    excludes=self.excludes,
                    progress=(lambda s: progress("restore", s)) if progress else None,
                    trees=self._trees,
                    prefetched=self._kept,
                    frees=frees,
                    # the rows the live side's capture left: only what the restore
                    # changes is stat'ed again for the new rows
                    cached=dircache.CacheView(self.store.catalog),
                )
            except (SpriteError, OSError) as e:
                # The layer is partly restored. Keep the intent (so nothing forgets it) but mark
                # it failed: it is reported and not retried blindly at the next start.
                self._fail_intent(e)
                raise RestoreFailed(target_id, undo, e, paths) from e
            crashpoint("restore-before-commit")
            with self.store.catalog.transaction() as db:
                # Every removed directory's own row, then each removed subtree's rows below it
                # once: one scan of the table per top (not per nested directory: 175 ms of the
                # typical undo's downtime went to scanning 17k rows 40 times).
                tops = minimal([tuple(p.split(b"/")) for p in res.cache_removed])
                dircache.save(
                    db,
                    res.cache_changed,
                    res.cache_removed,
                    removed_trees=[b"/".join(p) for p in tops],
                )
                if not paths:
                    registry.set_meta(db, "active", target_id)
                registry.set_meta(db, "restore_intent", None)
        return res

    def pending_restore(self) -> dict[str, Any] | None:
        raw = self.store.catalog.meta("restore_intent")
        try:
            intent = json.loads(raw) if raw else None
        except ValueError:
            intent = {"target": None, "undo": None, "failed": {"error": "unreadable intent"}}
        return intent if isinstance(intent, dict) else None

    def _fail_intent(self, error: BaseException) -> None:
        intent = self.pending_restore()
        if intent is None:
            return
        intent["failed"] = {"error": str(error), "time_ns": time.time_ns()}
        try:
            with self.store.catalog.transaction() as db:
                registry.set_meta(db, "restore_intent", json.dumps(intent))
        except (SpriteError, OSError, sqlite3.Error) as e:  # a full disk may refuse this too
            log.error("could not record the failed restore: %s", e)

    def interrupted_restore(self) -> dict[str, Any] | None:
        """A restore that did not finish: what it was doing, why it stopped, what state the
        layer is in and how to finish or roll it back; None when there is none."""
        intent = self.pending_restore()
        if intent is None:
            return None
        target, undo = intent.get("target"), intent.get("undo")
        chosen = [str(p) for p in intent.get("paths") or []]
        finish = f"sprite-env restore {target} --yes" if target else "sprite-env reset --yes"
        finish += "".join(f" --path {shlex.quote(show(os.fsencode(p)))}" for p in chosen)
        failed = intent.get("failed") or {}
        reason = failed.get("error") or (
            str(self.resume_error) if self.resume_error else "interrupted (the daemon stopped)"
        )
        return {
            "target": target,
            "undo": undo,
            "started": _rfc3339(intent.get("time_ns")),
            "error": reason,
            "layer": f"partly restored: some paths as in {target or 'the base image'}, "
            f"the others as in {undo or 'the state before'}",
            "paths": chosen,
            "finish": finish,
            "roll_back": f"sprite-env restore {undo} --yes" if undo else None,
        }

    def resume_pending(self, progress: Progress | None = None) -> RestoreReport | None:
        """Finishes an interrupted delete's collection and a restore a crash interrupted.

        A restore that failed (rather than being killed) is not retried here: the layer may
        have changed since (the environment ran on), and retrying what failed for a
        cause still present only fails again. It stays recorded and reported until another
        restore replaces it.

        Raises:
            RestoreFailed: the interrupted restore could not be finished now (the intent
                is then marked failed).
        """
        pending_gc = self.store.catalog.meta("gc_pending")
        if pending_gc:
            self._resume_collection(pending_gc)
        intent = self.pending_restore()
        if intent is None or intent.get("failed"):
            return None
        target, undo = intent.get("target"), intent.get("undo")
        chosen = [str(p) for p in intent.get("paths") or []] or None
        try:
            if target is None:  # a reset
                top = self._empty_top(self.registry.get(str(undo)).top_tree)
            elif chosen:  # those paths of the target over the state before (rebuilt)
                before = self.registry.get(str(undo)).top_tree
                top = self._graft(before, self.registry.get(target).top_tree, chosen)
            else:
                top = self.registry.get(target).top_tree
            live, sink = self._capture_live()  # the half-restored tree as it is now
            self._preflight(target or "the base image", top, live.top_tree, sink.read)
        except (SpriteError, OSError) as e:  # gone, damaged, too big: nothing changed now
            self._fail_intent(e)
            raise RestoreFailed(target, undo, e, chosen) from e
        finally:
            self._forget_checks()
        res = self._restore_to(top, target, live.top_tree, sink.read, progress, undo, paths=chosen)
        return RestoreReport(target, undo, res.stats, res.warnings, True, paths=chosen or [])

    def export(
        self,
        cid: str,
        dest: str,
        *,
        paths: list[str] | None = None,
        progress: Progress | None = None,
        base_image: str | None = None,
    ) -> RestoreStats:
        """Writes checkpoint ``cid`` (or only ``paths`` of it, with the directories leading
        to them) into the empty directory ``dest`` (root untouched). With ``base_image``
        (an overlay's LOWER), as the environment saw it: the base image with the layer
        over it, as the overlay view shows it.

        Raises:
            UnknownCheckpoint, InvalidPath, PathNotFound: a bad id or path.
            UserError: ``dest`` is not empty.
            StoreError: the checkpoint is damaged.
        """
        read, top = self._view(cid, base_image)
        read_tree: ReadObject = read
        if paths:
            chosen = self._chosen(cid, top, paths, live=False, read=read)
            made: dict[ObjectId, bytes] = {}  # the selection's trees, in memory only

            def put(data: bytes) -> ObjectId:
                oid = object_id(data)
                made[oid] = data
                return oid

            def read_made(oid: ObjectId) -> bytes:
                data = made.get(oid)
                return data if data is not None else read(oid)

            top = graft(read_made, put, None, top, chosen)
            read_tree = read_made
        if os.listdir(dest):
            raise UserError(f"{dest} is not empty")
        try:
            res = restore(
                dest,
                read_tree,
                read,
                None,
                top,
                progress=(lambda s: progress("restore", s)) if progress else None,
                refresh_cache=False,
            )
        except StoreError as e:  # lost or damaged objects: say whose
            raise StoreError(f"checkpoint {cid} is damaged: {e} (see: {CHECK_HINT})") from None
        return res.stats

    # -- single paths ------------------------------------------------------------------------

    def find(
        self, cid: str, path: str | bytes, *, base_image: str | None = None
    ) -> tuple[TreeEntry, ReadObject]:
        """The entry at ``path`` (relative to the layer's root; ``/`` is the root) in
        checkpoint ``cid``, automatic ones included, mounted or not, and the reader of its
        objects (for :meth:`entries` and :meth:`read_file`). With ``base_image`` (an
        overlay's LOWER): as the environment saw it, the base image's files included.

        Raises:
            UnknownCheckpoint: no such checkpoint.
            InvalidPath: ``..``, NUL, or a symlink or file on the way (never followed).
            PathNotFound: no such entry in that checkpoint (code ``not_found``).
        """
        parts = parse_path(path)
        read, top = self._view(cid, base_image)
        entry = lookup(read, top, parts, cid)
        if entry is None:
            raise PathNotFound(f"no {show(parts)} in checkpoint {cid}")
        return entry, read

    def _view(self, cid: str, base_image: str | None) -> tuple[ReadObject, ObjectId]:
        """The reader and top tree of checkpoint ``cid``: the store's, or merged over
        ``base_image`` (a fresh merge: its synthetic ids live as long as the reader)."""
        top = self.registry.get(cid).top_tree
        if base_image is None:
            return self.store.read, top
        merged = MergedTrees(self.store.read, base_image)
        return merged.read, merged.top(top)

    def entries(self, entry: TreeEntry, read: ReadObject | None = None) -> list[TreeEntry]:
        """A directory entry's children, sorted by name (``read``: as :meth:`find` gave)."""
        return decode_tree((read or self.store.read)(entry.subtree))

    def read_file(
        self, entry: TreeEntry, read: ReadObject | None = None, *, block: int = 1 << 20
    ) -> Iterator[bytes]:
        """A file entry's bytes, piece by piece (holes as zeros, at most ``block`` at a
        time), read as they are consumed: a file of any size costs one chunk of memory.

        Raises:
            InvalidPath: not a regular file.
            StoreError: a piece is missing or damaged (raised where it is reached).
        """
        from sprite_env.ids import ObjectId  # noqa: PLC0415 (a NewType, only here at runtime)

        if entry.kind is not Kind.FILE:
            raise InvalidPath(f"{show(entry.name)[1:]} is a {entry.kind.name.lower()}, not a file")
        read = read or self.store.read
        raw = read(ObjectId(entry.payload)) if entry.indirect else entry.payload
        for oid, off, n in decode_chunks(raw):
            if oid is None:
                while n > 0:
                    yield bytes(min(n, block))
                    n -= block
                continue
            piece = read(oid)[off : off + n]
            if len(piece) != n:
                raise StoreError(f"chunk {oid.hex()[:16]} is shorter than its piece")
            yield piece

    def restore_paths(
        self,
        cid: str,
        paths: list[str],
        *,
        created_by: str = "user",
        progress: Progress | None = None,
        undo_id: str | None = None,
        base_image: str | None = None,
    ) -> RestoreReport:
        """Makes only ``paths`` (files or whole subtrees) of the layer as in checkpoint
        ``cid``, leaving everything else alone: a path the checkpoint holds is written (its
        missing parent directories created as the checkpoint has them), one it does not
        hold is deleted. Undoable like any restore: an automatic checkpoint of the whole
        layer comes first (as in :meth:`restore`, ``undo_id`` reserves its id). The
        directories above the paths keep their live metadata; the active checkpoint stays.
        Paths are the layer's (UPPER's, under an overlay: restoring one there brings back
        what the environment saw, a whiteout or a copy-up included); with ``base_image``,
        a path only the base image holds is no error (it is as in ``cid`` already).

        Raises:
            UnknownCheckpoint, InvalidPath, PathNotFound: a bad id or path (nothing changed;
                a path in neither the checkpoint nor the live layer is not found).
            RestoreFailed: it stopped part-way (resumable like a whole restore).
        """
        target = self.registry.get(cid)
        chosen = self._chosen(cid, target.top_tree, paths, live=True, base_image=base_image)
        texts = [os.fsdecode(b"/" + b"/".join(p)) for p in chosen]  # lossless (intent)
        comment = f"before restore of {_brief(chosen)} from {cid}"
        if undo_id is not None:
            undo = self._create(
                comment, created_by, True, progress, skip_unchanged=False, auto_id=undo_id
            )
        else:
            undo = self.create_if_changed(comment, created_by=created_by, progress=progress)
            active = self.registry.active()
            if undo is None and active is not None:
                undo = self.registry.get(active)  # the layer is exactly that checkpoint
        if undo is None:  # no checkpoint yet and an unchanged layer: take one anyway
            undo = self.create(comment, created_by=created_by, auto=True, progress=progress)
        top = self._graft(undo.top_tree, target.top_tree, texts)
        if top == undo.top_tree:  # those paths already are as in cid
            return RestoreReport(cid, None, RestoreStats(), noop=True, paths=texts)
        try:
            self._preflight(cid, top, undo.top_tree, self.store.read)
            self._write_intent({"target": cid, "undo": undo.id, "paths": texts})
            res = self._restore_to(
                top, cid, undo.top_tree, self.store.read, progress, undo.id, paths=texts
            )
        finally:
            self._forget_checks()
        return RestoreReport(cid, undo.id, res.stats, res.warnings, paths=texts)

    def check_restore_paths(
        self,
        cid: str,
        paths: list[str],
        *,
        base_image: str | None = None,
        progress: Progress | None = None,
    ) -> bool:
        """:meth:`check_restore` for :meth:`restore_paths`: False when those paths already
        are as in ``cid``; raises what ``restore_paths`` would, before anything changes.
        Its live side is a :meth:`prewarm`, as for :meth:`check_restore`."""
        self._forget_checks()
        top, live_top, sink = self._grafted_live(
            cid, paths, base_image, stored=True, progress=progress
        )
        if top == live_top:
            return False
        self._preflight(cid, top, live_top, sink.read)
        return True

    def _grafted_live(
        self,
        cid: str,
        paths: list[str],
        base_image: str | None,
        *,
        stored: bool = False,
        progress: Progress | None = None,
    ) -> tuple[ObjectId, ObjectId, HashOnlySink]:
        """A capture of the live layer (hash-only; ``stored``: a :meth:`prewarm`), and its
        top with ``paths`` as in ``cid``: what a path restore would make of it. Returns
        (that top, the live top, the sink that holds the grafted trees and reads both)."""
        target = self.registry.get(cid)
        chosen = self._chosen(cid, target.top_tree, paths, live=True, base_image=base_image)
        if stored:
            live, _ = self._store_live(progress)
            sink = HashOnlySink(self.store)
        else:
            live, sink = self._capture_live()
        top = graft(
            sink.read,
            lambda d: sink.put(d, ObjectKind.TREE),
            live.top_tree,
            target.top_tree,
            chosen,
        )
        return top, live.top_tree, sink

    def preview_paths(
        self, cid: str, paths: list[str], *, base_image: str | None = None
    ) -> Preview:
        """What ``restore_paths(cid, paths)`` would do, without doing it (``base_image``: as
        in :meth:`diff`)."""
        top, live_top, sink = self._grafted_live(cid, paths, base_image)
        return Preview(cid, self._compare(sink.read, top, live_top, base_image))

    def check_paths(
        self, cid: str, paths: list[str], *, live: bool = True, base_image: str | None = None
    ) -> None:
        """Refuses, as :meth:`restore_paths` (``live``) or :meth:`export` would (given the
        same ``base_image``), paths that cannot be restored or exported from ``cid``;
        cheap (lookups and lstat), for a host to answer before it queues the job.

        Raises:
            UnknownCheckpoint, InvalidPath, PathNotFound.
        """
        if live:
            top = self.registry.get(cid).top_tree
            self._chosen(cid, top, paths, live=True, base_image=base_image)
        else:
            read, top = self._view(cid, base_image)
            self._chosen(cid, top, paths, live=False, read=read)

    def _chosen(
        self,
        cid: str,
        top: ObjectId,
        paths: list[str],
        *,
        live: bool,
        read: ReadObject | None = None,
        base_image: str | None = None,
    ) -> list[Parts]:
        """The paths, parsed and checked against checkpoint ``cid``'s tree ``top`` (read
        with ``read``) and, with ``live``, the live layer (by lstat along the path: nothing
        is followed; a path only in ``base_image`` counts as there)."""
        chosen = minimal([parse_path(p) for p in paths])
        if not chosen:
            raise InvalidPath("no path given")
        if () in chosen:
            raise InvalidPath(
                "the path / is the whole layer: leave out the paths to restore or export all"
            )
        for p in chosen:
            here = lookup(read or self.store.read, top, p, cid) is not None
            if live:
                there = _live_exists(self.root, p)  # first: it refuses a symlink on the way
                if not there and base_image is not None:
                    there = _live_exists(base_image, p)
                if not (here or there):
                    raise PathNotFound(f"{show(p)} is neither in {cid} nor in the live layer")
            elif not here:
                raise PathNotFound(f"no {show(p)} in checkpoint {cid}")
        return chosen

    def _graft(self, base: ObjectId, source: ObjectId, texts: list[str]) -> ObjectId:
        """``base`` with ``texts`` as in ``source`` (``snapshot.paths.graft``), stored: the
        restore's files cache names these trees. Like a reset's empty tree they belong to
        no checkpoint, and are rebuilt from the undo checkpoint when a restore resumes."""
        chosen = [parse_path(t) for t in texts]
        with self.store.writer() as w:
            top = graft(self.store.read, lambda d: w.put(d, ObjectKind.TREE), base, source, chosen)
            w.commit()
        return top

    # -- delete ----------------------------------------------------------------------------

    def delete(self, cid: str) -> DeleteReport:
        """Deletes a checkpoint and frees the space only it used."""
        return self.delete_many([cid])

    def unique_bytes(self) -> dict[str, int | None]:
        """Each checkpoint's stored bytes that no other checkpoint holds: what deleting it
        alone would free (see ``checkpoints/usage.py``)."""

        def stored(oids: Iterable[ObjectId]) -> dict[ObjectId, int]:
            return {o: loc.entry.stored_len for o, loc in self.store.locate_many(oids).items()}

        return self._usage.unique_bytes(self.store.read, stored, self.registry.all())

    def plan_delete(self, cids: list[str]) -> DeleteReport:
        """What :meth:`delete_many` would free, computed by the same prune plan but not
        carried out (``delete --dry-run``): nothing changes."""
        active = self.registry.active()
        for cid in cids:
            self.registry.get(cid)
            if cid == active:
                raise ActiveCheckpoint(cid)
        remaining = [c for c in self.registry.all() if c.id not in cids]
        found = reach(self.store.read, [(c.id, c.top_tree) for c in remaining])
        if not found.complete:
            return DeleteReport(list(cids), 0, 0, 0, 0, found.problems(), dry_run=True)
        live = found.live | {c.record for c in remaining if c.record is not None}
        plan = plan_prune(self.store, live)
        return DeleteReport(
            list(cids),
            plan.bytes_freed_estimate,  # exact but for the rewritten packs' new headers
            plan.objects_dead,
            plan.packs_deleted + plan.packs_rewritten,
            plan.packs_written_estimate,
            [],
            dry_run=True,
        )

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
        ``stat`` per pack (6-8 ms for 1,000 packs, a 32 GB store; 0.07 ms for a small
        one). Purging reads each cached tree once: 69 ms for 2,041 directories.
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
            self._usage.forget()  # their objects' sizes left the catalog with them
        else:
            with self.store.catalog.transaction() as db:
                purge(db, set())
        self._cache_purged = self._cache_purged | damaged


def _reading_first(
    seen: Mapping[ObjectId, bytes],
    read: Callable[[ObjectId], bytes],
    read_many: Callable[[list[ObjectId]], list[bytes]] | None,
) -> tuple[Callable[[ObjectId], bytes], Callable[[list[ObjectId]], list[bytes]] | None]:
    """``read`` and ``read_many`` that take what ``seen`` holds from there (the objects
    are addressed by content: the bytes held are the ones the store would give)."""

    def read_one(oid: ObjectId) -> bytes:
        got = seen.get(oid)
        return got if got is not None else read(oid)

    if read_many is None:
        return read_one, None
    many = read_many

    def read_some(oids: list[ObjectId]) -> list[bytes]:
        out: list[bytes | None] = [seen.get(o) for o in oids]
        missing = [o for o, got in zip(oids, out, strict=True) if got is None]
        if missing:
            it = iter(many(missing))
            out = [got if got is not None else next(it) for got in out]
        return out  # type: ignore[return-value]

    return read_one, read_some


def _files_cache(store: Store, ep: Epoch) -> Mapping[bytes, dircache.CachedDir]:
    """All rows for a full walk; row by row for a walk the journal narrowed."""
    if ep.hint is not None:
        return dircache.CacheView(store.catalog)
    return dircache.load(store.catalog)


def _save_cache(db: Any, r: CaptureResult) -> None:
    dircache.save(db, r.cache_changed, r.cache_removed, removed_trees=r.cache_removed_trees)
    pagesums.save(db, r.page_sums, r.cache_changed, r.cache_removed, r.cache_removed_trees)


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


def _brief(chosen: list[Parts]) -> str:
    """The paths for a comment: at most three, control characters escaped."""
    text = ", ".join(show(p) for p in chosen[:3])
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text + (f" and {len(chosen) - 3} more" if len(chosen) > 3 else "")


def _live_exists(root: str, parts: Parts) -> bool:
    """Whether ``parts`` exists in the live tree at ``root``, walking with ``O_NOFOLLOW``.

    Raises:
        InvalidPath: a component on the way is a symlink or not a directory.
    """
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for depth, name in enumerate(parts):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return False
            if depth == len(parts) - 1:
                return True
            if not stat.S_ISDIR(st.st_mode):
                what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
                raise InvalidPath(
                    f"{show(parts[: depth + 1])} is {what} in the live layer: paths are not "
                    f"followed through it; name {show(parts[: depth + 1])} itself"
                )
            nfd = os.open(
                name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
            )
            os.close(fd)
            fd = nfd
        return True
    finally:
        os.close(fd)


def _rfc3339(ns: object) -> str | None:
    if not isinstance(ns, int):
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns / 1e9))
