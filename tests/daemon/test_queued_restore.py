"""A queued restore whose target is deleted while it waits fails not_found before it stops
anything (issue 10: the services were stopped and restarted first)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.daemon import write_file

pytestmark = pytest.mark.integration

SERVICE = 'command = "exec sleep 1000"\nrestart = "always"\n'


def _service(d: Any) -> dict[str, Any]:
    status, got = d.json("GET", "/v1/services")
    return next(s for s in got["services"] if s["name"] == "tick")  # type: ignore[no-any-return]


def _until(ok: Any) -> None:
    deadline = time.monotonic() + 60
    while not ok():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_restore_whose_target_went_while_it_waited_bounces_nothing(daemon_factory: Any) -> None:
    d = daemon_factory("--no-view")
    write_file(os.path.join(d.root, "etc", "sprite", "services", "tick.toml"), SERVICE.encode())
    assert run_cli("services", "start", "tick", env=d.env()).returncode == 0
    deadline = time.monotonic() + 20
    while _service(d)["state"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pid = _service(d)["pid"]
    write_file(os.path.join(d.root, "a"), b"a")
    d.create("v0")
    write_file(os.path.join(d.root, "a"), b"b")
    d.create("v1")
    # A slow job in front (a 300 MB file to store), then, queued behind it, the delete of
    # v1 and a restore to v1: the restore is accepted while v1 still exists.
    write_file(os.path.join(d.root, "big.bin"), os.urandom(300 << 20))
    results: dict[str, Any] = {}
    slow = threading.Thread(target=lambda: results.update(create=d.create("slow")))
    slow.start()
    _until(lambda: (d.json("GET", "/v1/status")[1]["job"] or {}).get("kind") == "create")
    gone = threading.Thread(
        target=lambda: results.update(delete=d.json("DELETE", "/v1/checkpoints/v1"))
    )
    gone.start()
    _until(lambda: d.json("GET", "/v1/status")[1]["queued"] >= 1)  # the delete waits
    status, evs = d.stream("POST", "/v1/checkpoints/v1/restore")
    slow.join(120)
    gone.join(120)
    assert results["delete"][0] == 200, results
    assert status == 202
    assert (evs[-1]["type"], evs[-1]["code"]) == ("error", "not_found"), evs
    assert not any(e.get("data") == "Stopping services..." for e in evs)
    assert _service(d)["pid"] == pid  # never stopped
