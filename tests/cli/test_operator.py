"""What operators expect (issue 10, point 9): a systemd unit whose daemon takes its flags
from a config file, and shell completion."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from typing import Any

import pytest

from sprite_env.client import Client
from sprite_env.errors import DaemonUnavailable
from tests.helpers.cli import REPO, run_cli
from tests.helpers.daemon import write_file

pytestmark = pytest.mark.integration


def _exec_start(unit: str) -> list[str]:
    (line,) = [x for x in unit.splitlines() if x.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


def test_the_unit_starts_a_daemon_with_the_flags_of_its_config(tmp_path: Any) -> None:
    units, config = tmp_path / "units", tmp_path / "etc" / "daemon.conf"
    r = run_cli("install-unit", "--unit-dir", str(units), "--config", str(config))
    assert r.returncode == 0, r
    unit = (units / "sprite-env.service").read_text()
    argv = _exec_start(unit)
    assert os.path.isabs(argv[0])
    assert os.access(argv[0], os.X_OK)
    assert argv[1:] == ["daemon", f"@{config}"]
    assert "WantedBy=multi-user.target" in unit
    if shutil.which("systemd-analyze"):  # systemd's own parser accepts it
        v = subprocess.run(
            ["systemd-analyze", "verify", str(units / "sprite-env.service")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert (v.returncode, v.stderr) == (0, ""), v

    # The template names no layer: a daemon started on it refuses, touching nothing.
    assert "--overlay" in config.read_text()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert p.returncode == 2, p
    assert "say which layer the daemon owns" in p.stderr

    # Named in the config, the unit's own command line serves that layer.
    root, state = tmp_path / "layer", tmp_path / "state"
    write_file(str(root / "a"), b"a")
    config.write_text(
        f"# the layer\n--root {shlex.quote(str(root))}\n--state {state}  # private\n"
        "--no-view --auto-interval 0\n"
    )
    log = open(tmp_path / "daemon.log", "wb")  # noqa: SIM115 (closed below)
    # PYTHONFAULTHANDLER: a SIGABRT writes every thread's Python stack to the log (below)
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    d = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        c = Client(str(state / "api.sock"), wait=60)
        try:
            st = c.status()
        except DaemonUnavailable as e:
            # Say why, if it comes back: three CI runs met a daemon alive and still
            # importing. The client had given up after 0.8 s, not 60 (its grace for "none
            # runs" kept from a first look at /proc that missed the daemon just spawned;
            # tests/test_client.py), found by running this test beside the suite. Where the
            # daemon is: the kernel's view, its run delay, the machine, then Python's.
            raise AssertionError(f"{e}\n{_why_silent(d, tmp_path / 'daemon.log')}") from None
        assert st["root"] == str(root)
        assert st["auto_interval_s"] == 0
        assert c.create("from the unit")["id"] == "v0"
    finally:
        d.send_signal(signal.SIGTERM)
        code = d.wait(timeout=120)
        log.close()
    assert code == 0, (tmp_path / "daemon.log").read_text()


def _proc(pid: int, name: str, keep: tuple[str, ...] = ()) -> str:
    """``/proc/PID/NAME`` (only its lines that start with one of ``keep``, if given)."""
    try:
        with open(f"/proc/{pid}/{name}") as f:
            text = f.read()
    except OSError as e:
        return f"/proc/{pid}/{name}: {e}"
    if keep:
        text = "".join(x for x in text.splitlines(True) if x.startswith(keep))
    return f"/proc/{pid}/{name}: {text.strip()}"


def _why_silent(d: subprocess.Popen[bytes], log: Any) -> str:
    """What a started daemon that does not answer is doing: its state and kernel stack,
    its children, its run delay (schedstat: run time, wait for a CPU, slices), the load
    and the busiest processes, then (it is aborted) the Python stack of each thread."""
    facts = [f"the daemon's exit: {d.poll()}", _proc(d.pid, "status", ("State", "Threads"))]
    facts += [_proc(d.pid, "wchan"), _proc(d.pid, "stack"), _proc(d.pid, "schedstat")]
    facts.append(_proc(d.pid, "sched", ("se.sum_exec_runtime", "nr_switches", "nr_invol")))
    for args in (
        ["-o", "pid,stat,wchan:32,etime,args", "--ppid", str(d.pid)],
        ["-eo", "pid,ppid,stat,pcpu,etime,args", "--sort=-pcpu"],
    ):
        ps = subprocess.run(["ps", *args], capture_output=True, text=True, check=False)
        facts.append("\n".join(x[:160] for x in ps.stdout.splitlines()[:15]))
    with open("/proc/loadavg") as f:
        facts.append(f"/proc/loadavg: {f.read().strip()}")
    if d.poll() is None:
        d.send_signal(signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            d.wait(timeout=10)
    facts.append(f"its log:\n{log.read_text(errors='replace')}")
    return "\n".join(facts)


def test_install_unit_keeps_an_existing_config(tmp_path: Any) -> None:
    config = tmp_path / "daemon.conf"
    config.write_text("--root /srv/data\n")
    r = run_cli("install-unit", "--unit-dir", str(tmp_path), "--config", str(config))
    assert r.returncode == 0, r
    assert config.read_text() == "--root /srv/data\n"


def test_bash_completion_completes_commands(tmp_path: Any) -> None:
    r = run_cli("completion", "bash")
    assert r.returncode == 0, r
    script = tmp_path / "sprite-env.bash"
    script.write_text(r.stdout)
    # Complete "sprite-env che" in a real bash, with the generated function.
    probe = (
        f"source {script}; COMP_WORDS=(sprite-env che); COMP_CWORD=1; COMP_LINE='sprite-env che';"
        " COMP_POINT=${#COMP_LINE}; $(complete -p sprite-env | sed -E 's/.*-F ([^ ]+).*/\\1/')"
        " sprite-env che sprite-env; printf '%s\\n' \"${COMPREPLY[@]}\""
    )
    t0 = time.monotonic()
    b = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30)
    assert b.returncode == 0, b
    assert "checkpoints" in b.stdout.split()
    assert time.monotonic() - t0 < 30
