"""The JSON shapes of the API, defined once: the socket, the CLI's ``--json``, the Python
client, the MCP tools and the OpenAPI document all use these.

Each shape is a ``TypedDict``: mypy checks the code that builds one (a missing or unknown
key is a type error), and :func:`json_schema` derives its JSON Schema from the same
annotations, so the schema cannot drift from the type. A shape is *closed* (no field
beyond its own) unless it is in :data:`OPEN`: events and problems carry per-job or
per-error extras (``checkpoint``, ``undo``, ``stats``...; a problem's context).

This module imports nothing of sprite-env: the online CLI and the MCP server load it on
their start-up path, and every layer may use it without a cycle.

Shapes: :class:`Checkpoint` (a list row or an info), :class:`Problem` (an error),
:class:`DiffEntry` in a :data:`Diff`, :class:`PreviewStep` in a :class:`Preview`, the four
events (:data:`Event`), :class:`Job`, :class:`Status` (and its :class:`RemoteStatus`),
:class:`DeleteReport`, :class:`ActivityEntry`, :class:`Entry` (a non-file of a
checkpoint), and the request bodies (:class:`CreateRequest`, ...).
"""

import types
from collections.abc import Callable, Iterable
from typing import (
    Any,
    Literal,
    NotRequired,
    Required,
    TypedDict,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

# No ``from __future__ import annotations`` here: Python 3.11 computes a TypedDict's
# required keys from its annotations when the class is made, and a string annotation
# hides ``NotRequired`` from it (the key would count as required; see _object_schema).

#: How an entry changed from one tree to the other.
ChangeKind = Literal["added", "removed", "modified", "meta"]
#: What a restore does to a path.
ActionKind = Literal["delete", "create", "change", "metadata"]
#: The type of an entry of a tree.
EntryType = Literal["file", "dir", "symlink", "chr", "blk", "fifo"]
#: Where a checkpoint is durable: this machine only, or in the store's bucket too.
Storage = Literal["local", "remote"]


class CaptureWarning(TypedDict):
    """A file a checkpoint could not capture as it was (``code``: unreadable,
    changed_while_read, socket_skipped, mount_point)."""

    path: str
    code: str
    message: str


class Checkpoint(TypedDict):
    """One checkpoint: Sprites' fields (id, create_time, comment, is_auto, history) and
    ours. ``unique_bytes`` (in list and info): what deleting it alone would free; null
    when a damaged store cannot tell. ``storage`` (in list, info and a create's event):
    ``remote`` once a catalog generation holding it is durable in the store's bucket,
    else ``local`` (always, for a store with no remote)."""

    id: str
    create_time: str
    comment: str
    is_auto: bool
    history: list[str]
    created_by: str
    parent: str | None
    files: int
    dirs: int
    bytes: int
    bytes_added: int
    warnings: list[CaptureWarning]
    walk: str
    walk_reason: str
    is_active: bool
    unique_bytes: NotRequired[int | None]
    storage: NotRequired[Storage]


class Problem(TypedDict):
    """An error: a stable ``code`` to branch on, a human ``message``, the HTTP status."""

    code: str
    message: str
    status: int


class DiffEntry(TypedDict):
    """One changed path and the entries it stands for (an added directory of 50 files is
    51 added); ``inner``: entries below it under another change (a type change)."""

    path: str
    change: ChangeKind
    type: EntryType
    size: int | None
    entries: int
    inner: NotRequired[dict[str, int]]


#: What changed from checkpoint ``from`` to ``to`` (a checkpoint, or "live"): ``counts``
#: sums entries per change (changes with none are left out).
Diff = TypedDict(
    "Diff", {"from": str, "to": str, "counts": dict[str, int], "changes": list[DiffEntry]}
)


class PreviewStep(TypedDict):
    """One path of a preview: the change since the target and the ``action`` that undoes
    it, with the ``entries`` it touches (``inner``: below it, by action)."""

    path: str
    change: ChangeKind
    type: EntryType
    size: int | None
    action: ActionKind
    entries: int
    inner: NotRequired[dict[str, int]]


class PreviewCounts(TypedDict):
    """Entries per action (every action, zeros included); ``remove`` is ``delete``'s old
    name, kept for clients."""

    delete: int
    create: int
    change: int
    metadata: int
    remove: int


class Preview(TypedDict):
    """What restoring checkpoint ``id`` would do, changing nothing."""

    id: str
    counts: PreviewCounts
    changes: list[PreviewStep]


class DeleteReport(TypedDict):
    """What a delete freed (or, ``dry_run``, would free); ``problems``: damage met."""

    id: str | None
    ids: list[str]
    bytes_freed: int
    objects_removed: int
    packs_deleted: int
    packs_written: int
    problems: list[str]
    dry_run: bool


class InfoEvent(TypedDict):
    """A human line about a job (``data``); some carry more (``undo``, ``ends_sessions``)."""

    type: Literal["info"]
    time: str
    job: NotRequired[int]
    data: str
    undo: NotRequired[str | None]
    ends_sessions: NotRequired[bool]


class ProgressEvent(TypedDict):
    """A phase's counters (files, bytes, done, total...), at most 10 a second."""

    type: Literal["progress"]
    time: str
    job: NotRequired[int]
    phase: str


class CompleteEvent(TypedDict):
    """A job's last line when it worked: ``data`` a human line, ``id`` its checkpoint, and
    per job ``checkpoint``, ``undo``, ``stats``, ``noop``, ``skipped``..."""

    type: Literal["complete"]
    time: str
    job: NotRequired[int]
    data: str
    id: NotRequired[str | None]
    checkpoint: NotRequired[Checkpoint]
    undo: NotRequired[str | None]
    noop: NotRequired[bool]
    skipped: NotRequired[bool]
    paths: NotRequired[list[str]]
    stats: NotRequired[dict[str, Any]]
    diff: NotRequired[Diff]
    preview: NotRequired[Preview]
    report: NotRequired[DeleteReport]
    dest: NotRequired[str]


class ErrorEvent(TypedDict):
    """A job's last line when it failed: ``error`` the message, ``code`` as a problem's."""

    type: Literal["error"]
    time: str
    job: NotRequired[int]
    error: str
    code: str


#: One NDJSON line of a job's stream (every line has ``type`` and ``time``; the daemon's
#: name their ``job``). The last line is ``complete`` or ``error``.
Event = InfoEvent | ProgressEvent | CompleteEvent | ErrorEvent


class Job(TypedDict):
    """A job of the daemon's queue (``GET /v1/jobs/{n}``): ``result`` its last event when
    done, ``error`` its problem when failed."""

    id: int
    kind: str
    target: str | None
    actor: str
    state: Literal["queued", "running", "done", "failed"]
    submitted: str
    result: NotRequired[Event]
    error: NotRequired[Problem]


class RemoteGc(TypedDict):
    """The last run of remote deletes (after a push that dropped checkpoints): when, what
    it deleted, and ``next_run_s``, when what it spared for the grace period
    (``SPRITE_ENV_REMOTE_GRACE``) is due to go (null: nothing waits)."""

    at: str
    generations_deleted: int
    packs_deleted: int
    bytes_freed: int
    next_run_s: float | None


class RemoteStatus(TypedDict):
    """The background upload to the store's bucket (``/v1/status``'s ``remote``):
    ``state`` idle, uploading, retrying (after a failed push, or a lost lease:
    ``last_error`` says why, and who holds the prefix; ``next_attempt_s`` when it tries
    again), starting or stopped; ``local`` the checkpoints
    not yet remote; ``generation`` the newest this daemon pushed; ``progress`` the push's
    packs and bytes sent of those the bucket lacked; ``gc`` the last run of remote deletes
    (null until one ran)."""

    url: str
    state: Literal["starting", "idle", "uploading", "retrying", "stopped"]
    local: int
    generation: int | None
    last_push: str | None
    last_error: str | None
    failures: int
    next_attempt_s: float | None
    progress: dict[str, int] | None
    gc: RemoteGc | None


class Status(TypedDict):
    """The daemon (``GET /v1/status``): where it works, the job running, the store's use,
    the upload to its bucket (``remote``, null with no remote)."""

    version: str
    pid: int
    root: str
    state: str
    store: str
    started: str
    active: str | None
    job: Job | None
    queued: int
    mount: str | None
    base_image: str | None
    interrupted_restore: dict[str, Any] | None
    auto_interval_s: float
    max_checkpoints: int
    store_usage: dict[str, Any]
    remote: RemoteStatus | None


class ActivityEntry(TypedDict):
    """One line of the activity log, newest first."""

    time: str
    action: str
    id: str | None
    actor: str
    ok: bool
    detail: str


class EntryMeta(TypedDict):
    """An entry of a directory of a checkpoint (names not UTF-8 show as ``\\xNN``)."""

    name: str
    type: EntryType
    size: int | None
    mode: str
    uid: int
    gid: int
    mtime_ns: int
    target: NotRequired[str]


class Entry(TypedDict):
    """A path of a checkpoint that is not a file; a directory lists its ``entries``."""

    id: str
    path: str
    type: EntryType
    size: int | None
    mode: str
    uid: int
    gid: int
    mtime_ns: int
    target: NotRequired[str]
    entries: NotRequired[list[EntryMeta]]


class Services(TypedDict):
    """The environment's services and the definitions that did not parse."""

    services: list[dict[str, Any]]
    errors: list[str]


class ServiceLogs(TypedDict):
    """The last lines a service wrote."""

    name: str
    lines: list[str]


# -- request bodies ---------------------------------------------------------------------


class CreateRequest(TypedDict, total=False):
    """``POST /v1/checkpoint``: ``auto`` and ``reason`` as ``create --auto --reason``;
    ``wait_remote`` as ``create --wait-remote``: the stream ends once the checkpoint is
    remote (``progress`` lines of phase ``upload`` meanwhile), or with ``upload_failed``."""

    comment: str
    auto: bool
    reason: str
    created_by: str
    wait_remote: bool


class RestoreRequest(TypedDict, total=False):
    """``POST /v1/checkpoints/{id}/restore``: ``paths`` only those (absolute) paths."""

    created_by: str
    paths: list[str]


class PreviewRequest(TypedDict, total=False):
    """``POST /v1/checkpoints/{id}/preview``: a restore of only ``paths``."""

    paths: list[str]


class ExportRequest(TypedDict, total=False):
    """``POST /v1/checkpoints/{id}/export``: ``dest`` an absolute, missing or empty
    directory (required)."""

    dest: str
    paths: list[str]
    created_by: str


class ResetRequest(TypedDict, total=False):
    """``POST /v1/reset``."""

    created_by: str


#: Shapes that may carry fields beyond their own (see the module's docstring).
OPEN: frozenset[str] = frozenset(
    {"Problem", "InfoEvent", "ProgressEvent", "CompleteEvent", "ErrorEvent", "ActivityEntry"}
)
#: Every named shape, for the OpenAPI document's components.
SHAPES: tuple[Any, ...] = (
    CaptureWarning,
    Checkpoint,
    Problem,
    DiffEntry,
    Diff,
    PreviewStep,
    PreviewCounts,
    Preview,
    InfoEvent,
    ProgressEvent,
    CompleteEvent,
    ErrorEvent,
    Job,
    RemoteStatus,
    Status,
    DeleteReport,
    ActivityEntry,
    EntryMeta,
    Entry,
    Services,
    ServiceLogs,
    CreateRequest,
    RestoreRequest,
    PreviewRequest,
    ExportRequest,
    ResetRequest,
)

_SCALARS: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def json_schema(shape: Any, ref: Callable[[str], str] | None = None) -> dict[str, Any]:
    """The JSON Schema (2020-12) of ``shape``: a TypedDict or any annotation made of
    str, int, float, bool, None, Any, Literal, unions, list[...] and dict[str, ...].

    Args:
        shape: the type.
        ref: for a named shape inside another, the ``$ref`` to point at (e.g.
            ``#/components/schemas/Name``); None writes them out in place.

    Raises:
        TypeError: an annotation this does not know (a new shape needs a new case here).
    """
    if shape is Any:
        return {}
    if shape in _SCALARS:
        # A JSON number without a fraction is an int: a float field accepts both.
        return {"type": ["number"]} if shape is float else {"type": _SCALARS[shape]}
    origin, args = get_origin(shape), get_args(shape)
    if origin is Literal:
        return {"const": args[0]} if len(args) == 1 else {"enum": list(args)}
    if origin in (Union, types.UnionType):
        if all(a in _SCALARS and a is not float for a in args):
            return {"type": [_SCALARS[a] for a in args]}
        return {"anyOf": [json_schema(a, ref) for a in args]}
    if origin is list:
        return {"type": "array", "items": json_schema(args[0], ref)}
    if origin is dict:
        return {"type": "object", "additionalProperties": json_schema(args[1], ref)}
    if is_typeddict(shape):
        if ref is not None:
            return {"$ref": ref(shape.__name__)}
        return _object_schema(shape, None)
    raise TypeError(f"no JSON Schema for {shape!r}")


def component_schema(shape: Any, ref: Callable[[str], str] | None = None) -> dict[str, Any]:
    """A named shape's own schema (its fields; nested shapes as ``ref`` says)."""
    return _object_schema(shape, ref)


def _object_schema(shape: Any, ref: Callable[[str], str] | None) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    required: list[str] = []
    # The keys a TypedDict requires are read from its annotations, not __required_keys__:
    # Python 3.11 gets those wrong for a TypedDict of a module with string annotations
    # (``from __future__ import annotations``; the MCP server's are).
    for key, hint in get_type_hints(shape, include_extras=True).items():
        origin = get_origin(hint)
        if origin is NotRequired or origin is Required:
            hint = get_args(hint)[0]
        if origin is Required or (origin is not NotRequired and shape.__total__):
            required.append(key)
        properties[key] = json_schema(hint, ref)
    out: dict[str, Any] = {
        "title": shape.__name__,
        "type": "object",
        "properties": properties,
        "required": sorted(required),
        "additionalProperties": shape.__name__ in OPEN,
    }
    if shape.__doc__ and not shape.__doc__.startswith(shape.__name__ + "("):
        out["description"] = " ".join(shape.__doc__.split())
    return out


def field_types(shape: Any) -> dict[str, type]:
    """A request body's fields and the Python type each value must have (``list[str]``:
    list), for checking a parsed body against its shape."""
    return {k: get_origin(v) or v for k, v in get_type_hints(shape).items()}


# -- builders: the one place a shape is assembled from parts -----------------------------


def diff(a: str, b: str | None, changes: Iterable[DiffEntry]) -> Diff:
    """The diff from checkpoint ``a`` to ``b`` (None: the live layer), counts summed from
    the entries (a change's own, and its ``inner`` ones)."""
    listed = list(changes)
    counts: dict[str, int] = {}
    for ch in listed:
        for change, n in [(ch["change"], ch["entries"]), *ch.get("inner", {}).items()]:
            counts[change] = counts.get(change, 0) + n
    kept = {c: counts[c] for c in get_args(ChangeKind) if counts.get(c)}
    return {"from": a, "to": b or "live", "counts": kept, "changes": listed}
