"""The route table's parts: what each endpoint takes and answers, in one declaration.

The router (``routes.py``) matches requests with it and checks their query and body
against it; the OpenAPI document (``openapi.py``) is written from it. One table, so a
route cannot be served without being documented, nor documented without being served.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from sprite_env.api.server import Request, Response, StreamResponse

Answer = Response | StreamResponse
Endpoint = Callable[[Request, dict[str, str]], Awaitable[Answer]]

#: An answer that is a job's NDJSON stream (one ``shapes.Event`` a line).
EVENTS = "events"
#: An answer that is a file's bytes (``application/octet-stream``), or a ``shapes.Entry``.
FILE = "file"


@dataclass(frozen=True)
class Param:
    """A query parameter: its name, JSON Schema and meaning."""

    name: str
    schema: dict[str, Any]
    description: str


@dataclass(frozen=True)
class Operation:
    """One method on one path.

    Attributes:
        run: the endpoint.
        summary: one line for the document.
        answer: the shape of the JSON it answers with (a ``shapes`` type), or
            :data:`EVENTS` or :data:`FILE`.
        status: the status of a good answer.
        body: the shape of the request's JSON body (a ``total=False`` TypedDict), or None
            when it takes none.
        query: the query parameters it takes; any other is refused (``bad_request``).
            None: the query is not looked at (Sprites' endpoints, as they always were).
    """

    run: Endpoint
    summary: str
    answer: Any
    status: int = 200
    body: Any = None
    query: tuple[Param, ...] | None = None


@dataclass(frozen=True)
class Route:
    """A path template (``/v1/checkpoints/{id}``) and its operations by method.

    A ``{name}`` is one path segment; a trailing ``/{path}`` is the rest of the path,
    slashes and all, and may be missing (the root).
    """

    template: str
    methods: dict[str, Operation]
    pattern: re.Pattern[str] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        text = self.template
        tail = ""
        if text.endswith("/{path}"):
            text, tail = text[: -len("/{path}")], r"(?P<path>(?:/.*)?)"
        regex = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(text)) + tail
        object.__setattr__(self, "pattern", re.compile(regex))

    @property
    def params(self) -> list[str]:
        """The names of its path parameters, in order."""
        return re.findall(r"\{(\w+)\}", self.template)
