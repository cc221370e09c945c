"""The router in-process, over a fake backend (``fake_backend.py``): every bad request gets
a problem with a stable code and the right status, and none of them reaches the backend.
Milliseconds a case, no daemon; ``test_bad_input.py`` keeps the same cases end to end."""

from __future__ import annotations

import json

import jsonschema
import pytest

from sprite_env.api import shapes
from sprite_env.api.routes import MAX_PATHS
from tests.api.fake_backend import FakeBackend, exchange, request
from tests.api.inprocess import parse_answers

ROUTED_TO_BACKEND = {"status", "job"}  # reads with no input worth refusing


def _problem(backend: FakeBackend, method: str, target: str, body: bytes = b"", **kw: object):
    answer = request(backend, method, target, body, **kw)  # type: ignore[arg-type]
    problem = answer.json()
    jsonschema.validate(problem, shapes.json_schema(shapes.Problem))
    assert problem["status"] == answer.status, problem
    assert answer.headers["content-type"] == "application/json"
    return answer.status, problem["code"], problem["message"]


@pytest.mark.parametrize(
    ("method", "target", "body", "status", "code"),
    [
        # Malformed or wrong JSON bodies.
        ("POST", "/v1/checkpoint", b"{not json", 400, "invalid_json"),
        ("POST", "/v1/checkpoint", b"\xff\xfe", 400, "invalid_json"),
        ("POST", "/v1/checkpoint", b"[1, 2]", 400, "invalid_json"),
        ("POST", "/v1/checkpoint", b'"a string"', 400, "invalid_json"),
        ("POST", "/v1/checkpoint", b"[" * 60_000, 400, "invalid_json"),
        ("POST", "/v1/checkpoint", b'{"coment": "typo"}', 400, "bad_request"),
        ("POST", "/v1/checkpoint", b'{"comment": 5}', 400, "bad_request"),
        ("POST", "/v1/checkpoint", b'{"auto": "yes"}', 400, "bad_request"),
        ("POST", "/v1/checkpoint", b'{"created_by": "evil\\u001b[2J"}', 400, "invalid_actor"),
        ("POST", "/v1/checkpoints/v0/restore", b'{"paths": "/etc"}', 400, "bad_request"),
        ("POST", "/v1/checkpoints/v0/restore", b'{"paths": [""]}', 400, "bad_request"),
        ("POST", "/v1/checkpoints/v0/restore", b'{"paths": [7]}', 400, "bad_request"),
        (
            "POST",
            "/v1/checkpoints/v0/restore",
            json.dumps({"paths": ["/a"] * (MAX_PATHS + 1)}).encode(),
            400,
            "bad_request",
        ),
        (
            "POST",
            "/v1/checkpoints/v0/restore",
            json.dumps({"paths": ["/" + "a" * 5000]}).encode(),
            400,
            "bad_request",
        ),
        ("POST", "/v1/checkpoints/v0/export", b"{}", 400, "bad_request"),  # no dest
        ("POST", "/v1/checkpoints/v0/export", b'{"dest": ["/x"]}', 400, "bad_request"),
        ("POST", "/v1/checkpoints/v0/preview", b'{"paths": [null]}', 400, "bad_request"),
        ("POST", "/v1/reset", b'{"force": true}', 400, "bad_request"),
        # Ill-formed ids, and path tricks inside an id's segment.
        ("GET", "/v1/checkpoints/v01", b"", 400, "invalid_id"),
        ("GET", "/v1/checkpoints/%2e%2e", b"", 400, "invalid_id"),
        ("GET", "/v1/checkpoints/..%2Fetc", b"", 400, "invalid_id"),
        ("GET", "/v1/checkpoints/v0%2Frestore", b"", 400, "invalid_id"),
        ("GET", "/v1/checkpoints/v1;rm", b"", 400, "invalid_id"),
        ("GET", "/v1/checkpoints/v0%00", b"", 400, "invalid_id"),
        ("POST", "/v1/checkpoints/bad%20id/restore", b"", 400, "invalid_id"),
        ("GET", "/v1/checkpoints/v0/diff?against=../v1", b"", 400, "invalid_id"),
        ("GET", "/v1/checkpoints?history=../x", b"", 400, "invalid_id"),
        ("GET", "/v1/checkpoints/%2e%2e/files/etc/passwd", b"", 400, "invalid_id"),
        # Queries.
        ("GET", "/v1/checkpoints?include_auto=maybe", b"", 400, "bad_request"),
        ("GET", "/v1/checkpoints?bogus=1", b"", 400, "bad_request"),
        ("GET", "/v1/checkpoints/v0/files/a?raw=1", b"", 400, "bad_request"),
        ("DELETE", "/v1/checkpoints/v0?dry_run=perhaps", b"", 400, "bad_request"),
        ("DELETE", "/v1/checkpoints/v0?force=1", b"", 400, "bad_request"),
        ("GET", "/v1/activity?limit=-1", b"", 400, "bad_request"),
        ("GET", "/v1/activity?limit=%C2%B2", b"", 400, "bad_request"),  # "²" is no digit
        ("GET", "/v1/activity?limit=" + "9" * 5000, b"", 400, "bad_request"),
        ("GET", "/v1/services/web/logs?lines=0", b"", 400, "bad_request"),
        ("GET", "/v1/jobs/x", b"", 400, "bad_request"),
        ("GET", "/v1/jobs/%D9%A3", b"", 400, "bad_request"),  # an Arabic-Indic three
        # Names.
        ("POST", "/v1/services/..%2Fetc/start", b"", 400, "bad_request"),
        ("GET", "/v1/services/-x/logs", b"", 400, "bad_request"),
        # Paths and methods.
        ("GET", "/v2/checkpoints", b"", 404, "unknown_path"),
        ("GET", "/", b"", 404, "unknown_path"),
        ("GET", "/v1/checkpoints/v0/restore/now", b"", 404, "unknown_path"),
        ("PUT", "/v1/checkpoints", b"", 405, "method_not_allowed"),
        ("GET", "/v1/checkpoint", b"", 405, "method_not_allowed"),
        ("PATCH", "/v1/checkpoints/v0", b"", 405, "method_not_allowed"),
        ("DELETE", "/v1/openapi.json", b"", 405, "method_not_allowed"),
    ],
)
def test_a_bad_request_is_a_problem_and_never_reaches_the_backend(
    method: str, target: str, body: bytes, status: int, code: str
) -> None:
    backend = FakeBackend()
    assert _problem(backend, method, target, body)[:2] == (status, code)
    assert [c for c, _ in backend.calls if c not in ROUTED_TO_BACKEND] == []


@pytest.mark.parametrize(
    ("method", "target", "body"),
    [
        ("GET", "/v1/checkpoints/v7", b""),
        ("GET", "/v1/checkpoints/auto-20200101T000000Z", b""),
        ("DELETE", "/v1/checkpoints/v7", b""),
        ("GET", "/v1/checkpoints/v7/diff", b""),
        ("GET", "/v1/checkpoints/v7/preview", b""),
        ("POST", "/v1/checkpoints/v7/restore", b""),
        ("POST", "/v1/checkpoints/v7/restore", b'{"paths": ["/a"]}'),
        ("POST", "/v1/checkpoints/v7/export", b'{"dest": "/tmp/x"}'),
        ("GET", "/v1/checkpoints/v7/files/a", b""),
    ],
)
def test_an_unknown_id_is_not_found(method: str, target: str, body: bytes) -> None:
    status, code, message = _problem(FakeBackend(), method, target, body)
    assert (status, code) == (404, "not_found")
    assert "v7" in message or "auto-" in message


def test_an_unknown_job_is_not_found() -> None:
    assert _problem(FakeBackend(), "GET", "/v1/jobs/999")[:2] == (404, "not_found")


def test_405_names_the_allowed_methods() -> None:
    answer = request(FakeBackend(), "PUT", "/v1/checkpoints/v0")
    assert (answer.status, answer.headers["allow"]) == (405, "DELETE, GET")


def test_good_requests_reach_the_backend_with_checked_values() -> None:
    backend = FakeBackend()
    assert request(backend, "GET", "/v1/checkpoints?includeAuto=1&history=v0").status == 200
    body = json.dumps({"paths": ["/a", "/b c"], "created_by": "agent/1"}).encode()
    assert request(backend, "POST", "/v1/checkpoints/v0/restore", body).status == 202
    answer = request(backend, "POST", "/v1/checkpoint", b'{"comment": "x", "auto": true}')
    events = [json.loads(line) for line in answer.body.splitlines()]
    jsonschema.validate(events[-1], {**shapes.json_schema(shapes.Event)})
    request(backend, "DELETE", "/v1/checkpoints/v0?dry_run=1")
    request(backend, "GET", "/v1/activity?limit=7&action=create")
    assert backend.calls == [
        ("checkpoints_json", (True, "v0")),
        ("restore_paths", ("v0", ["/a", "/b c"], "agent/1")),
        ("create", ("x", "api", True, None)),
        ("delete", ("v0", "api", True)),
        ("activity_entries", (7, "create")),
    ]


def test_a_path_reaches_the_backend_as_its_raw_bytes() -> None:
    # Decoded once, after matching: a name that is not UTF-8 stays itself, "%2F" is a
    # slash inside the path (the engine refuses ".." and symlinks on the way).
    backend = FakeBackend()
    answer = request(backend, "GET", "/v1/checkpoints/v0/files/dir/caf%E9%2Fx/../y")
    assert (answer.status, answer.body) == (200, b"one")
    assert answer.headers["content-type"] == "application/octet-stream"
    assert backend.calls == [("read_path", ("v0", b"/dir/caf\xe9/x/../y"))]
    request(backend, "GET", "/v1/checkpoints/v0/files")
    assert backend.calls[-1] == ("read_path", ("v0", b"/"))


def test_a_bad_request_leaves_the_connection_serving_the_next() -> None:
    head = "Host: sprite\r\n"
    raw = (
        f"POST /v1/checkpoint HTTP/1.1\r\n{head}Content-Length: 9\r\n\r\n{{not json"
        f"GET /v1/status HTTP/1.1\r\n{head}Connection: close\r\n\r\n"
    ).encode()
    answers = parse_answers(exchange(FakeBackend(), raw))
    assert [a.status for a in answers] == [400, 200]
    jsonschema.validate(answers[1].json(), shapes.json_schema(shapes.Status))


def test_the_openapi_document_lists_the_route_table() -> None:
    doc = request(FakeBackend(), "GET", "/v1/openapi.json").json()
    assert set(doc["paths"]) >= {
        "/v1/checkpoints",
        "/v1/checkpoint",
        "/v1/checkpoints/{id}",
        "/v1/checkpoints/{id}/files/{path}",
        "/v1/openapi.json",
    }
    create = doc["paths"]["/v1/checkpoint"]["post"]
    body = create["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/CreateRequest"}
    assert set(doc["components"]["schemas"]["CreateRequest"]["properties"]) == set(
        shapes.CreateRequest.__annotations__
    )
    params = {p["name"] for p in doc["paths"]["/v1/activity"]["get"]["parameters"]}
    assert params == {"limit", "action"}
