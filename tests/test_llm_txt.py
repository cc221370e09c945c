"""llm.txt tells agents what to run: every command it shows is run here, in the order shown,
against a real daemon, and must succeed."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from typing import Any

import pytest

from tests.helpers.cli import REPO
from tests.helpers.daemon import write_file

pytestmark = pytest.mark.integration

PROGRAMS = ("sprite-env", "curl", "ls", "diff", "cp")


def shown_commands() -> list[str]:
    """The indented command lines of llm.txt (two spaces, then a known program)."""
    with open(os.path.join(REPO, "llm.txt"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    return [
        line.strip()
        for line in lines
        if line.startswith("  ")
        and not line.startswith("   ")
        and line.strip().split(" ", 1)[0] in PROGRAMS
    ]


def test_llm_txt_shows_every_command() -> None:
    cmds = shown_commands()
    words = {" ".join(shlex.split(c)[:3]) for c in cmds if c.startswith("sprite-env")}
    for needed in (
        "sprite-env checkpoints create",
        "sprite-env checkpoints list",
        "sprite-env checkpoints info",
        "sprite-env checkpoints diff",
        "sprite-env checkpoints delete",
        "sprite-env checkpoints log",
        "sprite-env restore v0",
        "sprite-env checkpoints cat",
        "sprite-env checkpoints export",
        "sprite-env reset --yes",
    ):
        assert any(w.startswith(needed) for w in words), needed
    curls = " ".join(c for c in cmds if c.startswith("curl"))
    for endpoint in (
        "/v1/checkpoints",
        "/v1/checkpoint ",
        "/restore",
        "-X DELETE",
        "/diff",
        "/preview",
        "/files/",
        "/export",
        "/v1/activity",
        "/v1/status",
        "/v1/jobs/1/events",
    ):
        assert endpoint in curls, endpoint


def test_every_command_in_llm_txt_runs(daemon: Any, tmp_path: Any) -> None:
    root, state = daemon.root, daemon.state
    hosts = os.path.join(root, "etc", "hosts")
    write_file(hosts, b"127.0.0.1 localhost\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "sprite-env"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m sprite_env "$@"\n')
    wrapper.chmod(0o755)
    env = {
        **os.environ,
        **daemon.env(),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHONPATH": REPO,
    }
    # Layer changes between commands, so that each one has something to show.
    before = {
        "sprite-env --as my-agent checkpoints create": lambda: write_file(hosts, b"10.0.0.1 db\n"),
        "sprite-env checkpoints diff v0": lambda: write_file(os.path.join(root, "new.txt"), b"n"),
        "sprite-env services list": lambda: write_file(
            os.path.join(root, "etc", "sprite", "services", "web.toml"),
            b'command = "while true; do echo up; sleep 1; done"\n',
        ),
        "ls /.sprite/checkpoints/": lambda: daemon.stream("POST", "/v1/checkpoints/v0/restore"),
        # A path restore through the API with something to do.
        "curl --unix-socket /.sprite/api.sock -X POST http://sprite/v1/checkpoints/v0/restore -d": (
            lambda: write_file(hosts, b"changed by hand\n")
        ),
    }
    ran = []
    for cmd in shown_commands():
        for prefix, action in before.items():
            if cmd.startswith(prefix) and prefix not in ran:
                action()
                ran.append(prefix)
        # /etc/hosts is the layer's file for the shell's diff and cp; sprite-env takes paths
        # relative to the layer's root as they are.
        here = cmd if cmd.startswith("sprite-env") else cmd.replace(" /etc/hosts", " " + hosts)
        real = (
            here.replace("/.sprite/api.sock", daemon.socket)
            .replace("/.sprite/", state + "/")
            .replace("/tmp/hosts-from-v0", str(tmp_path / "hosts-from-v0"))
            .replace("/tmp/v0-etc", str(tmp_path / "v0-etc"))
            .replace("/tmp/v0-copy", str(tmp_path / "v0-copy"))
        )
        if real.startswith("curl "):
            real = "curl -sS --fail-with-body " + real[len("curl ") :]
        p = subprocess.run(
            real, shell=True, env=env, capture_output=True, text=True, timeout=300, cwd=root
        )
        ok = (0, 1) if cmd.startswith("diff ") else (0,)  # diff: 1 means "they differ"
        if cmd.startswith("sprite-env reset"):
            # This daemon has no base image (no --overlay): llm.txt says reset is refused
            # there and changes nothing; tests/overlay/test_reset_line.py runs it in a sprite.
            assert p.returncode == 2, p
            assert "needs a base image" in p.stderr, p
            continue
        assert p.returncode in ok, f"{cmd}\n-> {real}\nexit {p.returncode}\n{p.stdout}\n{p.stderr}"
    assert len(ran) == len(before)
    for copy in ("v0-etc", "v0-copy"):  # the exports (CLI, API) hold v0's /etc only
        assert os.listdir(tmp_path / copy) == ["etc"]
        with open(tmp_path / copy / "etc" / "hosts", "rb") as f:
            assert f.read() == b"127.0.0.1 localhost\n"
    with open(hosts, "rb") as f:  # the API's path restore, the last restore run
        assert f.read() == b"127.0.0.1 localhost\n"
    with open(tmp_path / "hosts-from-v0", "rb") as f:
        assert f.read() == b"127.0.0.1 localhost\n"
