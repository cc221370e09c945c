"""The restore's question under a real pseudo-terminal (issue 10): it is asked on the
terminal (stderr), never on stdout; "no" changes nothing and exits 2 (not 1, "a bug")."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.helpers.cli import REPO
from tests.helpers.daemon import write_file

pytestmark = pytest.mark.integration


def _run_on_pty(argv: list[str], env: dict[str, str], answer: bytes, out: Any) -> tuple[int, str]:
    """Runs ``argv`` with stdin and stderr on a new pty and stdout to ``out``; answers the
    question when it shows. Returns the exit code and what the terminal showed."""
    main, sub = pty.openpty()
    p = subprocess.Popen(argv, stdin=sub, stdout=out, stderr=sub, env=env, cwd=REPO)
    os.close(sub)
    seen = b""
    answered = False
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        if not answered and b"[y/N]" in seen:
            os.write(main, answer)
            answered = True
        if p.poll() is not None and not ready:
            break
    code = p.wait(timeout=60)
    os.close(main)
    return code, seen.decode(errors="replace")


def test_restore_asks_on_the_terminal_and_no_means_nothing(
    daemon_factory: Any, tmp_path: Any
) -> None:
    d = daemon_factory("--no-view")
    write_file(f"{d.root}/a", b"one")
    d.create("v0")
    write_file(f"{d.root}/a", b"two")
    env = {**os.environ, **d.env(), "PYTHONPATH": REPO}
    argv = [sys.executable, "-m", "sprite_env", "restore", "v0"]
    with open(tmp_path / "out.txt", "wb") as out:
        code, shown = _run_on_pty(argv, env, b"n\n", out)
    assert code == 2, shown
    assert "Restore v0? [y/N]" in shown
    assert "Aborted." in shown
    assert b"[y/N]" not in (tmp_path / "out.txt").read_bytes()  # > out.txt still asks
    with open(f"{d.root}/a", "rb") as f:
        assert f.read() == b"two"
    with open(tmp_path / "out2.txt", "wb") as out:
        code, shown = _run_on_pty(argv, env, b"y\n", out)
    assert code == 0, shown
    assert b"undo with: sprite-env restore auto-" in (tmp_path / "out2.txt").read_bytes()
    with open(f"{d.root}/a", "rb") as f:
        assert f.read() == b"one"
