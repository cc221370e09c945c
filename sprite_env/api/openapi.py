"""The API as an OpenAPI 3.1 document (``GET /v1/openapi.json``), written from the router's
route table (``table.py``) and the shapes (``shapes.py``): nothing in it is typed twice.

OpenAPI 3.1's schemas are JSON Schema 2020-12, so a client validates an answer with any
JSON Schema validator against ``components/schemas``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sprite_env import __version__
from sprite_env.api import shapes
from sprite_env.api.table import EVENTS, FILE

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sprite_env.api.table import Operation, Route

_PATH_PARAMS = {
    "id": "a checkpoint id (v3, auto-20261129T081500Z)",
    "n": "a job number",
    "name": "a service's name",
    "path": "a path inside the checkpoint, slashes and all (empty: the root)",
}


def ref(name: str) -> str:
    return f"#/components/schemas/{name}"


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _answer(op: Operation) -> dict[str, Any]:
    if op.answer == EVENTS:
        return {
            "description": "a job's events as NDJSON, one Event a line, the last "
            "complete or error; the job goes on if the client leaves",
            "content": {"application/x-ndjson": {"schema": {"$ref": ref("Event")}}},
        }
    if op.answer == FILE:
        return {
            "description": "a file's bytes; anything else (a directory), its Entry",
            "content": {
                "application/octet-stream": {"schema": {"type": "string"}},
                **_json({"$ref": ref("Entry")}),
            },
        }
    return {"description": op.summary, "content": _json(shapes.json_schema(op.answer, ref))}


def _operation(route: Route, method: str, op: Operation) -> dict[str, Any]:
    params: list[dict[str, Any]] = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "description": _PATH_PARAMS.get(name, name),
            "schema": {"type": "string"},
        }
        for name in route.params
    ]
    params += [
        {"name": p.name, "in": "query", "description": p.description, "schema": p.schema}
        for p in op.query or ()
    ]
    problem = {"description": "a problem", "content": _json({"$ref": ref("Problem")})}
    out: dict[str, Any] = {
        "operationId": f"{method.lower()}_{_slug(route.template)}",
        "summary": op.summary,
        "parameters": params,
        "responses": {str(op.status): _answer(op), "4XX": problem, "5XX": problem},
    }
    if op.body is not None:
        out["requestBody"] = {
            "required": False,
            "content": _json({"$ref": ref(op.body.__name__)}),
        }
    return out


def _slug(template: str) -> str:
    words = [w.strip("{}") for w in template.split("/")[2:] if w]
    return "_".join(words).replace(".", "_") or "root"


def document(routes: Iterable[Route]) -> dict[str, Any]:
    """The OpenAPI document of ``routes``, with every shape as a component."""
    paths: dict[str, Any] = {}
    for route in routes:
        paths[route.template] = {
            method.lower(): _operation(route, method, op) for method, op in route.methods.items()
        }
    schemas = {s.__name__: shapes.component_schema(s, ref) for s in shapes.SHAPES}
    schemas["Event"] = shapes.json_schema(shapes.Event, ref)
    return {
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "info": {
            "title": "sprite-env",
            "version": __version__,
            "description": "Checkpoints of this environment's filesystem, over the Unix "
            "socket STATE/api.sock (curl --unix-socket /.sprite/api.sock http://sprite/...)."
            " Errors are a Problem with a stable code; jobs answer with NDJSON events.",
        },
        "servers": [{"url": "http://sprite"}],
        "paths": paths,
        "components": {"schemas": schemas},
    }
