from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from typing import TYPE_CHECKING

import pytest
import trio

from sprite_env.services import ProcInfo, processes_using, terminate
from sprite_env.services.processes import _stat, _uses, alive, group_members

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    Spawn = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Starts helper processes in their own session (processes_using skips our group) and
    kills and reaps whatever is left at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], cwd: str | Path = "/") -> subprocess.Popen[bytes]:
        p = subprocess.Popen(argv, cwd=cwd, start_new_session=True)
        started.append(p)
        return p

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def wait_until(check: Callable[[], object]) -> None:
    deadline = time.monotonic() + 5
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def found(path: Path, pid: int) -> ProcInfo | None:
    return next((p for p in processes_using(str(path)) if p.pid == pid), None)


def test_finds_cwd_and_open_files(tmp_path: Path, spawn: Spawn) -> None:
    inside = tmp_path / "inside"
    (inside / "sub").mkdir(parents=True)
    data = inside / "data.txt"
    data.write_text("x")
    in_cwd = spawn(["sleep", "60"], cwd=inside / "sub")
    holder = spawn(["sh", "-c", 'exec 3<"$1"; exec sleep 60', "sh", str(data)])
    outsider = spawn(["sleep", "60"], cwd=tmp_path)
    wait_until(lambda: found(tmp_path / "inside", holder.pid) is not None)

    by_pid = {p.pid: p for p in processes_using(str(inside))}
    assert by_pid[in_cwd.pid].uses == (f"cwd {inside / 'sub'}",)
    assert by_pid[in_cwd.pid].name == "sleep"
    assert by_pid[in_cwd.pid].cmdline == "sleep 60"
    assert by_pid[holder.pid].uses == (f"fd 3 {data}",)
    assert outsider.pid not in by_pid
    assert "fd 3" in by_pid[holder.pid].describe()
    assert by_pid[holder.pid].to_json()["uses"] == [f"fd 3 {data}"]


def test_finds_deleted_files_executables_and_maps(tmp_path: Path, spawn: Spawn) -> None:
    data = tmp_path / "gone.txt"
    data.write_text("x")
    holder = spawn(["sh", "-c", 'exec 3<"$1"; exec sleep 60', "sh", str(data)])
    wait_until(lambda: found(tmp_path, holder.pid) is not None)
    data.unlink()  # still open: it still pins the mount
    info = found(tmp_path, holder.pid)
    assert info is not None
    assert info.uses == (f"fd 3 {data} (deleted)",)

    binary = tmp_path / "mysleep"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", binary)
    runner = spawn([str(binary), "60"])
    wait_until(lambda: found(tmp_path, runner.pid) is not None)
    info = found(tmp_path, runner.pid)
    assert info is not None
    assert info.uses == (f"exe {binary}", f"map {binary}")


def test_skips_ourselves_but_not_our_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    same_group = subprocess.Popen(["sleep", "60"], cwd=tmp_path)  # in pytest's group
    try:
        pids = {p.pid for p in processes_using(str(tmp_path))}
        assert os.getpid() not in pids
        assert same_group.pid in pids  # a sibling started by hand is not protected
        assert {p.pid for p in processes_using(str(tmp_path), exclude=[same_group.pid])} == (
            pids - {same_group.pid}
        )
    finally:
        same_group.kill()
        same_group.wait()


def test_whole_system_scan_does_not_fail() -> None:
    # Processes come and go while /proc is read; nothing may raise.
    everyone = processes_using("/")
    assert all(p.pid != os.getpid() for p in everyone)
    assert all(p.uses for p in everyone)


def test_vanished_process_reads_as_nothing(spawn: Spawn) -> None:
    p = spawn(["true"])
    p.wait()
    assert _stat(p.pid) is None
    assert _uses(p.pid, {"/"}) == []
    assert not alive(p.pid)
    assert group_members(p.pid) == []


def test_terminate_ends_them(tmp_path: Path, spawn: Spawn) -> None:
    data = tmp_path / "data"
    data.write_text("x")
    a = spawn(["sleep", "60"], cwd=tmp_path)
    b = spawn(["sh", "-c", 'exec 3<"$1"; exec sleep 60', "sh", str(data)])
    stubborn = spawn(["sh", "-c", "trap '' TERM; exec sleep 60"], cwd=tmp_path)
    wait_until(
        lambda: {a.pid, b.pid, stubborn.pid} <= {p.pid for p in processes_using(str(tmp_path))}
    )
    procs = processes_using(str(tmp_path))

    report = trio.run(lambda: terminate(procs, grace=0.3, kill_wait=2))

    assert sorted(report.ended) == sorted([a.pid, b.pid])
    assert report.killed == [stubborn.pid]
    assert report.survivors == []
    assert a.wait() == -signal.SIGTERM
    assert b.wait() == -signal.SIGTERM
    assert stubborn.wait() == -signal.SIGKILL
    assert processes_using(str(tmp_path)) == []


def test_terminate_never_signals_a_reused_pid_or_ourselves(tmp_path: Path, spawn: Spawn) -> None:
    p = spawn(["sleep", "60"], cwd=tmp_path)
    wait_until(lambda: found(tmp_path, p.pid) is not None)
    info = found(tmp_path, p.pid)
    assert info is not None
    # As if the scanned process had exited and another had taken its pid since.
    impostor = ProcInfo(info.pid, info.name, info.cmdline, info.start_time + 1, info.uses)
    gone = spawn(["true"])
    gone.wait()

    report = trio.run(lambda: terminate([impostor, gone.pid, os.getpid(), 0, -1], grace=0.2))

    assert sorted(report.ended) == sorted([p.pid, gone.pid])  # counted as already gone
    assert p.poll() is None  # but never signalled
    assert report.killed == report.survivors == []
