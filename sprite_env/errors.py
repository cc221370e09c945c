"""The exception tree of sprite-env, and the exit code each kind maps to.

Every error a user can meet is a :class:`SpriteError`; its ``exit_code`` is what the command
line exits with (the map is documented in ``cli/main.py``). ``UserError`` and its kin are
printed without a traceback.
"""

from __future__ import annotations


class SpriteError(Exception):
    """Base of every error raised on purpose by sprite-env."""

    exit_code: int = 1

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message


class UserError(SpriteError):
    """Bad input from the user: shown as one line, no traceback."""

    exit_code = 2


class StoreError(SpriteError):
    """The store cannot do what was asked (damage, locking, format)."""

    exit_code = 3


class NotAStore(StoreError):
    """A directory that is not a store (or of a format this version cannot read)."""


class StoreLocked(StoreError):
    """Another process holds the store's writer lock."""

    exit_code = 4

    def __init__(self, path: str, pid: int | None) -> None:
        who = f"pid {pid}" if pid else "another process"
        super().__init__(f"store {path} is locked by {who}")
        self.pid = pid


class ObjectNotFound(StoreError):
    """An object id the catalog does not know."""

    def __init__(self, object_id: bytes) -> None:
        super().__init__(f"object {object_id.hex()} not found in the catalog")
        self.object_id = object_id


class CorruptPack(StoreError):
    """A pack whose bytes do not match what the catalog or its own table says."""

    def __init__(self, pack: str, offset: int | None, reason: str) -> None:
        where = f"pack {pack}" + (f" at offset {offset}" if offset is not None else "")
        super().__init__(f"corrupt {where}: {reason}")
        self.pack = pack
        self.offset = offset
        self.reason = reason


class CorruptObject(StoreError):
    """An object whose bytes read back fine but do not parse (a tree, a chunk list)."""


class SnapshotError(SpriteError):
    """Capture, restore or diff failed as a whole."""


#: The exit code of each error ``code`` the API answers with (see ``cli/main.py``); codes
#: not listed (``internal``, ``request_timeout``, unknown ones) exit 1.
_API_EXIT_CODES: dict[str, int] = {
    **dict.fromkeys(
        (
            "invalid_json",
            "bad_request",
            "invalid_id",
            "invalid_comment",
            "invalid_actor",
            "invalid_path",
            "not_found",
            "active_checkpoint",
            "quota_exceeded",
            "no_base_image",
            "no_remote",
            "unknown_path",
            "method_not_allowed",
            "body_too_large",
            "unsupported_media_type",
        ),
        2,
    ),
    "store_error": 3,
    "upload_failed": 3,
    "restore_failed": 6,
    "busy": 4,
}


class ApiError(SpriteError):
    """The daemon refused or failed a request: its stable ``code``, message and HTTP status
    (None for an ``error`` line of an event stream, which comes after a 2xx status)."""

    def __init__(self, code: str, message: str, status: int | None = None) -> None:
        super().__init__(message, _API_EXIT_CODES.get(code, 1))
        self.code = code
        self.status = status


class DaemonUnavailable(SpriteError):
    """No daemon answers on the API socket (none running, or still starting)."""

    exit_code = 5
