"""The service supervisor: runs the services defined in the layer, restarts them, keeps logs.

Concepts:

- Each started service gets one supervising task in the supervisor's nursery. The task
  spawns the command in a new session (so the service is the leader of its own process
  group), copies its output into the log, waits for it, and applies the restart policy.
- **States**: ``running``; ``stopping`` (stop signal sent, waiting); ``backoff`` (exited,
  waiting to be restarted); ``stopped`` (by request, or exited with code 0 under
  ``on-failure`` or ``never``); ``failed`` (could not be spawned, or exited otherwise
  under ``never``). ``reason`` says why in words. ``always`` restarts any exit.
- **Stopping** ends the whole process group: ``stop_signal``, up to ``stop_timeout``
  seconds, then SIGKILL. When the main process exits on its own, whatever is left of its
  group is ended the same way (systemd's ``KillMode=control-group``), so a restart never
  runs beside the previous run's children. A process that leaves the group (``setsid``)
  escapes; on a restore, :func:`~sprite_env.services.processes.processes_using` finds it.
- **Backoff**: a restart waits 1 s, doubling up to 60 s; a run that lasted 30 s resets
  the wait to 1 s (:class:`Backoff`; tests shrink it). A service that cannot be spawned at
  all (program or working directory missing) is ``failed`` at once and not retried: the
  definition needs fixing, then ``start NAME``.
- **Logs**: ``LOG_DIR/NAME.log`` holds the service's stdout and stderr as written, and the
  supervisor's own lines, ``[sprite-env TIME] started (pid 12): COMMAND``. Past 1 MiB it is
  renamed to ``NAME.log.1`` (replacing the previous one) and a new one begun.
- ``LOG_DIR/NAME.pid`` (``PID START_TIME``) exists while a service runs. A daemon that
  was killed cannot stop its services (they run in sessions of their own); the next
  supervisor ends the groups these files name before it starts anything, so no service
  runs twice.
- While :meth:`Supervisor.paused` is held (a restore), every service is stopped and none
  can be started.

Error handling:
    Nothing a service does can raise out of the supervisor: a failed spawn, a crash, an
    unwritable log become states, ``reason`` texts and log lines. The methods raise
    :class:`~sprite_env.errors.UserError` subclasses only, for bad names, unknown or bad
    definitions, and starts while paused or shut down; each carries the API ``code`` it
    maps to.

Cancellation:
    Cancelling :meth:`Supervisor.run` stops every service (shielded: each gets its
    ``stop_timeout``, then SIGKILL) before it returns, so no service outlives the daemon's
    clean shutdown.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import trio

from sprite_env import privacy
from sprite_env.errors import UserError
from sprite_env.services.definitions import (
    ServiceDef,
    UnknownService,
    load_definition,
    load_definitions,
    validate_name,
)
from sprite_env.services.processes import group_members, start_time, wait_group_gone

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

log = logging.getLogger(__name__)

State = Literal["running", "stopping", "backoff", "stopped", "failed"]

#: A service's log is rotated past this size (one old generation, ``NAME.log.1``, is kept).
LOG_MAX_BYTES = 1 << 20
#: After SIGKILL, how long to wait for the group before reporting it stuck (D state).
KILL_WAIT_S = 5.0
#: Once the group is gone, how long a process that escaped it (setsid) may keep the output
#: pipe open before we stop reading; it then gets SIGPIPE on its next write.
DRAIN_S = 1.0
#: How long a service left running by a previous daemon gets between SIGTERM and SIGKILL
#: (its definition may have changed since; this is the default stop_timeout).
LEFTOVER_STOP_S = 10.0
_CHUNK = 64 * 1024


class ServicesPaused(UserError):
    """A start while services are held stopped (a restore is running)."""

    code = "busy"


class SupervisorNotRunning(UserError):
    """A start before :meth:`Supervisor.run` began or after it ended."""

    code = "stopping"


@dataclass(frozen=True)
class Backoff:
    """How long a restart waits: ``initial``, doubling per consecutive restart up to
    ``maximum``; a run that lasted ``reset_after`` seconds starts again at ``initial``."""

    initial: float = 1.0
    maximum: float = 60.0
    reset_after: float = 30.0

    def next(self, previous: float | None, ran_for: float) -> float:
        """The wait before the next restart.

        Args:
            previous: the wait before the run that just ended (None for the first run).
            ran_for: how long that run lasted, in seconds.
        """
        if previous is None or ran_for >= self.reset_after:
            return self.initial
        return min(previous * 2, self.maximum)


class Supervisor:
    """Starts, stops and restarts the services defined under ``root``.

    Args:
        root: the environment's root; definitions are read from
            ``ROOT/etc/sprite/services`` (see ``definitions.py``).
        log_dir: where ``NAME.log``, ``NAME.log.1`` and ``NAME.pid`` go; outside the layer
            (logs are not checkpointed), and one per supervisor.
        backoff: restart timing.
        log_max_bytes: rotation size of each log.
        kill_wait: seconds to wait for a process group after SIGKILL.

    All methods run in the trio thread, except :meth:`logs` (blocking file reads, any
    thread) and :meth:`status` (no I/O).
    """

    def __init__(
        self,
        root: str,
        log_dir: str,
        *,
        backoff: Backoff | None = None,
        log_max_bytes: int = LOG_MAX_BYTES,
        kill_wait: float = KILL_WAIT_S,
    ) -> None:
        self.root = root
        self.log_dir = log_dir
        self.backoff = backoff or Backoff()
        self.log_max_bytes = log_max_bytes
        self.kill_wait = kill_wait
        #: One ``"FILE: reason"`` per bad definition file, as of the last reload.
        self.definition_errors: list[str] = []
        self._services: dict[str, _Service] = {}
        self._nursery: trio.Nursery | None = None
        self._paused = 0

    # -- lifetime ----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hosts the supervising tasks until cancelled; started once the log directory
        exists and services left running by a previous daemon are ended (up to
        ``LEFTOVER_STOP_S`` each, after a crash only). Starts no service by itself: call
        :meth:`start_all`.

        Cancellation:
            Stops every running service (see the module docstring) before returning.
        """
        await trio.to_thread.run_sync(self._make_log_dir)
        await self._end_leftovers()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None

    # -- reads -------------------------------------------------------------------------------

    def status(self) -> list[dict[str, Any]]:
        """Every known service, by name: ``name, state, pid, restarts, last_exit`` (the
        last return code; negative: killed by that signal), ``since`` (RFC 3339, when the
        state began), ``reason``, ``command`` and ``restart``. Known means defined at the
        last :meth:`reload` (or start), or still running."""
        return [self._services[n].to_json() for n in sorted(self._services)]

    def logs(self, name: str, lines: int = 100) -> list[str]:
        """The last ``lines`` lines of a service's log (both generations), oldest first.

        Blocking: reads up to the last 2 MiB of files; from trio, call it through
        ``trio.to_thread.run_sync``.

        Raises:
            InvalidServiceName: ``name`` cannot be a service.
            UnknownService: no such service and no log of that name.
        """
        validate_name(name)
        path = self._log_path(name)
        if name not in self._services and not any(os.path.exists(p) for p in (path, path + ".1")):
            raise UnknownService(name)
        if lines <= 0:
            return []
        out = _tail(path, lines)
        if len(out) < lines:
            out = _tail(path + ".1", lines - len(out)) + out
        return [line.decode("utf-8", "replace") for line in out]

    async def reload(self) -> list[str]:
        """Re-reads the definitions: new ones appear as ``stopped``, those removed from
        disk are forgotten unless running (a running service keeps its old definition
        until stopped). Returns the bad files' messages (also in ``definition_errors``)."""
        defs, errors = await trio.to_thread.run_sync(load_definitions, self.root)
        for name, definition in defs.items():
            svc = self._services.get(name)
            if svc is None:
                self._services[name] = _Service(definition)
            elif not svc.active:
                svc.definition = definition
        for name in [n for n, s in self._services.items() if n not in defs and not s.active]:
            del self._services[name]
        self.definition_errors = errors
        return errors

    # -- control -----------------------------------------------------------------------------

    async def start_all(self) -> list[str]:
        """Reloads the definitions and starts every defined service not running already.

        Returns:
            The bad definition files' messages (each also logged as a warning); those
            services are not started, the others are.

        Raises:
            ServicesPaused, SupervisorNotRunning: as :meth:`start`.
        """
        errors = await self.reload()
        for message in errors:
            log.warning("service definition %s", message)
        for name in sorted(self._services):
            svc = self._services[name]
            async with svc.lock:
                if not svc.active:
                    await self._launch(svc, svc.definition)
        return errors

    async def start(self, name: str) -> dict[str, Any]:
        """Starts one service from its definition, read from disk now (so an edit takes
        effect); a service that is running or waiting to restart is left alone.

        Returns:
            Its status (``running``, or ``failed`` if it could not be spawned).

        Raises:
            InvalidServiceName, UnknownService, DefinitionError: see ``definitions.py``.
            ServicesPaused: inside :meth:`paused`.
            SupervisorNotRunning: :meth:`run` is not running.
        """
        definition = await trio.to_thread.run_sync(load_definition, self.root, name)
        svc = self._services.setdefault(name, _Service(definition))
        async with svc.lock:
            if not svc.active:
                await self._launch(svc, definition)
        return svc.to_json()

    async def stop(self, name: str) -> dict[str, Any]:
        """Stops one service (process group: stop_signal, stop_timeout, SIGKILL) and waits
        until it is gone; a pending restart is cancelled. Stopping a stopped service is
        a no-op.

        Returns:
            Its status, ``stopped`` (or ``failed`` if it had failed before).

        Raises:
            InvalidServiceName: ``name`` cannot be a service.
            UnknownService: neither known nor defined on disk.
        """
        validate_name(name)
        svc = self._services.get(name)
        if svc is None:
            await self.reload()
            svc = self._services.get(name)
            if svc is None:
                raise UnknownService(name)
        async with svc.lock:
            if svc.active and svc.scope is not None:
                svc.scope.cancel()
                await svc.done.wait()
        return svc.to_json()

    async def stop_all(self) -> None:
        """Stops every service, all at once (so the wait is the longest ``stop_timeout``)."""
        async with trio.open_nursery() as nursery:
            for name in list(self._services):
                nursery.start_soon(self.stop, name)

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """Stops every service and refuses starts until the block ends; for a restore::

            async with supervisor.paused():
                ...  # replace the layer
            errors = await supervisor.start_all()

        Services are not started again on exit: the caller does, to report it.
        """
        self._paused += 1
        try:
            await self.stop_all()
            yield
        finally:
            self._paused -= 1

    # -- supervising -------------------------------------------------------------------------

    def _make_log_dir(self) -> None:
        """Creates the log directory, private (sprite_env/privacy.py): a service's output may
        say what the layer holds. One an older version made 0755 (logs 0640) is tightened,
        said at INFO only: the daemon has warned about the state directory around it."""
        if os.path.isdir(self.log_dir):
            privacy.tighten(self.log_dir, "services directory", logging.INFO)
        privacy.make_dir(self.log_dir)

    def _log_path(self, name: str) -> str:
        return os.path.join(self.log_dir, f"{name}.log")

    def _pid_path(self, name: str) -> str:
        return os.path.join(self.log_dir, f"{name}.pid")

    def _write_pid_file(self, name: str, pid: int) -> None:
        """``NAME.pid``: ``PID START_TIME``, while the service runs; see _end_leftovers."""
        try:
            with os.fdopen(
                privacy.open_file(self._pid_path(name), os.O_WRONLY | os.O_TRUNC), "w"
            ) as f:
                f.write(f"{pid} {start_time(pid) or 0}\n")
        except OSError as e:
            log.error("service %s: pid file: %s", name, e)

    async def _end_leftovers(self) -> None:
        """Ends the services a previous supervisor left running (a daemon that was killed
        cannot stop them: they run in sessions of their own), so that start_all does not
        run them twice. Each ``NAME.pid`` names a group leader; it is ended only if a
        process with that pid and start time still runs (a reused pid is left alone)."""
        for name, pid in _leftovers(self.log_dir):
            log.warning("ending service %s (pid %d), left running by a previous daemon", name, pid)
            _killpg(pid, signal.SIGTERM)
            with trio.move_on_after(LEFTOVER_STOP_S):
                await wait_group_gone(pid)
            if group_members(pid):
                _killpg(pid, signal.SIGKILL)
                with trio.move_on_after(self.kill_wait):
                    await wait_group_gone(pid)

    async def _launch(self, svc: _Service, definition: ServiceDef) -> None:
        """Starts ``svc``'s supervising task; returns once its first spawn was tried."""
        if self._paused:
            raise ServicesPaused(
                f"cannot start {definition.name}: services are stopped for a restore"
            )
        if self._nursery is None:
            raise SupervisorNotRunning("the service supervisor is not running")
        svc.definition = definition
        svc.restarts = 0
        await self._nursery.start(self._supervise, svc)

    async def _supervise(self, svc: _Service, *, task_status: trio.TaskStatus[None]) -> None:
        svc.done = trio.Event()
        logfile = _LogFile(self._log_path(svc.name), self.log_max_bytes)
        started = False

        def spawned() -> None:
            nonlocal started
            if not started:
                started = True
                task_status.started()

        try:
            with trio.CancelScope() as svc.scope:  # stop() cancels it
                await self._loop(svc, logfile, spawned)
        except Exception as e:  # a bug here must not take the daemon's nursery down
            log.exception("service %s: supervisor error", svc.name)
            svc.enter("failed", f"supervisor error: {type(e).__name__}: {e}")
            logfile.note(svc.reason or "")
        finally:
            if svc.state in ("running", "stopping", "backoff"):
                svc.enter("stopped", "stopped by request")
                logfile.note("stopped")
            logfile.close()
            svc.pid = None
            svc.done.set()
            spawned()  # for nursery.start, if we never got that far

    async def _loop(self, svc: _Service, logfile: _LogFile, spawned: Callable[[], None]) -> None:
        delay: float | None = None
        while True:
            begun = trio.current_time()
            code = await self._run_once(svc, logfile, spawned)
            if code is None:
                return  # could not spawn: failed, not retried
            ran_for = trio.current_time() - begun
            definition = svc.definition
            what = _describe_exit(code, definition)
            restart = definition.restart
            if restart == "never" or (restart == "on-failure" and code == 0):
                svc.enter("stopped" if code == 0 else "failed", what)
                logfile.note(f"{what}; not restarted (restart = {restart})")
                if code == 0:
                    log.info("service %s %s", svc.name, what)
                else:
                    log.warning("service %s %s; not restarted", svc.name, what)
                return
            delay = self.backoff.next(delay, ran_for)
            svc.enter("backoff", f"{what}; restarting in {delay:g} s")
            logfile.note(svc.reason or "")
            log.info("service %s %s", svc.name, svc.reason)
            await trio.sleep(delay)
            svc.restarts += 1

    async def _run_once(
        self, svc: _Service, logfile: _LogFile, spawned: Callable[[], None]
    ) -> int | None:
        """One run: spawn, watch, end the group. The return code, or None if the spawn
        failed."""
        definition = svc.definition
        cwd = definition.cwd(self.root)
        try:
            proc = await trio.lowlevel.open_process(
                definition.argv(),
                cwd=cwd,
                env=definition.environment(os.environ),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: stop signals reach its children
            )
        except OSError as e:
            reason = f"cannot start: {_spawn_error(e, definition, cwd)}"
            svc.enter("failed", reason)
            logfile.note(reason)
            log.warning("service %s %s", svc.name, reason)
            spawned()
            return None
        # No checkpoint from here to the try: a cancellation cannot leave the process behind.
        svc.pid = proc.pid
        self._write_pid_file(svc.name, proc.pid)
        svc.enter("running", None)
        logfile.note(f"started (pid {proc.pid}): {definition.display()}")
        spawned()
        try:
            await self._watch(svc, proc, logfile)
        finally:
            svc.pid = None
            svc.last_exit = proc.returncode
            with contextlib.suppress(OSError):
                os.unlink(self._pid_path(svc.name))
        code = proc.returncode
        assert code is not None  # _watch returns or raises only once the process is reaped
        return code

    async def _watch(self, svc: _Service, proc: trio.Process, logfile: _LogFile) -> None:
        stdout = proc.stdout
        assert stdout is not None
        # Shielded: while the group is being stopped, its output must still be read (it
        # goes to the log, and a full pipe would block a service that is shutting down).
        pump_scope = trio.CancelScope(shield=True)
        pump_done = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_pump, stdout, logfile, pump_scope, pump_done)
                try:
                    await proc.wait()
                finally:
                    with trio.CancelScope(shield=True):
                        try:
                            await self._end_group(svc, proc, logfile)
                            with trio.move_on_after(DRAIN_S):
                                await pump_done.wait()
                        finally:
                            pump_scope.cancel()  # else the shielded pump would hang us
        finally:
            with trio.CancelScope(shield=True):
                await stdout.aclose()

    async def _end_group(self, svc: _Service, proc: trio.Process, logfile: _LogFile) -> None:
        """Ends the service's process group: stop_signal, stop_timeout, SIGKILL; then
        reaps the main process. Shielded by the caller."""
        definition = svc.definition
        pgid = proc.pid  # start_new_session: the leader's pid is the group's id
        sig = definition.stop_signal
        if proc.returncode is not None and not group_members(pgid):
            return  # the usual exit: nothing left behind
        if proc.returncode is None:
            svc.enter("stopping", f"sent {sig.name}")
            logfile.note(f"stopping: sending {sig.name} to process group {pgid}")
        else:
            logfile.note(f"main process exited; sending {sig.name} to the rest of group {pgid}")
        _killpg(pgid, sig)
        with trio.move_on_after(definition.stop_timeout):
            await _wait_ended(proc, pgid)
            return
        logfile.note(f"still running {definition.stop_timeout:g} s after {sig.name}: SIGKILL")
        log.info("service %s: still running after %s, sending SIGKILL", svc.name, sig.name)
        _killpg(pgid, signal.SIGKILL)
        with trio.move_on_after(self.kill_wait):
            await _wait_ended(proc, pgid)
            return
        left = group_members(pgid)
        logfile.note(f"processes {left} survive SIGKILL (stuck in the kernel?)")
        log.warning("service %s: processes %s survive SIGKILL", svc.name, left)
        # The main process must still be reaped; SIGKILL ends it once it leaves the kernel.
        await proc.wait()


class _Service:
    """A service's mutable record; only the supervisor touches it."""

    def __init__(self, definition: ServiceDef) -> None:
        self.definition = definition
        self.state: State = "stopped"
        self.reason: str | None = None
        self.pid: int | None = None
        self.restarts = 0
        self.last_exit: int | None = None
        self.since = _now()
        self.lock = trio.Lock()  # start and stop of one service take turns
        self.scope: trio.CancelScope | None = None
        self.done = trio.Event()  # set while no supervising task runs
        self.done.set()

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def active(self) -> bool:
        """A supervising task runs: the service is running, stopping or in backoff."""
        return not self.done.is_set()

    def enter(self, state: State, reason: str | None) -> None:
        self.state = state
        self.reason = reason
        self.since = _now()

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "pid": self.pid,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "since": self.since,
            "reason": self.reason,
            "command": self.definition.display(),
            "restart": self.definition.restart,
        }


class _LogFile:
    """A service's log, rotated past ``max_bytes``.

    Writes happen in the trio thread: they are appends of at most 64 KiB to a local file,
    which land in the page cache (as the daemon's own logging does); a thread hop per chunk
    would cost more than the write.
    """

    def __init__(self, path: str, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._fd: int | None = None
        self._size = 0
        self._broken = False

    def write(self, data: bytes | bytearray) -> None:
        """Appends ``data``; past ``max_bytes`` the file is rotated, at a line end where
        one fits (so a generation never exceeds ``max_bytes``)."""
        view = memoryview(data)
        try:
            while view:
                if self._fd is None:
                    self._open()
                room = self.max_bytes - self._size
                if len(view) <= room:
                    self._write_all(view)
                    break
                cut = bytes(view[:room]).rfind(b"\n") + 1
                if cut == 0 and self._size == 0:
                    cut = room  # one line longer than a whole file: split it
                self._write_all(view[:cut])
                view = view[cut:]
                self.close()
                os.replace(self.path, self.path + ".1")
        except OSError as e:
            # The service keeps running and its output is read and dropped: a full disk
            # must not block it on a full pipe. Said once, until writing works again.
            if not self._broken:
                log.error("service log %s: %s; output dropped meanwhile", self.path, e)
            self._broken = True
            self.close()
            return
        self._broken = False

    def _open(self) -> None:
        self._fd = privacy.open_file(self.path, os.O_WRONLY | os.O_APPEND)  # 0600
        self._size = os.fstat(self._fd).st_size

    def _write_all(self, view: memoryview) -> None:
        assert self._fd is not None
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
            self._size += n

    def note(self, text: str) -> None:
        """A line of the supervisor's own."""
        self.write(f"[sprite-env {_now()}] {text}\n".encode())

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


async def _pump(
    stream: trio.abc.ReceiveStream, logfile: _LogFile, scope: trio.CancelScope, done: trio.Event
) -> None:
    try:
        with scope:
            while chunk := await stream.receive_some(_CHUNK):
                logfile.write(chunk)
    finally:
        done.set()


async def _wait_ended(proc: trio.Process, pgid: int) -> None:
    await proc.wait()
    await wait_group_gone(pgid)


def _killpg(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # the group is gone already: what we wanted
    except PermissionError as e:  # a member changed its user (setuid); the rest got it
        log.warning("process group %d: %s: %s", pgid, sig.name, e)


def _describe_exit(code: int, definition: ServiceDef) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    text = f"exited with code {code}"
    if isinstance(definition.command, str) and code in (126, 127):
        # /bin/sh's own codes: the program was not found (127) or not executable (126).
        text += " (command not found)" if code == 127 else " (command not executable)"
    return text


def _spawn_error(e: OSError, definition: ServiceDef, cwd: str) -> str:
    reason = e.strerror or str(e)
    if e.filename == cwd:
        return f"working directory {definition.workdir} ({cwd}): {reason}"
    if e.filename is not None:
        return f"{e.filename}: {reason}"
    return reason


def _leftovers(log_dir: str) -> list[tuple[str, int]]:
    """The live leaders named by ``*.pid`` files in ``log_dir``; the files are removed."""
    found = []
    for entry in sorted(os.listdir(log_dir)):
        name = entry.removesuffix(".pid")
        if name == entry:
            continue
        path = os.path.join(log_dir, entry)
        try:
            with open(path) as f:
                pid, started = (int(x) for x in f.read().split())
        except (OSError, ValueError):
            pid, started = 0, 0
        if pid > 1 and started and start_time(pid) == started:
            found.append((name, pid))
        with contextlib.suppress(OSError):
            os.unlink(path)
    return found


def _tail(path: str, n: int) -> list[bytes]:
    """The last ``n`` lines of a file (no trailing newline), reading blocks from its end."""
    try:
        with open(path, "rb") as f:
            pos = f.seek(0, os.SEEK_END)
            data = b""
            while pos > 0 and data.count(b"\n") <= n:
                step = min(_CHUNK, pos)
                pos -= step
                f.seek(pos)
                data = f.read(step) + data
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return lines[-n:]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
