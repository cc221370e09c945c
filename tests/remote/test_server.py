"""The test server script (``.ci/s3-server``), and the remote store when its server stops
and comes back."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

import pytest

from sprite_env.checkpoints import Engine
from sprite_env.store.remote import generations, pull, push
from sprite_env.store.s3 import RemoteError, S3Storage, StoreUrl
from tests.helpers import trees
from tests.remote.conftest import SCRIPT, Server


def test_a_second_start_only_prints_the_same_assignments(s3_server: Server) -> None:
    again = s3_server.start()
    assert again.splitlines()[:3] == [
        f"AWS_ENDPOINT_URL=http://127.0.0.1:{s3_server.port}",
        "AWS_ACCESS_KEY_ID=test:tester",
        "AWS_SECRET_ACCESS_KEY=testing",
    ]
    out = subprocess.run(["sh", "-c", f"{again}\necho $AWS_ENDPOINT_URL"], capture_output=True)
    assert out.stdout.decode().strip() == f"http://127.0.0.1:{s3_server.port}"  # shell syntax


def test_a_port_another_server_holds_is_refused(s3_server: Server, tmp_path) -> None:
    env = dict(os.environ, S3_SERVER_PORT=str(s3_server.port))
    r = subprocess.run(
        ["sh", SCRIPT, "start", str(tmp_path / "other")], env=env, capture_output=True, text=True
    )
    assert r.returncode == 1
    assert f"127.0.0.1:{s3_server.port} is taken" in r.stderr


def test_bad_usage(tmp_path) -> None:
    r = subprocess.run(["sh", SCRIPT, "restart", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2
    assert "usage:" in r.stderr


def test_a_stopped_server_fails_a_push_that_resumes_when_it_is_back(
    s3_server: Server, s3_env: dict[str, str], tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server stops between two checkpoints: the push fails with a clear error within
    its retry bound, nothing is committed, and after a restart (its data kept) the next
    push completes and a fresh machine gets both checkpoints.

    The server stopped and started is this worker's session server (a restart reuses its
    rings and data: one start, not the two of a private server; the tests of one xdist
    worker run one after another, so none uses it meanwhile). It is started again
    whatever happens."""
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    storage = S3Storage(StoreUrl(f"test-{uuid.uuid4().hex[:12]}", "s/"))
    storage.create_bucket()
    root, store_dir = str(tmp_path / "layer"), str(tmp_path / "store")
    trees.build_tree(root, trees.sample_spec())
    with Engine(root, store_dir) as e:
        e.create("v0")
        push(e.store, storage)
        with open(os.path.join(root, "new"), "wb") as f:
            f.write(os.urandom(100_000))
        e.create("v1")
        s3_server.stop()
        try:
            t0 = time.monotonic()
            with pytest.raises(RemoteError, match=r"failed: .*(Connect|connect)"):
                push(e.store, storage)
            assert time.monotonic() - t0 < 15  # 2 attempts, backoff with jitter
        finally:
            s3_server.start()
        assert [g.number for g in generations(storage)] == [0]
        assert push(e.store, storage).generation.number == 1
    pulled = str(tmp_path / "pulled")
    pull(storage, pulled)
    with Engine(str(tmp_path / "b"), pulled, create=False) as e:
        assert sorted(c.id for c in e.checkpoints()) == ["v0", "v1"]
