"""API errors: a stable ``code``, a human ``message`` and the HTTP status, in one table.

Every error the API returns is the JSON object ``{"code", "message", "status"}`` (or, inside
a stream, an ``error`` event with ``code``). Clients branch on ``code``, never on text.
"""

from __future__ import annotations

import errno
import json
from typing import Any

from sprite_env.checkpoints.engine import ActiveCheckpoint
from sprite_env.checkpoints.registry import InvalidCheckpointId, UnknownCheckpoint
from sprite_env.errors import SnapshotError, SpriteError, StoreError, StoreLocked, UserError

#: code -> HTTP status. README and llm.txt copy this table.
STATUS: dict[str, int] = {
    "invalid_json": 400,
    "bad_request": 400,
    "invalid_id": 400,
    "invalid_comment": 400,
    "invalid_actor": 400,
    "invalid_path": 400,
    "not_found": 404,
    "unknown_path": 404,
    "method_not_allowed": 405,
    "request_timeout": 408,
    "active_checkpoint": 409,
    "quota_exceeded": 409,
    "no_base_image": 409,
    "no_remote": 409,
    "body_too_large": 413,
    "headers_too_large": 431,
    "store_error": 500,
    "io_error": 500,
    "internal": 500,
    "restore_failed": 500,
    "upload_failed": 502,
    "not_implemented": 501,
    "no_space": 507,
    "busy": 503,
    "stopping": 503,
}


class Problem(Exception):
    """An error to answer with; raised by handlers, turned into JSON by the server."""

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = STATUS[code]
        self.extra = extra

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "status": self.status, **self.extra}

    def body(self) -> bytes:
        return json.dumps(self.to_json()).encode() + b"\n"


def problem_for(error: BaseException) -> Problem:
    """The problem an exception from the engine (or anywhere) stands for."""
    if isinstance(error, Problem):
        return error
    if isinstance(error, UnknownCheckpoint):
        return Problem("not_found", str(error))
    if isinstance(error, InvalidCheckpointId):
        return Problem("invalid_id", str(error))
    if isinstance(error, ActiveCheckpoint):
        return Problem("active_checkpoint", str(error))
    if isinstance(error, StoreLocked):
        return Problem("busy", str(error))
    code = getattr(error, "code", None)
    if isinstance(error, SpriteError) and not isinstance(error, UserError) and code in STATUS:
        return Problem(code, str(error))  # e.g. a restore that failed part-way
    if isinstance(error, StoreError | SnapshotError):  # e.g. an unsafe name in a stored tree
        return Problem("store_error", str(error))
    if isinstance(error, UserError):
        code = getattr(error, "code", "bad_request")
        return Problem(code if code in STATUS else "bad_request", str(error))
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        where = f": {error.filename}" if error.filename else ""
        return Problem("no_space", f"{error.strerror}{where} (nothing was kept; free space)")
    if isinstance(error, OSError):
        return Problem("io_error", f"{error}")
    return Problem("internal", f"internal error: {type(error).__name__}: {error}")
