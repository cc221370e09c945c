"""A brief freeze of the processes that use the environment, for a consistent capture.

A capture reads files one after another; a writer that keeps writing (a log, a SQLite
database in WAL mode: two files that must agree) would be caught half-way. The engine
therefore captures twice: once with everything running (that stores nearly all the data
and refreshes the files cache), then again with the writers frozen, which only re-reads
what changed in between. Only that second pass is the writers' pause.

The freeze is the kernel's cgroup freezer (v2 ``cgroup.freeze``, else the v1 ``freezer``
controller): unlike SIGSTOP it is invisible to the processes and to their shells (no
"Stopped" job, no SIGCHLD), and a child forked meanwhile is frozen with its parent. The
processes are moved into a cgroup of ours for the freeze and back to their own after.
What the capture sees is what a power cut at that instant would leave: every file whole
as of one moment, which is what SQLite's WAL recovery and any journaling program expect.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sprite_env.mountinfo import mounts

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)

#: How long to wait for the kernel to report the group frozen.
FREEZE_TIMEOUT_S = 5.0


class FreezeUnavailable(Exception):
    pass


def _cgroup_mounts() -> dict[str, str]:
    """``{"cgroup2": path, "freezer": path}`` for the hierarchies that are mounted."""
    out: dict[str, str] = {}
    for m in mounts():
        if m.fstype == "cgroup2":
            out.setdefault("cgroup2", m.mountpoint)
        elif m.fstype == "cgroup" and "freezer" in m.options:
            out.setdefault("freezer", m.mountpoint)
    return out


def _cgroup_of(pid: int, hierarchy: str) -> str | None:
    """The pid's cgroup path in ``hierarchy`` ("" for v2, "freezer" for v1)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                _hid, controllers, path = line.rstrip("\n").split(":", 2)
                if (hierarchy == "" and controllers == "" and _hid == "0") or (
                    hierarchy and hierarchy in controllers.split(",")
                ):
                    return path
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


@dataclass
class _Group:
    """Our freezer cgroup in one hierarchy."""

    mount: str
    v2: bool
    path: str = ""
    homes: dict[int, str] = field(default_factory=dict)  # pid -> cgroup it came from

    def create(self) -> None:
        self.path = os.path.join(self.mount, f"sprite-env-freeze-{os.getpid()}")
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.path)
        if self.v2 and not os.path.exists(os.path.join(self.path, "cgroup.freeze")):
            os.rmdir(self.path)
            raise FreezeUnavailable("cgroup v2 without cgroup.freeze")

    def add(self, pid: int) -> bool:
        home = _cgroup_of(pid, "" if self.v2 else "freezer")
        if home is None:
            return False
        try:
            with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
                f.write(str(pid))
        except (ProcessLookupError, FileNotFoundError):
            return False  # it ended meanwhile
        self.homes[pid] = home
        return True

    def set_frozen(self, frozen: bool) -> None:
        if self.v2:
            with open(os.path.join(self.path, "cgroup.freeze"), "w") as f:
                f.write("1" if frozen else "0")
        else:
            with open(os.path.join(self.path, "freezer.state"), "w") as f:
                f.write("FROZEN" if frozen else "THAWED")

    def wait_frozen(self) -> None:
        deadline = time.monotonic() + FREEZE_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.v2:
                with open(os.path.join(self.path, "cgroup.events")) as f:
                    if "frozen 1" in f.read():
                        return
            else:
                with open(os.path.join(self.path, "freezer.state")) as f:
                    if f.read().strip() == "FROZEN":
                        return
            time.sleep(0.001)
        raise FreezeUnavailable("the kernel did not freeze the group in time")

    def release(self) -> float:
        """Thaws, sends every process home, removes the cgroup (best effort, never raises:
        a process left frozen would be far worse than a stray empty cgroup). Returns when
        the processes were thawed (``time.monotonic``); the cleanup after costs them
        nothing."""
        with contextlib.suppress(OSError):
            self.set_frozen(False)
        thawed = time.monotonic()
        for pid, home in self.homes.items():
            with (
                contextlib.suppress(OSError),
                open(os.path.join(self.mount, home.lstrip("/"), "cgroup.procs"), "w") as f,
            ):
                f.write(str(pid))
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return thawed
            except FileNotFoundError:
                return thawed
            except OSError:
                time.sleep(0.01)  # the last moves settle
        log.error("could not remove %s", self.path)
        return thawed


def thaw_leftovers() -> list[int]:
    """Thaws the freezer cgroups a killed daemon left (``sprite-env-freeze-*``): their
    processes would stay frozen forever. They go to the hierarchy's root cgroup (where
    they came from is lost with the daemon). Returns their pids."""
    thawed: list[int] = []
    for kind, mount in _cgroup_mounts().items():
        try:
            names = [n for n in os.listdir(mount) if n.startswith("sprite-env-freeze-")]
        except OSError:
            continue
        for name in names:
            if _owner_alive(os.path.join(mount, name), name):
                continue  # another daemon's freeze, in progress: not left by anyone
            group = _Group(mount, v2=kind == "cgroup2", path=os.path.join(mount, name))
            try:
                with open(os.path.join(group.path, "cgroup.procs")) as f:
                    pids = [int(line) for line in f if line.strip()]
            except OSError:
                pids = []
            group.homes = dict.fromkeys(pids, "/")
            log.warning("thawing %d processes a previous daemon left frozen", len(pids))
            group.release()
            thawed += pids
    return thawed


def _owner_alive(path: str, name: str) -> bool:
    """True if the process that made the freezer cgroup ``path`` (its pid is in ``name``)
    still runs: another daemon (of another layer on this machine) holding its writers for
    a capture's frozen pass, which thawing would break. A process of that pid started after
    the cgroup was made is another one (the pid was reused): the owner is dead."""
    try:
        pid = int(name.rsplit("-", 1)[1])
        made = os.stat(path).st_mtime
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
    except (ValueError, OSError, IndexError, StopIteration):
        return False  # no such process (or unreadable): thaw
    started = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
    return started <= made + 1  # btime has a one-second granularity


def _freezer() -> tuple[str, str] | None:
    """The freezer this machine offers, ("cgroup2" or "freezer", its mount), or None."""
    found = _cgroup_mounts()
    v2 = found.get("cgroup2")
    if v2 is not None and os.path.exists(os.path.join(v2, "cgroup.subtree_control")):
        return "cgroup2", v2
    if "freezer" in found:
        return "freezer", found["freezer"]
    return None


def available() -> str | None:
    """Which freezer this machine offers ("cgroup2", "freezer"), or None."""
    freezer = _freezer()
    return freezer[0] if freezer else None


@dataclass
class FreezeReport:
    frozen: list[int] = field(default_factory=list)
    #: From freezing our cgroup (its processes moved in) to thawing it: an upper bound of
    #: any process's pause (it includes looking for newcomers and moving them in).
    seconds: float = 0.0
    method: str | None = None


@contextlib.contextmanager
def frozen(find: Callable[[], list[int]], report: FreezeReport | None = None) -> Iterator[None]:
    """Freezes every process ``find()`` names (asked again until it names no new one, so a
    process that started using the tree meanwhile is caught too) for the block.

    Raises:
        FreezeUnavailable: no cgroup freezer here (the caller decides whether to go on).
    """
    report = report if report is not None else FreezeReport()
    freezer = _freezer()
    if freezer is None:
        raise FreezeUnavailable("no cgroup freezer is mounted")
    kind, mount = freezer
    group = _Group(mount, v2=kind == "cgroup2")
    group.create()
    t0 = time.monotonic()
    try:
        # Moved in while the group runs, then frozen by one write: every process stops at
        # the same instant, and none waits in the freeze for the moves of the others (a
        # move waits for an RCU grace period: 3-29 ms each on this VM, so frozen first, the
        # first of 8 processes stood still through the other 7 moves).
        for pid in find():
            if pid != os.getpid():
                group.add(pid)
        t0 = time.monotonic()
        group.set_frozen(True)
        for _round in range(10):  # who started using the tree since: stops as it is moved in
            new = [p for p in find() if p not in group.homes and p != os.getpid()]
            if not new:
                break
            for pid in new:
                group.add(pid)
        group.wait_frozen()
        report.frozen = sorted(group.homes)
        report.method = kind
        yield
    finally:
        thawed = group.release()
        report.seconds = thawed - t0
