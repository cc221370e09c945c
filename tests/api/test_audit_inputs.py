"""Each input of the outside audit (issue 15, point 8) that was answered with a 500
``internal``, a wrong status or a dropped connection, pinned: over the real daemon's socket
(the standard library's client, raw bytes, curl, the CLI) and in process where a crafted
store is needed."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from typing import Any

import pytest

from sprite_env.api.problems import STATUS, problem_for
from sprite_env.checkpoints import registry
from sprite_env.checkpoints.engine import InvalidComment, check_comment
from sprite_env.checkpoints.registry import InvalidCheckpointId, validate_id
from sprite_env.errors import SnapshotError
from sprite_env.snapshot.tree import decode_tree, encode_tree
from sprite_env.store.pack import ObjectKind
from tests.api.inprocess import InProcessDaemon, parse_answers
from tests.helpers.cli import run_cli
from tests.helpers.daemon import write_file


def _problem(resp: tuple[int, dict[str, str], bytes], status: int, code: str) -> dict[str, Any]:
    got, headers, raw = resp
    body: dict[str, Any] = json.loads(raw)
    assert (got, body["code"], body["status"]) == (status, code, status), body
    assert headers["content-type"] == "application/json"
    return body


def _raw(path: str, data: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(path)
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


AUDIT_400S = [
    # int() and str.isdigit() take Unicode digits: "²" was a ValueError, a 500.
    ("GET", "/v1/jobs/%C2%B2", None, "bad_request"),
    ("GET", "/v1/jobs/%D9%A3/events", None, "bad_request"),
    ("GET", "/v1/activity?limit=%C2%B2", None, "bad_request"),
    ("GET", "/v1/services/tick/logs?lines=%C2%B2", None, "bad_request"),
    # int() refuses more than 4,300 digits.
    ("GET", "/v1/jobs/" + "9" * 5000, None, "bad_request"),
    ("GET", "/v1/activity?limit=" + "1" * 5000, None, "bad_request"),
    # json's decoder recurses per level: a RecursionError.
    ("POST", "/v1/checkpoint", b"[" * 60_000, "invalid_json"),
    ("POST", "/v1/checkpoints/v0/restore", b"[" * 60_000, "invalid_json"),
    # "$" matches before a final newline: "v0\n" passed as an id.
    ("GET", "/v1/checkpoints/v0%0A", None, "invalid_id"),
    ("GET", "/v1/checkpoints?history=v0%0A", None, "invalid_id"),
    ("GET", "/v1/checkpoints/v0/diff?against=v0%0A", None, "invalid_id"),
]


@pytest.mark.integration
def test_audit_inputs_get_400s(daemon: Any) -> None:
    write_file(os.path.join(daemon.root, "hosts"), b"127.0.0.1 localhost\n")
    daemon.create("v0 exists, so a lax id check would find it")
    for method, path, body, code in AUDIT_400S:
        _problem(daemon.request(method, path, body), 400, code)
    assert daemon.request("GET", "/v1/status")[0] == 200
    assert [c["id"] for c in daemon.json("GET", "/v1/checkpoints")[1]] == ["v0"]


@pytest.mark.integration
def test_a_lone_surrogate_in_a_comment_is_refused_before_the_capture(daemon: Any) -> None:
    write_file(os.path.join(daemon.root, "hosts"), b"127.0.0.1 localhost\n")
    resp = daemon.request("POST", "/v1/checkpoint", b'{"comment": "bad \\ud800 text"}')
    body = _problem(resp, 400, "invalid_comment")
    assert "surrogate" in body["message"]
    # No job ran (the old answer was a 200 stream whose capture ran, then failed).
    status, jobs = daemon.json("GET", "/v1/status")
    assert (status, jobs["job"], jobs["queued"]) == (200, None, 0)
    assert daemon.json("GET", "/v1/checkpoints") == (200, [])
    assert daemon.json("GET", "/v1/jobs/1")[1]["code"] == "not_found"


@pytest.mark.integration
def test_431_and_501_bodies_carry_their_own_status(daemon: Any) -> None:
    big = b"GET /v1/status HTTP/1.1\r\nHost: sprite\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"
    out = _raw(daemon.socket, big)
    assert out.startswith(b"HTTP/1.1 431 "), out[:100]
    body = json.loads(out.split(b"\r\n\r\n", 1)[1])
    assert (body["code"], body["status"]) == ("headers_too_large", 431)

    gzip = b"POST /v1/checkpoint HTTP/1.1\r\nHost: sprite\r\nTransfer-Encoding: gzip\r\n\r\n"
    out = _raw(daemon.socket, gzip)
    assert out.startswith(b"HTTP/1.1 501 "), out[:100]
    body = json.loads(out.split(b"\r\n\r\n", 1)[1])
    assert (body["code"], body["status"]) == ("not_implemented", 501)
    assert {"headers_too_large": 431, "not_implemented": 501}.items() <= STATUS.items()


@pytest.mark.integration
def test_head_is_answered_and_the_connection_kept(daemon: Any) -> None:
    get = daemon.request("GET", "/v1/checkpoints")
    # HEAD then GET on one connection: the HEAD's answer has the GET's head and no body,
    # and the connection is still there for the GET (it used to be dropped).
    out = _raw(
        daemon.socket,
        b"HEAD /v1/checkpoints HTTP/1.1\r\nHost: sprite\r\n\r\n"
        b"GET /v1/checkpoints HTTP/1.1\r\nHost: sprite\r\nConnection: close\r\n\r\n",
    )
    head, after = parse_answers(out, "HEAD", first_only=True)[0], out.split(b"\r\n\r\n", 1)[1]
    assert (head.status, head.body) == (200, b"")
    assert head.headers["content-length"] == str(len(get[2]))
    assert after.startswith(b"HTTP/1.1 200 ")
    assert after.endswith(get[2])

    # HEAD where only POST is served: 405 with Allow, no body.
    out = _raw(daemon.socket, b"HEAD /v1/checkpoint HTTP/1.1\r\nHost: sprite\r\n\r\n")
    (a,) = parse_answers(out, "HEAD")
    assert (a.status, a.headers["allow"], a.body) == (405, "POST", b"")

    p = daemon.curl("-sSI", "http://sprite/v1/status")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("HTTP/1.1 200 OK")


def test_validation_functions_are_strict() -> None:
    for bad in ("v0\n", "auto-20200101T000000Z\n", "v\u00b2", "v\uff11"):
        with pytest.raises(InvalidCheckpointId):
            validate_id(bad)
    assert validate_id("v0") == "v0"
    with pytest.raises(InvalidComment, match="surrogate"):
        check_comment("a\ud800b")
    assert check_comment("plain \u00e9t\u00e9 \U0001f600") == "plain \u00e9t\u00e9 \U0001f600"


def test_a_snapshot_error_is_a_store_error_not_internal() -> None:
    p = problem_for(SnapshotError("refusing unsafe file name b'..'"))
    assert (p.code, p.status) == ("store_error", 500)


def test_unsafe_stored_names_get_documented_answers(tmp_path: Any, expect_log: Any) -> None:
    """A checkpoint whose stored tree names ``..`` or ``a/b`` (crafted in the store, as the
    audit did): listing, diffs, previews and the restore answer with documented codes."""
    expect_log(r"restore .* failed|unsafe file name")
    root = os.path.join(tmp_path, "root")
    with InProcessDaemon(root, os.path.join(tmp_path, "state")) as d:
        write_file(os.path.join(root, "x"), b"hi")
        assert d.request("POST", "/v1/checkpoint", b'{"comment": "good"}').status == 200
        assert d.daemon is not None
        engine = d.daemon.engine
        good = engine.registry.get("v0")
        (dot,) = decode_tree(engine.store.read(good.top_tree))
        entries = decode_tree(engine.store.read(dot.subtree))
        for bad in (b"..", b"a/b"):
            crafted = [dataclasses.replace(e, name=bad) for e in entries]
            with engine.store.writer() as w:
                inner = w.put(encode_tree(crafted), ObjectKind.TREE)
                top = w.put(encode_tree([dataclasses.replace(dot, payload=inner)]), ObjectKind.TREE)
                cid, seq = engine.registry.next_manual_id()
                cp = dataclasses.replace(good, id=cid, seq=seq, top_tree=top, history=["v0"])
                cp.record = w.put(cp.record_bytes(), ObjectKind.META)
                w.commit(lambda db, cp=cp: registry.insert(db, cp))
            for method, path in [
                ("GET", f"/v1/checkpoints/{cid}"),
                ("GET", f"/v1/checkpoints/{cid}/diff"),
                ("GET", f"/v1/checkpoints/{cid}/diff?against=v0"),
                ("GET", f"/v1/checkpoints/{cid}/preview"),
                ("POST", f"/v1/checkpoints/{cid}/restore"),
            ]:
                a = d.request(method, path)
                assert a.status != 500 or a.json()["code"] != "internal", a
                if a.headers["content-type"] == "application/x-ndjson":
                    last = json.loads(a.body.splitlines()[-1])
                    assert last["type"] == "complete" or (
                        last["code"] in STATUS and last["code"] != "internal"
                    ), last
                else:
                    assert a.status < 500 or a.json()["code"] in STATUS, a


@pytest.mark.integration
def test_the_cli_refuses_a_bad_actor_without_a_traceback(daemon: Any, tmp_path: Any) -> None:
    online = run_cli("--as", "a\nb", "checkpoints", "create", env=daemon.env())
    offline = run_cli(
        "--root", os.path.join(tmp_path, "off"), "--as", "a\nb", "checkpoints", "create"
    )
    for r in (online, offline):
        assert r.returncode == 2, r.stderr
        assert "invalid actor" in r.stderr
        assert "Traceback" not in r.stderr
    r = run_cli("checkpoints", "create", env={**daemon.env(), "SPRITE_ACTOR": "x\x1b[2J"})
    assert (r.returncode, "Traceback" in r.stderr) == (2, False), r.stderr
    assert daemon.json("GET", "/v1/checkpoints") == (200, [])


@pytest.mark.integration
def test_a_utf8_actor_travels_in_the_header(daemon: Any) -> None:
    # http.client sent headers as latin-1 and failed on this name with a traceback.
    r = run_cli("--as", "агент-日本", "checkpoints", "create", env=daemon.env())
    assert r.returncode == 0, r.stderr
    status, cps = daemon.json("GET", "/v1/checkpoints")
    assert [c["created_by"] for c in cps] == ["агент-日本"]
    # curl sends the header's bytes as typed (UTF-8); the daemon reads them so (it read
    # latin-1: "cafÃ©").
    p = daemon.curl("-H", "X-Sprite-Actor: café", "-X", "POST", "http://sprite/v1/checkpoint")
    assert json.loads(p.stdout.splitlines()[-1])["checkpoint"]["created_by"] == "café"
    _, log = daemon.json("GET", "/v1/activity")
    assert [e["actor"] for e in log if e["action"] == "create"] == ["café", "агент-日本"]
