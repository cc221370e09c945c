"""NDJSON progress events: how they are made (their shapes are ``shapes.py``'s ``Event``).

Every line is one JSON object with ``type`` and ``time`` (RFC 3339, UTC) and the ``job``
number, as on Sprites' management socket (the offline CLI's, which run in no job, have
none):

==========  ==============================================================================
type        fields
==========  ==============================================================================
info        ``data``: a human line ("Saving filesystem state...")
progress    ``phase`` (capture, restore, prune) and that phase's counters (files, bytes, ...)
complete    ``data``: a human line; ``id``; more per job (``checkpoint``, ``undo``, ``stats``)
error       ``error``: a human message; ``code``: a stable error code
==========  ==============================================================================

The last line of a stream is always ``complete`` or ``error``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

Event = dict[str, Any]

TERMINAL = frozenset({"complete", "error"})


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _event(type_: str, job: int | None, fields: dict[str, Any]) -> Event:
    numbered = {} if job is None else {"job": job}
    return {"type": type_, "time": now_rfc3339(), **numbered, **fields}


def info(job: int | None, text: str, **extra: Any) -> Event:
    return _event("info", job, {"data": text, **extra})


def progress(job: int | None, phase: str, counters: dict[str, Any]) -> Event:
    return _event("progress", job, {"phase": phase, **counters})


def complete(job: int | None, text: str, **extra: Any) -> Event:
    return _event("complete", job, {"data": text, **extra})


def error(job: int | None, message: str, code: str) -> Event:
    return _event("error", job, {"error": message, "code": code})


def encode(event: Event) -> bytes:
    """One NDJSON line. ASCII-only JSON: a non-UTF-8 file name travels as \\udcXX escapes
    (Python's surrogateescape), which every JSON parser accepts."""
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"
