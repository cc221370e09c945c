"""Sprites' self-checkpointing pattern in a sprite (issue 10, point 3): a script inside
MERGED runs ``sprite-env checkpoints restore v0`` with no terminal and no ``--yes``; the
restore ends that very session, and the command still says the undo id first."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from typing import Any

import pytest

from sprite_env.services import processes_using
from tests.helpers.cli import REPO
from tests.helpers.daemon import write_file

pytestmark = pytest.mark.integration


def _wait_job_done(d: Any, job: int) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status, j = d.json("GET", f"/v1/jobs/{job}")
        if j["state"] in ("done", "failed"):
            return j  # type: ignore[no-any-return]
        time.sleep(0.1)
    raise AssertionError(f"job {job} did not end")


def test_a_script_in_merged_restores_and_learns_its_undo_id(overlay_daemon: Any) -> None:
    d, o = overlay_daemon, overlay_daemon.overlay
    write_file(os.path.join(o.merged, "app", "main.py"), b"print(1)\n")
    d.create("v0")
    write_file(os.path.join(o.merged, "app", "main.py"), b"print(2)\n")
    work = os.path.join(o.merged, "app")
    p = subprocess.run(  # its cwd is in MERGED: the restore ends it
        [sys.executable, "-m", "sprite_env", "checkpoints", "restore", "v0"],
        cwd=work,
        env={**os.environ, **d.env(), "PYTHONPATH": REPO},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p
    m = re.search(r"accepted as job (\d+)", p.stdout)
    assert m is not None, p.stdout
    undo = re.search(r"Undo with: sprite-env restore (auto-\S+) --yes", p.stdout)
    assert undo is not None, p.stdout
    assert f"sprite-env curl /v1/jobs/{m[1]}/events" in p.stdout
    job = _wait_job_done(d, int(m[1]))
    assert job["state"] == "done", job
    assert job["result"]["undo"] == undo[1]  # the id it printed is the undo checkpoint
    with open(os.path.join(o.merged, "app", "main.py"), "rb") as f:
        assert f.read() == b"print(1)\n"


def test_a_restore_to_where_the_layer_is_ends_no_session(overlay_daemon: Any) -> None:
    d, o = overlay_daemon, overlay_daemon.overlay
    write_file(os.path.join(o.merged, "app", "main.py"), b"print(1)\n")
    d.create("v0")
    session = subprocess.Popen(["sleep", "1000"], cwd=os.path.join(o.merged, "app"))
    try:
        deadline = time.monotonic() + 20
        while session.pid not in {q.pid for q in processes_using(o.merged)}:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        status, evs = d.stream("POST", "/v1/checkpoints/v0/restore")
        assert evs[-1]["type"] == "complete", evs
        assert evs[-1]["noop"] is True
        assert session.poll() is None  # still running: nothing was taken down
        status, cps = d.json("GET", "/v1/checkpoints?include_auto=true")
        assert [c["id"] for c in cps] == ["v0"]  # no undo checkpoint, no retention churn
    finally:
        session.kill()
        session.wait()
