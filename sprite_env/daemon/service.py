"""The daemon: owns the engine and runs everything around it in one trio process.

Start-up order matters: the state directory's lock first (one daemon per state), then the
engine (which finishes an interrupted restore), and only then the socket, so a client
never talks to a daemon whose layer is half restored: until the socket exists, clients
wait. Shutdown runs the other way: stop accepting, fail queued jobs, let the running one
finish, take an automatic checkpoint if the layer changed, unmount the view, close.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import grp
import json
import logging
import os
import re
import signal
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any, cast

import trio

from sprite_env import __version__, privacy, statelock
from sprite_env.api import events, shapes
from sprite_env.api.backend import FileBytes
from sprite_env.api.front import Front
from sprite_env.api.server import SERVER, Limits, serve_unix
from sprite_env.checkpoints import Engine
from sprite_env.checkpoints.engine import CHECK_HINT, RestoreFailed
from sprite_env.daemon.activity import ActivityLog
from sprite_env.daemon.answers import AnswerCache
from sprite_env.daemon.environment import Environment
from sprite_env.daemon.jobs import Job, JobRunner
from sprite_env.daemon.retention import (
    QuotaExceeded,
    RetentionPolicy,
    make_room,
    plan_retention,
)
from sprite_env.daemon.scheduler import run_scheduler
from sprite_env.daemon.uploader import NoRemote, RemoteWait, Uploader
from sprite_env.errors import SpriteError, StoreError, UserError
from sprite_env.journal import ChangeJournal, Journal, NoJournal, open_journal
from sprite_env.overlay import Overlay, freeze
from sprite_env.overlay.freeze import FreezeReport
from sprite_env.services import Supervisor
from sprite_env.snapshot import plan
from sprite_env.snapshot.paths import entry_json, show
from sprite_env.snapshot.tree import Kind
from sprite_env.store.check import stats as store_stats
from sprite_env.store.lease import Lease
from sprite_env.store.remote import ObjectStorage, writer_id

if TYPE_CHECKING:
    import argparse
    from collections.abc import AsyncIterator, Iterator, Mapping
    from concurrent.futures import Future

    from sprite_env.api.backend import JobHandle
    from sprite_env.api.events import Event
    from sprite_env.checkpoints.registry import Checkpoint
    from sprite_env.fuse.operations import ViewOperations
    from sprite_env.ids import ObjectId
    from sprite_env.snapshot.diff import Counted
    from sprite_env.store.backend import RemoteConfig

log = logging.getLogger("sprite_env.daemon")

#: An ``{"auto": true}`` request is satisfied by an automatic checkpoint this recent.
RECENT_AUTO_S = 600
#: Automatic checkpoints an agent session starts from ("before <client> session", as
#: ``sprite-env mcp`` and the README's hook take them): the newest KEEP_SESSIONS are
#: always kept by retention.
SESSION_COMMENT = re.compile(r"before .+ session")
KEEP_SESSIONS = 5


class DaemonRunning(SpriteError):
    exit_code = 4


class NoBaseImage(UserError):
    """A reset asked of a daemon with no base image below its layer (no ``--overlay``):
    there, "back to the base image" would mean an empty root (issue 10: it wiped one)."""

    code = "no_base_image"

    def __init__(self, root: str) -> None:
        super().__init__(
            f"reset needs a base image below the layer, and this daemon has none (it "
            f"checkpoints {root} itself, not an overlay's upper layer): nothing was changed. "
            "To go back to a checkpoint, use: sprite-env restore ID"
        )


@dataclass
class DaemonConfig:
    root: str = "/"
    state: str = "/.sprite"
    store: str | None = None  # default STATE/store
    #: ``--store s3://...``: packs and catalog in object storage, store_dir their local copy.
    remote: RemoteConfig | None = None
    socket_group: str | None = None
    auto_interval_s: float = 3600.0
    max_checkpoints: int = 200
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    view: bool = True
    view_count: int = 5
    view_auto: bool = False
    limits: Limits = field(default_factory=Limits)
    excludes: list[str] | None = None
    overlay: Overlay | None = None
    journal: bool = True  # the change journal (fanotify), where the kernel supports it
    front: bool = True  # list and info repeated by a front process (api/front.py)

    @property
    def layer(self) -> str:
        """What checkpoints hold: UPPER with an overlay, else the root."""
        return self.overlay.upper if self.overlay else self.root

    @property
    def env_root(self) -> str:
        """Where the environment sees its files: MERGED with an overlay, else the root."""
        return self.overlay.merged if self.overlay else self.root

    @property
    def store_dir(self) -> str:
        return self.store or os.path.join(self.state, "store")

    @property
    def socket(self) -> str:
        return os.path.join(self.state, "api.sock")

    @property
    def mountpoint(self) -> str:
        return os.path.join(self.state, "checkpoints")


class Daemon:
    """The operations the API exposes, over one engine. Methods run in the trio thread;
    engine work goes to worker threads, one job at a time through :class:`JobRunner`."""

    def __init__(
        self, config: DaemonConfig, engine: Engine, activity: ActivityLog, env: Environment
    ) -> None:
        self.config = config
        self.engine = engine
        self.activity = activity
        self.env = env
        self.jobs = JobRunner()
        self.view: ViewOperations | None = None
        self.started = events.now_rfc3339()
        self.jobs.on_finished.append(self._after_job)
        #: List and info answers, until the checkpoints change (``answers.py``).
        self._answers = AnswerCache()
        self.lock_fd = -1  # STATE/daemon.lock, where clients read what we are doing
        #: The background upload to the store's bucket (None: no remote store).
        self.uploader: Uploader | None = None

    def say_phase(self, phase: str) -> None:
        if self.lock_fd >= 0:
            try:
                statelock.write(self.lock_fd, phase)
            except OSError as e:  # a hint for clients only
                log.warning("daemon.lock: %s", e)

    # -- reads (concurrent with jobs: the catalog's readers see committed rows) ------------

    def busy(self) -> bool:
        return self.jobs.running is not None

    def job(self, number: int) -> JobHandle | None:
        return self.jobs.get(number)

    async def status(self) -> shapes.Status:
        running = self.jobs.running
        return {
            "version": __version__,
            "pid": os.getpid(),
            "root": self.config.root,
            "state": self.config.state,
            "store": self.config.store_dir,
            "started": self.started,
            "active": await trio.to_thread.run_sync(self.engine.active),
            "job": cast("shapes.Job", running.to_json()) if running else None,
            "queued": self.jobs.queued(),
            "mount": self.config.mountpoint if self.view is not None else None,
            # What a reset goes back to; None: no base image, so no reset.
            "base_image": self.config.overlay.lower if self.config.overlay else None,
            # A restore that did not finish (the layer is partly restored), or None.
            "interrupted_restore": await trio.to_thread.run_sync(self.engine.interrupted_restore),
            "auto_interval_s": self.config.auto_interval_s,
            "max_checkpoints": self.config.max_checkpoints,
            # What the store holds and the room left on its file system (store stats).
            "store_usage": await trio.to_thread.run_sync(
                lambda: store_stats(self.engine.store).to_json()
            ),
            "remote": await self._remote_status(),
        }

    async def _remote_status(self) -> shapes.RemoteStatus | None:
        up = self.uploader
        if up is None:
            return None
        ids = await trio.to_thread.run_sync(
            lambda: [c.id for c in self.engine.checkpoints(include_auto=True)]
        )
        local = sum(1 for cid in ids if up.storage_of(cid) == "local")
        return cast("shapes.RemoteStatus", up.to_json(local))

    def _storage_of(self, cid: str) -> str:
        return "local" if self.uploader is None else self.uploader.storage_of(cid)

    def _drop_answers(self) -> None:
        """Cached list and info answers are stale (they show each checkpoint's storage)."""
        self._answers.clear()

    def _after_push(self) -> None:
        """A push made checkpoints remote: the answers, and the view's listing (its
        ``.checkpoints.json``), show their storage again."""
        self._drop_answers()
        if self.view is not None:
            self.view.refresh()

    async def checkpoints_json(self, include_auto: bool, history: str | None) -> bytes:
        """``GET /v1/checkpoints``, encoded. Answers are cut from one listing of every
        checkpoint, read once per change (``answers.py``): a client polling in a loop
        then costs a lookup, not a catalog query, a walk of the trees (``unique_bytes``)
        and a JSON encoding on a process the running job needs."""
        since = self._answers.generation
        rows = await self._rows()

        def read() -> bytes:
            if history is not None and not any(r["id"] == history for r in rows):
                # unknown (or newer than the rows): the engine answers, or says not found
                return _encode(self.engine.listing(include_auto=include_auto, history=history))
            return _encode(
                [
                    r
                    for r in rows
                    if (include_auto or not r["is_auto"])
                    and (history is None or r["id"] == history or history in r["history"])
                ]
            )

        return await self._answers.get(("list", include_auto, history), read, since=since)

    async def info_json(self, cid: str) -> bytes:
        """``GET /v1/checkpoints/{id}``, encoded: its row of the listing (as the list)."""
        since = self._answers.generation
        rows = await self._rows()

        def read() -> bytes:
            for r in rows:
                if r["id"] == cid:
                    return _encode(r)
            return _encode(self.engine.info_json(cid))  # not found: the engine's error

        return await self._answers.get(("info", cid), read, since=since)

    async def _rows(self) -> list[dict[str, Any]]:
        """Every checkpoint's row (``Engine.listing``), newest first, automatic ones too."""
        return await self._answers.rebuilt(
            ("rows",), lambda: self.engine.listing(include_auto=True)
        )

    async def diff(self, a: str, b: str | None, actor: str) -> shapes.Diff:
        base = self._base_image()
        if b is not None:  # two checkpoints: only the store is read, no need to queue
            diffs = await trio.to_thread.run_sync(lambda: self.engine.diff(a, b, base_image=base))
            return _diff_json(a, b, diffs)
        await trio.to_thread.run_sync(self.engine.info, a)  # unknown id: 404 before queueing

        async def body(job: Job) -> Event:
            job.info(f"Comparing {a} with the live layer...")
            diffs = await trio.to_thread.run_sync(
                lambda: self.engine.diff(a, None, base_image=base)
            )
            return events.complete(job.id, "Diff done", id=a, diff=_diff_json(a, None, diffs))

        job = self.jobs.submit("diff", a, actor, body)
        return cast("shapes.Diff", _wait_result(await _finished(job), "diff"))

    async def preview(self, cid: str, actor: str) -> dict[str, Any]:
        await trio.to_thread.run_sync(self.engine.info, cid)

        async def body(job: Job) -> Event:
            base = self._base_image()
            p = await trio.to_thread.run_sync(lambda: self.engine.preview(cid, base_image=base))
            return events.complete(job.id, "Preview done", id=cid, preview=p.to_json())

        job = self.jobs.submit("preview", cid, actor, body)
        return _wait_result(await _finished(job), "preview")

    def _base_image(self) -> str | None:
        """LOWER under an overlay: previews and diffs show the merged view, paths as a
        user sees them in MERGED, never UPPER's whiteouts (issue 10)."""
        return self.config.overlay.lower if self.config.overlay else None

    def _merged_stats(
        self, target_top: ObjectId, live_top: ObjectId, counted: Mapping[ObjectId, dict[str, int]]
    ) -> dict[str, int]:
        """An overlay restore's counters as its preview counted them: in MERGED's entries
        (from the target's top tree to the state it replaced, ``live_top``), not UPPER's
        whiteouts; taken from ``counted`` (by live top tree) where the check counted them."""
        if live_top in counted:
            return counted[live_top]
        changes = self.engine.compare_tops(target_top, live_top, base_image=self._base_image())
        return plan.as_stats(plan.counts(changes))

    async def activity_entries(self, limit: int, action: str | None) -> list[dict[str, Any]]:
        return await trio.to_thread.run_sync(lambda: self.activity.entries(limit, action))

    # -- the environment's services --------------------------------------------------------

    async def services(self) -> shapes.Services:
        sup = self.env.supervisor
        await sup.reload()
        return {"services": sup.status(), "errors": sup.definition_errors}

    async def service_start(self, name: str) -> dict[str, Any]:
        return await self.env.supervisor.start(name)

    async def service_stop(self, name: str) -> dict[str, Any]:
        return await self.env.supervisor.stop(name)

    async def service_logs(self, name: str, lines: int) -> shapes.ServiceLogs:
        sup = self.env.supervisor
        return {"name": name, "lines": await trio.to_thread.run_sync(sup.logs, name, lines)}

    # -- jobs ------------------------------------------------------------------------------

    async def create(
        self,
        comment: str,
        actor: str,
        *,
        auto: bool = False,
        reason: str | None = None,
        wait_remote: bool = False,
    ) -> Job | RemoteWait:
        """A create job (``wait_remote``: its stream ends once the checkpoint is remote,
        see :class:`~sprite_env.daemon.uploader.RemoteWait`)."""
        from sprite_env.checkpoints.engine import check_comment

        text = reason if auto and reason else comment
        check_comment(text)
        if wait_remote and self.uploader is None:
            raise NoRemote  # before anything is created
        if not auto:  # a manual create over the quota is refused before its stream starts
            try:
                await trio.to_thread.run_sync(self._room_for, 1, True, actor, "this checkpoint")
            except QuotaExceeded as e:  # a failure like any other: in the activity log
                await self._record("create", None, actor, False, str(e))
                raise

        async def body(job: Job) -> Event:
            # An automatic one ("before <agent> session") is skipped only when it would be
            # a copy: one under 10 minutes old exists AND the layer still equals the
            # checkpoint it is on. A file written since is always captured (issue 10).
            may_skip = auto and await trio.to_thread.run_sync(self._recent_auto) is not None
            job.info("Creating checkpoint...")
            await trio.to_thread.run_sync(self._room_for, 1, False, actor)
            job.info("Saving filesystem state...")
            report = FreezeReport()
            pause = self.env.pause(report)
            made = await trio.to_thread.run_sync(
                lambda: (self.engine.create_if_changed if may_skip else self.engine.create)(
                    text,
                    created_by=actor,
                    auto=auto,
                    progress=job.progress_from_thread(),
                    pause=pause,
                )
            )
            if made is None:
                on = await trio.to_thread.run_sync(self.engine.active)
                said = f"skipped: no change since {on}"
                await self._record("create", on, actor, True, f"{said} ({text})")
                current = await trio.to_thread.run_sync(self.engine.info, str(on))
                return events.complete(
                    job.id,
                    f"Checkpoint {said}",
                    id=on,
                    skipped=True,
                    checkpoint={**current.to_json(active=on), "storage": self._storage_of(str(on))},
                )
            cp = made
            extra: dict[str, Any] = {}
            if pause is not None:
                extra["pause"] = _pause_json(report)
                job.info(
                    f"Writers paused for {report.seconds * 1000:.0f} ms "
                    f"({len(report.frozen)} processes)"
                )
            await self._record("create", cp.id, actor, True, text)
            if auto:
                await self._apply_retention()
            return events.complete(
                job.id,
                f"Checkpoint {cp.id} created successfully",
                id=cp.id,
                checkpoint={**cp.to_json(active=cp.id), "storage": self._storage_of(cp.id)},
                **extra,
            )

        job = self.jobs.submit("create", None, actor, self._recorded("create", None, actor, body))
        if wait_remote and self.uploader is not None:
            return RemoteWait(job, self.uploader)
        return job

    async def restore(self, cid: str, actor: str) -> Job:
        await trio.to_thread.run_sync(self.engine.info, cid)  # 404/400 before the 202

        async def body(job: Job) -> Event:
            job.info(f"Restoring from checkpoint {cid}...")
            # Before anything stops: the target (it may have been deleted while this job
            # waited), room and intact data, and whether there is anything to do at all.
            # A restore that cannot be done, or need not be, bounces no service and, under
            # an overlay, ends no session (issue 10). The check stores what changed (a
            # prewarm, journal-driven), so the undo checkpoint taken once the environment
            # is down reads only what changed after it (issue 11, point 6).
            progress = job.progress_from_thread()
            # An overlay restore's counts (MERGED's entries, see _merged_stats) are counted
            # during the check, beside its verifying: counted after the restore, they were
            # 0.75-0.84 s between "Services started" and the complete event (the medium
            # step's undo). The restore's undo checkpoint then finds the layer as the check
            # did (nothing wrote meanwhile), or they are counted again after it.
            counted: dict[ObjectId, dict[str, int]] = {}
            beside = None
            if self.config.overlay is not None:
                target_top = (await trio.to_thread.run_sync(self.engine.info, cid)).top_tree

                def beside(live_top: ObjectId) -> None:
                    try:
                        counted[live_top] = self._merged_stats(target_top, live_top, {})
                    except (SpriteError, OSError) as e:  # counted after the restore instead
                        log.warning("counting the restore's changes: %s", e)

            check = functools.partial(self.engine.check_restore, cid, progress, beside=beside)
            if not await trio.to_thread.run_sync(check):
                await trio.to_thread.run_sync(self.engine.set_active, cid)
                await self._record("restore", cid, actor, True, "already there: nothing to do")
                return events.complete(
                    job.id,
                    f"The layer already is {cid}: nothing to restore",
                    id=cid,
                    undo=None,
                    noop=True,
                )
            undo_id = await self._undo_slot(job, actor)
            # The merged counts are counted while the environment comes back up (they read
            # only trees of the store), so that the complete event follows "Services
            # started" at once: counted after it, they were part of the 2.0-6.8 s the
            # caller still waited then (issue 11's table, medium layer). A thread of its
            # own, not a task: a nursery around the restore would wrap its errors in groups.
            counter = ThreadPoolExecutor(1, thread_name_prefix="restore-count")
            counting: Future[dict[str, int]] | None = None
            try:
                async with self.env.down(job):
                    rep = await trio.to_thread.run_sync(
                        lambda: self.engine.restore(
                            cid,
                            created_by=actor,
                            progress=job.progress_from_thread(),
                            undo_id=undo_id,
                        )
                    )
                    if self.config.overlay is not None and rep.undo is not None:
                        undo = rep.undo
                        counting = counter.submit(
                            lambda: self._merged_stats(
                                target_top, self.engine.info(undo).top_tree, counted
                            )
                        )
                merged = await trio.to_thread.run_sync(counting.result) if counting else {}
            finally:
                counter.shutdown(wait=False)
            stats = {**rep.to_json(), **merged}
            await self._record("restore", cid, actor, True, f"undo: {rep.undo}")
            await self._apply_retention(keep=rep.undo)
            return events.complete(
                job.id, f"Restore from {cid} complete", id=cid, undo=rep.undo, stats=stats
            )

        return self.jobs.submit("restore", cid, actor, self._recorded("restore", cid, actor, body))

    async def reset(self, actor: str) -> Job:
        if self.config.overlay is None:
            raise NoBaseImage(self.config.root)

        async def body(job: Job) -> Event:
            job.info("Resetting the layer to the base image...")
            await trio.to_thread.run_sync(
                self._room_for, 1, False, actor, "the reset's undo checkpoint"
            )
            await self._prewarm(job)
            async with self.env.down(job):
                rep = await trio.to_thread.run_sync(
                    lambda: self.engine.reset(created_by=actor, progress=job.progress_from_thread())
                )
            await self._record("reset", None, actor, True, f"undo: {rep.undo}")
            await self._apply_retention()
            return events.complete(job.id, "Reset complete", undo=rep.undo, stats=rep.to_json())

        return self.jobs.submit("reset", None, actor, self._recorded("reset", None, actor, body))

    async def delete(self, cid: str, actor: str, *, dry_run: bool = False) -> dict[str, Any]:
        await trio.to_thread.run_sync(self.engine.info, cid)
        if dry_run:  # a plan over the catalog, changing nothing: no need to queue
            rep = await trio.to_thread.run_sync(self.engine.plan_delete, [cid])
            return rep.to_json()

        async def body(job: Job) -> Event:
            rep = await trio.to_thread.run_sync(self.engine.delete, cid)
            await self._record("delete", cid, actor, True, f"{rep.bytes_freed} bytes freed")
            return events.complete(job.id, f"Deleted {cid}", id=cid, report=rep.to_json())

        job = self.jobs.submit("delete", cid, actor, self._recorded("delete", cid, actor, body))
        return _wait_result(await _finished(job), "report")

    # -- any checkpoint, any path (issue 10, point 5) --------------------------------------

    async def read_path(self, cid: str, path: bytes) -> FileBytes | dict[str, Any]:
        """``GET /v1/checkpoints/{id}/files/{path}``: a file's size and bytes (read as they
        are sent, so a file of any size costs one block of memory); anything else, its
        entry as JSON (a directory with its entries). Reads the store only: it runs beside
        any job, for every checkpoint, automatic or not, mounted or not.

        Error handling:
            An unknown id or path, ``..`` or a symlink on the way raise before an answer
            starts. A piece found damaged after the first block ends the answer short of
            its Content-Length (logged), which a client reports as a cut answer.
        """
        base = self._base_image()  # under an overlay: as the environment saw it
        entry, read = await trio.to_thread.run_sync(
            lambda: self.engine.find(cid, path, base_image=base)
        )
        if entry.kind is Kind.FILE:
            blocks = self.engine.read_file(entry, read)
            try:
                first = await trio.to_thread.run_sync(_take, blocks)  # damage: an error answer
            except StoreError as e:
                raise StoreError(
                    f"checkpoint {cid} is damaged at {show(path)}: {e} (see: {CHECK_HINT})"
                ) from None
            return FileBytes(entry.size, _send_blocks(first, blocks, f"{cid}:{show(path)}"))
        children = None
        if entry.kind is Kind.DIR:
            children = await trio.to_thread.run_sync(self.engine.entries, entry, read)
        return entry_json(cid, path, entry, children)

    async def export(
        self, cid: str, dest: str, paths: list[str], actor: str, *, uid: int | None = None
    ) -> Job:
        """``POST /v1/checkpoints/{id}/export``: a job writing checkpoint ``cid`` (or only
        ``paths``) into ``dest``, an absolute directory that is missing or empty, on this
        machine as the daemon sees it. Refused before the job: an unknown id or path, a
        relative, non-empty or private DEST, or one the caller (user ``uid``, from the
        socket's peer credentials) could not write itself (see :meth:`_check_dest`)."""
        base = self._base_image()
        if paths:  # an unknown id or path: 4xx before the job
            await trio.to_thread.run_sync(
                lambda: self.engine.check_paths(cid, paths, live=False, base_image=base)
            )
        else:
            await trio.to_thread.run_sync(self.engine.info, cid)
        self._check_dest(dest, uid)

        async def body(job: Job) -> Event:
            job.info(f"Exporting {cid} to {dest}...")
            self._check_dest(dest, uid)  # again: it may have been filled while the job waited
            with contextlib.suppress(FileExistsError):
                os.mkdir(dest, 0o700)
            stats = await trio.to_thread.run_sync(
                lambda: self.engine.export(
                    cid,
                    dest,
                    paths=paths or None,
                    progress=job.progress_from_thread(),
                    base_image=base,
                )
            )
            shown = f" ({', '.join(paths)})" if paths else ""
            await self._record("export", cid, actor, True, f"to {dest}{shown}")
            return events.complete(
                job.id,
                f"Exported {cid} to {dest}",
                id=cid,
                dest=dest,
                paths=paths,
                stats=stats.__dict__,
            )

        return self.jobs.submit("export", cid, actor, self._recorded("export", cid, actor, body))

    def _check_dest(self, dest: str, uid: int | None = None) -> None:
        """An export's DEST: absolute, a missing name in an existing directory or an empty
        directory (not a symlink), and not where the daemon keeps its own data or below an
        overlay's internals. Writing into the layer's live view (the root, MERGED) is what a
        user does in a sprite, where every path is in MERGED: allowed, it is then in the
        next checkpoint like any file written there.

        The daemon writes as root: a caller of another user (``uid``, given the socket
        through ``--socket-group``) may only export into a directory it owns (DEST, or its
        parent when DEST is missing), so the API never lets it write where it could not.

        Raises:
            UserError: one of these does not hold (nothing was written).
        """
        if not os.path.isabs(dest):
            raise UserError(f"export destination {dest!r} must be an absolute path")
        where = os.path.join(os.path.realpath(os.path.dirname(dest)), os.path.basename(dest))
        private = {"the state directory": self.config.state, "the store": self.config.store_dir}
        if self.config.overlay is not None:
            o = self.config.overlay
            private |= {"the layer (UPPER)": o.upper, "the base image (LOWER)": o.lower}
            private["the overlay's WORK"] = o.work
        for what, top in private.items():
            top = os.path.realpath(top)
            if where == top or where.startswith(top.rstrip("/") + "/"):
                raise UserError(f"cannot export into {dest}: it is inside {what} ({top})")
        try:
            st = os.lstat(where)
        except FileNotFoundError:
            if not os.path.isdir(os.path.dirname(where)):
                raise UserError(
                    f"cannot export into {dest}: {os.path.dirname(dest)} is not a directory"
                ) from None
            owner = os.stat(os.path.dirname(where)).st_uid
            if uid not in (None, 0, owner):
                raise UserError(
                    f"cannot export into {dest}: user {uid} does not own "
                    f"{os.path.dirname(where)} (the daemon writes as root; other users "
                    "export into their own directories)"
                ) from None
            return
        if uid not in (None, 0, st.st_uid):
            raise UserError(
                f"cannot export into {dest}: user {uid} does not own it (the daemon writes "
                "as root; other users export into their own directories)"
            )
        if not stat.S_ISDIR(st.st_mode):
            raise UserError(f"cannot export into {dest}: it exists and is not a directory")
        if os.listdir(where):
            raise UserError(f"cannot export into {dest}: it is not empty")

    async def restore_paths(self, cid: str, paths: list[str], actor: str) -> Job:
        """``POST /v1/checkpoints/{id}/restore`` with ``paths``: those files or subtrees as
        in ``cid``, the rest untouched (``Engine.restore_paths``). Runs as a whole restore
        does: checked while everything runs, a no-op when they already match, services
        down around it, an undo checkpoint first (under an overlay, its id said before the
        sessions end)."""
        # An unknown id, "..", a symlink on the way, a path in neither: 4xx before the 202.
        base = self._base_image()
        await trio.to_thread.run_sync(lambda: self.engine.check_paths(cid, paths, base_image=base))
        shown = ", ".join(paths)

        async def body(job: Job) -> Event:
            job.info(f"Restoring {shown} from checkpoint {cid}...")
            progress = job.progress_from_thread()
            if not await trio.to_thread.run_sync(  # a prewarm too, as for a whole restore
                lambda: self.engine.check_restore_paths(
                    cid, paths, base_image=base, progress=progress
                )
            ):
                await self._record("restore", cid, actor, True, f"{shown}: already as in {cid}")
                return events.complete(
                    job.id,
                    f"{shown} already as in {cid}: nothing to restore",
                    id=cid,
                    undo=None,
                    noop=True,
                    paths=paths,
                )
            undo_id = await self._undo_slot(job, actor)
            async with self.env.down(job):
                rep = await trio.to_thread.run_sync(
                    lambda: self.engine.restore_paths(
                        cid,
                        paths,
                        created_by=actor,
                        progress=job.progress_from_thread(),
                        undo_id=undo_id,
                        base_image=base,
                    )
                )
            await self._record("restore", cid, actor, True, f"{shown}; undo: {rep.undo}")
            await self._apply_retention(keep=rep.undo)
            return events.complete(
                job.id,
                f"Restore of {shown} from {cid} complete",
                id=cid,
                undo=rep.undo,
                paths=paths,
                stats=rep.to_json(),
            )

        return self.jobs.submit("restore", cid, actor, self._recorded("restore", cid, actor, body))

    async def preview_paths(self, cid: str, paths: list[str], actor: str) -> dict[str, Any]:
        """``POST /v1/checkpoints/{id}/preview`` with ``paths``: what ``restore_paths``
        would do, in the words of a whole preview."""
        await trio.to_thread.run_sync(self.engine.info, cid)

        async def body(job: Job) -> Event:
            base = self._base_image()
            p = await trio.to_thread.run_sync(
                lambda: self.engine.preview_paths(cid, paths, base_image=base)
            )
            return events.complete(job.id, "Preview done", id=cid, preview=p.to_json())

        job = self.jobs.submit("preview", cid, actor, body)
        return _wait_result(await _finished(job), "preview")

    async def _undo_slot(self, job: Job, actor: str) -> str | None:
        """Makes room for a restore's undo checkpoint and, under an overlay, reserves its
        id and says it: the restore ends every session using MERGED, the caller's own
        included, which must hear the undo id while it still can (issue 10). Returns the
        reserved id (None: the engine picks it)."""
        await trio.to_thread.run_sync(
            self._room_for, 1, False, actor, "the restore's undo checkpoint"
        )
        if self.env.overlay is None:
            return None
        undo_id = await trio.to_thread.run_sync(self.engine.reserve_auto_id)
        job.info(
            f"Undo checkpoint: {undo_id}; the sessions using {self.env.overlay.merged} end now",
            undo=undo_id,
            ends_sessions=True,
        )
        return undo_id

    async def _prewarm(self, job: Job) -> None:
        """Stores what changed while the environment still runs: the undo checkpoint,
        taken once it is down, then reads only what changed since (less downtime). A
        restore's check does the same (``Engine.check_restore``); a reset, which has no
        check, calls this."""
        if self.env.overlay is not None:
            await trio.to_thread.run_sync(self.engine.prewarm, job.progress_from_thread())

    def _recorded(self, action: str, cid: str | None, actor: str, body: Any) -> Any:
        """Wraps a job body so that a failure is in the activity log too."""

        async def wrapped(job: Job) -> Event:
            try:
                return await body(job)  # type: ignore[no-any-return]
            except Exception as e:
                with trio.CancelScope(shield=True):
                    await self._record(action, cid, actor, False, str(e))
                raise

        return wrapped

    async def _record(
        self, action: str, cid: str | None, actor: str, ok: bool, detail: str
    ) -> None:
        try:
            await trio.to_thread.run_sync(
                lambda: self.activity.record(action, cid, actor, ok, detail)
            )
        except OSError as e:  # a full disk must not fail the job that already succeeded
            log.error("activity log: %s", e)

    # -- policies --------------------------------------------------------------------------

    def _room_for(self, adding: int, check_only: bool, actor: str = "quota", why: str = "") -> None:
        """Deletes automatic checkpoints (oldest first) so ``adding`` more fit the quota;
        raises ``quota_exceeded``, naming the manual checkpoints to delete and ``why`` the
        room is needed, if only manual checkpoints would be left to delete."""
        cps = self.engine.checkpoints(include_auto=True)
        active = self.engine.active()
        drop = make_room(
            [(c.id, c.is_auto, c.create_time_ns) for c in cps],
            self.config.max_checkpoints,
            adding=adding,
            protect={active} if active else set(),
            why=why,
        )
        if drop and not check_only:
            self.engine.delete_many(drop)
            for cid in drop:
                self.activity.record(
                    "delete", cid, "quota", True, f"room for a checkpoint of {actor}"
                )

    def _recent_auto(self) -> Checkpoint | None:
        now = time.time_ns()
        for c in self.engine.checkpoints(include_auto=True):
            if c.is_auto and now - c.create_time_ns < RECENT_AUTO_S * 1_000_000_000:
                return c
        return None

    async def _apply_retention(self, keep: str | None = None) -> None:
        """Deletes automatic checkpoints the policy no longer keeps (never the active one,
        nor ``keep``: the undo point of the restore just done)."""

        def prune() -> list[str]:
            cps = [c for c in self.engine.checkpoints(include_auto=True) if c.is_auto]
            autos = [(c.id, c.create_time_ns) for c in cps]
            # The points an agent session started from are kept, the newest few of them,
            # whatever else the policy drops (issue 13: CalmAPI keeps five).
            sessions = [c.id for c in cps if SESSION_COMMENT.fullmatch(c.comment)]
            protect = {c for c in (self.engine.active(), keep) if c}
            protect.update(sessions[:KEEP_SESSIONS])  # newest first
            plan = plan_retention(autos, self.config.retention, protect=protect)
            if plan.drop:
                self.engine.delete_many(plan.drop)
                for cid in plan.drop:
                    self.activity.record("delete", cid, "retention", True, "pruned by policy")
            return plan.drop

        dropped = await trio.to_thread.run_sync(prune)
        if dropped:
            log.info("retention pruned %s", ", ".join(dropped))

    async def scheduled(self, reason: str) -> None:
        """The scheduler's tick: an automatic checkpoint if the layer changed."""

        async def body(job: Job) -> Event:
            await trio.to_thread.run_sync(self._room_for, 1, False, "scheduler")
            pause = self.env.pause(FreezeReport())
            cp = await trio.to_thread.run_sync(
                lambda: self.engine.create_if_changed(
                    reason, created_by="scheduler", progress=job.progress_from_thread(), pause=pause
                )
            )
            if cp is None:
                return events.complete(job.id, "Layer unchanged; no checkpoint", skipped=True)
            await self._record("create", cp.id, "scheduler", True, reason)
            await self._apply_retention()
            return events.complete(job.id, f"Checkpoint {cp.id} created successfully", id=cp.id)

        await _finished(self.jobs.submit("auto", None, "scheduler", body))

    def _after_job(self, job: Job) -> None:
        self._drop_answers()
        if self.uploader is not None:  # a commit, maybe: pushed if the bucket lacks it
            self.uploader.notify()
        if self.view is not None and job.kind in ("create", "restore", "reset", "delete", "auto"):
            self.view.refresh()


#: Bytes read per trip to a worker thread while a file is sent (one chunk is ~64 KiB).
SEND_BLOCK = 1 << 20


def _take(blocks: Iterator[bytes]) -> bytes:
    """Up to ``SEND_BLOCK`` bytes of ``blocks`` (b"" at the end), in a worker thread."""
    out: list[bytes] = []
    n = 0
    for block in blocks:
        out.append(block)
        n += len(block)
        if n >= SEND_BLOCK:
            break
    return b"".join(out)


async def _send_blocks(first: bytes, rest: Iterator[bytes], what: str) -> AsyncIterator[bytes]:
    block = first
    while block:
        yield block
        try:
            block = await trio.to_thread.run_sync(_take, rest)
        except (SpriteError, OSError) as e:  # the answer ends short of its Content-Length
            log.error("sending %s: %s", what, e)
            return


async def _finished(job: Job) -> Job:
    await job.done.wait()
    return job


def _wait_result(job: Job, key: str) -> dict[str, Any]:
    if job.problem is not None:
        raise job.problem
    result: dict[str, Any] = job.result[key]
    return result


def _encode(value: Any) -> bytes:
    return json.dumps(value).encode() + b"\n"


def _pause_json(r: FreezeReport) -> dict[str, Any]:
    return {"seconds": round(r.seconds, 6), "processes": len(r.frozen), "method": r.method}


def _diff_json(a: str, b: str | None, diffs: list[Counted]) -> shapes.Diff:
    """What changed from ``a`` to ``b`` (``shapes.Diff``, as the offline CLI says it)."""
    return shapes.diff(a, b, [cast("shapes.DiffEntry", d.to_json()) for d in diffs])


# -- running ---------------------------------------------------------------------------------


def _make_state_dir(state: str, socket_group: str | None) -> None:
    """Creates STATE, or makes it private: 0700, or 0710 for group G given ``--socket-group
    G``, since connecting to STATE/api.sock needs search permission on STATE. G can then
    open the socket, llm.txt and the view by name, never list STATE or open the store,
    the logs or the lock, which are 0700/0600 of their own (see ``sprite_env/privacy.py``).

    Raises:
        UserError: the group does not exist.
        privacy.AccessDenied: this user may not create or change STATE.
    """
    gid = -1
    if socket_group is not None:
        try:
            gid = grp.getgrnam(socket_group).gr_gid
        except KeyError:
            raise UserError(f"--socket-group: unknown group {socket_group!r}") from None
    mode = 0o710 if gid != -1 else privacy.DIR_MODE
    try:
        before = privacy.make_dir(state, mode, gid)
        if not os.access(state, os.R_OK | os.W_OK | os.X_OK):  # root's STATE, our uid not
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), state)
    except PermissionError as e:
        raise privacy.AccessDenied("state directory", state, e) from None
    if before is not None and before & ~mode & privacy.OPEN_BITS:
        log.warning(
            "state directory %s was mode %04o, open to other users: made %04o", state, before, mode
        )


def _lock_state(state: str) -> int:
    """Takes the state directory's lock (one daemon per state) and writes our pid into it."""
    path = os.path.join(state, "daemon.lock")
    fd = privacy.open_file(path, os.O_RDWR)  # 0600, an older 0644 one too
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = os.pread(fd, 32, 0).decode(errors="replace").split("\n")[0].strip() or "?"
        os.close(fd)
        raise DaemonRunning(f"another sprite-env daemon (pid {pid}) serves {state}") from None
    statelock.write(fd, "starting")
    return fd


def install_llm_txt(state: str) -> str:
    """Writes the agents' guide to STATE/llm.txt (atomically: readers never see half)."""
    text = resources.files("sprite_env").joinpath("llm.txt").read_bytes()
    dest = os.path.join(state, "llm.txt")
    tmp = dest + ".tmp"
    with open(tmp, "wb") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, dest)
    return dest


async def run(
    config: DaemonConfig, *, task_status: trio.TaskStatus[Daemon] = trio.TASK_STATUS_IGNORED
) -> None:
    """Runs the daemon until SIGTERM or SIGINT (or cancellation)."""
    state = config.state  # absolute (config_from_args)
    _make_state_dir(state, config.socket_group)
    lock_fd = _lock_state(state)
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            install_llm_txt(state)
            where = f"{config.store_dir}, packs in {config.remote}" if config.remote else None
            log.info("opening %s (store %s)", config.layer, where or config.store_dir)
            engine = await trio.to_thread.run_sync(
                lambda: Engine(
                    config.layer,
                    config.store_dir,
                    excludes=config.excludes,
                    exclude_dirs=[state],
                    resume=False,
                    remote=config.remote,
                )
            )
            # Armed before any capture (an interrupted restore's, the first checkpoint's):
            # the first capture walks everything, and every later one builds on it.
            journal = await trio.to_thread.run_sync(
                lambda: open_journal(
                    config.layer,
                    views=[config.env_root] if config.overlay else [],
                    overlay=config.overlay is not None,
                    enabled=config.journal,
                )
            )
            engine.journal = journal
            if isinstance(journal, NoJournal):
                log.info("%s: every checkpoint walks the whole layer", journal.reason)
            lease: Lease | None = None
            try:
                supervisor = Supervisor(config.env_root, os.path.join(state, "services"))
                env = Environment(supervisor, config.overlay, journal)
                activity = ActivityLog(os.path.join(state, "activity.jsonl"))
                daemon = Daemon(config, engine, activity, env)
                daemon.lock_fd = lock_fd
                storage: ObjectStorage | None = None
                if config.remote is not None:  # before anything serves: a second daemon
                    storage = await trio.to_thread.run_sync(config.remote.storage)
                    wid = writer_id(engine.store)  # on this prefix stops here (LeaseHeld)
                    lease = await trio.to_thread.run_sync(Lease.acquire, storage, wid)
                    lease.keep_renewed()
                if config.overlay is not None:
                    await trio.to_thread.run_sync(freeze.thaw_leftovers)
                async with trio.open_nursery() as services:
                    services.start_soon(_poll_journal, journal)
                    await services.start(supervisor.run)
                    await _finish_interrupted(daemon)
                    if storage is not None:  # after a restore resumed: it commits
                        daemon.uploader = Uploader(
                            engine,
                            storage,
                            lease=lease,
                            on_change=daemon._after_push,
                            gc=config.remote.gc if config.remote is not None else None,
                        )
                        lease = None  # the uploader's now: it releases it when it stops
                        await services.start(daemon.uploader.run)
                    await env.up()
                    await _serve(daemon, signals, task_status)
                    if daemon.uploader is not None:  # a push ends at its next pack
                        daemon.uploader.stop()
                    await supervisor.stop_all()
                    await _shutdown_checkpoint(daemon)
                    services.cancel_scope.cancel()
            finally:
                if lease is not None:  # the start failed before the uploader took it
                    lease.release()
                journal.close()
                engine.close()
    finally:
        os.close(lock_fd)


async def _poll_journal(journal: ChangeJournal) -> None:
    """Reads the journal's events as they come, so the kernel's queue (unlimited: its
    memory is the daemon's) stays short between checkpoints; batched every 50 ms, decoded
    off the trio thread."""
    if not isinstance(journal, Journal):
        return
    while True:
        await trio.lowlevel.wait_readable(journal.fileno())
        await trio.to_thread.run_sync(journal.poll)
        await trio.sleep(0.05)


async def _serve(
    daemon: Daemon,
    signals: Any,
    task_status: trio.TaskStatus[Daemon],
) -> None:
    from sprite_env.api.routes import Router

    config = daemon.config
    # Repeated list and info answers come from a process of their own (api/front.py).
    repeater = Front(lambda: daemon._answers.generation, SERVER) if config.front else None
    if repeater is not None:
        daemon._answers.on_clear.append(repeater.clear)
    async with trio.open_nursery() as outer:  # the view: last to go
        if config.view:
            daemon.view = await _start_view(outer, daemon)
        async with trio.open_nursery() as inner:
            inner.start_soon(daemon.jobs.run)
            with trio.CancelScope() as front:  # socket and scheduler: first to go
                async with trio.open_nursery() as front_nursery:
                    await front_nursery.start(
                        lambda task_status: serve_unix(
                            config.socket,
                            Router(daemon).handle,
                            group=config.socket_group,
                            limits=config.limits,
                            front=repeater,
                            task_status=task_status,
                        )
                    )
                    log.info("listening on %s", config.socket)
                    daemon.say_phase("serving")
                    front_nursery.start_soon(daemon._answers.run)  # rebuilt after changes
                    front_nursery.start_soon(
                        lambda: run_scheduler(daemon.scheduled, interval=config.auto_interval_s)
                    )
                    task_status.started(daemon)
                    async for signum in signals:
                        log.info("%s: stopping", signal.Signals(signum).name)
                        daemon.say_phase("stopping")
                        break
                    front.cancel()
            daemon.jobs.close()  # queued jobs fail; the running one ends; run() returns
        outer.cancel_scope.cancel()


async def _finish_interrupted(daemon: Daemon) -> None:
    """Finishes a restore (or delete) a crash interrupted, before anyone can connect. With
    an overlay, MERGED comes down first: UPPER must not change under a mounted overlay."""
    engine = daemon.engine
    intent = engine.pending_restore()
    if intent is not None and intent.get("failed"):
        # A restore that failed is not retried blindly (see Engine.resume_pending); the
        # daemon serves as usual and reports it until another restore replaces it.
        log.warning("a restore did not finish: %s", engine.interrupted_restore())
        intent = None
    if intent is not None:
        log.info("finishing an interrupted restore")
        daemon.say_phase("finishing-restore")
        unmounting = await daemon.env.take_down()
        try:
            rep = await trio.to_thread.run_sync(engine.resume_pending)
        except RestoreFailed as e:
            # Never a daemon that cannot start (issue 15): say so, and serve.
            log.error("%s", e)
            daemon.activity.record("restore", e.target, "daemon", False, str(e))
            rep = None
        finally:
            await daemon.env.settle(unmounting)
        if rep is not None:
            daemon.activity.record("restore", rep.id, "daemon", True, "finished after a crash")
    else:
        await trio.to_thread.run_sync(engine.resume_pending)  # an interrupted delete


async def _start_view(nursery: trio.Nursery, daemon: Daemon) -> ViewOperations | None:
    from sprite_env.fuse.merged import MergedSource
    from sprite_env.fuse.mount import serve
    from sprite_env.fuse.operations import ViewConfig
    from sprite_env.fuse.source import CheckpointSource, StoreSource

    with contextlib.suppress(OSError):  # exists (or is a stale mount: serve() detaches it)
        os.mkdir(daemon.config.mountpoint, 0o755)
    source: CheckpointSource = StoreSource.from_engine(daemon.engine)
    if daemon.config.overlay is not None:  # each checkpoint as MERGED looked: base + layer
        source = MergedSource(source, daemon.config.overlay.lower)
    view_config = ViewConfig(count=daemon.config.view_count, include_auto=daemon.config.view_auto)

    async def mounted(task_status: trio.TaskStatus[ViewOperations]) -> None:
        try:
            await serve(source, daemon.config.mountpoint, view_config, task_status=task_status)
        except SpriteError as e:
            log.error("checkpoint view not mounted: %s", e)
            task_status.started(None)  # type: ignore[arg-type]

    try:
        ops: ViewOperations | None = await nursery.start(mounted)
    except SpriteError as e:
        log.error("checkpoint view not mounted: %s", e)
        return None
    if ops is not None:
        log.info("checkpoint view at %s", daemon.config.mountpoint)
    return ops


async def _shutdown_checkpoint(daemon: Daemon) -> None:
    """At a clean shutdown, an automatic checkpoint if the layer changed since the last."""
    if daemon.config.auto_interval_s <= 0:
        return
    try:
        pause = daemon.env.pause(FreezeReport())
        cp = await trio.to_thread.run_sync(
            lambda: daemon.engine.create_if_changed(
                "at daemon shutdown", created_by="scheduler", pause=pause
            )
        )
    except (SpriteError, OSError) as e:
        log.error("shutdown checkpoint failed: %s", e)
        return
    if cp is not None:
        daemon.activity.record("create", cp.id, "scheduler", True, "at daemon shutdown")
        log.info("shutdown checkpoint %s", cp.id)


def config_from_args(args: argparse.Namespace) -> DaemonConfig:
    overlay = Overlay.parse(args.overlay) if args.overlay else None
    if overlay and args.root:
        raise UserError("--overlay names the layer (UPPER) and the root (MERGED): drop --root")
    given = [f for f, v in (("--socket", args.socket), ("--as", args.actor)) if v]
    given += ["--json"] if args.json else []
    if given:  # the daemon's socket is STATE/api.sock, and it answers as itself
        verb = "means" if len(given) == 1 else "mean"
        raise UserError(f"{' and '.join(given)} {verb} nothing to the daemon: drop them")
    if not overlay and not args.root:
        # No default: a daemon checkpoints (and restores) all of its root, so ``/`` must be
        # asked for, never fallen into (issue 10).
        raise UserError(
            "say which layer the daemon owns: --overlay LOWER:UPPER:WORK:MERGED (a sprite: "
            "a base image with the layer above it) or --root DIR (checkpoints of DIR itself; "
            "--root / for the whole machine)"
        )
    root = overlay.merged if overlay else os.path.abspath(args.root)
    state = os.path.abspath(args.state or os.path.join(root, ".sprite"))
    if overlay and (state + "/").startswith(root.rstrip("/") + "/"):
        raise UserError(
            f"with --overlay the state directory must be outside MERGED ({root}): a restore "
            "unmounts MERGED; give --state"
        )
    if args.max_checkpoints < 1:
        raise UserError("--max-checkpoints must be at least 1")
    remote = _remote_of(args)  # a bad URL, size or keep: said before anything starts
    return DaemonConfig(
        root=root,
        state=state,
        store=os.path.abspath(args.store) if args.store and remote is None else None,
        remote=remote,
        socket_group=args.socket_group,
        auto_interval_s=args.auto_interval * 60.0,
        max_checkpoints=args.max_checkpoints,
        view=not args.no_view,
        view_count=args.view_count,
        view_auto=args.view_auto,
        limits=Limits(request_timeout=args.request_timeout),
        excludes=args.exclude,
        overlay=overlay,
        journal=not args.no_journal,
    )


def _remote_of(args: argparse.Namespace) -> RemoteConfig | None:
    """``--store s3://BUCKET/PREFIX`` and ``--cache-size``, or None (a local store)."""
    from sprite_env.store.backend import BadCacheSize, RemoteConfig, is_remote

    if not is_remote(args.store):
        if args.cache_size is not None:
            raise BadCacheSize(
                "--cache-size bounds a remote store's cache: it needs --store s3://BUCKET/PREFIX"
            )
        return None
    return RemoteConfig.parse(args.store, args.cache_size)


def run_from_args(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = config_from_args(args)
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(run, config)
    return 0
