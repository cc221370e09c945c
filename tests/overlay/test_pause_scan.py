"""The writers' pause of an overlay's create looks for newcomers without reading every
process again: inside the pause, only the processes started since the first scan are read,
and one of them that uses MERGED is frozen with the rest. Real processes, the real cgroup
freezer; MERGED is a plain directory here (the scan and the freeze look at the processes'
paths only)."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from typing import Any

import pytest

from sprite_env.daemon import environment
from sprite_env.overlay import freeze
from sprite_env.services import Supervisor, process_ids

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the freezer needs root"),
    pytest.mark.skipif(freeze.available() != "cgroup2", reason="needs the cgroup v2 freezer"),
]

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def _frozen_state(pid: int) -> bool:
    """True if the cgroup v2 group ``pid`` is in now says it is frozen."""
    with open("/proc/mounts") as f:
        mount = next(line.split()[1] for line in f if line.split()[2] == "cgroup2")
    with open(f"/proc/{pid}/cgroup") as f:
        rel = next(line for line in f if line.startswith("0::")).strip()[3:]
    events = os.path.join(mount, rel.lstrip("/"), "cgroup.events")
    if not os.path.exists(events):
        return False  # the root cgroup (no freezer of its own there)
    with open(events) as f:
        return "frozen 1" in f.read().split("\n")


def test_a_process_started_after_the_first_scan_is_frozen_and_old_ones_are_not_reread(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    merged = tmp_path / "merged"
    merged.mkdir()
    env = environment.Environment(
        Supervisor(str(merged), str(tmp_path / "logs")), types.SimpleNamespace(merged=str(merged))
    )  # type: ignore[arg-type]
    procs: list[subprocess.Popen[bytes]] = []
    scans: list[set[int]] = []
    real = environment.processes_using

    def scan(path: str, *, exclude: Any = ()) -> Any:
        scans.append(set(exclude))
        found = real(path, exclude=exclude)
        if len(scans) == 1:  # between the first scan and the freeze: a newcomer
            procs.append(subprocess.Popen(SLEEPER, cwd=merged))
        return found

    monkeypatch.setattr(environment, "processes_using", scan)
    procs.append(subprocess.Popen(SLEEPER, cwd=merged))
    try:
        report = freeze.FreezeReport()
        pause = env.pause(report)
        assert pause is not None
        with pause():
            old, new = procs
            assert old.pid in report.frozen
            assert new.pid in report.frozen
            assert _frozen_state(old.pid)
            assert _frozen_state(new.pid)
        assert scans[0] == set()  # the first scan read every process
        assert old.pid in scans[1]  # the look for newcomers left it alone
        assert os.getpid() in scans[1]
        assert os.getppid() in scans[1]
        assert new.pid not in scans[1]
        assert not _frozen_state(old.pid)
        # another freeze of the same pause reads every process again
        n = len(scans)
        with pause():
            assert {old.pid, new.pid} <= set(report.frozen)
        assert scans[n] == set()
        assert process_ids() >= {old.pid, new.pid}
    finally:
        for p in procs:
            p.kill()
            p.wait()
