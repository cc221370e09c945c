"""Size like ZFS's ``used`` (issue 10, point 6): each checkpoint's ``unique_bytes`` is
what deleting it would free, ``delete --dry-run`` says the figure the delete then frees,
and the store's size and free space are in ``/v1/status`` and ``store stats`` while the
daemon runs."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.daemon import write_file

pytestmark = pytest.mark.integration
KiB = 1024


def test_unique_bytes_dry_run_and_the_delete_agree(daemon_factory: Any) -> None:
    d = daemon_factory("--no-view")
    write_file(os.path.join(d.root, "shared.bin"), os.urandom(64 * KiB))  # in all three
    write_file(os.path.join(d.root, "data.bin"), os.urandom(200 * KiB))
    d.create("v0")
    write_file(os.path.join(d.root, "data.bin"), os.urandom(300 * KiB))  # v0's goes away
    d.create("v1")
    write_file(os.path.join(d.root, "notes"), b"tiny")
    d.create("v2")  # shares v1's data.bin

    status, cps = d.json("GET", "/v1/checkpoints")
    unique = {c["id"]: c["unique_bytes"] for c in cps}
    # Random data does not compress: v0 alone holds its 200 KiB, v1's 300 KiB is v2's too.
    assert 200 * KiB <= unique["v0"] < 210 * KiB
    assert unique["v1"] < 8 * KiB  # its trees and record only
    assert unique["v2"] < 8 * KiB
    status, info = d.json("GET", "/v1/checkpoints/v0")
    assert info["unique_bytes"] == unique["v0"]
    r = run_cli("--socket", d.socket, "checkpoints", "info", "v0")
    assert "Unique:" in r.stdout

    before = d.json("GET", "/v1/checkpoints?include_auto=true")[1]
    r = run_cli("--socket", d.socket, "checkpoints", "delete", "v0", "--dry-run", "--json")
    assert r.returncode == 0, r
    plan = json.loads(r.stdout)
    assert plan["dry_run"] is True
    assert d.json("GET", "/v1/checkpoints?include_auto=true")[1] == before  # nothing gone
    r = run_cli("--socket", d.socket, "checkpoints", "delete", "v0", "--dry-run")
    assert r.stdout.startswith("Deleting v0 would free ")
    assert "nothing deleted" in r.stdout

    status, done = d.json("DELETE", "/v1/checkpoints/v0")
    assert done["bytes_freed"] == plan["bytes_freed"]  # the figure the delete then frees
    assert done["bytes_freed"] >= unique["v0"]


def test_store_usage_in_status_and_store_stats_while_the_daemon_runs(daemon_factory: Any) -> None:
    d = daemon_factory("--no-view")
    write_file(os.path.join(d.root, "a"), os.urandom(100 * KiB))
    d.create("v0")
    status, st = d.json("GET", "/v1/status")
    usage = st["store_usage"]
    assert usage["stored_bytes"] >= 100 * KiB
    assert 0 < usage["fs_free_bytes"] <= usage["fs_total_bytes"]
    store = os.path.join(d.state, "store")
    r = run_cli("--store", store, "store", "stats", "--json")  # the daemon holds the store
    assert r.returncode == 0, r
    got = json.loads(r.stdout)
    assert got["stored_bytes"] == usage["stored_bytes"]
    r = run_cli("--store", store, "store", "stats")
    assert "file system:" in r.stdout
