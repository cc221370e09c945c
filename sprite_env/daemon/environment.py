"""What runs on the layer, and how a restore takes it down and brings it back.

Without an overlay the layer is a plain directory: a restore stops the services, replaces
files, and starts the services again; other processes are left alone (with ``--root /``
they include the shell that asked). With ``--overlay`` the environment is MERGED, and a
restore is the Sprites shape: stop the services, end every process that holds a file or a
working directory in MERGED (sessions end), unmount MERGED, replace UPPER, empty WORK,
mount again, start the services. Processes started by hand do not come back.
"""

from __future__ import annotations

import contextlib
import logging
from contextlib import AbstractContextManager, asynccontextmanager
from typing import TYPE_CHECKING

import trio

from sprite_env.overlay import freeze
from sprite_env.services import Supervisor, process_ids, processes_using, terminate

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from sprite_env.checkpoints.engine import Pause
    from sprite_env.daemon.jobs import Job
    from sprite_env.journal import ChangeJournal
    from sprite_env.overlay import Overlay
    from sprite_env.overlay.mount import Unmounting

log = logging.getLogger(__name__)

#: Seconds a process using MERGED gets between SIGTERM and SIGKILL at a restore.
END_GRACE_S = 5.0


class Environment:
    def __init__(
        self, supervisor: Supervisor, overlay: Overlay | None, journal: ChangeJournal | None = None
    ) -> None:
        self.supervisor = supervisor
        self.overlay = overlay
        #: The layer's change journal: quiet while the environment is down (see :meth:`down`).
        self.journal = journal
        #: How captures hold the layer still: "cgroup2" or "freezer" (see overlay/freeze.py),
        #: or None (no overlay, or no freezer: files are re-read if they change instead).
        self.freezer = freeze.available() if overlay is not None else None
        if overlay is not None and self.freezer is None:
            log.warning("no cgroup freezer: captures cannot pause the environment's writers")

    def pause(self, report: freeze.FreezeReport) -> Pause | None:
        """What a create passes to the engine: freeze whatever uses MERGED (processes that
        hold a file or a working directory there, services included) for the second pass."""
        if self.overlay is None or self.freezer is None:
            return None
        merged = self.overlay.merged

        def frozen() -> AbstractContextManager[None]:
            seen: set[int] = set()  # each freeze's own: its first scan reads every process

            def find() -> list[int]:
                # The first scan (before the freeze) reads every process; the freeze's look
                # for newcomers, inside the writers' pause, reads only the processes started
                # since the scan before it: reading all again was 4-17 ms of a 23-57 ms
                # pause (the consistency test, load 2). A process started since is caught
                # (a child of a frozen one is frozen with it: a cgroup is inherited); one
                # that was running and opened something in MERGED in the few ms between the
                # first scan and the freeze is not, as none is that starts during the
                # frozen pass: each file the capture reads is still checked for changes
                # while it is read.
                now = process_ids()
                found = [p.pid for p in processes_using(merged, exclude=seen)]
                seen.update(now)
                return found

            return freeze.frozen(find, report)

        return frozen

    @property
    def root(self) -> str:
        """Where the environment sees its files (services' working directories map here)."""
        return self.overlay.merged if self.overlay else self.supervisor.root

    async def up(self, job: Job | None = None) -> None:
        """Mounts the overlay (if down) and starts the services."""
        if self.overlay is not None:
            await trio.to_thread.run_sync(self.overlay.mount)
        errors = await self.supervisor.start_all()
        for e in errors:
            log.warning("service definition: %s", e)
            if job is not None:
                job.info(f"Service definition skipped: {e}")
        if job is not None:
            job.info("Services started")

    async def take_down(self, job: Job | None = None) -> Unmounting | None:
        """Ends what uses MERGED and unmounts it (overlay only); services must be stopped.
        Returns once MERGED is out of the mount table; the caller finishes the unmount
        (``Unmounting.finish``: the kernel's teardown of the overlay) before mounting again."""
        if self.overlay is None:
            return None
        procs = await trio.to_thread.run_sync(processes_using, self.overlay.merged)
        if procs:
            if job is not None:
                job.info(f"Ending {len(procs)} processes using {self.overlay.merged}...")
            for p in procs:
                log.info("ending %s", p.describe())
            report = await terminate(procs, grace=END_GRACE_S)
            if report.survivors:
                log.error("processes survived SIGKILL: %s", report.survivors)
        return await trio.to_thread.run_sync(self.overlay.start_unmount)

    async def settle(self, unmounting: Unmounting | None) -> None:
        """After UPPER was replaced (overlay only): waits for the overlay's teardown that
        ``take_down`` left running and empties WORK, so that MERGED can be mounted again."""
        if self.overlay is None:
            return
        if unmounting is not None:
            await trio.to_thread.run_sync(unmounting.finish)
        await trio.to_thread.run_sync(self.overlay.empty_work)

    @asynccontextmanager
    async def down(self, job: Job) -> AsyncIterator[None]:
        """Holds the environment down for the block (a restore or reset), then brings it
        back up, also when the block failed: a failed restore must not leave it down."""
        if self.overlay is not None:  # what the unmount would flush, flushed while up
            try:
                await trio.to_thread.run_sync(self.overlay.flush)
            except OSError as e:  # only a head start: the unmount flushes (and fails) anyway
                log.warning("flushing %s before a restore: %s", self.overlay.upper, e)
        job.info("Stopping services...")
        # The journal reads none of the restore's events until the services run again:
        # read as soon as the restore was committed (``Journal.quiet`` in the engine), the
        # medium undo's ~1,100 directories' events would be decoded while the services'
        # processes are spawned (that start took 80-87 ms in two rounds against 2 ms for
        # the mount before it; 10-145 ms in three rounds after this: within the noise).
        quiet = self.journal.quiet() if self.journal is not None else contextlib.nullcontext()
        with quiet:
            try:
                async with self.supervisor.paused():
                    unmounting = await self.take_down(job)
                    job.info("Restoring filesystem...")
                    try:
                        # the overlay's teardown goes on beside the block, on the other
                        # core: 0.39 s of the medium step's downtime when it was waited for
                        yield
                    finally:
                        with trio.CancelScope(shield=True):
                            await self.settle(unmounting)
            finally:
                with trio.CancelScope(shield=True):
                    await self.up(job)
