"""The request layer under faults (issue 14, point 6), through tests/remote/faultproxy.py in
front of the real Swift: each fault is ridden out by retries; past the bound a push fails
with a clear error and commits nothing; wrong credentials fail at the first request."""

from __future__ import annotations

import math
import os
import threading
import time
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest

from sprite_env.checkpoints import Engine
from sprite_env.store import check, open_store
from sprite_env.store.remote import generations, pull, push
from sprite_env.store.s3 import BadRemoteSetting, RemoteError, RetryPolicy, S3Storage, StoreUrl
from tests.helpers import trees
from tests.remote.faultproxy import FaultProxy

if TYPE_CHECKING:
    from collections.abc import Iterator

#: Short waits so the suite stays quick: the real defaults are RetryPolicy's.
FAST = RetryPolicy(
    attempts=12, seconds=30, base=0.05, cap=0.4, connect_timeout=1.0, read_timeout=1.0
)


@pytest.fixture
def proxy(s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """The proxy in front of the suite's server; this process's AWS_ENDPOINT_URL points at
    it."""
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"], stall_seconds=5) as p:
        monkeypatch.setenv("AWS_ENDPOINT_URL", p.url)
        yield p


def _storage(bucket: str, policy: RetryPolicy = FAST) -> S3Storage:
    return S3Storage(StoreUrl(bucket, "store/"), policy=policy)


@pytest.fixture
def bucket(proxy: FaultProxy) -> str:
    name = f"test-{uuid.uuid4().hex[:12]}"
    _storage(name).create_bucket()
    return name


def _write(root: str, rel: str, data: bytes) -> None:
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _two_checkpoints(tmp_path, storage: S3Storage) -> tuple[str, str]:
    """A store with v0 pushed and v1 (two new data packs' worth) committed locally only."""
    root, store_dir = str(tmp_path / "layer"), str(tmp_path / "store")
    trees.build_tree(root, trees.sample_spec())
    with Engine(root, store_dir) as e:
        e.create("v0")
        push(e.store, storage)
        _write(root, "big/one", os.urandom(300_000))
        _write(root, "big/two", os.urandom(300_000))
        e.create("v1")
    return root, store_dir


def _pulled_ids(storage: S3Storage, tmp_path, name: str, root: str) -> list[str]:
    """Pulls the newest complete generation into a new store, checks it byte by byte,
    and gives its checkpoints."""
    pulled = str(tmp_path / name)
    pull(storage, pulled)
    with open_store(pulled, writable=False) as s:
        assert check(s, read_data=True).ok
    with Engine(root, pulled, create=False) as e:
        return sorted(c.id for c in e.checkpoints(include_auto=True))


def _named_packs_present(storage: S3Storage, tmp_path) -> None:
    """No generation in the bucket names a pack the bucket lacks."""
    for gen in generations(storage):
        pulled = str(tmp_path / f"gen-{gen.number}-{gen.writer}")
        pull(storage, pulled, generation=gen)  # raises if any of its packs is missing


@pytest.mark.parametrize("action", ["500", "503", "reset", "reset-after", "stall", "down"])
def test_a_push_and_a_pull_ride_out_each_fault(
    proxy: FaultProxy, bucket: str, tmp_path, action: str
) -> None:
    """Two failures in a row at each step of a push (the listing, a pack, the generation)
    and at a pull's downloads are retried; both complete, and the pull is sound."""
    # A stall costs a read timeout each time it is met (four times): half a second of
    # silence is already far past Swift's answers here, so it ends the attempt as surely.
    storage = _storage(bucket, replace(FAST, read_timeout=0.5) if action == "stall" else FAST)
    root, store_dir = _two_checkpoints(tmp_path, storage)
    if action == "down":  # the server goes away for a second and comes back
        proxy.down()
        threading.Timer(1.0, proxy.up).start()
    # A stall costs a read timeout each time: once per step is enough.
    times = 1 if action == "stall" else 2
    if action != "down":
        proxy.script(action, method="GET", path="list-type=2", times=times)
        proxy.script(action, method="PUT", path="/packs/", times=times)
        proxy.script(action, method="PUT", path="/catalog/", times=times)
    t0 = time.monotonic()
    with open_store(store_dir) as s:
        report = push(s, storage)
    assert report.generation.number == 1
    assert report.packs_uploaded >= 1
    if action == "down":  # it could not have finished while the server was away
        assert time.monotonic() - t0 >= 1.0
    if action != "down":
        assert proxy.count(action) == 3 * times
        proxy.script(action, method="GET", path="/packs/", times=times)
    assert _pulled_ids(storage, tmp_path, "pulled", root) == ["v0", "v1"]
    if action != "down":
        assert proxy.count(action) == 4 * times


def test_a_download_cut_short_is_fetched_again(proxy: FaultProxy, bucket: str, tmp_path) -> None:
    """The headers arrive, then half the body, then a reset: boto3 would not retry this;
    the pull fetches the object again into a new file, and its bytes are whole."""
    storage = _storage(bucket)
    root, _ = _two_checkpoints(tmp_path, storage)
    proxy.script("cut", method="GET", path="/packs/", times=2)
    proxy.script("cut", method="GET", path="/catalog/", times=1)
    assert _pulled_ids(storage, tmp_path, "pulled", root) == ["v0"]
    assert proxy.count("cut") == 3


def test_a_ranged_read_cut_short_or_refused_is_tried_again(proxy: FaultProxy, bucket: str) -> None:
    """A ranged GET (a pack read by range) rides out a body cut short and a 503 like any
    download, and gives exactly the bytes asked for (fewer at the object's end)."""
    storage = _storage(bucket)
    data = os.urandom(300_000)
    storage.put_bytes("packs/x.pack", data)
    proxy.script("cut", method="GET", path="/packs/x.pack")
    proxy.script("503", method="GET", path="/packs/x.pack")
    assert storage.get_range("packs/x.pack", 1000, 50_000) == data[1000:51_000]
    assert (proxy.count("cut"), proxy.count("503")) == (1, 1)
    assert storage.get_range("packs/x.pack", 299_990, 100) == data[299_990:]


def test_past_the_bound_a_push_fails_clearly_and_commits_nothing(
    proxy: FaultProxy, bucket: str, tmp_path
) -> None:
    """A pack's upload answered 503 SlowDown every time: the push stops after the bound
    with an error naming the operation and the object; no generation names a missing
    pack; once the server recovers the next push sends only what is missing."""
    storage = _storage(bucket, RetryPolicy(attempts=3, seconds=30, base=0.05, cap=0.1))
    root, store_dir = _two_checkpoints(tmp_path, storage)
    before = set(storage.list("packs/"))
    proxy.script("pass", method="PUT", path="/packs/", times=1)  # one new pack gets there
    proxy.script("503", method="PUT", path="/packs/", times=math.inf)
    with open_store(store_dir) as s, pytest.raises(RemoteError) as err:
        push(s, storage)
    msg = str(err.value)
    assert f"s3://{bucket}/store/: upload of packs/" in msg
    assert "(after 3 attempts in" in msg
    assert "SlowDown (HTTP 503)" in msg
    assert proxy.count("503") == 3
    assert [g.number for g in generations(storage)] == [0]  # nothing committed
    sent = set(storage.list("packs/")) - before
    assert len(sent) == 1
    _named_packs_present(storage, tmp_path)
    assert _pulled_ids(storage, tmp_path, "pulled", root) == ["v0"]
    proxy.clear()
    with open_store(store_dir) as s:
        resumed = push(s, storage)
        total = len(s.catalog.packs())
    assert resumed.packs_present == len(before) + 1  # the one that got there is reused
    assert resumed.packs_uploaded == total - len(before) - 1
    assert _pulled_ids(storage, tmp_path, "pulled-again", root) == ["v0", "v1"]


def test_the_total_time_bounds_a_stalled_server(proxy: FaultProxy, bucket: str, tmp_path) -> None:
    """A server that takes requests and never answers: each attempt ends at the read
    timeout, and no attempt starts once the total time is up, whatever attempts remain."""
    policy = RetryPolicy(attempts=100, seconds=2.0, base=0.05, cap=0.2, read_timeout=0.5)
    storage = _storage(bucket, policy)
    _, store_dir = _two_checkpoints(tmp_path, storage)
    proxy.script("stall", method="PUT", path="/packs/", times=math.inf)
    t0 = time.monotonic()
    with (
        open_store(store_dir) as s,
        pytest.raises(RemoteError, match=r"; bound: 100 attempts, 2 s\)"),
    ):
        push(s, storage)
    took = time.monotonic() - t0
    assert took < 2.0 + 0.5 + 2.0  # the bound, one attempt's timeout, slack for a busy host
    assert 2 <= proxy.count("stall") < 100
    assert [g.number for g in generations(storage)] == [0]


def test_wrong_credentials_fail_at_the_first_request(
    proxy: FaultProxy, bucket: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused signature is not retried: one request, and an error that says what to
    check."""
    storage = _storage(bucket)
    _, store_dir = _two_checkpoints(tmp_path, storage)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    wrong = _storage(bucket)
    seen = len(proxy.seen)
    with open_store(store_dir) as s, pytest.raises(RemoteError) as err:
        push(s, wrong)
    assert "credentials were refused" in str(err.value)
    assert "AWS_SECRET_ACCESS_KEY" in str(err.value)
    assert len(proxy.seen) == seen + 1


def test_a_missing_object_is_not_retried(proxy: FaultProxy, bucket: str, tmp_path) -> None:
    from sprite_env.store.s3 import RemoteNotFound

    storage = _storage(bucket)
    seen = len(proxy.seen)
    with pytest.raises(RemoteNotFound, match="no object packs/nothing"):
        storage.get_file("packs/nothing", str(tmp_path / "x"))
    assert len(proxy.seen) == seen + 1
    assert not os.path.exists(tmp_path / "x")


def test_retry_settings_from_the_environment() -> None:
    p = RetryPolicy.from_env(
        {
            "AWS_MAX_ATTEMPTS": "3",
            "SPRITE_ENV_S3_RETRY_SECONDS": "7.5",
            "SPRITE_ENV_S3_READ_TIMEOUT": "2",
        }
    )
    assert (p.attempts, p.seconds, p.read_timeout) == (3, 7.5, 2.0)
    assert RetryPolicy.from_env({}) == RetryPolicy()
    for bad in ({"AWS_MAX_ATTEMPTS": "many"}, {"SPRITE_ENV_S3_RETRY_SECONDS": "-1"}):
        with pytest.raises(BadRemoteSetting, match="AWS_MAX_ATTEMPTS|SPRITE_ENV_S3_RETRY"):
            RetryPolicy.from_env(bad)
    # Full jitter: every wait lies in [0, min(cap, base * 2**n)), and they differ.
    d = RetryPolicy()
    for n in range(8):
        waits = [d.backoff(n) for _ in range(200)]
        assert all(0 <= w <= min(d.cap, d.base * 2**n) for w in waits)
        assert len(set(waits)) > 100


def test_a_failed_push_reports_at_once_and_its_lock_blocks_no_later_push(
    proxy: FaultProxy, bucket: str, tmp_path
) -> None:
    """The server fails the pack PUTs and the lock's DELETE: the push raises its error
    while the lock's release goes on in the background, and the lock left behind does not
    refuse this process's next push (no lease here holds it: a leftover)."""
    storage = _storage(bucket, RetryPolicy(attempts=2, seconds=30, base=0.05, cap=0.1))
    _, store_dir = _two_checkpoints(tmp_path, storage)
    proxy.script("503", method="PUT", path="/packs/", times=math.inf)
    proxy.script("503", method="DELETE", path="/locks/", times=math.inf)
    with open_store(store_dir) as s, pytest.raises(RemoteError, match="upload of packs/"):
        push(s, storage)
    deadline = time.monotonic() + 10
    while proxy.count("503", method="DELETE") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # the background release tries its 2 attempts
    assert proxy.count("503", method="DELETE") == 2
    assert len(storage.list("locks/")) == 1
    proxy.clear()
    with open_store(store_dir) as s:
        assert push(s, storage).generation.number == 1
    assert storage.list("locks/") == {}  # the leftover removed, our own released
