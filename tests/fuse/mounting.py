"""Real mounts for the tests: the view served in-process by a trio loop in a thread.

This is the daemon's shape (one process owns the engine and serves the view), so a test
creates and deletes checkpoints through the same :class:`Engine` while it is mounted.
Every mount uses the file system name :data:`FSNAME`, which :func:`sweep_stale_mounts`
looks for: a test run that was killed leaves nothing mounted for the next one.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
import trio

from sprite_env.fuse import MountError, ViewConfig, ViewOperations, mounts, serve, unmount

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from types import TracebackType

    from sprite_env.fuse import CheckpointSource

#: ``sprite-env-test.<pid>``: the pid says whose mount it is, so that a test process sweeps
#: only the mounts of processes that are gone, never those of another one running beside
#: it (``pytest -n``: each worker sweeps at its start).
FSNAME_PREFIX = "sprite-env-test."
FSNAME = f"{FSNAME_PREFIX}{os.getpid()}"

#: On the tests that drop the kernel's caches (``/proc/sys/vm/drop_caches``, machine-wide)
#: and those that count on the kernel keeping pages or names: ``pytest -n`` (xdist's
#: ``--dist loadgroup``) runs them all in one worker, one after another, so no test drops
#: what another counts on.
PAGE_CACHE = pytest.mark.xdist_group("page_cache")

#: Runs of a test that counts on the kernel keeping pages or names: one more for each that
#: met a ``drop_caches`` from outside this test run (:class:`CacheDrops`).
KERNEL_CACHE_ATTEMPTS = 3


class CacheDrops:
    """Whether someone dropped the kernel's caches since this was made.

    The group above keeps this suite's own drops apart, but the kernel may be shared: on
    this VM other processes' cold benchmarks write ``/proc/sys/vm/drop_caches`` (its
    ``drop_pagecache`` count in ``/proc/vmstat`` was 123 on 2026-12-03), which empties every
    mount's pages and names at once. A fresh-clone CI run failed so: 4 of 40 pushed files
    still cached, the 36 checked after them gone. A test that counts on cached pages runs
    its scenario again (up to :data:`KERNEL_CACHE_ATTEMPTS`) when this says it met a drop,
    and asserts on the last run in any case.
    """

    def __init__(self) -> None:
        self._start = self.count()

    @staticmethod
    def count() -> int:
        with open("/proc/vmstat") as f:
            return sum(
                int(value)
                for name, value in (line.split() for line in f)
                if name in ("drop_pagecache", "drop_slab")
            )

    @property
    def seen(self) -> bool:
        return self.count() != self._start


def undisturbed_runs() -> Iterator[int]:
    """``for _ in undisturbed_runs():`` runs a scenario that counts on cached pages again
    while a run met a drop (:class:`CacheDrops`), :data:`KERNEL_CACHE_ATTEMPTS` times at
    most; the caller asserts on the last run."""
    for attempt in range(KERNEL_CACHE_ATTEMPTS):
        drops = CacheDrops()
        yield attempt
        if not drops.seen:
            return


requires_fuse = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="needs /dev/fuse and fusermount3",
)


def sweep_stale_mounts() -> list[str]:
    """Detaches every test mount left behind by this process or by one that is gone;
    returns their mount points.

    The connection is aborted first: a thread of a dead test that is blocked in a request
    to its own mount is released, so its process can end.
    """
    swept = []
    for m in mounts():
        if m.source == FSNAME or (m.source.startswith(FSNAME_PREFIX) and _gone(m.source)):
            abort_connection(m.device)
            with contextlib.suppress(MountError):
                unmount(m.mountpoint, lazy=True)
                swept.append(m.mountpoint)
    return swept


def _gone(fsname: str) -> bool:
    """Whether the test process named in ``fsname`` has ended."""
    pid = fsname[len(FSNAME_PREFIX) :]
    return not pid.isdigit() or not os.path.exists(f"/proc/{pid}")


def abort_connection(device: str) -> None:
    """Aborts a FUSE connection by its device ("0:NN"); every request then fails."""
    path = f"/sys/fs/fuse/connections/{device.partition(':')[2]}/abort"
    with contextlib.suppress(OSError), open(path, "w") as f:
        f.write("1\n")


def is_mounted(path: str) -> bool:
    path = os.path.abspath(path)
    return any(m.mountpoint == path and m.source == FSNAME for m in mounts())


class Mounted:
    """A context manager: the view of ``source`` mounted at ``mountpoint`` until exit."""

    def __init__(
        self, source: CheckpointSource, mountpoint: str, config: ViewConfig | None = None
    ) -> None:
        self.source = source
        self.mountpoint = os.path.abspath(mountpoint)
        self.config = config or ViewConfig()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._ops: ViewOperations | None = None
        self._thread = threading.Thread(target=self._run, name="fuse-view", daemon=True)

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as e:  # handed to the test's thread
            self._error = e
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            self._scope = nursery.cancel_scope
            start = functools.partial(
                serve, self.source, self.mountpoint, self.config, fsname=FSNAME
            )
            self._ops = await nursery.start(start)
            self._ready.set()

    def __enter__(self) -> Mounted:
        self._thread.start()
        if not self._ready.wait(20) or self._ops is None:
            self._stop()
            raise RuntimeError(f"mount failed: {self._error!r}") from self._error
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()
        if self._error is not None and exc is None:
            raise self._error

    def _stop(self) -> None:
        try:
            if self._thread.is_alive() and self._token is not None and self._scope is not None:
                with contextlib.suppress(trio.RunFinishedError):
                    trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
            self._thread.join(20)
        finally:
            for m in mounts():
                if m.mountpoint == self.mountpoint and m.source == FSNAME:
                    if self._thread.is_alive():  # stuck: fail its requests so it can end
                        abort_connection(m.device)
                    try:
                        unmount(self.mountpoint, lazy=True)
                    except MountError:
                        if is_mounted(self.mountpoint):  # (else it just went away)
                            raise

    @property
    def ops(self) -> ViewOperations:
        assert self._ops is not None
        return self._ops

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Runs ``fn(*args)`` in the view's trio thread (its state is not thread-safe)."""
        assert self._token is not None
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def path(self, *parts: str) -> str:
        return os.path.join(self.mountpoint, *parts)


def wait_until(cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
