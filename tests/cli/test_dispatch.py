"""Which way a command runs (online or offline), what each way refuses, and what the
online way loads (no daemon needed: these stop before talking to one)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers.cli import REPO, run_cli

NO_DAEMON = {"SPRITE_API_SOCK": "/nonexistent/api.sock", "SPRITE_API_WAIT": "0"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["checkpoints", "list", "--exclude", "cache"], "--exclude works offline only"),
        (["checkpoints", "create", "--reason", "x"], "--reason goes with --auto"),
        (["--root", "/nonexistent", "restore", "v0", "--detach"], "--detach needs the daemon"),
        (["--root", "/nonexistent", "reset", "--detach"], "--detach needs the daemon"),
        (["--store", "/nonexistent", "checkpoints", "log"], "activity log is the daemon's"),
    ],
)
def test_refused_before_anything_runs(args: list[str], message: str) -> None:
    r = run_cli(*args, env=NO_DAEMON)
    assert r.returncode == 2
    assert message in r.stderr
    assert not os.path.exists("/nonexistent")


def test_the_online_way_loads_no_engine() -> None:
    probe = (
        "import sys\n"
        "from sprite_env.cli.main import main\n"
        "code = main(['checkpoints', 'list'])\n"
        "heavy = ('sprite_env.checkpoints', 'sprite_env.store', 'sprite_env.snapshot',\n"
        "         'sprite_env.fuse', 'sprite_env.daemon', 'sprite_env.api', 'trio',\n"
        "         'pyfuse3', 'rich', 'h11')\n"
        "print(code, sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **NO_DAEMON},
        timeout=60,
    )
    assert r.stdout.strip() == "5 []", r.stdout + r.stderr


def test_every_argument_has_help_text() -> None:
    """Issue 10: every positional and option says what it is (and its default)."""
    import argparse

    from sprite_env.cli.main import build_parser

    missing: list[str] = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    walk(sub, [*path, name])
            elif a.help is None and a.dest != "deferred_args":  # demo's real parser has it
                missing.append(f"{' '.join(path)} {a.option_strings or a.dest}")

    walk(build_parser(), ["sprite-env"])
    assert missing == []
