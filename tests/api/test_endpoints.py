"""Every endpoint of a real daemon, over its Unix socket: shapes, streams, jobs, policies."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any

import pytest

from tests.helpers import trees
from tests.helpers.cli import run_cli
from tests.helpers.daemon import write_file

pytestmark = pytest.mark.integration


def test_create_streams_events_and_lists(daemon: Any) -> None:
    write_file(os.path.join(daemon.root, "etc/hosts"), b"127.0.0.1 localhost\n")
    status, headers, raw = daemon.request(
        "POST", "/v1/checkpoint", {"comment": "first"}, headers={"X-Sprite-Actor": "my-agent"}
    )
    assert status == 200
    assert headers["content-type"] == "application/x-ndjson"
    evs = [json.loads(line) for line in raw.splitlines()]
    for e in evs:
        assert {"type", "time", "job"} <= e.keys()
        assert e["time"].endswith("Z")
    assert [e["data"] for e in evs if e["type"] == "info"] == [
        "Creating checkpoint...",
        "Saving filesystem state...",
    ]
    last = evs[-1]
    assert last["type"] == "complete"
    assert last["id"] == "v0"
    assert last["data"] == "Checkpoint v0 created successfully"
    assert last["checkpoint"]["created_by"] == "my-agent"

    status, cps = daemon.json("GET", "/v1/checkpoints")
    assert status == 200
    assert [c["id"] for c in cps] == ["v0"]
    c = cps[0]
    for key in ("id", "create_time", "comment", "is_auto", "history", "created_by", "parent"):
        assert key in c
    assert (c["comment"], c["is_auto"], c["is_active"], c["files"]) == ("first", False, True, 1)

    status, info = daemon.json("GET", "/v1/checkpoints/v0")
    assert status == 200
    assert info == c

    write_file(os.path.join(daemon.root, "b.txt"), b"b")
    assert daemon.create("second")["id"] == "v1"
    status, cps = daemon.json("GET", "/v1/checkpoints")
    assert [c["id"] for c in cps] == ["v1", "v0"]  # newest first
    assert cps[0]["history"] == ["v0"]
    assert cps[0]["parent"] == "v0"
    status, hist = daemon.json("GET", "/v1/checkpoints?history=v0")
    assert [c["id"] for c in hist] == ["v1", "v0"]


def test_restore_answers_202_streams_and_restores(daemon: Any) -> None:
    spec = trees.sample_spec()
    trees.build_tree(daemon.root, spec)
    before = trees.snapshot_tree(daemon.root)
    daemon.create("good")
    write_file(os.path.join(daemon.root, "junk/new.txt"), b"oops")
    os.unlink(os.path.join(daemon.root, "big.bin")) if os.path.exists(
        os.path.join(daemon.root, "big.bin")
    ) else None

    status, preview = daemon.json("GET", "/v1/checkpoints/v0/preview")
    assert status == 200
    assert preview["counts"]["remove"] >= 1
    assert any(ch["path"] == "junk" for ch in preview["changes"])

    status, evs = daemon.stream("POST", "/v1/checkpoints/v0/restore")
    assert status == 202
    last = evs[-1]
    assert last["type"] == "complete", evs
    assert last["data"] == "Restore from v0 complete"
    assert last["undo"].startswith("auto-")
    assert evs[0] == {**evs[0], "type": "info", "data": "Restoring from checkpoint v0..."}
    trees.assert_trees_equal(before, daemon.root)

    # The undo point is hidden unless asked for, and holds the junk.
    status, cps = daemon.json("GET", "/v1/checkpoints")
    assert [c["id"] for c in cps] == ["v0"]
    status, cps = daemon.json("GET", "/v1/checkpoints?include_auto=true")
    assert {c["id"] for c in cps} == {"v0", last["undo"]}
    status, d = daemon.json("GET", f"/v1/checkpoints/v0/diff?against={last['undo']}")
    assert status == 200
    assert {"path": "junk", "change": "added", "type": "dir"}.items() <= next(
        ch for ch in d["changes"] if ch["path"] == "junk"
    ).items()


def test_diff_against_live_and_between_checkpoints(daemon: Any) -> None:
    write_file(os.path.join(daemon.root, "a.txt"), b"one")
    daemon.create()
    write_file(os.path.join(daemon.root, "a.txt"), b"two!")
    write_file(os.path.join(daemon.root, "new.txt"), b"n")
    status, live = daemon.json("GET", "/v1/checkpoints/v0/diff")
    assert status == 200
    assert live["from"] == "v0"
    assert live["to"] == "live"
    assert {(c["path"], c["change"]) for c in live["changes"]} >= {
        ("a.txt", "modified"),
        ("new.txt", "added"),
    }
    daemon.create()
    status, between = daemon.json("GET", "/v1/checkpoints/v0/diff?against=v1")
    assert {(c["path"], c["change"]) for c in between["changes"]} == {
        (c["path"], c["change"]) for c in live["changes"]
    }
    assert between["counts"]["added"] == 1


def test_delete_frees_and_refuses_the_active_one(daemon: Any) -> None:
    write_file(os.path.join(daemon.root, "a.bin"), os.urandom(200_000))
    daemon.create()
    write_file(os.path.join(daemon.root, "a.bin"), os.urandom(200_000))
    daemon.create()
    status, err = daemon.json("DELETE", "/v1/checkpoints/v1")
    assert (status, err["code"], err["status"]) == (409, "active_checkpoint", 409)
    assert "cannot delete active checkpoint" in err["message"]
    status, rep = daemon.json("DELETE", "/v1/checkpoints/v0")
    assert status == 200
    assert rep["id"] == "v0"
    assert rep["bytes_freed"] > 150_000
    status, err = daemon.json("DELETE", "/v1/checkpoints/v0")
    assert (status, err["code"]) == (404, "not_found")
    # Ids are never reused.
    assert daemon.create()["id"] == "v2"


def test_jobs_queue_one_at_a_time_and_survive_a_client_that_leaves(daemon: Any) -> None:
    for i in range(300):
        write_file(os.path.join(daemon.root, f"d{i % 10}/f{i}"), os.urandom(20_000))
    # A client sends a create, reads one line and hangs up.
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(daemon.socket)
    body = b'{"comment": "left"}'
    s.sendall(
        b"POST /v1/checkpoint HTTP/1.1\r\nHost: sprite\r\nContent-Length: %d\r\n\r\n%s"
        % (len(body), body)
    )
    first = s.recv(4096)
    assert b"200" in first.split(b"\r\n")[0]
    s.close()
    # A second create queued behind it says what it waits for (or runs after it).
    status, evs = daemon.stream("POST", "/v1/checkpoint", {"comment": "second"})
    assert status == 200
    assert evs[-1]["type"] == "complete"
    assert evs[-1]["id"] == "v1"
    waits = [e["data"] for e in evs if e["type"] == "info" and e["data"].startswith("Waiting")]
    assert waits in ([], ["Waiting for job 1 (create)..."])
    status, cps = daemon.json("GET", "/v1/checkpoints")
    assert [(c["id"], c["comment"]) for c in cps] == [("v1", "second"), ("v0", "left")]
    status, job = daemon.json("GET", "/v1/jobs/1")
    assert (job["state"], job["kind"], job["result"]["id"]) == ("done", "create", "v0")
    status, evs = daemon.stream("GET", "/v1/jobs/1/events")  # a late follower gets it all
    assert evs[0]["data"] == "Creating checkpoint..."
    assert evs[-1]["id"] == "v0"


def test_auto_checkpoint_on_request_unless_a_recent_one(daemon: Any) -> None:
    write_file(os.path.join(daemon.root, "a"), b"a")
    first = daemon.create(auto=True, reason="before claude session")
    assert first["id"].startswith("auto-")
    assert first["checkpoint"]["comment"] == "before claude session"
    again = daemon.create(auto=True, reason="before another session")
    assert again["skipped"] is True
    assert again["id"] == first["id"]
    assert again["data"] == f"Checkpoint skipped: no change since {first['id']}"
    status, log = daemon.json("GET", "/v1/activity?limit=1")
    assert log[0]["detail"].startswith(f"skipped: no change since {first['id']}")
    status, cps = daemon.json("GET", "/v1/checkpoints")
    assert cps == []  # Sprites' list: automatic ones only when asked for
    # The CLI's list leaves automatic ones out too, but not the one the layer is on.
    r = run_cli("--socket", daemon.socket, "checkpoints", "list")
    assert r.returncode == 0, r
    assert first["id"] in r.stdout
    assert "*" in r.stdout
    # A file written since is never left out: recent or not, this one is a new checkpoint.
    write_file(os.path.join(daemon.root, "b"), b"written after the first")
    third = daemon.create(auto=True, reason="before a third session")
    assert third.get("skipped") is not True
    assert third["id"] not in (first["id"],)
    status, cps = daemon.json("GET", "/v1/checkpoints?includeAuto=true")
    assert [c["id"] for c in cps] == [third["id"], first["id"]]


def test_quota_refuses_manual_and_prunes_auto(daemon_factory: Any) -> None:
    d = daemon_factory("--max-checkpoints", "3")
    for i in range(3):
        write_file(os.path.join(d.root, "f"), str(i).encode())
        d.create(f"c{i}")
    status, err = d.json("POST", "/v1/checkpoint", {"comment": "one too many"})
    assert (status, err["code"]) == (409, "quota_exceeded")
    assert "quota of 3 checkpoints" in err["message"]
    assert "sprite-env checkpoints delete v0" in err["message"]  # which one to delete
    status, log = d.json("GET", "/v1/activity?limit=1")  # a refused create is logged too
    assert (log[0]["action"], log[0]["ok"]) == ("create", False)
    assert "quota" in log[0]["detail"]
    # A restore needs room for its undo point: with only manual checkpoints, it fails
    # cleanly (nothing touched), saying why and which to delete ...
    status, evs = d.stream("POST", "/v1/checkpoints/v0/restore")
    assert evs[-1]["type"] == "error"
    assert evs[-1]["code"] == "quota_exceeded"
    assert "the restore's undo checkpoint needs one slot" in evs[-1]["error"]
    assert "(the oldest: v0)" in evs[-1]["error"]
    with open(os.path.join(d.root, "f"), "rb") as f:
        assert f.read() == b"2"
    # ... and once a manual one is deleted, autos fill and then give way.
    d.json("DELETE", "/v1/checkpoints/v1")
    status, evs = d.stream("POST", "/v1/checkpoints/v0/restore")
    assert evs[-1]["type"] == "complete"
    undo1 = evs[-1]["undo"]
    write_file(os.path.join(d.root, "f"), b"changed")
    status, evs = d.stream("POST", "/v1/checkpoints/v2/restore")
    assert evs[-1]["type"] == "complete", evs
    status, cps = d.json("GET", "/v1/checkpoints?include_auto=true")
    ids = [c["id"] for c in cps]
    assert len(ids) == 3
    assert "v0" in ids
    assert "v2" in ids
    assert undo1 not in ids
    status, log = d.json("GET", "/v1/activity?action=delete")
    assert any(e["id"] == undo1 and e["actor"] == "quota" for e in log)


def test_activity_log_names_who(daemon: Any) -> None:
    write_file(os.path.join(daemon.root, "a"), b"a")
    daemon.request("POST", "/v1/checkpoint", {"comment": "x"}, headers={"X-Sprite-Actor": "claude"})
    write_file(os.path.join(daemon.root, "a"), b"b")
    daemon.create("y", created_by="cursor")
    daemon.request("POST", "/v1/checkpoints/v0/restore")
    daemon.request("DELETE", "/v1/checkpoints/v1")
    status, log = daemon.json("GET", "/v1/activity")
    assert status == 200
    got = [(e["action"], e["id"], e["actor"], e["ok"]) for e in log]
    assert got[:4] == [
        ("delete", "v1", "api", True),
        ("restore", "v0", "api", True),
        ("create", "v1", "cursor", True),
        ("create", "v0", "claude", True),
    ]
    status, log = daemon.json("GET", "/v1/activity?limit=1")
    assert len(log) == 1
    # A failure is logged too.
    daemon.request("DELETE", "/v1/checkpoints/v0")
    status, log = daemon.json("GET", "/v1/activity?limit=1")
    assert (log[0]["action"], log[0]["ok"]) == ("delete", False)
    assert "active" in log[0]["detail"]


def test_reset_without_a_base_image_is_refused_and_touches_nothing(daemon: Any) -> None:
    # Issue 10: on a daemon without --overlay, "back to the base image" emptied the root.
    trees.build_tree(daemon.root, trees.sample_spec())
    daemon.create("before")
    before = trees.snapshot_tree(daemon.root)
    status, problem = daemon.json("POST", "/v1/reset")
    assert (status, problem["code"], problem["status"]) == (409, "no_base_image", 409)
    assert "nothing was changed" in problem["message"]
    trees.assert_trees_equal(before, daemon.root)
    status, cps = daemon.json("GET", "/v1/checkpoints?include_auto=true")
    assert [c["id"] for c in cps] == ["v0"]  # no undo checkpoint either: nothing ran
    status, st = daemon.json("GET", "/v1/status")
    assert st["base_image"] is None


def test_status(daemon: Any) -> None:
    status, st = daemon.json("GET", "/v1/status")
    assert status == 200
    assert st["pid"] == daemon.proc.pid
    assert st["root"] == daemon.root
    assert st["state"] == daemon.state
    assert st["job"] is None
    assert st["queued"] == 0


def test_twenty_clients_list_while_a_create_runs(daemon: Any) -> None:
    for i in range(2000):
        write_file(os.path.join(daemon.root, f"d{i % 40}/f{i}"), os.urandom(4096))
    daemon.create("base")
    for i in range(0, 2000, 3):
        write_file(os.path.join(daemon.root, f"d{i % 40}/f{i}"), os.urandom(4096))
    latencies: list[float] = []
    errors: list[str] = []
    done = threading.Event()

    def lister() -> None:
        while not done.is_set():
            t = time.perf_counter()
            status, cps = daemon.json("GET", "/v1/checkpoints")
            latencies.append(time.perf_counter() - t)
            if status != 200 or not cps:
                errors.append(f"{status} {cps}")

    threads = [threading.Thread(target=lister) for _ in range(20)]
    for t in threads:
        t.start()
    try:
        last = daemon.create("under load")
    finally:
        done.set()
        for t in threads:
            t.join()
    assert last["id"] == "v1"
    assert errors == []
    assert len(latencies) >= 20
    latencies.sort()
    print(
        f"\nlist under load: {len(latencies)} requests, median "
        f"{latencies[len(latencies) // 2] * 1000:.1f} ms, p99 "
        f"{latencies[int(len(latencies) * 0.99)] * 1000:.1f} ms"
    )
