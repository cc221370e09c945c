"""The background uploader: the bucket follows the store's commits (issue 14, point 3).

A create commits locally and returns; this task then pushes the store
(:func:`sprite_env.store.remote.push`) so its checkpoints outlive the machine. Rules:

- **In commit order, one push at a time.** A push uploads a consistent copy of the
  catalog as the next generation, so each generation holds every commit before it.
  Commits that arrive while a push runs are coalesced: the next push carries them all.
- **Never on the event loop.** A push runs in a worker thread; the daemon serves
  meanwhile (jobs run beside it: a push reads the catalog through its own connection).
- **Durable is recorded in the store.** After a push, the checkpoints it carried are
  recorded in the catalog (:func:`~sprite_env.store.remote.record_durable`): those are
  ``remote``, every other one ``local``. The record survives a restart, and a push is
  due exactly when the checkpoints differ from it (one created, one deleted), so after a
  crash or a restart the uploader pushes whatever is not yet remote, and nothing when all
  is.
- **A failing server.** boto3 retries each request (``store/s3.py``); a push that still
  fails is tried again after a backoff that doubles from :data:`BACKOFF_FIRST_S` to
  :data:`BACKOFF_MAX_S`, with full jitter. The daemon keeps serving; ``/v1/status``'s
  ``remote`` says why (``last_error``) and when the next try is. A ``--wait-remote``
  caller asks for a try now, and fails after :data:`WAIT_FAILURES` failed pushes.
- **A prune meanwhile.** A delete may unlink a pack the push's copy named; that push
  fails with ``FileNotFoundError`` and is taken again at once with a new copy.
- **Remote deletes, when something is retirable.** Every push adds a generation (a whole
  catalog copy), so after each one a listing of ``catalog/`` (``remote_gc.due``) tells
  whether one of this writer's generations beyond ``SPRITE_ENV_REMOTE_KEEP`` has passed
  the grace; only then does a run (``remote_gc.collect``, which downloads the kept
  generations) delete it and the packs no kept generation names. Otherwise the task
  wakes when the grace passes, push or not, so a quiet daemon's bucket ends with
  ``keep`` generations and no pack it no longer needs.
- **The lease, held for the daemon's run.** One found lost (not renewed within half its
  stale time while the server was unreachable, or its lock removed from the bucket by
  another writer; ``store/lease.py``) stops the uploads at once, even while idle: the
  lease's thread wakes this task, which drops it and takes the prefix again before it
  pushes anything, with the push's backoff while that fails (``LeaseHeld`` naming the
  holder, or the server's error). ``last_error`` says both why the lease was lost and
  why it is not back yet; once it is, uploads resume where they stopped.

Cancellation:
    A push in its thread cannot be cancelled; :meth:`Uploader.stop` makes it end at its
    next pack (committing nothing) so the daemon's shutdown waits at most one PUT.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import sqlite3
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import trio

from sprite_env.api import events
from sprite_env.api.problems import Problem, problem_for
from sprite_env.errors import SpriteError, StoreError, UserError
from sprite_env.store.lease import Lease, LeaseHeld, LeaseLost
from sprite_env.store.remote import (
    PushProgress,
    durable_checkpoints,
    push,
    record_durable,
    writer_id,
)
from sprite_env.store.remote_gc import GcPolicy, collect, due

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from sprite_env.checkpoints import Engine
    from sprite_env.daemon.jobs import Job
    from sprite_env.store.remote import ObjectStorage, PushReport

log = logging.getLogger(__name__)

#: The wait after a first failed push (boto3's own retries spent); doubled per failure in
#: a row, up to BACKOFF_MAX_S, each a uniform draw below that bound (full jitter, as AWS's
#: "exponential backoff and jitter" recommends, so many daemons do not retry in step).
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 300.0
#: Pushes taken again at once when a prune unlinked a pack under them.
RACE_RETRIES = 3
#: A ``--wait-remote`` fails after this many failed pushes since it began (each one already
#: the client's bounded retries: AWS_MAX_ATTEMPTS, 6 by default, ~30 s of backoff).
WAIT_FAILURES = 2
#: The progress phase of an upload in a create's stream.
UPLOAD_PHASE = "upload"


class NoRemote(UserError):
    """``--wait-remote`` asked of a daemon with no remote store."""

    code = "no_remote"

    def __init__(self, who: str = "this daemon", how: str = "start the daemon with") -> None:
        super().__init__(
            f"{who} has no remote store, so no checkpoint can become remote: nothing was "
            f"created ({how} --store s3://BUCKET/PREFIX, or drop --wait-remote)"
        )


class UploadFailed(SpriteError):
    """A ``--wait-remote`` whose upload failed past its bound (the checkpoint is kept)."""

    code = "upload_failed"
    exit_code = 3


class LeaseNotHeld(StoreError):
    """The daemon lost the prefix's lease and could not take it again: nothing is uploaded
    until it does (tried again with the push's backoff). ``held``: another writer holds it
    (``LeaseHeld``), rather than the server failing."""

    exit_code = 4  # as LeaseHeld: someone else may have the prefix

    def __init__(self, message: str, *, held: bool) -> None:
        super().__init__(message)
        self.held = held


class _Stopping(Exception):
    """Raised by the progress callback to end a push at shutdown."""


class Uploader:
    """Pushes an engine's store to ``storage`` after each commit, in the background.

    Args:
        engine: the daemon's engine (its store is writable).
        storage: the bucket.
        on_change: called in the trio thread after a push made checkpoints remote (the
            daemon drops its cached answers, which show each checkpoint's ``storage``).
    """

    def __init__(
        self,
        engine: Engine,
        storage: ObjectStorage,
        *,
        lease: Lease | None = None,
        on_change: Callable[[], None] | None = None,
        gc: GcPolicy | None = None,
    ) -> None:
        self.engine = engine
        self.storage = storage
        # The prefix's lease, held (and renewed by its thread) from the daemon's start to
        # its clean stop: every push commits under it, with no per-push settle (1 s). One
        # lost (not renewed in time) is dropped and taken again before the next push.
        self.lease = lease
        self._leased = lease is not None
        self._lost: str | None = None  # why the lease was lost, until it is held again
        self._refresh = lease.policy.refresh_every if lease is not None else BACKOFF_MAX_S
        if lease is not None:
            lease.on_lost = self._lease_lost
        # Remote deletes (remote_gc.collect) run when a listing after a push finds one of
        # this writer's generations retirable (remote_gc.due), and at ``_gc_at``
        # (time.monotonic(); None: nothing waits) when what the grace spared comes due,
        # with no push needed. Not after every push: a run downloads the kept generations.
        # The daemon passes the policy its configuration parsed (``RemoteConfig.gc``).
        self._gc_policy = gc if gc is not None else GcPolicy()
        self._gc_at: float | None = None
        self.last_gc: dict[str, Any] | None = None  # the last run's outcome (status)
        self.on_change = on_change
        self.state = "starting"  # starting, idle, uploading, retrying, stopped
        self.last_error: str | None = None
        self.failures = 0  # failed pushes in a row
        self.failed_total = 0  # failed pushes since start (what a waiter counts)
        self.generation: int | None = None  # the newest generation this daemon pushed
        self.last_push: str | None = None  # when (RFC 3339)
        self.progress: PushProgress | None = None
        self.last_sent: PushProgress | None = None  # the last push's final counters
        self.next_attempt: float | None = None  # trio.current_time() of the next try
        self._durable: frozenset[str] = frozenset()
        self._wake = trio.Event()  # a commit, or a waiter asking for a try now
        self._changed = trio.Event()  # anything a waiter or the status shows
        self._stopping = False
        self._token: trio.lowlevel.TrioToken | None = None

    # -- what others ask (trio thread) ----------------------------------------------------

    def notify(self) -> None:
        """Says the store committed something (a job ended): a push may be due."""
        self._wake.set()

    def storage_of(self, cid: str) -> str:
        """``remote`` if a pushed generation holds checkpoint ``cid``, else ``local``."""
        return "remote" if cid in self._durable else "local"

    def stop(self) -> None:
        """Makes a running push end at its next pack (at shutdown; it commits nothing)."""
        self._stopping = True
        self._wake.set()

    def to_json(self, local: int) -> dict[str, Any]:
        """The ``remote`` part of ``/v1/status`` (``local``: checkpoints not yet remote)."""
        wait = None
        if self.next_attempt is not None:
            wait = round(max(0.0, self.next_attempt - trio.current_time()), 3)
        return {
            "url": repr(self.storage),
            "state": self.state,
            "local": local,
            "generation": self.generation,
            "last_push": self.last_push,
            "last_error": self.last_error,
            "failures": self.failures,
            "next_attempt_s": wait,
            "progress": asdict(self.progress) if self.progress is not None else None,
            "gc": self._gc_json(),
        }

    async def wait_remote(self, cid: str) -> AsyncIterator[dict[str, Any]]:
        """Waits until checkpoint ``cid`` is remote, yielding the push's counters as they
        change (a ``progress`` event's fields).

        Raises:
            UploadFailed: :data:`WAIT_FAILURES` pushes failed since the wait began (the
                upload goes on in the background).
            UnknownCheckpoint: ``cid`` was deleted meanwhile.
        """
        start = self.failed_total
        self._wake.set()  # a try now, even in a backoff: someone waits
        shown: PushProgress | None = None
        while cid not in self._durable:
            if self.state == "stopped":
                raise Problem("stopping", f"the daemon stopped before {cid} was remote")
            failed = self.failed_total - start
            if failed >= WAIT_FAILURES:
                raise UploadFailed(
                    f"checkpoint {cid} is not remote: its upload to {self.storage!r} failed "
                    f"{failed} times ({self.last_error}). It is kept locally, and the upload "
                    "goes on in the background with backoff (see sprite-env status)"
                )
            if failed and self.state == "retrying":
                self._wake.set()  # the waiter's bound, not the backoff's, decides
            if self.progress is not None and self.progress != shown:
                shown = self.progress
                yield asdict(shown)
            changed = self._changed
            await changed.wait()
            if cid not in self._durable:
                await trio.to_thread.run_sync(self.engine.info, cid)  # deleted: not found
        if self.last_sent is not None and self.last_sent != shown:
            yield asdict(self.last_sent)  # what the push that made it remote sent, at least

    # -- the task -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Pushes whenever the checkpoints differ from what the bucket holds, until
        cancelled (first thing: whatever a previous run left unpushed)."""
        self._token = trio.lowlevel.current_trio_token()
        self._durable = await trio.to_thread.run_sync(
            lambda: durable_checkpoints(self.engine.store)
        )
        task_status.started()
        races = 0
        try:
            while not self._stopping:
                self._wake = trio.Event()  # a commit from here on wakes the next round
                try:
                    done = await trio.to_thread.run_sync(self._push_if_behind)
                except _Stopping:
                    break
                except FileNotFoundError as e:
                    races += 1
                    if races <= RACE_RETRIES:  # a prune unlinked a pack: a new copy now
                        log.info("remote push raced a prune (%s); pushing again", e)
                        continue
                    await self._failed(e)
                    continue
                except Exception as e:  # the daemon serves on; the status says why
                    await self._failed(e)
                    continue
                races = 0
                if done is None:
                    self._set(state="idle")
                    with trio.move_on_after(self._gc_wait()):
                        await self._wake.wait()
                    continue
                ids, report = done
                self._pushed(ids, report)
        finally:
            self._set(state="stopped", next_attempt=None)  # waiters hear it
            lease, self.lease = self.lease, None
            if lease is not None:  # a clean stop frees the prefix for the next daemon
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(lease.release)

    def _push_if_behind(self) -> tuple[frozenset[str], PushReport] | None:
        """In a worker thread: one push if the checkpoints differ from the durable record."""
        self._hold_lease()
        ids = frozenset(c.id for c in self.engine.checkpoints(include_auto=True))
        if ids == self._durable:
            if self._gc_wait() == 0 and self.lease is not None:
                self._collect(self.lease)  # what the grace spared is due now
            return None
        self._from_thread(self._set, state="uploading", progress=None)
        try:
            done = push_checkpoints(self.engine, self.storage, self._on_progress, self.lease)
        except LeaseLost as e:
            self._drop_lease(self.lease.lost if self.lease is not None else None, e)
            raise
        if self.lease is not None:
            self._after_push(self.lease)
        return done

    def _lease_lost(self, reason: str) -> None:
        """``Lease.on_lost``, in the lease's thread: wakes the task, which drops it and
        takes the prefix again (and says so in the status) before anything more is sent;
        ``reason`` is the lease's own (:attr:`Lease.lost`)."""
        token = self._token
        if token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(lambda: self._wake.set())

    def _drop_lease(self, reason: str | None, error: Exception) -> None:
        """Forgets a lost lease (its lock is deleted in the background, or goes stale)."""
        lost, self.lease = self.lease, None
        self._lost = reason or str(error)
        if lost is not None:
            lost.release(wait=False)

    def _hold_lease(self) -> None:
        """In a worker thread, before anything is pushed or deleted: a lost lease is
        dropped and the prefix taken again (a daemon holds it for its whole run).

        Raises:
            LeaseNotHeld: it could not be taken again (another holder, or the server).
        """
        if not self._leased:
            return
        if self.lease is not None:
            reason = self.lease.lost
            if reason is None:
                return
            self._drop_lease(reason, LeaseLost(reason))
        try:
            lease = Lease.acquire(self.storage, writer_id(self.engine.store))
        except (SpriteError, OSError) as e:
            raise LeaseNotHeld(
                f"not uploading: this daemon lost the lease of {self.storage!r} "
                f"({self._lost}), and taking it again failed: {e}",
                held=isinstance(e, LeaseHeld),
            ) from e
        lease.on_lost = self._lease_lost
        lease.keep_renewed()
        self.lease = lease
        log.info("remote: the lease of %r is held again (lost: %s)", self.storage, self._lost)
        self._lost = None
        self._from_thread(self._set, last_error=None, failures=0)

    def _after_push(self, lease: Lease) -> None:
        """One listing of ``catalog/``: remote deletes now if a generation of this writer
        is retirable, else a wake-up for when one will be (see ``remote_gc.due``)."""
        try:
            wait = due(self.storage, lease.writer, self._gc_policy)
        except (SpriteError, OSError) as e:
            log.warning(
                "remote deletes on %r: listing failed (after the next push): %s", self.storage, e
            )
            return
        if wait == 0 or self._gc_wait() == 0:
            self._collect(lease)
        elif wait is not None:
            # +1 s: the server's clock has whole seconds (Last-Modified), so an age can
            # read up to 1 s low.
            at = time.monotonic() + wait + 1.0
            self._gc_at = at if self._gc_at is None else min(self._gc_at, at)

    def _collect(self, lease: Lease) -> None:
        """Remote deletes under the held lease; a failure is logged and tried after the
        next push (the push itself succeeded)."""
        try:
            report = collect(self.storage, lease.writer, self._gc_policy, lease=lease)
        except LeaseLost as e:  # nothing more is deleted; taken again at the next round
            log.warning("remote deletes on %r stopped: %s", self.storage, e)
            self._drop_lease(lease.lost, e)
            self._gc_at = None
            return
        except (SpriteError, OSError) as e:
            log.warning(
                "remote deletes on %r failed (tried after the next push): %s", self.storage, e
            )
            self._gc_at = None
            return
        # Due again once the soonest spared object passes the grace: +1 s, as the
        # server's clock has whole seconds (Last-Modified), so an age reads up to 1 s low.
        self._gc_at = time.monotonic() + report.due_in + 1.0 if report.due_in is not None else None
        gc = {
            "at": events.now_rfc3339(),
            "generations_deleted": report.generations,
            "packs_deleted": report.packs,
            "bytes_freed": report.bytes,
        }
        self._from_thread(self._set, last_gc=gc)

    def _gc_json(self) -> dict[str, Any] | None:
        if self.last_gc is None:
            return None
        wait = self._gc_wait()
        return {**self.last_gc, "next_run_s": round(wait, 3) if wait != math.inf else None}

    def _gc_wait(self) -> float:
        """Seconds until remote deletes the grace held back are due (inf: none wait)."""
        if self._gc_at is None:
            return math.inf
        return max(0.0, self._gc_at - time.monotonic())

    def _on_progress(self, p: PushProgress) -> None:
        if self._stopping:
            raise _Stopping
        self._from_thread(self._set, progress=p)

    def _from_thread(self, fn: Callable[..., None], **kw: Any) -> None:
        assert self._token is not None
        self._token.run_sync_soon(lambda: fn(**kw))

    def _set(self, **fields: Any) -> None:
        for k, v in fields.items():
            setattr(self, k, v)
        self._changed.set()
        self._changed = trio.Event()

    def _pushed(self, ids: frozenset[str], report: PushReport) -> None:
        gen = report.generation
        log.info(
            "remote: generation %d pushed to %r (%d packs, %d bytes sent; %d checkpoints)",
            gen.number,
            self.storage,
            report.packs_uploaded,
            report.bytes_uploaded,
            len(ids),
        )
        self._durable = ids
        self._set(
            last_sent=self.progress,  # the push's last counters (what it sent)
            generation=gen.number,
            last_push=events.now_rfc3339(),
            last_error=None,
            failures=0,
            next_attempt=None,
        )
        if self.on_change is not None:
            self.on_change()

    async def _failed(self, e: Exception) -> None:
        """Records a failed push and waits out its backoff (cut short by a waiter)."""
        if isinstance(e, SpriteError | OSError | sqlite3.Error):
            message = problem_for(e).message
            log.warning("remote push to %r failed: %s", self.storage, message)
        else:  # a bug, not the server: its traceback is worth an operator's eye
            message = f"internal error: {type(e).__name__}: {e}"
            log.exception("remote push to %r failed", self.storage)
        bound = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2**self.failures)
        if isinstance(e, LeaseNotHeld) and e.held:
            # Another writer holds the prefix and renews it every refresh_every (60 s): look
            # as often (one listing), so the prefix is taken back soon after it is free.
            bound = min(bound, self._refresh)
        delay = random.uniform(0.0, bound)
        self._set(
            state="retrying",
            last_error=message,
            failures=self.failures + 1,
            failed_total=self.failed_total + 1,
            progress=None,
            next_attempt=trio.current_time() + delay,
        )
        with trio.move_on_after(delay):
            await self._wake.wait()
        self._set(next_attempt=None)


def push_checkpoints(
    engine: Engine,
    storage: ObjectStorage,
    progress: Callable[[PushProgress], None] | None,
    lease: Lease | None = None,
) -> tuple[frozenset[str], PushReport]:
    """One push of ``engine``'s store, then the record of the checkpoints it made remote
    (blocks). The ids are listed before the push: each was committed before the push's
    copy of the catalog, so that copy holds it.

    Raises:
        as :func:`~sprite_env.store.remote.push`.
    """
    ids = frozenset(c.id for c in engine.checkpoints(include_auto=True))
    report = push(engine.store, storage, progress=progress, lease=lease)
    record_durable(engine.store, report.generation, ids)
    return ids, report


class RemoteWait:
    """A create's job followed by the wait for its checkpoint to be remote
    (``create --wait-remote``): the router's :class:`~sprite_env.api.backend.JobHandle`.

    The stream is the job's, its ``complete`` line held back until the checkpoint is
    remote (``progress`` lines of phase ``upload`` meanwhile), then sent with
    ``storage: remote``; or an ``error`` line (``upload_failed``) if the upload failed past
    its bound. The job itself ends as always: a client that leaves stops only its wait.
    """

    def __init__(self, job: Job, uploader: Uploader) -> None:
        self.job = job
        self.uploader = uploader

    def to_json(self) -> dict[str, Any]:
        return self.job.to_json()

    def stream(self) -> AsyncIterator[bytes]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[bytes]:
        final: events.Event | None = None
        async for e in self.job.follow():
            if e["type"] == "complete":
                final = e
                break
            yield events.encode(e)
        if final is None:  # the job failed: its error line was the last
            return
        cid = final.get("id")
        if not isinstance(cid, str):
            yield events.encode(final)
            return
        started = time.monotonic()
        yield events.encode(
            events.info(self.job.id, f"Uploading {cid} to {self.uploader.storage!r}...")
        )
        try:
            async for counters in self.uploader.wait_remote(cid):
                yield events.encode(events.progress(self.job.id, UPLOAD_PHASE, counters))
        except (SpriteError, Problem) as e:
            problem = problem_for(e)
            yield events.encode(events.error(self.job.id, problem.message, problem.code))
            return
        seconds = time.monotonic() - started
        yield events.encode(events.info(self.job.id, f"{cid} is remote ({seconds:.1f} s)"))
        done = dict(final, time=events.now_rfc3339())
        if isinstance(done.get("checkpoint"), dict):
            done["checkpoint"] = {**done["checkpoint"], "storage": "remote"}
        yield events.encode(done)


__all__ = [
    "BACKOFF_FIRST_S",
    "BACKOFF_MAX_S",
    "WAIT_FAILURES",
    "LeaseNotHeld",
    "NoRemote",
    "RemoteWait",
    "UploadFailed",
    "Uploader",
    "push_checkpoints",
]
