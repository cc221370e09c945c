"""The background upload through the real daemon, CLI and Swift (issue 14, point 3): a
create returns before its upload, each checkpoint's ``storage`` goes ``local`` then
``remote`` (list, info, status, the CLI's table and --json), ``create --wait-remote``
streams the upload, a daemon SIGKILLed mid-upload resumes it on restart, a stopped server
is retried while the daemon serves and the status says why."""

from __future__ import annotations

import json
import os
import signal
import time
from typing import TYPE_CHECKING, Any

from sprite_env.store.remote import generations, pull
from tests.helpers.cli import run_cli
from tests.helpers.daemon import write_file
from tests.remote.faultproxy import FaultProxy

if TYPE_CHECKING:
    from sprite_env.store.s3 import S3Storage


def _storages(d: Any) -> dict[str, str]:
    status, rows = d.json("GET", "/v1/checkpoints?include_auto=true")
    assert status == 200, rows
    return {r["id"]: r["storage"] for r in rows}


def _until_remote(d: Any, timeout: float = 30.0) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = _storages(d)
        if seen and set(seen.values()) == {"remote"}:
            return seen
        time.sleep(0.1)
    raise AssertionError(f"not all remote after {timeout} s: {_storages(d)}\n{d.log()}")


def test_create_wait_remote_streams_the_upload_and_every_face_says_remote(
    daemon_factory: Any, storage: S3Storage
) -> None:
    d = daemon_factory("--store", repr(storage), "--no-view")
    write_file(os.path.join(d.root, "a/file"), os.urandom(200_000))
    status, evs = d.stream("POST", "/v1/checkpoint", {"comment": "durable", "wait_remote": True})
    assert status == 200, evs
    assert evs[-1]["type"] == "complete", evs
    assert evs[-1]["id"] == "v0"
    assert evs[-1]["checkpoint"]["storage"] == "remote"
    ups = [e for e in evs if e["type"] == "progress" and e.get("phase") == "upload"]
    assert ups, evs  # at least the push's final counters
    last = ups[-1]
    assert last["packs"] == last["packs_total"] >= 2  # its data and metadata packs
    assert last["bytes"] == last["bytes_total"] > 0
    assert any(e["type"] == "info" and e["data"].startswith("Uploading v0 to") for e in evs)
    # Durable means a generation in the bucket holding it: a pull elsewhere has it.
    assert generations(storage)
    assert _storages(d) == {"v0": "remote"}
    status, info = d.json("GET", "/v1/checkpoints/v0")
    assert info["storage"] == "remote"
    status, st = d.json("GET", "/v1/status")
    remote = st["remote"]
    assert remote["url"] == repr(storage)
    assert remote["state"] == "idle"
    assert remote["local"] == 0
    assert remote["last_error"] is None
    # The CLI: --wait-remote, the table's STORAGE column, --json, info.
    env = d.env()
    write_file(os.path.join(d.root, "b/file"), b"second")
    r = run_cli("checkpoints", "create", "--comment", "cli", "--wait-remote", env=env)
    assert r.returncode == 0, r.stderr
    assert "v1:" in r.stdout
    assert "durable in the store's bucket" in r.stdout
    assert r.stdout.rstrip().endswith("Checkpoint created: v1")
    r = run_cli("checkpoints", "list", env=env)
    header, *rows = r.stdout.splitlines()
    assert header.split() == ["ID", "CREATED", "FILES", "SIZE", "ADDED", "STORAGE", "COMMENT"]
    assert all(" remote " in row for row in rows), r.stdout
    r = run_cli("checkpoints", "list", "--json", env=env)
    assert [c["storage"] for c in json.loads(r.stdout)] == ["remote", "remote"]
    r = run_cli("checkpoints", "info", "v1", env=env)
    assert "Storage:  remote" in r.stdout


def test_a_create_returns_before_its_upload_which_follows_in_commit_order(
    daemon_factory: Any, storage: S3Storage, tmp_path: Any
) -> None:
    """Without --wait-remote a create answers at once (``local``); the background push
    makes each remote, coalescing creates that arrive meanwhile, and a delete is pushed
    too (the newest generation no longer holds it)."""
    d = daemon_factory("--store", repr(storage), "--no-view")
    for i in range(3):
        write_file(os.path.join(d.root, f"f{i}"), os.urandom(100_000))
        done = d.create(f"c{i}")
        assert done["checkpoint"]["storage"] in ("local", "remote")
    assert _until_remote(d) == {"v0": "remote", "v1": "remote", "v2": "remote"}
    pushed = len(generations(storage))
    assert 1 <= pushed <= 3  # coalesced when a create came during a push
    status, _ = d.json("DELETE", "/v1/checkpoints/v1")
    assert status == 200
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        remote = d.json("GET", "/v1/status")[1]["remote"]
        if remote["generation"] == pushed and remote["state"] == "idle":
            break  # the generation after the delete's (numbers start at 0)
        time.sleep(0.1)
    assert remote["generation"] == pushed, remote
    assert remote["local"] == 0
    assert _storages(d) == {"v0": "remote", "v2": "remote"}
    pulled = str(tmp_path / "pulled")
    pull(storage, pulled)  # the newest generation no longer holds v1
    r = run_cli("--root", d.root, "--store", pulled, "checkpoints", "list", "--json")
    assert sorted(c["id"] for c in json.loads(r.stdout)) == ["v0", "v2"], r.stderr


def test_a_daemon_killed_mid_upload_resumes_it_and_a_pull_elsewhere_gets_everything(
    daemon_factory: Any, storage: S3Storage, tmp_path: Any
) -> None:
    """SIGKILLed right after the first pack's PUT of its first push: no generation, the
    checkpoint ``local`` (offline too); restarted, the daemon pushes on its own, every
    checkpoint ends ``remote``, and a second store pulled from the bucket has them all
    and passes ``store check --read-data``."""
    state = str(tmp_path / "state")
    d = daemon_factory(
        "--store",
        repr(storage),
        "--no-view",
        state=state,
        env={"SPRITE_ENV_CRASH_AT": "remote-after-pack-put"},
    )
    write_file(os.path.join(d.root, "big/one"), os.urandom(300_000))
    write_file(os.path.join(d.root, "big/two"), os.urandom(300_000))
    status, evs = d.stream("POST", "/v1/checkpoint", {"comment": "c0"})
    assert evs[-1]["type"] == "complete", evs  # committed locally, then the upload began
    assert d.proc.wait(30) == -signal.SIGKILL
    assert generations(storage) == []  # killed before any generation
    assert len(storage.list("packs/")) == 1
    r = run_cli(
        "--root", d.root, "--store", os.path.join(state, "store"), "checkpoints", "list", "--json"
    )
    assert [c["storage"] for c in json.loads(r.stdout)] == ["local"], r.stderr
    d2 = daemon_factory("--store", repr(storage), "--no-view", state=state)
    assert _until_remote(d2) == {"v0": "remote"}
    write_file(os.path.join(d2.root, "big/three"), os.urandom(300_000))
    assert d2.create("c1", wait_remote=True)["checkpoint"]["storage"] == "remote"
    ids = sorted(_storages(d2))
    assert ids == ["v0", "v1"]
    pulled = str(tmp_path / "pulled")
    pull(storage, pulled)
    r = run_cli("--root", d2.root, "--store", pulled, "checkpoints", "list", "--json")
    assert sorted(c["id"] for c in json.loads(r.stdout)) == ids, r.stderr
    r = run_cli("--root", d2.root, "--store", pulled, "store", "check", "--read-data")
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_stopped_server_is_retried_the_daemon_serves_and_the_status_says_why(
    daemon_factory: Any, storage: S3Storage, s3_env: dict[str, str]
) -> None:
    # The daemon reaches the server through the fault proxy: its down() refuses
    # connections exactly as a stopped server does, and its up() is the server back (a
    # stop and a start of a second Swift cost ~15 s more, 30 s under load).
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as proxy:
        # each request once: the test needs no client retry
        env = {"AWS_MAX_ATTEMPTS": "1", "AWS_ENDPOINT_URL": proxy.url}
        d = daemon_factory("--store", repr(storage), "--no-view", env=env)
        proxy.down()
        write_file(os.path.join(d.root, "f"), os.urandom(100_000))
        assert d.create("while down")["id"] == "v0"  # committed locally all the same
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            remote = d.json("GET", "/v1/status")[1]["remote"]
            # In its backoff, not already on its next try (under load the poll can land
            # on one: state "uploading" with failures >= 1).
            if remote["failures"] >= 1 and remote["state"] == "retrying":
                break
            time.sleep(0.1)
        assert remote["state"] == "retrying", remote
        assert "Could not connect" in remote["last_error"]
        assert remote["next_attempt_s"] is not None
        assert remote["local"] == 1
        assert _storages(d) == {"v0": "local"}
        r = run_cli("checkpoints", "create", "--comment", "w", "--wait-remote", env=d.env())
        assert r.returncode == 3, r.stdout + r.stderr
        assert "is not remote" in r.stderr
        assert "goes on in the background" in r.stderr
        assert generations(storage) == []  # nothing reached the server meanwhile
        proxy.up()
        r = run_cli("checkpoints", "create", "--comment", "w2", "--wait-remote", env=d.env())
        assert r.returncode == 0, r.stdout + r.stderr
        assert _until_remote(d) == {"v0": "remote", "v1": "remote", "v2": "remote"}
        assert d.json("GET", "/v1/status")[1]["remote"]["last_error"] is None


def test_without_a_remote_every_checkpoint_is_local_and_wait_remote_is_refused(
    daemon_factory: Any,
) -> None:
    d = daemon_factory("--no-view")
    write_file(os.path.join(d.root, "f"), b"x")
    assert d.create("plain")["checkpoint"]["storage"] == "local"
    assert _storages(d) == {"v0": "local"}
    assert d.json("GET", "/v1/status")[1]["remote"] is None
    status, answer = d.json("POST", "/v1/checkpoint", {"comment": "w", "wait_remote": True})
    assert status == 409
    assert answer["code"] == "no_remote"
    r = run_cli("checkpoints", "create", "--wait-remote", env=d.env())
    assert r.returncode == 2
    assert "no remote store" in r.stderr
    assert "nothing was created" in r.stderr
    assert _storages(d) == {"v0": "local"}  # nothing created
    r = run_cli("checkpoints", "list", env=d.env())
    assert "STORAGE" not in r.stdout  # no column of "local" on every line
    # The OpenAPI document (from shapes.py) names the field, the body's flag, the status.
    schemas = d.json("GET", "/v1/openapi.json")[1]["components"]["schemas"]
    assert schemas["Checkpoint"]["properties"]["storage"] == {"enum": ["local", "remote"]}
    assert schemas["CreateRequest"]["properties"]["wait_remote"] == {"type": "boolean"}
    assert "last_error" in schemas["RemoteStatus"]["properties"]
    assert "remote" in schemas["Status"]["required"]
