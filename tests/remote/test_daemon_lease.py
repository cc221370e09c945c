"""The daemon holds the prefix's lease for its whole run (issue 14, point 5), through real
daemon subprocesses and the real Swift: a second daemon on the same prefix is refused at
start while the first keeps uploading; after the first stops cleanly the second starts. A
daemon that loses its lease (its lock replaced by another writer's, or not renewed while
the server was down) stops uploading, says why in ``/v1/status``, loses nothing, and takes
the lease back once it is free."""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any

from sprite_env.store.lease import LOCKS, Lease, LeasePolicy, holders
from sprite_env.store.remote import generations, pull
from tests.helpers.cli import run_cli
from tests.helpers.daemon import write_file
from tests.remote.faultproxy import FaultProxy

if TYPE_CHECKING:
    from collections.abc import Callable

    from sprite_env.store.s3 import S3Storage


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
    first = daemon_factory("--store", repr(storage), "--no-view")
    held = holders(storage)
    assert len(held) == 1, held  # taken at start, before any push
    assert held[0].pid == first.proc.pid

    kw = {"root": os.path.join(base, "root2"), "state": os.path.join(base, "state2")}
    second = daemon_factory("--store", repr(storage), "--no-view", wait=False, **kw)
    assert second.proc.wait(60) == 4, second.log()  # LeaseHeld: as StoreLocked
    log = second.log()
    assert "is held by" in log, log
    assert str(first.proc.pid) in log, log  # the holder named
    assert not os.path.exists(second.socket)  # it never served
    assert [h.key for h in holders(storage)] == [held[0].key]  # nothing of its own left

    # The first keeps uploading under the lease it took at start, no new lock per push.
    write_file(os.path.join(first.root, "a/file"), os.urandom(100_000))
    _create_remote(first, "first's")
    assert [h.key for h in holders(storage)] == [held[0].key]

    assert first.stop() == 0, first.log()
    assert holders(storage) == []  # released at a clean stop

    again = daemon_factory("--store", repr(storage), "--no-view", **kw)
    write_file(os.path.join(again.root, "b/file"), b"second's")
    _create_remote(again, "second's")
    assert [h.pid for h in holders(storage)] == [again.proc.pid]


def test_a_sigkilled_holders_lease_goes_stale_and_a_new_daemon_takes_it(
    daemon_factory: Any, storage: S3Storage, tmp_path: Any
) -> None:
    # 10 s stale, renewed every second: the dead holder's lock ages out within the test,
    # and a refused daemon's start (a few seconds on 2 loaded cores) still finds it live.
    env = {"SPRITE_ENV_LEASE_STALE": "10", "SPRITE_ENV_LEASE_REFRESH": "1"}
    base = os.fspath(tmp_path)
    first = daemon_factory("--store", repr(storage), "--no-view", env=env)
    write_file(os.path.join(first.root, "a/file"), os.urandom(50_000))
    _create_remote(first, "first's")
    first.kill()  # SIGKILL: no release, its lock stays in the bucket
    killed = time.monotonic()
    # Its lock, or its two when the kill fell within a renewal (the new lock is written
    # before the old one is deleted): the dead daemon's and no one else's.
    assert {h.pid for h in holders(storage)} == {first.proc.pid}

    kw = {"root": os.path.join(base, "root2"), "state": os.path.join(base, "state2")}
    refused = daemon_factory("--store", repr(storage), "--no-view", wait=False, env=env, **kw)
    assert refused.proc.wait(60) == 4, refused.log()  # still live: refused
    # Stale once 10 s old by the server's clock, which the next daemon's start reads too:
    # polled for, not slept for to a bound with a second's margin.
    stale = LeasePolicy(stale_after=10, refresh_every=1)
    while holders(storage, stale):
        assert time.monotonic() < killed + 30, holders(storage, stale)
        time.sleep(0.1)
    again = daemon_factory("--store", repr(storage), "--no-view", env=env, **kw)
    assert [h.pid for h in holders(storage)] == [again.proc.pid]  # the stale one removed
    write_file(os.path.join(again.root, "b/file"), b"second's")
    _create_remote(again, "second's")


def _gc_runs_until(
    d: Any, storage: S3Storage, numbers: list[int], timeout: float = 30, after: Any = None
) -> Any:
    """Waits until the bucket holds just the generations ``numbers`` and the uploader has
    no run of remote deletes pending, and its last run (``remote.gc``, returned) is not
    ``after`` (the status hears of a run just after its deletes are listed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gc = d.json("GET", "/v1/status")[1]["remote"]["gc"]
        held = [g.number for g in generations(storage)]
        if gc is not None and gc["next_run_s"] is None and held == numbers and gc != after:
            return gc
        time.sleep(0.1)
    raise AssertionError(f"{generations(storage)}, gc {gc}\n{d.log()}")


def test_pushes_retire_the_generations_past_keep_and_a_delete_frees_its_packs(
    daemon_factory: Any, storage: S3Storage, tmp_path: Any
) -> None:
    # Grace 0, one generation kept: each push's listing finds the one before retirable.
    env = {"SPRITE_ENV_REMOTE_GRACE": "0", "SPRITE_ENV_REMOTE_KEEP": "1"}
    d = daemon_factory("--store", repr(storage), "--no-view", env=env)
    write_file(os.path.join(d.root, "a/file"), os.urandom(50_000))
    _create_remote(d, "kept")
    write_file(os.path.join(d.root, "b/file"), os.urandom(300_000))
    _create_remote(d, "deleted")
    write_file(os.path.join(d.root, "c/file"), b"newest")
    _create_remote(d, "newest")
    # No delete yet, and still not one catalog per push: the bucket keeps the newest. The
    # run right after a push may read the superseded one as 0 s old (whole-second clock)
    # and wait a second for it: the uploader wakes then, with no further push.
    _gc_runs_until(d, storage, [2])
    before = d.json("GET", "/v1/status")[1]["remote"]["gc"]

    os.unlink(os.path.join(d.root, "b/file"))
    status, _ = d.json("DELETE", "/v1/checkpoints/v1")
    assert status == 200
    gc = _gc_runs_until(d, storage, [3], after=before)  # the delete's push, 2 retired
    # The 300 kB only v1 held: generation 2 named its pack, generation 3 does not.
    assert gc["bytes_freed"] >= 300_000, gc
    pulled = os.path.join(os.fspath(tmp_path), "pulled")
    pull(storage, pulled)  # everything the newest names is still there
    r = run_cli("--root", d.root, "--store", pulled, "checkpoints", "list", "--json")
    assert sorted(c["id"] for c in json.loads(r.stdout)) == ["v0", "v2"], r.stderr
    r = run_cli("--root", d.root, "--store", pulled, "store", "check", "--read-data")
    assert r.returncode == 0, r.stdout + r.stderr


def test_within_the_grace_pushes_run_no_deletes_and_after_it_the_uploader_retires(
    daemon_factory: Any, storage: S3Storage
) -> None:
    # A run downloads every kept generation: within the grace a push lists catalog/ once
    # and runs nothing; when the grace passes, the uploader runs with no push needed.
    # Generation n is superseded when n + 1 commits, within its push: after ``started[n +
    # 1]``. So it must still be there before ``started[n + 1] + grace`` (less the listing's
    # 1 s clock), and its delete cannot come before: bounds that hold at any machine's
    # speed (three pushes may take longer than the grace under load).
    grace = 6.0
    env = {"SPRITE_ENV_REMOTE_GRACE": str(grace), "SPRITE_ENV_REMOTE_KEEP": "1"}
    d = daemon_factory("--store", repr(storage), "--no-view", env=env)
    started = []
    for n in range(3):
        write_file(os.path.join(d.root, f"f{n}"), os.urandom(20_000))
        started.append(time.monotonic())
        _create_remote(d, f"step {n}")
    held = [g.number for g in generations(storage)]
    listed = time.monotonic()
    assert held[:1] == [2], held
    for n in (0, 1):
        if listed < started[n + 1] + grace - 1.5:
            assert n in held, (n, held, listed - started[n + 1])
    gc = _gc_runs_until(d, storage, [2], timeout=grace + 60)
    # gone: so generation 1's grace had passed (it cannot have been superseded before
    # the third push started); and no push since did it
    assert time.monotonic() - started[2] >= grace - 1.5, gc
    assert gc["generations_deleted"] >= 1, gc


def _remote(d: Any) -> dict[str, Any]:
    status, body = d.json("GET", "/v1/status")
    assert status == 200, body
    remote: dict[str, Any] = body["remote"]
    return remote


def _until(d: Any, what: str, ok: Callable[[dict[str, Any]], bool], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        remote = _remote(d)
        if ok(remote):
            return remote
        time.sleep(0.1)
    raise AssertionError(f"not {what} after {timeout} s: {_remote(d)}\n{d.log()}")


def _storages(d: Any) -> dict[str, str]:
    status, rows = d.json("GET", "/v1/checkpoints?include_auto=true")
    assert status == 200, rows
    return {r["id"]: r["storage"] for r in rows}


def _bucket_holds(storage: S3Storage, d: Any, tmp_path: Any, name: str, ids: list[str]) -> None:
    """A pull of the bucket's newest generation lists ``ids`` and reads back whole."""
    pulled = os.path.join(os.fspath(tmp_path), name)
    pull(storage, pulled)
    r = run_cli("--root", d.root, "--store", pulled, "checkpoints", "list", "--json")
    assert sorted(c["id"] for c in json.loads(r.stdout)) == ids, r.stderr
    r = run_cli("--root", d.root, "--store", pulled, "store", "check", "--read-data")
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_lock_replaced_by_another_writer_stops_uploads_until_it_is_free(
    daemon_factory: Any, storage: S3Storage, tmp_path: Any
) -> None:
    # Renewed every 2 s (the removal is seen within that, even idle); 60 s stale, so
    # only the removal can lose it here.
    env = {"SPRITE_ENV_LEASE_STALE": "60", "SPRITE_ENV_LEASE_REFRESH": "2"}
    d = daemon_factory("--store", repr(storage), "--no-view", env=env)
    write_file(os.path.join(d.root, "a/file"), os.urandom(50_000))
    _create_remote(d, "before")
    # Another writer takes the prefix by force: right after the daemon renewed (its next
    # renewal a whole period away, so none writes a lock meanwhile), the daemon's lock
    # deleted and its own written.
    first = sorted(storage.list(LOCKS))
    deadline = time.monotonic() + 30
    while sorted(storage.list(LOCKS)) in (first, []) or len(storage.list(LOCKS)) != 1:
        assert time.monotonic() < deadline, d.log()
        time.sleep(0.05)
    mine = sorted(storage.list(LOCKS))
    for key in mine:
        storage.delete(key)
    other = Lease.acquire(storage, "b" * 12, LeasePolicy(stale_after=60, settle=0.1))
    try:
        remote = _until(d, "lost", lambda r: r["last_error"] is not None, 20)
        message = remote["last_error"]
        assert "lost the lease" in message, message
        assert "was removed from the bucket" in message, message
        assert "is held by writer bbbbbbbbbbbb" in message, message  # who, to act on
        assert "stop it, or use another prefix" in message, message
        assert remote["state"] == "retrying", remote
        assert [h.key for h in holders(storage)] == [other.key]  # ours is gone, not back

        # Meanwhile a create commits locally and is not pushed: no generation of ours.
        pushed = generations(storage)
        write_file(os.path.join(d.root, "b/file"), os.urandom(50_000))
        assert d.create("while held elsewhere")["checkpoint"]["storage"] == "local"
        # Two more refused rounds of its backoff (each <= the 2 s refresh), the second begun
        # after the create: waited for, not slept for (3 s before).
        tried = _remote(d)["failures"]
        _until(d, "refused twice more", lambda r: r["failures"] >= tried + 2, 20)
        assert generations(storage) == pushed
        assert _storages(d) == {"v0": "remote", "v1": "local"}
        status, evs = d.stream("POST", "/v1/checkpoint", {"comment": "w", "wait_remote": True})
        assert evs[-1]["type"] == "error", evs
        assert evs[-1]["code"] == "upload_failed", evs
        assert "is held by writer bbbbbbbbbbbb" in evs[-1]["error"], evs
        assert generations(storage) == pushed
    finally:
        other.release()
    # Free again: the daemon takes it back by itself and uploads what waited.
    _until(d, "resumed", lambda r: r["local"] == 0 and r["last_error"] is None, 60)
    assert _storages(d) == {"v0": "remote", "v1": "remote", "v2": "remote"}
    assert [h.pid for h in holders(storage)] == [d.proc.pid]
    _bucket_holds(storage, d, tmp_path, "pulled", ["v0", "v1", "v2"])


def test_a_lease_not_renewed_while_the_server_is_down_is_taken_again(
    daemon_factory: Any, storage: S3Storage, s3_env: dict[str, str], tmp_path: Any
) -> None:
    # Stale after 6 s, so lost after 3 s of failed renewals (every 0.5 s); each request
    # once, so a renewal fails at once while the server is down.
    env = {
        "SPRITE_ENV_LEASE_STALE": "6",
        "SPRITE_ENV_LEASE_REFRESH": "0.5",
        "AWS_MAX_ATTEMPTS": "1",
    }
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        d = daemon_factory(
            "--store", repr(storage), "--no-view", env={**env, "AWS_ENDPOINT_URL": proxy.url}
        )
        write_file(os.path.join(d.root, "a/file"), os.urandom(50_000))
        _create_remote(d, "before")
        proxy.down()
        # Idle, nothing to push: the status says so all the same, once the bound passed.
        remote = _until(d, "lost", lambda r: r["last_error"] is not None, 20)
        message = remote["last_error"]
        assert "lost the lease" in message, message
        assert "was not renewed for" in message, message
        assert "Could not connect" in message, message  # why: the server
        assert remote["state"] == "retrying", remote
        write_file(os.path.join(d.root, "b/file"), os.urandom(50_000))
        assert d.create("while down")["checkpoint"]["storage"] == "local"
        proxy.up()
        # Taken again (its own lock from before removed as a leftover) and v1 uploaded.
        _until(d, "resumed", lambda r: r["local"] == 0 and r["last_error"] is None, 60)
    assert _storages(d) == {"v0": "remote", "v1": "remote"}
    assert [h.pid for h in holders(storage)] == [d.proc.pid]
    _bucket_holds(storage, d, tmp_path, "pulled", ["v0", "v1"])
