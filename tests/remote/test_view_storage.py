"""The view's ``.checkpoints.json`` says where each checkpoint is (issue 14, point 3),
through the real daemon, its real mount and the real Swift: ``local`` while the server is
unreachable, ``remote`` once the push that the server's return lets through is durable,
as ``list`` says."""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any

from tests.helpers.daemon import write_file
from tests.remote.faultproxy import FaultProxy

if TYPE_CHECKING:
    from sprite_env.store.s3 import S3Storage


def _in_view(d: Any) -> dict[str, str]:
    with open(os.path.join(d.state, "checkpoints", ".checkpoints.json"), "rb") as f:
        return {r["id"]: r["storage"] for r in json.loads(f.read())}


def _listed(d: Any) -> dict[str, str]:
    status, rows = d.json("GET", "/v1/checkpoints")
    assert status == 200, rows
    return {r["id"]: r["storage"] for r in rows}


def test_the_view_says_local_until_the_push_then_remote(
    daemon_factory: Any, storage: S3Storage, s3_env: dict[str, str]
) -> None:
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        # each request once: a push fails at once while the proxy is down
        env = {"AWS_ENDPOINT_URL": proxy.url, "AWS_MAX_ATTEMPTS": "1"}
        d = daemon_factory("--store", repr(storage), env=env)  # with its view
        proxy.down()
        write_file(os.path.join(d.root, "a/file"), os.urandom(100_000))
        assert d.create("first")["checkpoint"]["storage"] == "local"
        assert _in_view(d) == {"v0": "local"} == _listed(d)
        with open(os.path.join(d.state, "checkpoints", ".checkpoints.json"), "rb") as f:
            row = json.loads(f.read())[0]
        assert row["comment"] == "first"
        assert row["auto"] is False
        assert row["created"] == d.json("GET", "/v1/checkpoints/v0")[1]["create_time"]
        proxy.up()
        status, evs = d.stream("POST", "/v1/checkpoint", {"comment": "2", "wait_remote": True})
        assert evs[-1]["type"] == "complete", (evs, d.log())
        assert _listed(d) == {"v1": "remote", "v0": "remote"}
        # the push refreshed the view: the file says so (the kernel's copy dropped)
        deadline = time.monotonic() + 5
        while _in_view(d) != {"v1": "remote", "v0": "remote"}:
            assert time.monotonic() < deadline, (_in_view(d), d.log())
            time.sleep(0.05)
