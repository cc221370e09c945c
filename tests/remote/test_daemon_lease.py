"""The daemon holds the prefix's lease for its whole run (issue 14, point 5), through real
daemon subprocesses and the real Swift: a second daemon on the same prefix is refused at
start while the first keeps uploading; after the first stops cleanly the second starts."""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any

from sprite_env.store.lease import holders
from sprite_env.store.remote import generations, pull
from tests.helpers.cli import run_cli

if TYPE_CHECKING:
    from sprite_env.store.s3 import S3Storage


def _url(storage: S3Storage) -> str:
    return f"s3://{storage.url.bucket}/{storage.url.prefix}"


def _write(root: str, rel: str, data: bytes) -> None:
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _create_remote(d: Any, comment: str) -> dict[str, Any]:
    status, evs = d.stream("POST", "/v1/checkpoint", {"comment": comment, "wait_remote": True})
    assert status == 200, (evs, d.log())
    assert evs[-1]["type"] == "complete", (evs, d.log())
    assert evs[-1]["checkpoint"]["storage"] == "remote", evs
    return dict(evs[-1])


def test_a_second_daemon_is_refused_at_start_and_starts_after_the_first_stops(
    daemon_factory: Any, storage: S3Storage, tmp_path: Any
) -> None:
    base = os.fspath(tmp_path)
    first = daemon_factory("--store", _url(storage), "--no-view")
    held = holders(storage)
    assert len(held) == 1, held  # taken at start, before any push
    assert held[0].pid == first.proc.pid

    kw = {"root": os.path.join(base, "root2"), "state": os.path.join(base, "state2")}
    second = daemon_factory("--store", _url(storage), "--no-view", wait=False, **kw)
    assert second.proc.wait(60) == 4, second.log()  # LeaseHeld: as StoreLocked
    log = second.log()
    assert "is held by" in log, log
    assert str(first.proc.pid) in log, log  # the holder named
    assert not os.path.exists(second.socket)  # it never served
    assert [h.key for h in holders(storage)] == [held[0].key]  # nothing of its own left

    # The first keeps uploading under the lease it took at start, no new lock per push.
    _write(first.root, "a/file", os.urandom(100_000))
    _create_remote(first, "first's")
    assert [h.key for h in holders(storage)] == [held[0].key]

    assert first.stop() == 0, first.log()
    assert holders(storage) == []  # released at a clean stop

    again = daemon_factory("--store", _url(storage), "--no-view", **kw)
    _write(again.root, "b/file", b"second's")
    _create_remote(again, "second's")
    assert [h.pid for h in holders(storage)] == [again.proc.pid]


def test_a_sigkilled_holders_lease_goes_stale_and_a_new_daemon_takes_it(
    daemon_factory: Any, storage: S3Storage, tmp_path: Any
) -> None:
    # 10 s stale, renewed every second: the dead holder's lock ages out within the test,
    # and a refused daemon's start (a few seconds on 2 loaded cores) still finds it live.
    env = {"SPRITE_ENV_LEASE_STALE": "10", "SPRITE_ENV_LEASE_REFRESH": "1"}
    base = os.fspath(tmp_path)
    first = daemon_factory("--store", _url(storage), "--no-view", env=env)
    _write(first.root, "a/file", os.urandom(50_000))
    _create_remote(first, "first's")
    first.kill()  # SIGKILL: no release, its lock stays in the bucket
    killed = time.monotonic()
    assert [h.pid for h in holders(storage)] == [first.proc.pid]

    kw = {"root": os.path.join(base, "root2"), "state": os.path.join(base, "state2")}
    refused = daemon_factory("--store", _url(storage), "--no-view", wait=False, env=env, **kw)
    assert refused.proc.wait(60) == 4, refused.log()  # still live: refused
    time.sleep(max(0.0, killed + 11.0 - time.monotonic()))  # stale: 10 s + the clock's 1 s
    again = daemon_factory("--store", _url(storage), "--no-view", env=env, **kw)
    assert [h.pid for h in holders(storage)] == [again.proc.pid]  # the stale one removed
    _write(again.root, "b/file", b"second's")
    _create_remote(again, "second's")


def test_a_deletes_push_frees_the_superseded_generations_and_keeps_the_newest(
    daemon_factory: Any, storage: S3Storage, tmp_path: Any
) -> None:
    # Grace 0 and one generation kept: the run after the delete's push frees at once.
    env = {"SPRITE_ENV_REMOTE_GRACE": "0", "SPRITE_ENV_REMOTE_KEEP": "1"}
    d = daemon_factory("--store", _url(storage), "--no-view", env=env)
    _write(d.root, "a/file", os.urandom(50_000))
    _create_remote(d, "kept")
    _write(d.root, "b/file", os.urandom(50_000))
    _create_remote(d, "deleted")
    _write(d.root, "c/file", b"newest")
    _create_remote(d, "newest")  # the head: v1 is not it, so it may be deleted
    assert len(generations(storage)) == 3  # no delete pushed yet: nothing collected
    status, _ = d.json("DELETE", "/v1/checkpoints/v1")
    assert status == 200
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(generations(storage)) != 4:
        time.sleep(0.1)

    # The run right after the delete's push may find the newest generation 0 s old by the
    # server's whole-second clock (superseded just now) and spare it for the grace: the
    # uploader wakes when that passes and frees it, with no further push.
    def settled() -> dict[str, Any] | None:
        gc: dict[str, Any] | None = d.json("GET", "/v1/status")[1]["remote"]["gc"]
        if gc is None or gc["next_run_s"] is not None:
            return None  # no run yet, or one is due when the grace passes
        return gc

    while time.monotonic() < deadline and (
        settled() is None or min(g.number for g in generations(storage)) < 3
    ):
        time.sleep(0.1)
    gc = settled()
    assert gc is not None, d.log()
    assert gc["generations_deleted"] >= 1, gc
    # The three before the delete's left the bucket (grace 0, keep 1); the newest stays.
    assert [g.number for g in generations(storage)] == [3], d.log()
    pulled = os.path.join(os.fspath(tmp_path), "pulled")
    pull(storage, pulled)  # everything the newest names is still there
    r = run_cli("--root", d.root, "--store", pulled, "checkpoints", "list", "--json")
    assert sorted(c["id"] for c in json.loads(r.stdout)) == ["v0", "v2"], r.stderr
    r = run_cli("--root", d.root, "--store", pulled, "store", "check", "--read-data")
    assert r.returncode == 0, r.stdout + r.stderr
