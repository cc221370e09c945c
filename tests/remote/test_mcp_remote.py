"""``checkpoint_create(wait_remote=true)`` through the MCP SDK's own client, against a real
daemon on the real Swift (behind tests/remote/faultproxy.py): it returns once the
checkpoint is in the bucket (``storage: remote``, and a pull elsewhere has it), and with
the server down it is a tool error ``upload_failed`` that keeps the checkpoint locally and
uploads it once the server is back."""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any

import pytest

from sprite_env.client import Client
from sprite_env.store import check, open_store
from sprite_env.store.remote import pull
from tests.helpers.cli import run_cli
from tests.mcp.test_server import call, error, run, session
from tests.remote.faultproxy import FaultProxy

if TYPE_CHECKING:
    from sprite_env.store.s3 import S3Storage

pytestmark = pytest.mark.integration


def _storages(sock: str) -> dict[str, str]:
    return {c["id"]: c["storage"] for c in Client(sock).list(include_auto=True)}


def test_create_waits_until_remote_or_fails_with_upload_failed(
    daemon_factory: Any, storage: S3Storage, s3_env: dict[str, str], tmp_path: Any
) -> None:
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        # Each request once: the server down is a failed push at once, not a minute of
        # the client's retries (the waiter's bound is two failed pushes).
        env = {"AWS_ENDPOINT_URL": proxy.url, "AWS_MAX_ATTEMPTS": "1"}
        url = f"s3://{storage.url.bucket}/{storage.url.prefix}"
        d = daemon_factory("--store", url, "--no-view", env=env)
        with open(os.path.join(d.root, "f"), "wb") as f:
            f.write(os.urandom(200_000))

        async def main() -> None:
            async with session(d.socket, "--no-session-checkpoint") as s:
                made = await call(s, "checkpoint_create", comment="durable", wait_remote=True)
                assert made["id"] == "v0"
                assert made["storage"] == "remote", made
                assert made["checkpoint"]["storage"] == "remote", made

                proxy.down()  # connections refused, as by a stopped server
                failed = await error(s, "checkpoint_create", comment="later", wait_remote=True)
                assert failed["code"] == "upload_failed", failed
                assert "v1 is not remote" in failed["message"], failed
                assert "kept locally" in failed["message"], failed
                listed = (await call(s, "checkpoint_list"))["checkpoints"]
                assert {c["id"]: c["storage"] for c in listed} == {"v1": "local", "v0": "remote"}

        run(main)
        # v0 was in the bucket when the tool returned: the server holds it whole.
        pulled = os.path.join(os.fspath(tmp_path), "pulled")
        pull(storage, pulled)
        with open_store(pulled, writable=False) as st:
            assert check(st, read_data=True).ok
        r = run_cli("--root", d.root, "--store", pulled, "checkpoints", "list", "--json")
        assert [c["id"] for c in json.loads(r.stdout)] == ["v0"], r.stderr
        proxy.up()  # the upload goes on in the background with its backoff
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _storages(d.socket) != {
            "v0": "remote",
            "v1": "remote",
        }:
            time.sleep(0.2)
        assert _storages(d.socket) == {"v0": "remote", "v1": "remote"}, d.log()
