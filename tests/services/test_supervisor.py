from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import TYPE_CHECKING, Any

import pytest
import trio

from sprite_env.services import (
    DEFINITIONS_DIR,
    Backoff,
    InvalidServiceName,
    ServicesPaused,
    Supervisor,
    SupervisorNotRunning,
    UnknownService,
)
from sprite_env.services.processes import alive, start_time

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

#: Real processes, so real time: short enough to keep the whole file to a few seconds.
FAST = Backoff(initial=0.05, maximum=0.2, reset_after=30)
TICK = "while true; do echo tick; sleep 0.1; done"


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "root"
        self.logs = tmp_path / "logs"
        (self.root / DEFINITIONS_DIR).mkdir(parents=True)

    def define(self, name: str, text: str) -> None:
        (self.root / DEFINITIONS_DIR / f"{name}.toml").write_text(text)

    def remove(self, name: str) -> None:
        (self.root / DEFINITIONS_DIR / f"{name}.toml").unlink()

    def run(self, body: Callable[[Supervisor], Awaitable[None]], **options: Any) -> None:
        sup = Supervisor(str(self.root), str(self.logs), **{"backoff": FAST, **options})

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                await nursery.start(sup.run)
                with trio.fail_after(10):
                    await body(sup)
                nursery.cancel_scope.cancel()

        trio.run(main)

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text()


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def state(sup: Supervisor, name: str) -> dict[str, Any]:
    (found,) = [s for s in sup.status() if s["name"] == name]
    return found


async def until(check: Callable[[], object]) -> None:
    """Polls ``check`` (a service's state or files: nothing to wait on); Env.run bounds it."""
    while not check():  # noqa: ASYNC110
        await trio.sleep(0.02)


def pid_in(path: Path) -> int | None:
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text else None


async def read_pid(path: Path) -> int:
    await until(lambda: pid_in(path))
    pid = pid_in(path)
    assert pid is not None
    return pid


def test_service_runs_logs_and_stops(env: Env) -> None:
    env.define("ticker", f"command = {TICK!r}\n")

    async def body(sup: Supervisor) -> None:
        assert await sup.start_all() == []
        s = state(sup, "ticker")
        assert s["state"] == "running"
        assert s["command"] == TICK
        pid = s["pid"]
        assert alive(pid)
        assert (env.logs / "ticker.pid").read_text().split()[0] == str(pid)
        await until(lambda: sup.logs("ticker").count("tick") >= 3)
        s = await sup.stop("ticker")
        assert s["state"] == "stopped"
        assert s["pid"] is None
        assert s["last_exit"] == -signal.SIGTERM
        assert s["restarts"] == 0
        assert not alive(pid)
        assert not (env.logs / "ticker.pid").exists()
        assert (await sup.stop("ticker"))["state"] == "stopped"  # again: a no-op

    env.run(body)
    log = env.log("ticker")
    assert "] started (pid " in log
    assert "stopping: sending SIGTERM" in log
    assert "tick\ntick\n" in log


def test_environment_and_working_directory(env: Env) -> None:
    (env.root / "srv").mkdir()
    env.define(
        "show",
        'command = ["/bin/sh", "-c", "echo $SPRITE_SERVICE $FOO $(pwd)"]\n'
        'workdir = "/srv"\nenv = { FOO = "bar" }\nrestart = "never"\n',
    )

    async def body(sup: Supervisor) -> None:
        await sup.start("show")
        await until(lambda: state(sup, "show")["state"] == "stopped")
        assert state(sup, "show")["last_exit"] == 0

    env.run(body)
    assert f"show bar {env.root / 'srv'}\n" in env.log("show")


def test_restart_on_failure_backs_off(env: Env) -> None:
    env.define("crash", 'command = "echo boom; exit 1"\n')

    async def body(sup: Supervisor) -> None:
        await sup.start_all()
        await until(lambda: state(sup, "crash")["restarts"] >= 4)
        s = state(sup, "crash")
        assert s["state"] in ("backoff", "running")
        assert s["last_exit"] == 1
        await until(lambda: state(sup, "crash")["state"] == "backoff")
        assert "exited with code 1; restarting in" in state(sup, "crash")["reason"]
        s = await sup.stop("crash")  # stops the pending restart
        assert s["state"] == "stopped"
        restarts = s["restarts"]
        await trio.sleep(0.3)
        assert state(sup, "crash")["restarts"] == restarts

    env.run(body)
    log = env.log("crash")
    waits = [line.rsplit(" in ", 1)[1] for line in log.splitlines() if "restarting in" in line]
    assert waits[:4] == ["0.05 s", "0.1 s", "0.2 s", "0.2 s"]  # doubling, up to the maximum
    assert log.count("boom") >= 5


def test_always_restarts_a_clean_exit(env: Env) -> None:
    env.define("oneshot", 'command = "true"\nrestart = "always"\n')

    async def body(sup: Supervisor) -> None:
        await sup.start("oneshot")
        await until(lambda: state(sup, "oneshot")["restarts"] >= 2)
        assert state(sup, "oneshot")["last_exit"] == 0
        await sup.stop("oneshot")

    env.run(body)


def test_backoff_policy() -> None:
    b = Backoff()
    waits = []
    previous = None
    for _ in range(9):
        previous = b.next(previous, ran_for=0.1)
        waits.append(previous)
    assert waits == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert b.next(60, ran_for=30) == 1  # a run of 30 s resets the wait
    assert b.next(60, ran_for=29.9) == 60


def test_restart_never(env: Env, expect_log: Callable[[str], None]) -> None:
    expect_log(r"service fails exited with code 3; not restarted")
    env.define("fails", 'command = "exit 3"\nrestart = "never"\n')
    env.define("done", 'command = "exit 0"\nrestart = "never"\n')
    env.define("clean", 'command = "exit 0"\n')  # on-failure: a clean exit is final too

    async def body(sup: Supervisor) -> None:
        await sup.start_all()
        final = ("stopped", "failed")
        await until(lambda: all(s["state"] in final for s in sup.status()))
        by_name = {s["name"]: s for s in sup.status()}
        assert by_name["fails"]["state"] == "failed"
        assert by_name["fails"]["last_exit"] == 3
        assert by_name["fails"]["reason"] == "exited with code 3"
        assert by_name["done"]["state"] == "stopped"
        assert by_name["clean"]["state"] == "stopped"
        assert all(s["restarts"] == 0 for s in sup.status())

    env.run(body)
    assert "exited with code 3; not restarted (restart = never)" in env.log("fails")


def test_command_not_found_in_a_shell(env: Env, expect_log: Callable[[str], None]) -> None:
    expect_log(r"service ghost exited with code 127 \(command not found\)")
    env.define("ghost", 'command = "no-such-program-here"\nrestart = "never"\n')

    async def body(sup: Supervisor) -> None:
        await sup.start("ghost")
        await until(lambda: state(sup, "ghost")["state"] == "failed")

    env.run(body)
    assert "not found" in env.log("ghost")


def test_stop_escalates_to_sigkill(env: Env) -> None:
    env.define(
        "stubborn",
        "command = \"trap '' TERM; echo ready; while true; do sleep 0.05; done\"\n"
        "stop_timeout = 0.3\n",
    )

    async def body(sup: Supervisor) -> None:
        await sup.start("stubborn")
        pid = state(sup, "stubborn")["pid"]
        await until(lambda: "ready" in sup.logs("stubborn"))
        began = time.monotonic()
        s = await sup.stop("stubborn")
        assert time.monotonic() - began >= 0.3
        assert s["state"] == "stopped"
        assert s["last_exit"] == -signal.SIGKILL
        assert not alive(pid)

    env.run(body)
    assert "still running 0.3 s after SIGTERM: SIGKILL" in env.log("stubborn")


def test_stop_ends_the_whole_process_group(env: Env, tmp_path: Path) -> None:
    child_file = env.root / "child.pid"
    env.define("parent", 'command = "sleep 1000 & echo $! > child.pid; wait"\n')

    async def body(sup: Supervisor) -> None:
        await sup.start("parent")
        child = await read_pid(child_file)
        assert alive(child)
        assert os.getpgid(child) == state(sup, "parent")["pid"]
        await sup.stop("parent")
        assert not alive(child)

    env.run(body)


def test_leftovers_are_ended_when_the_main_process_exits(env: Env) -> None:
    child_file = env.root / "child.pid"
    env.define("leaver", 'command = "sleep 1000 & echo $! > child.pid"\nrestart = "never"\n')

    async def body(sup: Supervisor) -> None:
        await sup.start("leaver")
        child = await read_pid(child_file)
        await until(lambda: state(sup, "leaver")["state"] == "stopped")
        assert not alive(child)

    env.run(body)
    assert "main process exited; sending SIGTERM to the rest of group" in env.log("leaver")


def test_a_service_that_cannot_start_fails(env: Env, expect_log: Callable[[str], None]) -> None:
    expect_log(r"service (noprog|nodir) cannot start")
    env.define("noprog", 'command = ["/nonexistent/program", "--flag"]\n')
    env.define("nodir", 'command = "true"\nworkdir = "/does/not/exist"\n')

    async def body(sup: Supervisor) -> None:
        await sup.start_all()  # returns once each spawn was tried: no waiting needed
        noprog, nodir = state(sup, "noprog"), state(sup, "nodir")
        assert noprog["state"] == "failed"
        assert noprog["reason"] == "cannot start: /nonexistent/program: No such file or directory"
        assert noprog["pid"] is None
        assert nodir["state"] == "failed"
        assert nodir["reason"].startswith("cannot start: working directory /does/not/exist (")
        await trio.sleep(0.2)
        assert state(sup, "noprog")["restarts"] == 0  # not retried: the definition is wrong

    env.run(body)
    assert "cannot start: /nonexistent/program" in env.log("noprog")
    assert "cannot start: working directory" in env.log("nodir")


def test_start_and_stop_by_name(env: Env) -> None:
    env.define("ticker", f"command = {TICK!r}\n")

    async def body(sup: Supervisor) -> None:
        with pytest.raises(UnknownService):
            await sup.start("nope")
        with pytest.raises(UnknownService):
            await sup.stop("nope")
        with pytest.raises(InvalidServiceName):
            await sup.stop("../x")
        with pytest.raises(UnknownService):
            sup.logs("nope")
        assert (await sup.stop("ticker"))["state"] == "stopped"  # defined, never started
        first = await sup.start("ticker")
        assert first["state"] == "running"
        assert (await sup.start("ticker"))["pid"] == first["pid"]  # running: left alone
        await sup.stop("ticker")
        second = await sup.start("ticker")
        assert second["pid"] != first["pid"]
        await sup.stop_all()
        assert state(sup, "ticker")["state"] == "stopped"

    env.run(body)


def test_reload_follows_the_definitions(env: Env, expect_log: Callable[[str], None]) -> None:
    expect_log(r"service definition broken.toml: invalid TOML")
    env.define("a", 'command = "sleep 100"\n')
    env.define("b", 'command = "sleep 100"\n')

    async def body(sup: Supervisor) -> None:
        assert sup.status() == []  # nothing read before a reload
        await sup.start("a")
        env.remove("a")
        env.remove("b")
        env.define("c", 'command = "true"\n')
        env.define("broken", "command = ")
        errors = await sup.reload()
        assert errors == sup.definition_errors
        assert len(errors) == 1
        # a runs on (removed from disk, still running); b is forgotten; c is new
        assert [(s["name"], s["state"]) for s in sup.status()] == [
            ("a", "running"),
            ("c", "stopped"),
        ]
        await sup.stop("a")
        await sup.start_all()  # logs the broken file
        assert [s["name"] for s in sup.status()] == ["c"]

    env.run(body)


def test_paused_holds_services_stopped(env: Env) -> None:
    env.define("ticker", f"command = {TICK!r}\n")

    async def body(sup: Supervisor) -> None:
        await sup.start_all()
        pid = state(sup, "ticker")["pid"]
        async with sup.paused():
            assert state(sup, "ticker")["state"] == "stopped"
            assert not alive(pid)
            with pytest.raises(ServicesPaused):
                await sup.start("ticker")
            with pytest.raises(ServicesPaused):
                await sup.start_all()
        await sup.start_all()
        assert state(sup, "ticker")["state"] == "running"

    env.run(body)


def test_cancelling_the_supervisor_stops_the_services(env: Env, tmp_path: Path) -> None:
    env.define("ticker", f"command = {TICK!r}\n")
    pids = []

    async def body(sup: Supervisor) -> None:
        await sup.start_all()
        pids.append(state(sup, "ticker")["pid"])

    env.run(body)  # cancels run() right after the body
    assert not alive(pids[0])
    sup = Supervisor(str(env.root), str(env.logs))
    with pytest.raises(SupervisorNotRunning):
        trio.run(sup.start_all)


def test_logs_rotate(env: Env) -> None:
    env.define(
        "chatty",
        'command = "i=0; while [ $i -lt 300 ]; do echo line-$i; i=$((i+1)); done"\n'
        'restart = "never"\n',
    )

    async def body(sup: Supervisor) -> None:
        await sup.start("chatty")
        await until(lambda: state(sup, "chatty")["state"] == "stopped")
        lines = sup.logs("chatty", 50)
        assert len(lines) == 50
        assert lines[-1].endswith("exited with code 0; not restarted (restart = never)")
        numbers = [int(x[5:]) for x in lines if x.startswith("line-")]
        assert numbers == list(range(300 - len(numbers), 300))
        assert sup.logs("chatty", 0) == []

    env.run(body, log_max_bytes=1000)
    current = env.logs / "chatty.log"
    assert current.stat().st_size <= 1000
    assert (env.logs / "chatty.log.1").stat().st_size <= 1000


def test_services_left_by_a_dead_daemon_are_ended(
    env: Env, expect_log: Callable[[str], None]
) -> None:
    expect_log(r"ending service old \(pid \d+\), left running by a previous daemon")
    env.logs.mkdir()
    orphan = subprocess.Popen(["sleep", "60"], start_new_session=True)
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        started, other_started = start_time(orphan.pid), start_time(other.pid)
        assert started is not None
        assert other_started is not None
        (env.logs / "old.pid").write_text(f"{orphan.pid} {started}\n")
        # A pid file whose pid now belongs to another process: left alone.
        (env.logs / "reused.pid").write_text(f"{other.pid} {other_started + 1}\n")
        (env.logs / "junk.pid").write_text("not a pid")

        async def body(sup: Supervisor) -> None:
            assert not alive(orphan.pid)
            assert alive(other.pid)

        env.run(body)
        assert orphan.wait() == -signal.SIGTERM
        assert other.poll() is None
        assert sorted(p.name for p in env.logs.iterdir()) == []
    finally:
        for p in (orphan, other):
            p.kill()
            p.wait()
