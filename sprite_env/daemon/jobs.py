"""The one job runner: work that changes the layer or the store runs one job at a time.

A job is submitted with an async body and queued (FIFO); the runner task runs the bodies
in order. Every job keeps the events it emitted, so any number of clients can follow it,
arrive late (they get everything from the start) or leave: a job never depends on who
watches it. Engine work inside a body runs on a worker thread; its progress callbacks hop
back to trio with ``run_sync_soon`` (never blocking the worker).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import trio

from sprite_env.api import events
from sprite_env.api.events import Event
from sprite_env.api.problems import Problem, problem_for

log = logging.getLogger(__name__)

#: Jobs waiting behind the running one; more are refused with ``busy``.
MAX_QUEUED = 32
#: Finished jobs kept for late followers and ``GET /v1/jobs/N``.
KEEP_FINISHED = 64
#: At most this many progress events a second reach the followers.
PROGRESS_HZ = 10.0


class Job:
    def __init__(self, number: int, kind: str, target: str | None, actor: str) -> None:
        self.id = number
        self.kind = kind
        self.target = target
        self.actor = actor
        self.state = "queued"
        self.submitted = events.now_rfc3339()
        self.events: list[Event] = []
        self.result: Any = None  # the complete event's payload, for non-streaming callers
        self.problem: Problem | None = None
        self.done = trio.Event()
        self._changed = trio.Event()
        self._token = trio.lowlevel.current_trio_token()
        self._last_progress = 0.0

    def describe(self) -> str:
        return f"{self.kind} {self.target}" if self.target else self.kind

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind,
            "target": self.target,
            "actor": self.actor,
            "state": self.state,
            "submitted": self.submitted,
        }
        if self.state == "done" and self.events:
            out["result"] = self.events[-1]
        if self.problem is not None:
            out["error"] = self.problem.to_json()
        return out

    # -- emitting (trio thread) -----------------------------------------------------------

    def emit(self, event: Event) -> None:
        last = self.events[-1] if self.events else None
        if (
            last is not None
            and event["type"] == last["type"] == "progress"
            and event["phase"] == last["phase"]
        ):
            self.events[-1] = event  # progress supersedes progress: the history stays short
        else:
            self.events.append(event)
        self._changed.set()
        self._changed = trio.Event()

    def fail(self, problem: Problem) -> None:
        """Ends the job's stream with ``problem`` (its last event)."""
        self.state = "failed"
        self.problem = problem
        self.emit(events.error(self.id, problem.message, problem.code))

    def info(self, text: str, **extra: Any) -> None:
        self.emit(events.info(self.id, text, **extra))

    def progress_from_thread(self) -> Callable[[str, Any], None]:
        """An engine ``progress`` callback for a worker thread: throttled, non-blocking."""

        def report(phase: str, counters: Any) -> None:
            now = time.monotonic()
            if now - self._last_progress < 1 / PROGRESS_HZ:
                return
            self._last_progress = now
            if dataclasses.is_dataclass(counters) and not isinstance(counters, type):
                data = dataclasses.asdict(counters)
            elif isinstance(counters, tuple) and len(counters) == 2:
                data = {"done": counters[0], "total": counters[1]}
            else:
                data = {"value": counters}
            event = events.progress(self.id, phase, data)
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self.emit, event)

        return report

    # -- following ------------------------------------------------------------------------

    async def follow(self) -> AsyncIterator[Event]:
        """Every event from the first, then new ones as they come, until the last."""
        seen = 0
        last: Event | None = None
        while True:
            if seen and self.events[seen - 1] is not last:  # a progress line was superseded
                last = self.events[seen - 1]
                yield last
            while seen < len(self.events):
                last = self.events[seen]
                seen += 1
                yield last
            if self.done.is_set():
                return
            await self._changed.wait()

    def stream(self) -> AsyncIterator[bytes]:
        async def lines() -> AsyncIterator[bytes]:
            async for e in self.follow():
                yield events.encode(e)

        return lines()


Body = Callable[[Job], Awaitable[Event]]


class JobRunner:
    """Runs submitted jobs one at a time, in order, in the daemon's nursery."""

    def __init__(self) -> None:
        self._numbers = 0
        self._jobs: OrderedDict[int, Job] = OrderedDict()
        self._send, self._receive = trio.open_memory_channel[tuple[Job, Body]](MAX_QUEUED)
        self.running: Job | None = None
        self.on_finished: list[Callable[[Job], None]] = []

    def get(self, number: int) -> Job | None:
        return self._jobs.get(number)

    def queued(self) -> int:
        return self._receive.statistics().current_buffer_used

    def submit(self, kind: str, target: str | None, actor: str, body: Body) -> Job:
        """Queues a job; raises ``busy`` if the queue is full."""
        self._numbers += 1
        job = Job(self._numbers, kind, target, actor)
        try:
            self._send.send_nowait((job, body))
        except trio.WouldBlock:
            raise Problem(
                "busy", f"{MAX_QUEUED} jobs are waiting already; try again later"
            ) from None
        except trio.ClosedResourceError:
            raise Problem("stopping", "the daemon is stopping") from None
        self._jobs[job.id] = job
        ahead = self.running
        if ahead is not None:
            job.info(f"Waiting for job {ahead.id} ({ahead.describe()})...")
        self._trim()
        return job

    def _trim(self) -> None:
        finished = [n for n, j in self._jobs.items() if j.done.is_set()]
        for n in finished[: max(0, len(finished) - KEEP_FINISHED)]:
            del self._jobs[n]

    async def run(self) -> None:
        """The runner task: until cancelled (a running job's engine thread is waited for)."""
        async with self._receive:
            async for job, body in self._receive:
                await self._run_one(job, body)

    async def _run_one(self, job: Job, body: Body) -> None:
        self.running = job
        job.state = "running"
        try:
            final = await body(job)
            job.state = "done"
            job.result = final
            job.emit(final)
        except trio.Cancelled:
            job.fail(Problem("stopping", "the daemon stopped before this job ended"))
            raise
        except Exception as e:
            problem = problem_for(e)
            if problem.code == "internal":
                log.exception("job %d (%s) failed", job.id, job.describe())
            elif problem.status < 500:  # refused as asked (a bad id, the active one): news
                log.info("job %d (%s) refused: %s", job.id, job.describe(), problem.message)
            else:  # a fault of the machine or the store: worth an operator's eye
                log.warning("job %d (%s) failed: %s", job.id, job.describe(), problem.message)
            job.fail(problem)
        finally:
            self.running = None
            job.done.set()
            for callback in self.on_finished:
                try:
                    callback(job)
                except Exception:
                    log.exception("job %d: on_finished callback failed", job.id)

    def close(self) -> None:
        """Refuses new jobs and fails the queued ones (at shutdown)."""
        self._send.close()
        while True:
            try:
                job, _body = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            job.fail(Problem("stopping", "the daemon stopped before this job ran"))
            job.done.set()
