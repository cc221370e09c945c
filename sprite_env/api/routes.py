"""The API's endpoints: parse and check the request, call the daemon, shape the answer.

Everything a client can get wrong is caught here and answered with a problem (see
``problems.py``): unknown paths and methods, ill-formed ids, malformed or oversized JSON,
unknown fields, wrong types. The daemon's methods see only checked values.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, unquote_to_bytes

import trio

from sprite_env.actor import clean_actor
from sprite_env.api.pacing import Pacer
from sprite_env.api.problems import Problem
from sprite_env.api.server import Request, Response, StreamResponse
from sprite_env.checkpoints.registry import validate_id
from sprite_env.errors import UserError
from sprite_env.services import validate_name

if TYPE_CHECKING:
    from sprite_env.daemon.service import Daemon

Answer = Response | StreamResponse
Endpoint = Callable[[Request, dict[str, str]], Awaitable[Answer]]

_ID = r"(?P<id>[^/]+)"


def json_response(value: Any, status: int = 200) -> Response:
    return Response(status, json.dumps(value).encode() + b"\n")


def _body(req: Request, allowed: dict[str, type]) -> dict[str, Any]:
    """The request's JSON object (empty body: {}), with only ``allowed`` fields and types."""
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


#: ``/v1/checkpoints/{id}/files/{path}``: the path may hold slashes (and be empty: the root).
_FILES = re.compile(rf"/v1/checkpoints/{_ID}/files(?P<path>(?:/.*)?)")
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


class Router:
    """Maps ``(method, path)`` to an endpoint; 404 for unknown paths, 405 for methods."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.pacer = Pacer(lambda: daemon.jobs.running is not None)
        self.routes: list[tuple[re.Pattern[str], dict[str, Endpoint]]] = [
            (re.compile(r"/v1/status"), {"GET": self.status}),
            (re.compile(r"/v1/checkpoints"), {"GET": self.list}),
            (re.compile(r"/v1/checkpoint"), {"POST": self.create}),
            (re.compile(rf"/v1/checkpoints/{_ID}"), {"GET": self.info, "DELETE": self.delete}),
            (re.compile(rf"/v1/checkpoints/{_ID}/restore"), {"POST": self.restore}),
            (
                re.compile(rf"/v1/checkpoints/{_ID}/preview"),
                {"GET": self.preview, "POST": self.preview},
            ),
            (_FILES, {"GET": self.files}),
            (re.compile(rf"/v1/checkpoints/{_ID}/export"), {"POST": self.export}),
            (re.compile(rf"/v1/checkpoints/{_ID}/diff"), {"GET": self.diff}),
            (re.compile(r"/v1/reset"), {"POST": self.reset}),
            (re.compile(r"/v1/activity"), {"GET": self.activity}),
            (re.compile(r"/v1/jobs/(?P<n>[^/]+)"), {"GET": self.job}),
            (re.compile(r"/v1/jobs/(?P<n>[^/]+)/events"), {"GET": self.job_events}),
            (re.compile(r"/v1/services"), {"GET": self.services}),
            (re.compile(r"/v1/services/(?P<name>[^/]+)/start"), {"POST": self.service_start}),
            (re.compile(r"/v1/services/(?P<name>[^/]+)/stop"), {"POST": self.service_stop}),
            (re.compile(r"/v1/services/(?P<name>[^/]+)/logs"), {"GET": self.service_logs}),
        ]

    async def handle(self, req: Request) -> Answer:
        await self.pacer.admit()
        path = req.path.rstrip("/") or "/"
        for pattern, methods in self.routes:
            m = pattern.fullmatch(path)
            if m is None:
                continue
            # HEAD is GET without the body (the server leaves the body out).
            endpoint = methods.get("GET" if req.method == "HEAD" else req.method)
            if endpoint is None:
                allowed = ", ".join(sorted(methods))
                problem = Problem(
                    "method_not_allowed", f"{req.method} not allowed on {path}; use {allowed}"
                )
                return Response(405, problem.body(), headers=[("allow", allowed)])
            # Segments are decoded after matching: "..%2Fetc" is one (invalid) id, not a path.
            return await endpoint(req, {k: unquote(v) for k, v in m.groupdict().items()})
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
        return json_response(await self.daemon.status())

    async def list(self, req: Request, _: dict[str, str]) -> Answer:
        _check_query(req, {"include_auto", "includeAuto", "history"})
        history = req.query.get("history") or None
        if history is not None:
            _id(history)
        include_auto = _flag(req, "include_auto", "includeAuto")
        return Response(200, await self.daemon.checkpoints_json(include_auto, history))

    async def info(self, req: Request, p: dict[str, str]) -> Answer:
        return Response(200, await self.daemon.info_json(_id(p["id"])))

    async def create(self, req: Request, _: dict[str, str]) -> Answer:
        body = _body(req, {"comment": str, "auto": bool, "reason": str, "created_by": str})
        job = await self.daemon.create(
            body.get("comment") or "",
            self._actor(req, body),
            auto=bool(body.get("auto")),
            reason=body.get("reason"),
        )
        return StreamResponse(200, job.stream())

    async def restore(self, req: Request, p: dict[str, str]) -> Answer:
        body = _body(req, {"created_by": str, "paths": list})
        paths = _paths(body)
        if paths:  # only those files or subtrees (issue 10, point 5)
            job = await self.daemon.restore_paths(_id(p["id"]), paths, self._actor(req, body))
            return StreamResponse(202, job.stream())
        job = await self.daemon.restore(_id(p["id"]), self._actor(req, body))
        return StreamResponse(202, job.stream())

    async def reset(self, req: Request, _: dict[str, str]) -> Answer:
        body = _body(req, {"created_by": str})
        job = await self.daemon.reset(self._actor(req, body))
        return StreamResponse(202, job.stream())

    async def delete(self, req: Request, p: dict[str, str]) -> Answer:
        _check_query(req, {"dry_run"})
        dry = req.query.get("dry_run", "false")
        if dry not in ("true", "false", "1", "0"):
            raise Problem("bad_request", f"dry_run must be true or false, not {dry!r}")
        return json_response(
            await self.daemon.delete(_id(p["id"]), self._actor(req), dry_run=dry in ("true", "1"))
        )

    async def preview(self, req: Request, p: dict[str, str]) -> Answer:
        paths = _paths(_body(req, {"paths": list})) if req.method == "POST" else []
        if paths:
            cid = _id(p["id"])
            return json_response(await self.daemon.preview_paths(cid, paths, self._actor(req)))
        return json_response(await self.daemon.preview(_id(p["id"]), self._actor(req)))

    async def files(self, req: Request, p: dict[str, str]) -> Answer:
        """A file's bytes (``application/octet-stream`` with its Content-Length), or the
        JSON of any other entry (a directory with its entries)."""
        _check_query(req, set())
        m = _FILES.fullmatch(req.path.rstrip("/"))
        assert m is not None  # the router matched it
        # The raw bytes of the path: a name need not be UTF-8 (unquote would replace it).
        path = unquote_to_bytes(m.group("path")) or b"/"
        got = await self.daemon.read_path(_id(p["id"]), path)
        if isinstance(got, dict):
            return json_response(got)
        return StreamResponse(200, got.blocks, "application/octet-stream", length=got.size)

    async def export(self, req: Request, p: dict[str, str]) -> Answer:
        body = _body(req, {"dest": str, "paths": list, "created_by": str})
        dest = body.get("dest")
        if not dest:
            raise Problem("bad_request", "field 'dest' (an absolute directory) is required")
        job = await self.daemon.export(
            _id(p["id"]), dest, _paths(body), self._actor(req, body), uid=req.peer_uid
        )
        return StreamResponse(202, job.stream())

    async def diff(self, req: Request, p: dict[str, str]) -> Answer:
        _check_query(req, {"against"})
        against = req.query.get("against") or None
        if against is not None:
            _id(against)
        return json_response(await self.daemon.diff(_id(p["id"]), against, self._actor(req)))

    async def activity(self, req: Request, _: dict[str, str]) -> Answer:
        _check_query(req, {"limit", "action"})
        limit = _number(req.query.get("limit", "100"), "limit", 1, 10_000)
        entries = await self.daemon.activity_entries(limit, req.query.get("action") or None)
        return json_response(entries)

    def _job(self, raw: str) -> Any:
        number = _number(raw, "the job number", 1, 10**18 - 1)
        job = self.daemon.jobs.get(number)
        if job is None:
            raise Problem("not_found", f"no job {number} (finished jobs are kept for a while)")
        return job

    async def job(self, req: Request, p: dict[str, str]) -> Answer:
        return json_response(self._job(p["n"]).to_json())

    async def job_events(self, req: Request, p: dict[str, str]) -> Answer:
        return StreamResponse(200, self._job(p["n"]).stream())

    # -- services --------------------------------------------------------------------------

    async def services(self, req: Request, _: dict[str, str]) -> Answer:
        sup = self.daemon.env.supervisor
        await sup.reload()
        return json_response({"services": sup.status(), "errors": sup.definition_errors})

    async def service_start(self, req: Request, p: dict[str, str]) -> Answer:
        return json_response(await self.daemon.env.supervisor.start(validate_name(p["name"])))

    async def service_stop(self, req: Request, p: dict[str, str]) -> Answer:
        return json_response(await self.daemon.env.supervisor.stop(validate_name(p["name"])))

    async def service_logs(self, req: Request, p: dict[str, str]) -> Answer:
        _check_query(req, {"lines"})
        count = _number(req.query.get("lines", "100"), "lines", 1, 100_000)
        name = validate_name(p["name"])
        sup = self.daemon.env.supervisor
        lines = await trio.to_thread.run_sync(sup.logs, name, count)
        return json_response({"name": name, "lines": lines})
