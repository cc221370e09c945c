"""Fixtures of the remote store's tests: a real OpenStack Swift (s3api) on 127.0.0.1.

``s3_server`` starts ``.ci/s3-server`` once per session (it installs Swift from Debian's
packages if missing) and stops it at the end; ``storage`` gives each test a bucket of its
own, with the server's address and keys in the standard AWS variables.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import tempfile
import uuid
from typing import TYPE_CHECKING

import pytest

from sprite_env.store.s3 import S3Storage, StoreUrl

if TYPE_CHECKING:
    from collections.abc import Iterator

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", ".ci", "s3-server")


def _free_ports(n: int) -> int:
    """A base port whose next ``n`` ports are free on 127.0.0.1 (another run, or another
    test session on this machine, may hold the default ones)."""
    for _ in range(100):
        base = random.randrange(20000, 60000)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free ports for the S3 server")


class Server:
    """One ``.ci/s3-server`` instance: its directory, base port and ``AWS_*`` variables."""

    def __init__(self, directory: str) -> None:
        if os.geteuid() != 0:
            pytest.skip("the S3 server (Swift) needs root: packages, ports, its data")
        self.dir = directory
        self.port = _free_ports(5)
        self.aws: dict[str, str] = {}

    def _run(self, cmd: str) -> str:
        env = dict(os.environ, S3_SERVER_PORT=str(self.port))
        r = subprocess.run(
            ["sh", SCRIPT, cmd, self.dir], env=env, capture_output=True, text=True, check=False
        )
        if r.returncode != 0:
            pytest.fail(f".ci/s3-server {cmd} failed ({r.returncode}):\n{r.stderr}")
        return r.stdout

    def start(self) -> str:
        out = self._run("start")
        self.aws = dict(ln.split("=", 1) for ln in out.splitlines() if ln.startswith("AWS_"))
        return out

    def stop(self) -> None:
        self._run("stop")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[Server]:
    """The suite's server, started once (installing Swift if needed) and stopped at the end."""
    with tempfile.TemporaryDirectory(prefix="s3-server-") as d:
        server = Server(d)
        try:
            server.start()
            yield server
        finally:
            server.stop()


@pytest.fixture
def s3_env(s3_server: Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The server's variables, set in this process for the test."""
    return use_server(s3_server, monkeypatch)


def use_server(server: Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Points the standard AWS variables of this process at ``server`` (for the test)."""
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    for k, v in server.aws.items():
        monkeypatch.setenv(k, v)
    # The lease's wait before it lists again (1 s by default) would be paid by every
    # push of the suite; tests/remote/test_lease.py sets its own.
    monkeypatch.setenv("SPRITE_ENV_LEASE_SETTLE", "0.1")
    return server.aws


@pytest.fixture
def storage(s3_env: dict[str, str]) -> S3Storage:
    """A new, empty bucket; the store under the prefix ``store/``."""
    s = S3Storage(StoreUrl(f"test-{uuid.uuid4().hex[:12]}", "store/"))
    s.create_bucket()
    return s
