"""``--store s3://BUCKET/PREFIX`` and ``--cache-size`` (issue 14): parsed once into a
``RemoteConfig``, handed to the engine, and a store that cannot be used refused at start
with one clear line (the real daemon and command line against the real Swift)."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest

from sprite_env.store.backend import BadCacheSize, RemoteConfig, parse_size
from sprite_env.store.remote_gc import GcPolicy
from sprite_env.store.s3 import BadStoreUrl, S3Storage, StoreUrl
from tests.helpers.cli import run_cli


def test_cache_sizes_parse_in_binary_units() -> None:
    assert parse_size("2G") == 2 << 30
    assert parse_size("512MiB") == 512 << 20
    assert parse_size("1.5k") == 1536
    assert parse_size("1000") == 1000
    for bad in ("lots", "", "-1G", "0", "2 GB extra"):
        with pytest.raises(BadCacheSize):
            parse_size(bad)


def test_a_remote_config_is_the_url_and_the_cache_bound() -> None:
    r = RemoteConfig.parse("s3://bucket/some/prefix/", "64M")
    assert r == RemoteConfig(StoreUrl("bucket", "some/prefix/"), 64 << 20)
    assert str(r) == "s3://bucket/some/prefix/"
    assert RemoteConfig.parse("s3://bucket").cache_bytes == 2 << 30  # the default bound
    with pytest.raises(BadStoreUrl):
        RemoteConfig.parse("s3:///prefix")


def test_the_remote_config_carries_what_remote_deletes_keep() -> None:
    env = {"SPRITE_ENV_REMOTE_KEEP": "3", "SPRITE_ENV_REMOTE_GRACE": "60"}
    assert RemoteConfig.parse("s3://b/p", env=env).gc == GcPolicy(keep=3, grace=60.0)
    assert RemoteConfig.parse("s3://b/p", env={}).gc == GcPolicy()


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (["--store", "ftp://host/x"], {}, "not an object storage URL"),
        (["--store", "s3://b/p", "--cache-size", "3 parsecs"], {}, "not a size"),
        (["--cache-size", "1G"], {}, "needs --store s3://"),
        (["--store", "s3://b/p"], {"SPRITE_ENV_REMOTE_KEEP": "0"}, "SPRITE_ENV_REMOTE_KEEP"),
        (["--store", "s3://b/p"], {"SPRITE_ENV_REMOTE_GRACE": "1h"}, "SPRITE_ENV_REMOTE_GRACE"),
    ],
)
def test_bad_options_are_refused_before_anything_starts(
    tmp_path: Any, args: list[str], env: dict[str, str], said: str
) -> None:
    """By the daemon and by an offline command: exit 2, one line, nothing created (a bad
    keep or grace too: not at the daemon's first remote delete, after it served)."""
    state = tmp_path / "state"
    r = run_cli("daemon", "--root", str(tmp_path), "--state", str(state), *args, env=env)
    assert r.returncode == 2, r.stderr
    assert said in r.stderr
    assert "Traceback" not in r.stderr
    assert not state.exists()
    r = run_cli("--root", str(tmp_path), *args, "checkpoints", "list", env=env)
    assert r.returncode == 2, r.stderr
    assert said in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / ".sprite").exists()


def _refused_at_start(daemon_factory: Any, url: str, env: dict[str, str]) -> str:
    d = daemon_factory("--store", url, wait=False, env=env)
    assert d.proc.wait(60) == 2, d.log()
    assert not os.path.exists(d.socket)
    assert not os.path.exists(os.path.join(d.state, "store"))  # nothing opened or made
    return str(d.log())


def test_wrong_credentials_stop_the_daemon_at_start(
    daemon_factory: Any, storage: S3Storage
) -> None:
    log = _refused_at_start(daemon_factory, repr(storage), {"AWS_SECRET_ACCESS_KEY": "wrong"})
    assert f"cannot use the store {storage!r}" in log
    assert "HTTP 403" in log
    assert "credentials" in log


def test_a_missing_bucket_stops_the_daemon_at_start(
    daemon_factory: Any, storage: S3Storage
) -> None:
    url = f"s3://{storage.url.bucket}-missing/store/"
    log = _refused_at_start(daemon_factory, url, {})
    assert f"cannot use the store {url}" in log
    assert "NoSuchBucket" in log


def test_an_endpoint_that_does_not_answer_stops_the_daemon_at_start(
    daemon_factory: Any, storage: S3Storage
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_MAX_ATTEMPTS": "1"}
    log = _refused_at_start(daemon_factory, repr(storage), env)
    assert f"cannot use the store {storage!r}" in log
    assert "Could not connect" in log


def test_a_daemon_on_a_bucket_serves_and_checkpoints(
    daemon_factory: Any, storage: S3Storage
) -> None:
    """The value reaches the engine: the store keeps its local copy in STATE/store, with
    the pack cache beside its packs, and commits checkpoints there."""
    d = daemon_factory("--store", repr(storage), "--cache-size", "64M", "--no-view")
    with open(os.path.join(d.root, "f"), "wb") as f:
        f.write(b"hello")
    assert d.create("first")["id"] == "v0"
    store = os.path.join(d.state, "store")
    assert os.path.isdir(os.path.join(store, "cache"))
    assert os.listdir(os.path.join(store, "packs"))  # captured here, as a local store does
    assert f"packs in {storage!r}" in d.log()
