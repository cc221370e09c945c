"""``GET /v1/openapi.json`` against a real daemon: every route it serves is in the document,
nothing else is served, and real answers (JSON, NDJSON lines, problems) validate against
the document's schemas (issue 13, point 5)."""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import quote

import jsonschema
import pytest

from tests.helpers.daemon import write_file

pytestmark = pytest.mark.integration

SERVICE = b'command = "exec sleep 1000"\nrestart = "never"\n'


class Checked:
    """Requests by ``(method, template)``, each answer validated against the document."""

    def __init__(self, daemon: Any, doc: dict[str, Any]) -> None:
        self.daemon = daemon
        self.doc = doc
        self.covered: set[tuple[str, str]] = set()

    def __call__(
        self,
        method: str,
        template: str,
        body: Any = None,
        query: str = "",
        expect: int | None = None,
        **params: str,
    ) -> Any:
        path = template
        for name, value in params.items():
            path = path.replace("{" + name + "}", quote(value, safe="/" if name == "path" else ""))
        status, headers, raw = self.daemon.request(method, path + query, body)
        if expect is not None:
            assert status == expect, raw
        operation = self.doc["paths"][template][method.lower()]
        responses = operation["responses"]
        answer = responses.get(str(status)) or responses[f"{str(status)[0]}XX"]
        ctype = headers["content-type"].split(";")[0]
        schema = {**answer["content"][ctype]["schema"], "components": self.doc["components"]}
        validator = jsonschema.Draft202012Validator(schema)
        if ctype == "application/x-ndjson":
            value: Any = [json.loads(line) for line in raw.splitlines()]
            assert value, "an empty stream"
            for event in value:
                validator.validate(event)
            assert value[-1]["type"] in ("complete", "error")
        elif ctype == "application/octet-stream":
            value = raw
        else:
            value = json.loads(raw)
            validator.validate(value)
        self.covered.add((method, template))
        return value


def _operations(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(m.upper(), path) for path, ops in doc["paths"].items() for m in ops}


def test_every_route_is_documented_and_real_answers_validate(
    daemon_factory: Any, tmp_path: os.PathLike[str]
) -> None:
    d = daemon_factory()
    status, doc = d.json("GET", "/v1/openapi.json")
    assert status == 200
    assert doc["openapi"] == "3.1.0"
    for schema in doc["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)
    call = Checked(d, doc)
    call("GET", "/v1/openapi.json", expect=200)

    write_file(os.path.join(d.root, "etc/hosts"), b"127.0.0.1 localhost\n")
    write_file(os.path.join(d.root, "app/main.py"), b"print(1)\n")
    call("POST", "/v1/checkpoint", {"comment": "first"}, expect=200)
    write_file(os.path.join(d.root, "app/new.py"), b"x = 2\n")
    done = call("POST", "/v1/checkpoint", {"comment": "second", "created_by": "t"}, expect=200)
    assert done[-1]["id"] == "v1"

    call("GET", "/v1/status", expect=200)
    call("GET", "/v1/checkpoints", expect=200)
    listed = call("GET", "/v1/checkpoints", query="?include_auto=true", expect=200)
    assert [c["id"] for c in listed] == ["v1", "v0"]
    call("GET", "/v1/checkpoints/{id}", expect=200, id="v0")
    call("GET", "/v1/checkpoints/{id}", expect=404, id="v7")  # a Problem
    call("GET", "/v1/checkpoints/{id}/diff", expect=200, id="v0")
    diff = call("GET", "/v1/checkpoints/{id}/diff", query="?against=v1", expect=200, id="v0")
    assert diff["counts"]["added"] == 1  # (and /app's mtime: meta)
    call("GET", "/v1/checkpoints/{id}/preview", expect=200, id="v0")
    call("POST", "/v1/checkpoints/{id}/preview", {"paths": ["/app"]}, expect=200, id="v0")
    entry = call("GET", "/v1/checkpoints/{id}/files/{path}", expect=200, id="v1", path="/app")
    assert {e["name"] for e in entry["entries"]} == {"main.py", "new.py"}
    got = call("GET", "/v1/checkpoints/{id}/files/{path}", id="v1", path="/etc/hosts")
    assert got == b"127.0.0.1 localhost\n"
    dest = os.path.join(os.fspath(tmp_path), "out")
    call("POST", "/v1/checkpoints/{id}/export", {"dest": dest}, expect=202, id="v0")
    call("DELETE", "/v1/checkpoints/{id}", query="?dry_run=true", expect=200, id="v0")
    events = call("POST", "/v1/checkpoints/{id}/restore", expect=202, id="v0")
    undo = events[-1]["undo"]
    call("POST", "/v1/checkpoints/{id}/restore", {"paths": ["/app/new.py"]}, expect=202, id=undo)
    call("DELETE", "/v1/checkpoints/{id}", expect=200, id="v1")
    call("DELETE", "/v1/checkpoints/{id}", expect=409, id="v0")  # the active one
    call("POST", "/v1/reset", expect=409)  # no base image: a Problem
    call("GET", "/v1/activity", query="?limit=5", expect=200)
    job = events[-1]["job"]
    call("GET", "/v1/jobs/{n}", expect=200, n=str(job))
    call("GET", "/v1/jobs/{n}/events", expect=200, n=str(job))
    call("GET", "/v1/jobs/{n}", expect=404, n="999999")

    write_file(os.path.join(d.root, "etc/sprite/services/tick.toml"), SERVICE)
    services = call("GET", "/v1/services", expect=200)
    assert [s["name"] for s in services["services"]] == ["tick"]
    call("POST", "/v1/services/{name}/start", expect=200, name="tick")
    call("GET", "/v1/services/{name}/logs", query="?lines=5", expect=200, name="tick")
    call("POST", "/v1/services/{name}/stop", expect=200, name="tick")
    call("POST", "/v1/services/{name}/stop", expect=404, name="nope")

    assert call.covered == _operations(doc)


def test_the_document_is_what_is_served(daemon: Any) -> None:
    """A method the document leaves out of a path is refused (405, and ``Allow`` names the
    documented ones); a path it leaves out is unknown (404)."""
    _, doc = daemon.json("GET", "/v1/openapi.json")
    for template, operations in doc["paths"].items():
        path = template.replace("{id}", "v0").replace("{n}", "1").replace("{name}", "web")
        path = path.replace("{path}", "etc")
        status, headers, _ = daemon.request("PUT", path)
        assert status == 405, template
        documented = {m.upper() for m in operations}
        assert set(headers["allow"].split(", ")) == documented, template
    for path in ("/v1/openapi", "/v1/checkpoints/v0/files2", "/v2/status"):
        status, _, raw = daemon.request("GET", path)
        assert (status, json.loads(raw)["code"]) == (404, "unknown_path"), path
