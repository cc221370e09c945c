"""The restore preview and the diff through the real daemon and the real CLI (issue 10):
the restore's own verbs, counted in entries, deletions first, and the same counts as the
restore reports afterwards."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest

from tests.helpers.cli import REPO, run_cli
from tests.helpers.daemon import write_file

if TYPE_CHECKING:
    from tests.helpers.daemon import DaemonProcess

pytestmark = pytest.mark.integration


def _layer_with_changes(d: DaemonProcess) -> None:
    """v0, then: a new directory of 50 files, 3 files with other content, 25 chmods (they
    sort first by path, as the 2000 deletions of the issue hid behind chmods)."""
    for i in range(25):
        write_file(os.path.join(d.root, f"app/bin/tool{i:02d}"), b"#!/bin/sh\n")
        os.chmod(os.path.join(d.root, f"app/bin/tool{i:02d}"), 0o644)
    for i in range(3):
        write_file(os.path.join(d.root, f"etc/conf{i}.ini"), b"x=%d\n" % i)
    d.create("base")
    for i in range(25):
        os.chmod(os.path.join(d.root, f"app/bin/tool{i:02d}"), 0o755)
    for i in range(50):
        write_file(os.path.join(d.root, f"new/f{i:02d}.txt"), b"new\n")
    for i in range(3):
        write_file(os.path.join(d.root, f"etc/conf{i}.ini"), b"x=changed %d\n" % i)


def _cli(d: DaemonProcess, *args: str) -> Any:
    r = run_cli(*args, env=d.env())
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def test_preview_deletions_first_counted_as_the_restore_counts(daemon_factory: Any) -> None:
    d = daemon_factory("--no-view")
    _layer_with_changes(d)

    out = _cli(d, "checkpoints", "restore", "v0", "--preview").stdout.splitlines()
    assert out[0] == (
        "Restoring v0 would delete 51, change 3, create 0 and fix the metadata of 25 entries:"
    )
    assert out[1] == "  delete    new/ (51 entries)"
    assert out[2:5] == [f"  change    etc/conf{i}.ini" for i in range(3)]
    assert out[5:] == [f"  metadata  app/bin/tool{i:02d}" for i in range(25)]  # no "." line

    pv = json.loads(_cli(d, "checkpoints", "restore", "v0", "--preview", "--json").stdout)
    counts = {"delete": 51, "change": 3, "create": 0, "metadata": 25}
    assert pv["counts"] == {**counts, "remove": 51}
    new = next(ch for ch in pv["changes"] if ch["path"] == "new")
    assert (new["action"], new["entries"], new["change"]) == ("delete", 51, "added")

    # diff says what changed since v0 (added), the preview what the restore does (delete)
    diff = _cli(d, "checkpoints", "diff", "v0").stdout.splitlines()
    assert "+ new (51 entries)" in diff
    assert not any(line.startswith("delete") for line in diff)

    done = _cli(d, "checkpoints", "restore", "v0", "--yes").stdout
    m = re.search(r"Restored v0: (\d+) deleted, (\d+) changed, (\d+) created, (\d+) metadata", done)
    assert m is not None, done
    reported = dict(
        zip(("delete", "change", "create", "metadata"), map(int, m.groups()), strict=True)
    )
    assert reported == counts

    # the same state again: nothing to do, and the diff says so instead of printing nothing
    r = _cli(d, "checkpoints", "diff", "v0")
    assert r.stdout == "no changes between v0 and the live layer\n"
    d.create("again")
    assert _cli(d, "checkpoints", "diff", "v0", "v1").stdout == "no changes between v0 and v1\n"
    between = json.loads(_cli(d, "checkpoints", "diff", "v0", "v1", "--json").stdout)
    assert (between["changes"], between["counts"]) == ([], {})


def _under_a_terminal(env: dict[str, str], *args: str, answer: bytes) -> str:
    """Runs the CLI with a pseudo-terminal as its controlling terminal; answers the
    question when it comes; returns everything the terminal showed."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: exec at once
        os.chdir(REPO)
        os.execve(sys.executable, [sys.executable, "-m", "sprite_env", *args], env)
    seen = b""
    answered = False
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
            if not answered and b"[y/N]" in seen:
                os.write(fd, answer)
                answered = True
    finally:
        os.close(fd)
        os.waitpid(pid, 0)
    return seen.decode(errors="replace").replace("\r", "")


def test_the_sample_before_the_question_lists_deletions_first(daemon_factory: Any) -> None:
    d = daemon_factory("--no-view")
    _layer_with_changes(d)
    shown = _under_a_terminal({**os.environ, **d.env()}, "restore", "v0", answer=b"n\n")
    lines = [line for line in shown.splitlines() if line.startswith("  ")]
    assert lines == [
        "  delete        51  new/ and everything in it",
        "  change         3  in etc/: conf0.ini, conf1.ini, conf2.ini",
        "  metadata      25  in app/bin/: tool00, tool01, tool02, tool03, tool04, tool05, "
        "tool06, ... (18 more)",
    ], shown
    assert "Every path: sprite-env restore v0 --preview" in shown
    assert "... and" not in shown
    assert os.path.exists(os.path.join(d.root, "new"))  # declined: nothing done
