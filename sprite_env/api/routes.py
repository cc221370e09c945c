"""The API's endpoints: parse and check the request, call the backend, shape the answer.

Everything a client can get wrong is caught here and answered with a problem (see
``problems.py``): unknown paths and methods, ill-formed ids, malformed or oversized JSON,
unknown fields, wrong types. The backend (``backend.py``: the daemon, or a test's fake)
sees only checked values. The route table declares each endpoint's query, body and answer
(``table.py``, in the words of ``shapes.py``): the router checks requests against it and
``GET /v1/openapi.json`` is written from it.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, unquote_to_bytes

from sprite_env.actor import clean_actor
from sprite_env.api import openapi, shapes
from sprite_env.api.pacing import Pacer
from sprite_env.api.problems import Problem
from sprite_env.api.server import Request, Response, StreamResponse
from sprite_env.api.table import EVENTS, FILE, Answer, Operation, Param, Route
from sprite_env.checkpoints.registry import validate_id
from sprite_env.errors import UserError
from sprite_env.services import validate_name

if TYPE_CHECKING:
    from sprite_env.api.backend import Backend, JobHandle


def json_response(value: Any, status: int = 200) -> Response:
    return Response(status, json.dumps(value).encode() + b"\n")


def _body(req: Request, shape: Any) -> dict[str, Any]:
    """The request's JSON object (empty body: {}), with only the fields of ``shape`` (a
    ``shapes`` request TypedDict), each of its type."""
    allowed = shapes.field_types(shape)
    if not req.body.strip():
        return {}
    try:
        value = json.loads(req.body)
    except (ValueError, UnicodeDecodeError) as e:
        raise Problem("invalid_json", f"request body is not valid JSON: {e}") from None
    except RecursionError:  # json's decoder recurses per level: 60,000 "[" reach the limit
        raise Problem("invalid_json", "request body is nested too deeply") from None
    if not isinstance(value, dict):
        raise Problem("invalid_json", "request body must be a JSON object")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise Problem(
            "bad_request", f"unknown field {unknown[0]!r}; known: {', '.join(sorted(allowed))}"
        )
    for key, kind in allowed.items():
        if key in value and value[key] is not None and not isinstance(value[key], kind):
            raise Problem("bad_request", f"field {key!r} must be a {kind.__name__}")
    return value


#: Paths one request may name, and the length of each (PATH_MAX).
MAX_PATHS = 1000
MAX_PATH = 4096


def _paths(body: dict[str, Any]) -> list[str]:
    """The ``paths`` field: non-empty strings, at most ``MAX_PATHS`` of ``MAX_PATH``."""
    paths = body.get("paths") or []
    if len(paths) > MAX_PATHS:
        raise Problem("bad_request", f"at most {MAX_PATHS} paths in one request")
    for path in paths:
        if not isinstance(path, str) or not path or len(path) > MAX_PATH:
            raise Problem(
                "bad_request", f"each of 'paths' must be a path of 1 to {MAX_PATH} characters"
            )
    return list(paths)


def _flag(req: Request, *names: str) -> bool:
    for name in names:
        raw = req.query.get(name)
        if raw is None:
            continue
        if raw.lower() in ("", "1", "true", "yes"):
            return True
        if raw.lower() in ("0", "false", "no"):
            return False
        raise Problem("bad_request", f"query parameter {name} must be true or false, not {raw!r}")
    return False


def _check_query(req: Request, allowed: set[str]) -> None:
    unknown = sorted(set(req.query) - allowed)
    if unknown:
        raise Problem("bad_request", f"unknown query parameter {unknown[0]!r}")


def _id(raw: str) -> str:
    validate_id(raw)
    return raw


#: A number in a path or a query: ASCII digits only (``int()`` and ``str.isdigit()`` also
#: take "²" or "٣"), and few of them (``int()`` refuses more than 4,300).
_NUMBER = re.compile(r"[0-9]{1,18}")


def _number(raw: str, what: str, low: int, high: int) -> int:
    if _NUMBER.fullmatch(raw) is None or not low <= int(raw) <= high:
        raise Problem(
            "bad_request", f"{what} must be a number from {low} to {high}, not {raw[:40]!r}"
        )
    return int(raw)


def _utf8(header: str | None) -> str | None:
    """A header's text: UTF-8 if its bytes are (the client and curl send UTF-8), else
    latin-1 as the server decoded it."""
    if header is None:
        return None
    try:
        return header.encode("latin-1").decode("utf-8")
    except UnicodeDecodeError:
        return header


_FILES_ROUTE = "/v1/checkpoints/{id}/files/{path}"
_FLAG = {"type": "string", "enum": ["true", "false", "1", "0", "yes", "no", ""]}
_ID_PARAM = {"type": "string"}
_COUNT = {"type": "string", "pattern": "^[0-9]{1,18}$"}


class Router:
    """Maps ``(method, path)`` to an endpoint; 404 for unknown paths, 405 for methods."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.pacer = Pacer(backend.busy)
        op, b = Operation, shapes
        self.routes: list[Route] = [
            Route("/v1/status", {"GET": op(self.status, "the daemon's state", b.Status)}),
            Route(
                "/v1/openapi.json",
                {"GET": op(self.openapi, "this document (OpenAPI 3.1)", dict[str, Any])},
            ),
            Route(
                "/v1/checkpoints",
                {
                    "GET": op(
                        self.list,
                        "the checkpoints, newest first",
                        list[b.Checkpoint],
                        query=(
                            Param("include_auto", _FLAG, "also the automatic checkpoints"),
                            Param("includeAuto", _FLAG, "include_auto, as Sprites spells it"),
                            Param("history", _ID_PARAM, "only this one and its descendants"),
                        ),
                    )
                },
            ),
            Route(
                "/v1/checkpoint",
                {
                    "POST": op(
                        self.create,
                        "take a checkpoint (goes on if the client leaves)",
                        EVENTS,
                        body=b.CreateRequest,
                    )
                },
            ),
            Route(
                "/v1/checkpoints/{id}",
                {
                    "GET": op(self.info, "one checkpoint", b.Checkpoint),
                    "DELETE": op(
                        self.delete,
                        "delete a checkpoint and free its space (not the active one)",
                        b.DeleteReport,
                        query=(Param("dry_run", _FLAG, "only say what it would free"),),
                    ),
                },
            ),
            Route(
                "/v1/checkpoints/{id}/restore",
                {
                    "POST": op(
                        self.restore,
                        "restore the layer (or only paths) as in the checkpoint, after an "
                        "undo checkpoint",
                        EVENTS,
                        status=202,
                        body=b.RestoreRequest,
                    )
                },
            ),
            Route(
                "/v1/checkpoints/{id}/preview",
                {
                    "GET": op(self.preview, "what a restore would change", b.Preview),
                    "POST": op(
                        self.preview,
                        "what a restore of paths would change",
                        b.Preview,
                        body=b.PreviewRequest,
                    ),
                },
            ),
            Route(
                _FILES_ROUTE,
                {"GET": op(self.files, "a path as in the checkpoint", FILE, query=())},
            ),
            Route(
                "/v1/checkpoints/{id}/export",
                {
                    "POST": op(
                        self.export,
                        "write the checkpoint (or paths) into a new directory",
                        EVENTS,
                        status=202,
                        body=b.ExportRequest,
                    )
                },
            ),
            Route(
                "/v1/checkpoints/{id}/diff",
                {
                    "GET": op(
                        self.diff,
                        "what changed from the checkpoint to another or the live layer",
                        b.Diff,
                        query=(Param("against", _ID_PARAM, "the other checkpoint"),),
                    )
                },
            ),
            Route(
                "/v1/reset",
                {
                    "POST": op(
                        self.reset,
                        "the layer back to its base image, after an undo checkpoint",
                        EVENTS,
                        status=202,
                        body=b.ResetRequest,
                    )
                },
            ),
            Route(
                "/v1/activity",
                {
                    "GET": op(
                        self.activity,
                        "the activity log, newest first",
                        list[b.ActivityEntry],
                        query=(
                            Param("limit", _COUNT, "at most this many (1 to 10000; 100)"),
                            Param("action", {"type": "string"}, "only this action"),
                        ),
                    )
                },
            ),
            Route("/v1/jobs/{n}", {"GET": op(self.job, "a job", b.Job)}),
            Route(
                "/v1/jobs/{n}/events",
                {"GET": op(self.job_events, "a job's events, from the first", EVENTS)},
            ),
            Route(
                "/v1/services", {"GET": op(self.services, "the environment's services", b.Services)}
            ),
            Route(
                "/v1/services/{name}/start",
                {"POST": op(self.service_start, "start a service", dict[str, Any])},
            ),
            Route(
                "/v1/services/{name}/stop",
                {"POST": op(self.service_stop, "stop a service", dict[str, Any])},
            ),
            Route(
                "/v1/services/{name}/logs",
                {
                    "GET": op(
                        self.service_logs,
                        "a service's last lines",
                        b.ServiceLogs,
                        query=(Param("lines", _COUNT, "how many (1 to 100000; 100)"),),
                    )
                },
            ),
        ]
        self._document: bytes | None = None

    async def handle(self, req: Request) -> Answer:
        await self.pacer.admit()
        path = req.path.rstrip("/") or "/"
        for route in self.routes:
            m = route.pattern.fullmatch(path)
            if m is None:
                continue
            # HEAD is GET without the body (the server leaves the body out).
            operation = route.methods.get("GET" if req.method == "HEAD" else req.method)
            if operation is None:
                allowed = ", ".join(sorted(route.methods))
                problem = Problem(
                    "method_not_allowed", f"{req.method} not allowed on {path}; use {allowed}"
                )
                return Response(405, problem.body(), headers=[("allow", allowed)])
            if operation.query is not None:
                _check_query(req, {p.name for p in operation.query})
            # Segments are decoded after matching: "..%2Fetc" is one (invalid) id, not a path.
            return await operation.run(req, {k: unquote(v) for k, v in m.groupdict().items()})
        raise Problem(
            "unknown_path", f"no endpoint {unquote(path)}; see GET /v1/status and llm.txt"
        )

    def _actor(self, req: Request, body: dict[str, Any] | None = None) -> str:
        named = (body or {}).get("created_by") or _utf8(req.headers.get("x-sprite-actor"))
        try:
            return clean_actor(named, "api")
        except UserError as e:
            raise Problem("invalid_actor", str(e)) from None

    # -- endpoints -------------------------------------------------------------------------

    async def status(self, req: Request, _: dict[str, str]) -> Answer:
        return json_response(await self.backend.status())

    async def openapi(self, req: Request, _: dict[str, str]) -> Answer:
        if self._document is None:  # the same for the daemon's life: written once
            self._document = json.dumps(openapi.document(self.routes)).encode() + b"\n"
        return Response(200, self._document)

    async def list(self, req: Request, _: dict[str, str]) -> Answer:
        history = req.query.get("history") or None
        if history is not None:
            _id(history)
        include_auto = _flag(req, "include_auto", "includeAuto")
        body = await self.backend.checkpoints_json(include_auto, history)
        return Response(200, body, shareable=True)  # the front may repeat it (front.py)

    async def info(self, req: Request, p: dict[str, str]) -> Answer:
        return Response(200, await self.backend.info_json(_id(p["id"])), shareable=True)

    async def create(self, req: Request, _: dict[str, str]) -> Answer:
        body = _body(req, shapes.CreateRequest)
        job = await self.backend.create(
            body.get("comment") or "",
            self._actor(req, body),
            auto=bool(body.get("auto")),
            reason=body.get("reason"),
            wait_remote=bool(body.get("wait_remote")),
        )
        return StreamResponse(200, job.stream())

    async def restore(self, req: Request, p: dict[str, str]) -> Answer:
        body = _body(req, shapes.RestoreRequest)
        paths = _paths(body)
        if paths:  # only those files or subtrees (issue 10, point 5)
            job = await self.backend.restore_paths(_id(p["id"]), paths, self._actor(req, body))
            return StreamResponse(202, job.stream())
        job = await self.backend.restore(_id(p["id"]), self._actor(req, body))
        return StreamResponse(202, job.stream())

    async def reset(self, req: Request, _: dict[str, str]) -> Answer:
        body = _body(req, shapes.ResetRequest)
        job = await self.backend.reset(self._actor(req, body))
        return StreamResponse(202, job.stream())

    async def delete(self, req: Request, p: dict[str, str]) -> Answer:
        dry = req.query.get("dry_run", "false")
        if dry not in ("true", "false", "1", "0"):
            raise Problem("bad_request", f"dry_run must be true or false, not {dry!r}")
        return json_response(
            await self.backend.delete(_id(p["id"]), self._actor(req), dry_run=dry in ("true", "1"))
        )

    async def preview(self, req: Request, p: dict[str, str]) -> Answer:
        paths = _paths(_body(req, shapes.PreviewRequest)) if req.method == "POST" else []
        if paths:
            cid = _id(p["id"])
            return json_response(await self.backend.preview_paths(cid, paths, self._actor(req)))
        return json_response(await self.backend.preview(_id(p["id"]), self._actor(req)))

    async def files(self, req: Request, p: dict[str, str]) -> Answer:
        """A file's bytes (``application/octet-stream`` with its Content-Length), or the
        JSON of any other entry (a directory with its entries)."""
        # The raw bytes of the path: a name need not be UTF-8 (unquote would replace it).
        m = _FILES.fullmatch(req.path.rstrip("/"))
        assert m is not None  # the router matched it
        path = unquote_to_bytes(m.group("path")) or b"/"
        got = await self.backend.read_path(_id(p["id"]), path)
        if isinstance(got, dict):
            return json_response(got)
        return StreamResponse(200, got.blocks, "application/octet-stream", length=got.size)

    async def export(self, req: Request, p: dict[str, str]) -> Answer:
        body = _body(req, shapes.ExportRequest)
        dest = body.get("dest")
        if not dest:
            raise Problem("bad_request", "field 'dest' (an absolute directory) is required")
        job = await self.backend.export(
            _id(p["id"]), dest, _paths(body), self._actor(req, body), uid=req.peer_uid
        )
        return StreamResponse(202, job.stream())

    async def diff(self, req: Request, p: dict[str, str]) -> Answer:
        against = req.query.get("against") or None
        if against is not None:
            _id(against)
        return json_response(await self.backend.diff(_id(p["id"]), against, self._actor(req)))

    async def activity(self, req: Request, _: dict[str, str]) -> Answer:
        limit = _number(req.query.get("limit", "100"), "limit", 1, 10_000)
        entries = await self.backend.activity_entries(limit, req.query.get("action") or None)
        return json_response(entries)

    def _job(self, raw: str) -> JobHandle:
        number = _number(raw, "the job number", 1, 10**18 - 1)
        job = self.backend.job(number)
        if job is None:
            raise Problem("not_found", f"no job {number} (finished jobs are kept for a while)")
        return job

    async def job(self, req: Request, p: dict[str, str]) -> Answer:
        return json_response(self._job(p["n"]).to_json())

    async def job_events(self, req: Request, p: dict[str, str]) -> Answer:
        return StreamResponse(200, self._job(p["n"]).stream())

    # -- services --------------------------------------------------------------------------

    async def services(self, req: Request, _: dict[str, str]) -> Answer:
        return json_response(await self.backend.services())

    async def service_start(self, req: Request, p: dict[str, str]) -> Answer:
        return json_response(await self.backend.service_start(validate_name(p["name"])))

    async def service_stop(self, req: Request, p: dict[str, str]) -> Answer:
        return json_response(await self.backend.service_stop(validate_name(p["name"])))

    async def service_logs(self, req: Request, p: dict[str, str]) -> Answer:
        count = _number(req.query.get("lines", "100"), "lines", 1, 100_000)
        return json_response(await self.backend.service_logs(validate_name(p["name"]), count))


#: The files route's pattern: the path's raw bytes are read from it (see ``files``).
_FILES = Route(_FILES_ROUTE, {}).pattern
