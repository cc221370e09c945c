"""Finding and ending the processes that use a directory tree (Linux ``/proc``).

A restore must unmount MERGED, and the kernel refuses while any process has its working
directory, its root, an open file, its executable or a mapped file below it. Such a process
was started by hand (services are stopped by the supervisor first); it does not come back.

The scan reads, for each process: ``/proc/PID/cwd``, ``root``, ``exe``, every
``fd/*`` link and the paths in ``maps``. A file deleted while open reads as
``PATH (deleted)``; it still pins the mount, so it counts.

Which processes are never listed or signalled: our own, our ancestors (the shell or
service manager that started the daemon), kernel threads, and pid 1. Siblings in our
process group are listed: a hand-started process is one, whoever started it.

Error handling:
    Processes come and go during a scan: a process that vanishes (ENOENT, ESRCH) or that
    we may not inspect (EACCES, EPERM: run the daemon as root to see them all) is skipped,
    never raised. :func:`terminate` treats a process that is gone as ended.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from sprite_env import procfs

if TYPE_CHECKING:
    from collections.abc import Iterable

_PROC = "/proc"
#: ``PF_KTHREAD`` in the ``flags`` field of ``/proc/PID/stat``.
_PF_KTHREAD = 0x00200000
_DELETED = " (deleted)"
#: How often :func:`terminate` and :func:`wait_group_gone` look again.
POLL_S = 0.02


@dataclass(frozen=True)
class ProcInfo:
    """A process found by :func:`processes_using`.

    ``start_time`` (clock ticks since boot) tells this process from a later one that got
    the same pid; ``uses`` says what it holds, e.g. ``("cwd /m/home", "fd 3 /m/db")``.
    """

    pid: int
    name: str
    cmdline: str
    start_time: int
    uses: tuple[str, ...]

    def describe(self) -> str:
        return f"{self.name} (pid {self.pid}): {', '.join(self.uses)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "name": self.name,
            "cmdline": self.cmdline,
            "uses": list(self.uses),
        }


@dataclass
class TerminateReport:
    """How each process ended: by SIGTERM (or on its own), by SIGKILL, or not at all (a
    process stuck in the kernel, D state, survives SIGKILL for a while)."""

    ended: list[int] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)


def processes_using(path: str, *, exclude: Iterable[int] = ()) -> list[ProcInfo]:
    """The processes that hold anything at or below ``path``, by pid.

    Args:
        path: a directory (usually a mount point); compared after resolving symlinks, as
            ``/proc`` shows resolved paths.
        exclude: more pids to leave out, besides ourselves and our ancestors.

    Returns:
        One :class:`ProcInfo` per process, with everything it was seen to hold.

    Blocking: reads ``/proc`` (a few ms for a few hundred processes); from trio, call it
    through ``trio.to_thread.run_sync``.
    """
    prefixes = {_prefix(os.path.abspath(path)), _prefix(os.path.realpath(path))}
    skip = _protected() | set(exclude)
    found: list[ProcInfo] = []
    for pid in _pids():
        if pid in skip:
            continue
        st = _stat(pid)
        if st is None or st.state == "Z" or st.flags & _PF_KTHREAD:
            continue
        uses = _uses(pid, prefixes)
        if uses:
            found.append(ProcInfo(pid, st.name, _cmdline(pid), st.start_time, tuple(uses)))
    return found


async def terminate(
    targets: Iterable[int | ProcInfo], grace: float = 5.0, *, kill_wait: float = 2.0
) -> TerminateReport:
    """Ends processes: SIGTERM to all, up to ``grace`` seconds, SIGKILL to the rest.

    Each target is pinned with a pidfd where the kernel has them, and a :class:`ProcInfo`
    target is checked against its ``start_time``, so a pid reused since the scan is never
    signalled. Ourselves, our ancestors and pid 1 are never signalled (nor pids <= 0,
    which ``kill`` would take as groups).

    Args:
        targets: pids, or processes from :func:`processes_using`.
        grace: seconds between SIGTERM and SIGKILL.
        kill_wait: seconds to wait after SIGKILL before reporting survivors.

    Returns:
        Which pids ended by TERM (or had gone already), which needed KILL, which survive.

    Cancellation:
        Safe to cancel while waiting; the processes signalled so far stay signalled.
    """
    protected = _protected()
    handles: list[_Handle] = []
    report = TerminateReport()
    try:
        for target in targets:
            pid, start = (
                (target.pid, target.start_time) if isinstance(target, ProcInfo) else (target, None)
            )
            if pid <= 0 or pid in protected or any(h.pid == pid for h in handles):
                continue
            handle = _Handle.open(pid, start)
            if handle is None:
                report.ended.append(pid)
            else:
                handles.append(handle)
        for h in handles:
            h.send(signal.SIGTERM)
        with trio.move_on_after(grace):
            await _wait_gone(handles)
        living = [h for h in handles if h.alive()]
        report.ended.extend(h.pid for h in handles if h not in living)
        for h in living:
            h.send(signal.SIGKILL)
        with trio.move_on_after(kill_wait):
            await _wait_gone(living)
        report.killed.extend(h.pid for h in living if not h.alive())
        report.survivors.extend(h.pid for h in living if h.alive())
    finally:
        for h in handles:
            h.close()
    return report


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []  # the common case, without a scan
    except PermissionError:
        pass  # a member we may not signal: it exists; find out which below
    members = []
    for pid in _pids():
        st = _stat(pid)
        if st is not None and st.pgrp == pgid and st.state != "Z":
            members.append(pid)
    return members


async def wait_group_gone(pgid: int) -> None:
    """Returns once process group ``pgid`` has no live member (poll: Linux has no event)."""
    while group_members(pgid):  # noqa: ASYNC110 - nothing to wait on but time
        await trio.sleep(POLL_S)


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    st = _stat(pid)
    return st is not None and st.state != "Z"


def start_time(pid: int) -> int | None:
    """When a live process started (clock ticks since boot; tells it from a later process
    with the same pid), or None if there is none."""
    st = _stat(pid)
    return st.start_time if st is not None and st.state != "Z" else None


# -- /proc reading ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Stat:
    name: str
    state: str
    ppid: int
    pgrp: int
    flags: int
    start_time: int


def _pids() -> list[int]:
    return [int(e) for e in os.listdir(_PROC) if e.isdigit()]


def process_ids() -> set[int]:
    """The pids of every process now (a listing of ``/proc``: no process is read)."""
    return set(_pids())


def _stat(pid: int) -> _Stat | None:
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:  # gone (ENOENT, ESRCH) or hidden from us
        return None
    # "pid (comm) state ppid pgrp session tty tpgid flags ... starttime": comm may hold
    # spaces and parentheses, so split after the last ')'.
    open_, close = raw.find("("), raw.rfind(")")
    fields = raw[close + 2 :].split()
    try:
        return _Stat(
            name=raw[open_ + 1 : close],
            state=fields[0],
            ppid=int(fields[1]),
            pgrp=int(fields[2]),
            flags=int(fields[6]),
            start_time=int(fields[19]),
        )
    except (IndexError, ValueError):
        return None


def _cmdline(pid: int) -> str:
    try:
        with open(f"{_PROC}/{pid}/cmdline", "rb") as f:
            raw = f.read(4096)
    except OSError:
        return ""
    return " ".join(a.decode("utf-8", "replace") for a in raw.rstrip(b"\0").split(b"\0"))


def _protected() -> set[int]:
    """Our pid, our ancestors' and pid 1."""
    pids = {1, os.getpid()}
    pid = os.getppid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        st = _stat(pid)
        if st is None:
            break
        pid = st.ppid
    return pids


def _prefix(path: str) -> str:
    return path if path.endswith("/") else path + "/"


def _below(target: str, prefixes: set[str]) -> bool:
    target = target.removesuffix(_DELETED)
    return any(target == p[:-1] or target.startswith(p) for p in prefixes)


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:  # gone, not ours to read, or a kernel thread without exe
        return None


def _uses(pid: int, prefixes: set[str]) -> list[str]:
    base = f"{_PROC}/{pid}"
    uses = []
    for what in ("cwd", "root", "exe"):
        target = _readlink(f"{base}/{what}")
        if target is not None and _below(target, prefixes):
            uses.append(f"{what} {target}")
    try:
        fds = sorted(os.listdir(f"{base}/fd"), key=lambda s: int(s) if s.isdigit() else -1)
    except OSError:
        fds = []
    for fd in fds:
        target = _readlink(f"{base}/fd/{fd}")
        if target is not None and _below(target, prefixes):
            uses.append(f"fd {fd} {target}")
    mapped: set[str] = set()
    data = procfs.read(f"{base}/maps")
    # Parsed only where a prefix occurs: a create's pause scans every process twice, and
    # line by line a process's maps cost about 1 us a mapping (most have hundreds).
    if any(os.fsencode(p) in data for p in prefixes):
        for line in data.split(b"\n"):
            # "start-end perms offset dev inode   path": the path may contain spaces.
            parts = line.decode("utf-8", "replace").split(maxsplit=5)
            if len(parts) == 6 and _below(parts[5], prefixes):
                mapped.add(parts[5])
    uses.extend(f"map {m}" for m in sorted(mapped))
    return uses


# -- signalling ------------------------------------------------------------------------------


class _Handle:
    """One process to end: a pidfd if the kernel has them (race-free), else the pid and
    its start time, checked before every signal."""

    def __init__(self, pid: int, pidfd: int | None, start_time: int | None) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.start_time = start_time

    @classmethod
    def open(cls, pid: int, start_time: int | None) -> _Handle | None:
        """None if the process is gone (or was replaced by another with its pid)."""
        pidfd: int | None = None
        with contextlib.suppress(OSError, AttributeError):  # gone, or no pidfd_open
            pidfd = os.pidfd_open(pid)
        st = _stat(pid)  # read after pinning: a pid reused from here on cannot matter
        if (
            st is None
            or st.state == "Z"
            or (start_time is not None and st.start_time != start_time)
        ):
            if pidfd is not None:
                os.close(pidfd)
            return None
        return cls(pid, pidfd, st.start_time)

    def alive(self) -> bool:
        if self.pidfd is not None:
            # A pidfd turns readable when the process exits (zombies included).
            ready, _, _ = select.select([self.pidfd], [], [], 0)
            return not ready
        st = _stat(self.pid)
        return st is not None and st.state != "Z" and st.start_time == self.start_time

    def send(self, sig: signal.Signals) -> None:
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, sig)
            elif self.alive():
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass  # exited meanwhile: what we wanted

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


async def _wait_gone(handles: list[_Handle]) -> None:
    """Polls until every process has ended (pidfds could be waited on, but not plain pids)."""
    while any(h.alive() for h in handles):  # noqa: ASYNC110 - polling is the only way
        await trio.sleep(POLL_S)
