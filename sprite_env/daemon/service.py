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
import grp
import json
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

import trio

from sprite_env import __version__, privacy
from sprite_env.api import events
from sprite_env.api.server import Limits, serve_unix
from sprite_env.checkpoints import Engine
from sprite_env.daemon.activity import ActivityLog
from sprite_env.daemon.environment import Environment
from sprite_env.daemon.jobs import Job, JobRunner
from sprite_env.daemon.retention import RetentionPolicy, make_room, plan_retention
from sprite_env.daemon.scheduler import run_scheduler
from sprite_env.errors import SpriteError, UserError
from sprite_env.overlay import Overlay, freeze
from sprite_env.overlay.freeze import FreezeReport
from sprite_env.services import Supervisor

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    from sprite_env.api.events import Event
    from sprite_env.checkpoints.registry import Checkpoint
    from sprite_env.fuse.operations import ViewOperations
    from sprite_env.snapshot.diff import Difference

log = logging.getLogger("sprite_env.daemon")

#: Encoded answers of reads kept until the next job ends (see ``checkpoints_json``).
MAX_CACHED_ANSWERS = 256
#: An ``{"auto": true}`` request is satisfied by an automatic checkpoint this recent.
RECENT_AUTO_S = 600


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
        self._answers: dict[tuple[object, ...], bytes] = {}
        self._generation = 0

    # -- reads (concurrent with jobs: the catalog's readers see committed rows) ------------

    async def status(self) -> dict[str, Any]:
        running = self.jobs.running
        return {
            "version": __version__,
            "pid": os.getpid(),
            "root": self.config.root,
            "state": self.config.state,
            "store": self.config.store_dir,
            "started": self.started,
            "active": await trio.to_thread.run_sync(self.engine.active),
            "job": running.to_json() if running else None,
            "queued": self.jobs.queued(),
            "mount": self.config.mountpoint if self.view is not None else None,
            # What a reset goes back to; None: no base image, so no reset.
            "base_image": self.config.overlay.lower if self.config.overlay else None,
            "auto_interval_s": self.config.auto_interval_s,
            "max_checkpoints": self.config.max_checkpoints,
        }

    async def checkpoints_json(self, include_auto: bool, history: str | None) -> bytes:
        """``GET /v1/checkpoints``, encoded. Answers are cached until the next job ends:
        only jobs change checkpoints, and a client polling in a loop then costs a lookup,
        not a catalog query and a JSON encoding on a process the running job needs."""

        def read() -> bytes:
            active = self.engine.active()
            cps = self.engine.checkpoints(include_auto=include_auto, history=history)
            return _encode([c.to_json(active=active) for c in cps])

        return await self._cached(("list", include_auto, history), read)

    async def info_json(self, cid: str) -> bytes:
        """``GET /v1/checkpoints/{id}``, encoded (cached like the list)."""

        def read() -> bytes:
            return _encode(self.engine.info(cid).to_json(active=self.engine.active()))

        return await self._cached(("info", cid), read)

    async def _cached(self, key: tuple[object, ...], read: Callable[[], bytes]) -> bytes:
        hit = self._answers.get(key)
        if hit is not None:
            return hit
        generation = self._generation
        value = await trio.to_thread.run_sync(read)
        if generation == self._generation:  # no job ended meanwhile: still true
            if len(self._answers) >= MAX_CACHED_ANSWERS:
                self._answers.clear()
            self._answers[key] = value
        return value

    async def diff(self, a: str, b: str | None, actor: str) -> dict[str, Any]:
        if b is not None:  # two checkpoints: only the store is read, no need to queue
            diffs = await trio.to_thread.run_sync(self.engine.diff, a, b)
            return _diff_json(a, b, diffs)
        await trio.to_thread.run_sync(self.engine.info, a)  # unknown id: 404 before queueing

        async def body(job: Job) -> Event:
            job.info(f"Comparing {a} with the live layer...")
            diffs = await trio.to_thread.run_sync(self.engine.diff, a, None)
            return events.complete(job.id, "Diff done", id=a, diff=_diff_json(a, None, diffs))

        job = self.jobs.submit("diff", a, actor, body)
        return _wait_result(await _finished(job), "diff")

    async def preview(self, cid: str, actor: str) -> dict[str, Any]:
        await trio.to_thread.run_sync(self.engine.info, cid)

        async def body(job: Job) -> Event:
            p = await trio.to_thread.run_sync(self.engine.preview, cid)
            changes = [_change_json(d) for d in p.differences]
            result = {"id": cid, "counts": p.counts(), "changes": changes}
            return events.complete(job.id, "Preview done", id=cid, preview=result)

        job = self.jobs.submit("preview", cid, actor, body)
        return _wait_result(await _finished(job), "preview")

    async def activity_entries(self, limit: int, action: str | None) -> list[dict[str, Any]]:
        return await trio.to_thread.run_sync(lambda: self.activity.entries(limit, action))

    # -- jobs ------------------------------------------------------------------------------

    async def create(
        self, comment: str, actor: str, *, auto: bool = False, reason: str | None = None
    ) -> Job:
        from sprite_env.checkpoints.engine import check_comment

        text = reason if auto and reason else comment
        check_comment(text)
        if not auto:  # a manual create over the quota is refused before its stream starts
            await trio.to_thread.run_sync(self._room_for, 1, True)

        async def body(job: Job) -> Event:
            if auto:
                recent = await trio.to_thread.run_sync(self._recent_auto)
                if recent is not None:
                    return events.complete(
                        job.id,
                        f"Checkpoint {recent.id} is less than {RECENT_AUTO_S // 60} minutes old",
                        id=recent.id,
                        skipped=True,
                        checkpoint=recent.to_json(),
                    )
            job.info("Creating checkpoint...")
            await trio.to_thread.run_sync(self._room_for, 1, False, actor)
            job.info("Saving filesystem state...")
            report = FreezeReport()
            pause = self.env.pause(report)
            cp = await trio.to_thread.run_sync(
                lambda: self.engine.create(
                    text,
                    created_by=actor,
                    auto=auto,
                    progress=job.progress_from_thread(),
                    pause=pause,
                )
            )
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
                checkpoint=cp.to_json(active=cp.id),
                **extra,
            )

        return self.jobs.submit("create", None, actor, self._recorded("create", None, actor, body))

    async def restore(self, cid: str, actor: str) -> Job:
        await trio.to_thread.run_sync(self.engine.info, cid)  # 404/400 before the 202

        async def body(job: Job) -> Event:
            job.info(f"Restoring from checkpoint {cid}...")
            await trio.to_thread.run_sync(self._room_for, 1, False, actor)  # the undo point
            await self._prewarm(job)
            async with self.env.down(job):
                rep = await trio.to_thread.run_sync(
                    lambda: self.engine.restore(
                        cid, created_by=actor, progress=job.progress_from_thread()
                    )
                )
            await self._record("restore", cid, actor, True, f"undo: {rep.undo}")
            await self._apply_retention()
            return events.complete(
                job.id, f"Restore from {cid} complete", id=cid, undo=rep.undo, stats=rep.to_json()
            )

        return self.jobs.submit("restore", cid, actor, self._recorded("restore", cid, actor, body))

    async def reset(self, actor: str) -> Job:
        if self.config.overlay is None:
            raise NoBaseImage(self.config.root)

        async def body(job: Job) -> Event:
            job.info("Resetting the layer to the base image...")
            await trio.to_thread.run_sync(self._room_for, 1, False, actor)
            await self._prewarm(job)
            async with self.env.down(job):
                rep = await trio.to_thread.run_sync(
                    lambda: self.engine.reset(created_by=actor, progress=job.progress_from_thread())
                )
            await self._record("reset", None, actor, True, f"undo: {rep.undo}")
            await self._apply_retention()
            return events.complete(job.id, "Reset complete", undo=rep.undo, stats=rep.to_json())

        return self.jobs.submit("reset", None, actor, self._recorded("reset", None, actor, body))

    async def delete(self, cid: str, actor: str) -> dict[str, Any]:
        await trio.to_thread.run_sync(self.engine.info, cid)

        async def body(job: Job) -> Event:
            rep = await trio.to_thread.run_sync(self.engine.delete, cid)
            await self._record("delete", cid, actor, True, f"{rep.bytes_freed} bytes freed")
            return events.complete(job.id, f"Deleted {cid}", id=cid, report=rep.to_json())

        job = self.jobs.submit("delete", cid, actor, self._recorded("delete", cid, actor, body))
        return _wait_result(await _finished(job), "report")

    async def _prewarm(self, job: Job) -> None:
        """Stores what changed while the environment still runs: the undo checkpoint,
        taken once it is down, then reads only what changed since (less downtime)."""
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

    def _room_for(self, adding: int, check_only: bool, actor: str = "quota") -> None:
        """Deletes automatic checkpoints (oldest first) so ``adding`` more fit the quota;
        raises ``quota_exceeded`` if only manual checkpoints would be left to delete."""
        cps = self.engine.checkpoints(include_auto=True)
        active = self.engine.active()
        drop = make_room(
            [(c.id, c.is_auto, c.create_time_ns) for c in cps],
            self.config.max_checkpoints,
            adding=adding,
            protect={active} if active else set(),
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

    async def _apply_retention(self) -> None:
        def prune() -> list[str]:
            autos = [
                (c.id, c.create_time_ns)
                for c in self.engine.checkpoints(include_auto=True)
                if c.is_auto
            ]
            active = self.engine.active()
            plan = plan_retention(
                autos, self.config.retention, protect={active} if active else set()
            )
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
        self._generation += 1
        self._answers.clear()
        if self.view is not None and job.kind in ("create", "restore", "reset", "delete", "auto"):
            self.view.refresh()


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


def _change_json(d: Difference) -> dict[str, Any]:
    return d.to_json()


def _diff_json(a: str, b: str | None, diffs: list[Difference]) -> dict[str, Any]:
    changes = [_change_json(d) for d in diffs]
    counts: dict[str, int] = {}
    for c in changes:
        counts[c["change"]] = counts.get(c["change"], 0) + 1
    return {"from": a, "to": b or "live", "counts": counts, "changes": changes}


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
        pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise DaemonRunning(f"another sprite-env daemon (pid {pid}) serves {state}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
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
            log.info("opening %s (store %s)", config.layer, config.store_dir)
            engine = await trio.to_thread.run_sync(
                lambda: Engine(
                    config.layer,
                    config.store_dir,
                    excludes=config.excludes,
                    exclude_dirs=[state],
                    resume=False,
                )
            )
            try:
                supervisor = Supervisor(config.env_root, os.path.join(state, "services"))
                env = Environment(supervisor, config.overlay)
                activity = ActivityLog(os.path.join(state, "activity.jsonl"))
                daemon = Daemon(config, engine, activity, env)
                if config.overlay is not None:
                    await trio.to_thread.run_sync(freeze.thaw_leftovers)
                async with trio.open_nursery() as services:
                    await services.start(supervisor.run)
                    await _finish_interrupted(daemon)
                    await env.up()
                    await _serve(daemon, signals, task_status)
                    await supervisor.stop_all()
                    await _shutdown_checkpoint(daemon)
                    services.cancel_scope.cancel()
            finally:
                engine.close()
    finally:
        os.close(lock_fd)


async def _serve(
    daemon: Daemon,
    signals: Any,
    task_status: trio.TaskStatus[Daemon],
) -> None:
    from sprite_env.api.routes import Router

    config = daemon.config
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
                            task_status=task_status,
                        )
                    )
                    log.info("listening on %s", config.socket)
                    front_nursery.start_soon(
                        lambda: run_scheduler(daemon.scheduled, interval=config.auto_interval_s)
                    )
                    task_status.started(daemon)
                    async for signum in signals:
                        log.info("%s: stopping", signal.Signals(signum).name)
                        break
                    front.cancel()
            daemon.jobs.close()  # queued jobs fail; the running one ends; run() returns
        outer.cancel_scope.cancel()


async def _finish_interrupted(daemon: Daemon) -> None:
    """Finishes a restore (or delete) a crash interrupted, before anyone can connect. With
    an overlay, MERGED comes down first: UPPER must not change under a mounted overlay."""
    engine = daemon.engine
    if engine.pending_restore() is not None:
        log.info("finishing an interrupted restore")
        await daemon.env.take_down()
        rep = await trio.to_thread.run_sync(engine.resume_pending)
        if daemon.env.overlay is not None:
            await trio.to_thread.run_sync(daemon.env.overlay.empty_work)
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
    return DaemonConfig(
        root=root,
        state=state,
        store=os.path.abspath(args.store) if args.store else None,
        socket_group=args.socket_group,
        auto_interval_s=args.auto_interval * 60.0,
        max_checkpoints=args.max_checkpoints,
        view=not args.no_view,
        view_count=args.view_count,
        view_auto=args.view_auto,
        limits=Limits(request_timeout=args.request_timeout),
        excludes=args.exclude,
        overlay=overlay,
    )


def run_from_args(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = config_from_args(args)
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(run, config)
    return 0
