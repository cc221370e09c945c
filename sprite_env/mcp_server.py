"""``sprite-env mcp``: checkpoints as MCP tools for coding agents, over stdio.

A client of the daemon's socket like the CLI (:class:`sprite_env.client.Client`): no
engine and no store in this process. Built on the official ``mcp`` SDK's low-level server.

Concepts:

- **Tools**: Sprites' names and arguments (``checkpoint_create(comment)``,
  ``checkpoint_list(include_auto)``, ``checkpoint_get(id)``, ``checkpoint_restore(id)``)
  and more (diff, preview, read a file, restore paths, delete, reset; ``wait_remote`` on
  a create, as ``create --wait-remote``: refused on a daemon with no bucket, so an agent
  is never told a local checkpoint is remote). Each has a JSON
  input schema, answers with structured content (and the same JSON as text) in the API's
  shapes (``api/shapes.py``; its output schema is derived from them), and carries
  ``ToolAnnotations`` that say truthfully whether it reads only, destroys, is idempotent.
- **Scopes**: ``read`` (list, get, diff, preview, read a file), ``create`` (adds
  ``checkpoint_create``; the default), ``full`` (adds restores, delete and, where the
  daemon has a base image, ``environment_reset``). A tool outside the scope is not listed,
  and a call to it is a tool error ``out_of_scope``.
- **Actor**: the MCP client's ``name/version`` from its initialize request (``clientInfo``)
  is sent as ``X-Sprite-Actor``, unless ``--as`` names one.
- **Session checkpoint**: when a session starts, an automatic checkpoint "before <client>
  session" (the daemon skips it when nothing changed and the newest is under 10 minutes
  old, the rule of ``create --auto``). Tool calls wait for it, so none races it.

Error handling:
    Every refusal of the daemon (:class:`~sprite_env.errors.ApiError`), a daemon that does
    not answer, and bad arguments are tool errors (``isError``) whose structured content is
    ``{"code", "message"}``; the server goes on answering. stdout carries only the
    protocol: everything this module says goes to stderr.
"""

from __future__ import annotations

import base64
import json
import signal
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

import anyio
import anyio.to_thread
import mcp_types as mt
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from sprite_env import __version__
from sprite_env.actor import InvalidActor, clean_actor
from sprite_env.api import shapes
from sprite_env.client import Client, Event, file_chunks
from sprite_env.errors import ApiError, DaemonUnavailable, SpriteError

if TYPE_CHECKING:
    from collections.abc import Callable

    from mcp.server.context import ServerRequestContext

__all__ = ["SCOPES", "TOOLS", "McpServer", "serve"]

#: The scopes, each with what it adds to the one before.
SCOPES = ("read", "create", "full")
#: Bytes of a file ``checkpoint_read_file`` returns at most (an agent's context is small;
#: 256 KiB is about 64k tokens of text); the answer says when it cut.
READ_LIMIT = 256 * 1024
#: Seconds tools/list waits for a daemon to say whether it has a base image (an MCP client
#: times out a server's start-up; the Client's default wait is 30 s).
_LIST_WAIT = 5.0

Args = dict[str, Any]
Result = Mapping[str, Any]


class CheckpointList(TypedDict):
    """``checkpoint_list``: the checkpoints, newest first."""

    checkpoints: list[shapes.Checkpoint]


class Created(TypedDict):
    """``checkpoint_create``: the new checkpoint (or, skipped, the one the layer is on) and
    where it is durable (``storage``: ``remote`` once in the store's bucket, which
    ``wait_remote`` waits for; null when skipped)."""

    id: str | None
    checkpoint: shapes.Checkpoint | None
    storage: shapes.Storage | None


class FileRead(TypedDict):
    """``checkpoint_read_file``: a file's ``text`` (or ``base64``), cut at the limit
    (``truncated``), or another entry's JSON (``entry``)."""

    id: str
    path: str
    size: NotRequired[int]
    truncated: NotRequired[bool]
    text: NotRequired[str]
    base64: NotRequired[str]
    entry: NotRequired[shapes.Entry]


class Restored(TypedDict):
    """A restore's or reset's answer: ``undo`` first, and under an overlay that the
    agent's shells ended (``ends_sessions``) and how to check (``note``)."""

    restored: str
    undo: str | None
    job: int | None
    ends_sessions: bool
    note: str


_ID = {"type": "string", "description": "a checkpoint id, such as v3"}


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its MCP description, the scope it needs, and what it does."""

    name: str
    scope: str
    description: str
    properties: dict[str, Any]
    required: tuple[str, ...]
    annotations: mt.ToolAnnotations
    run: Callable[[Client, Args], Result]
    output: Any  # the structured result's shape (a TypedDict)

    def tool(self) -> mt.Tool:
        schema: dict[str, Any] = {
            "type": "object",
            "properties": self.properties,
            "required": list(self.required),
            "additionalProperties": False,
        }
        return mt.Tool(
            name=self.name,
            description=self.description,
            input_schema=schema,
            output_schema=shapes.json_schema(self.output),
            annotations=self.annotations,
        )


def _hints(*, read_only: bool, destructive: bool, idempotent: bool) -> mt.ToolAnnotations:
    # Every tool acts on this machine's layer and store only: a closed world.
    return mt.ToolAnnotations(
        read_only_hint=read_only,
        destructive_hint=destructive,
        idempotent_hint=idempotent,
        open_world_hint=False,
    )


_READ = _hints(read_only=True, destructive=False, idempotent=True)
# A create adds a checkpoint and never changes one; each call adds another (not idempotent).
_CREATE = _hints(read_only=False, destructive=False, idempotent=False)
# A restore or reset overwrites the layer (an undo checkpoint keeps what it replaced, yet
# live processes see their files change): destructive; restoring the same id twice leaves
# the layer as once did, but takes a second undo checkpoint: not idempotent.
_RESTORE = _hints(read_only=False, destructive=True, idempotent=False)
# Deleting the same id twice: the second is not_found and changes nothing.
_DELETE = _hints(read_only=False, destructive=True, idempotent=True)


def _list(c: Client, a: Args) -> Result:
    return {"checkpoints": c.list(include_auto=bool(a.get("include_auto", False)))}


def _get(c: Client, a: Args) -> Result:
    return c.info(a["id"])


def _diff(c: Client, a: Args) -> Result:
    return c.diff(a["id"], a.get("against"))


def _preview(c: Client, a: Args) -> Result:
    return c.preview(a["id"], paths=a.get("paths") or None)


def _read_file(c: Client, a: Args) -> FileRead:
    with c.open_file(a["id"], a["path"]) as reply:
        if not (reply.headers.get("content-type") or "").startswith("application/octet-stream"):
            return {"id": a["id"], "path": a["path"], "entry": json.loads(reply.read())}
        data = bytearray()
        for chunk in file_chunks(reply):
            data += chunk
            if len(data) >= READ_LIMIT:  # the rest is never sent on to the agent: stop
                break
        length = reply.headers.get("content-length")
    size = int(length) if length is not None and length.isdigit() else len(data)
    shown = bytes(data[:READ_LIMIT])
    out: FileRead = {
        "id": a["id"],
        "path": a["path"],
        "size": size,
        "truncated": size > len(shown),
    }
    text = _utf8(shown, cut=size > len(shown))
    if text is not None:
        out["text"] = text
    else:
        out["base64"] = base64.b64encode(shown).decode("ascii")
    return out


def _utf8(data: bytes, *, cut: bool) -> str | None:
    """``data`` as text, or None when it is not UTF-8 (a cut may split the last character:
    up to 3 bytes of it are dropped)."""
    for drop in range(4 if cut else 1):
        try:
            return data[: len(data) - drop].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None


def _create(c: Client, a: Args) -> Created:
    wait = bool(a.get("wait_remote", False))
    try:
        done = c.create(str(a.get("comment", "")), wait_remote=wait)
    except ApiError as e:
        if e.code != "no_remote":
            raise
        # Refused, not ignored: an agent that asks for a checkpoint that outlives the
        # machine and gets a local one would find out only when the machine is gone. The
        # daemon refused before creating anything; say so in the tool's own words.
        raise ApiError(
            e.code,
            "this daemon has no remote store, so no checkpoint can become remote: nothing "
            "was created (call checkpoint_create without wait_remote for a local "
            "checkpoint; a remote needs the daemon started with --store s3://BUCKET/PREFIX)",
            e.status,
        ) from e
    checkpoint = done.get("checkpoint")
    storage = checkpoint.get("storage", "local") if isinstance(checkpoint, dict) else None
    return {"id": done.get("id"), "checkpoint": checkpoint, "storage": storage}


def _restored(c: Client, done: Event, info: Event | None, what: str) -> Restored:
    """The answer to a restore or reset: the undo id first, and under an overlay that the
    agent's shell sessions ended and how to check."""
    undo = done.get("undo") or (info or {}).get("undo")
    ends = bool(info and info.get("ends_sessions"))
    undo_hint = f"undo with checkpoint_restore(id={undo!r})" if undo else "no undo checkpoint"
    if ends:
        note = (
            "The restore ended the shell sessions that used the layer (your shells among "
            "them): open a new one. Check the result with checkpoint_diff(id="
            f"{undo!r}) or `sprite-env curl /v1/jobs/{done.get('job')}/events`; {undo_hint}."
        )
    else:
        note = f"Done; {undo_hint}."
    return {
        "restored": what,
        "undo": undo,
        "job": done.get("job"),
        "ends_sessions": ends,
        "note": note,
    }


def _restore_job(
    c: Client, start: Callable[[Callable[[Event], None]], Event], what: str
) -> Restored:
    info: list[Event] = []

    def seen(event: Event) -> None:
        if event.get("type") == "info" and (event.get("ends_sessions") or event.get("undo")):
            info.append(event)

    done = start(seen)
    return _restored(c, done, info[-1] if info else None, what)


def _restore(c: Client, a: Args) -> Result:
    return _restore_job(c, lambda on: c.restore(a["id"], on_event=on), a["id"])


def _restore_path(c: Client, a: Args) -> Result:
    paths = list(a["paths"])
    what = f"{', '.join(paths)} from {a['id']}"
    return _restore_job(c, lambda on: c.restore(a["id"], on_event=on, paths=paths), what)


def _delete(c: Client, a: Args) -> Result:
    return c.delete(a["id"])


def _reset(c: Client, a: Args) -> Result:
    return _restore_job(c, lambda on: c.reset(on_event=on), "the base image")


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "checkpoint_list",
        "read",
        "List the checkpoints of this environment's filesystem, newest first.",
        {
            "include_auto": {
                "type": "boolean",
                "description": "include automatic checkpoints (before restores, sessions)",
                "default": False,
            }
        },
        (),
        _READ,
        _list,
        CheckpointList,
    ),
    ToolSpec(
        "checkpoint_get",
        "read",
        "One checkpoint's record (id, time, comment, size, parent).",
        {"id": _ID},
        ("id",),
        _READ,
        _get,
        shapes.Checkpoint,
    ),
    ToolSpec(
        "checkpoint_diff",
        "read",
        "What changed from checkpoint `id` to checkpoint `against` (default: the live "
        "filesystem now).",
        {"id": _ID, "against": {"type": "string", "description": "another checkpoint id"}},
        ("id",),
        _READ,
        _diff,
        shapes.Diff,
    ),
    ToolSpec(
        "checkpoint_preview_restore",
        "read",
        "What restoring checkpoint `id` would change, without changing anything.",
        {"id": _ID},
        ("id",),
        _READ,
        _preview,
        shapes.Preview,
    ),
    ToolSpec(
        "checkpoint_read_file",
        "read",
        f"A file as it was in checkpoint `id` (text, or base64 when not UTF-8; at most "
        f"{READ_LIMIT // 1024} KiB); a directory gives its entries.",
        {"id": _ID, "path": {"type": "string", "description": "absolute path, e.g. /etc/hosts"}},
        ("id", "path"),
        _READ,
        _read_file,
        FileRead,
    ),
    ToolSpec(
        "checkpoint_create",
        "create",
        "Take a checkpoint of the whole filesystem now (every writer's changes, not only "
        "yours); returns its id and its `storage` (local, or remote once in the store's "
        "bucket). With `wait_remote`, returns only once it is remote, or fails with "
        "`upload_failed` (the checkpoint is kept locally and its upload goes on).",
        {
            "comment": {"type": "string", "description": "what this checkpoint is before or after"},
            "wait_remote": {
                "type": "boolean",
                "description": "wait until the checkpoint is durable in the store's bucket "
                "(--store s3://...); refused, creating nothing, where the daemon has none",
                "default": False,
            },
        },
        (),
        _CREATE,
        _create,
        Created,
    ),
    ToolSpec(
        "checkpoint_restore",
        "full",
        "Make the whole filesystem equal to checkpoint `id`. An automatic checkpoint is "
        "taken first: the answer's `undo` id restores what was there.",
        {"id": _ID},
        ("id",),
        _RESTORE,
        _restore,
        Restored,
    ),
    ToolSpec(
        "checkpoint_restore_path",
        "full",
        "Restore only the given files or directories from checkpoint `id`; the rest stays. "
        "The answer's `undo` id restores what was there.",
        {
            "id": _ID,
            "paths": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 1,
                "description": 'absolute paths, e.g. ["/app/src"]',
            },
        },
        ("id", "paths"),
        _RESTORE,
        _restore_path,
        Restored,
    ),
    ToolSpec(
        "checkpoint_delete",
        "full",
        "Delete checkpoint `id` and free its space (not the active one).",
        {"id": _ID},
        ("id",),
        _DELETE,
        _delete,
        shapes.DeleteReport,
    ),
    ToolSpec(
        "environment_reset",
        "full",
        "Empty the layer back to the base image (after an automatic checkpoint: the "
        "answer's `undo` id brings it back).",
        {},
        (),
        _RESTORE,
        _reset,
        Restored,
    ),
)
_BY_NAME = {t.name: t for t in TOOLS}
_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "boolean": bool,
    "array": list,
}


def _check_args(spec: ToolSpec, args: Args) -> str | None:
    """What is wrong with ``args`` for ``spec``, or None (the SDK's low-level server
    leaves argument checking to the tool)."""
    for key in spec.required:
        if key not in args:
            return f"{spec.name} needs the argument {key!r}"
    for key, value in args.items():
        prop = spec.properties.get(key)
        if prop is None:
            return f"{spec.name} has no argument {key!r} (it takes {sorted(spec.properties)})"
        if not isinstance(value, _JSON_TYPES[prop["type"]]):
            return f"{spec.name}: {key!r} must be a {prop['type']}"
        items: list[Any] = value if isinstance(value, list) else []
        if prop["type"] == "array" and (
            len(items) < prop.get("minItems", 0) or not all(isinstance(v, str) for v in items)
        ):
            return f"{spec.name}: {key!r} must be a non-empty list of strings"
    return None


def _error(code: str, message: str) -> mt.CallToolResult:
    return mt.CallToolResult(
        content=[mt.TextContent(text=f"{code}: {message}")],
        structured_content={"code": code, "message": message},
        is_error=True,
    )


def _log(line: str) -> None:
    print(f"sprite-env mcp: {line}", file=sys.stderr, flush=True)


class McpServer:
    """One stdio session's state: its scope, actor and session checkpoint.

    Args:
        scope: ``read``, ``create`` or ``full``.
        actor: who the activity log names; None: the MCP client's ``name/version``.
        socket_path: the daemon's socket (default as :class:`Client`'s).
        session_checkpoint: take the "before <client> session" checkpoint.
    """

    def __init__(
        self,
        scope: str = "create",
        *,
        actor: str | None = None,
        socket_path: str | None = None,
        session_checkpoint: bool = True,
    ) -> None:
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {SCOPES}, not {scope!r}")
        self.scope = scope
        self.actor = actor
        self.socket_path = socket_path
        self.session_checkpoint = session_checkpoint
        self._client_name: str | None = None
        self._started = False
        self._start_lock = anyio.Lock()
        self._has_base: bool | None = None
        self.server: Server[Any] = Server(
            "sprite-env",
            version=__version__,
            instructions="Checkpoints of this environment's filesystem. Take one with "
            "checkpoint_create before a risky change; checkpoint_diff shows what changed.",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        self.server.add_notification_handler(
            "notifications/initialized", mt.NotificationParams, self._initialized
        )

    # -- who and when ----------------------------------------------------------------------

    def _client(self) -> Client:
        # (neither: the Client's default, $SPRITE_ACTOR, else user)
        return Client(self.socket_path, actor=self.actor or self._client_name)

    def _learn_client(self, ctx: ServerRequestContext[Any]) -> None:
        if self._client_name is not None:
            return
        params = ctx.session.client_params
        info = params.client_info if params is not None else None
        if info is not None:
            name = f"{info.name}/{info.version}" if info.version else info.name
            try:
                self._client_name = clean_actor(name, "mcp-client")
            except InvalidActor:  # the daemon would refuse every call made under it
                self._client_name = "mcp-client"

    async def _session_start(self, ctx: ServerRequestContext[Any]) -> None:
        """Once per session, before the first tool runs: the session checkpoint, and
        whether the daemon has a base image (``environment_reset``)."""
        async with self._start_lock:
            if self._started:
                return
            self._learn_client(ctx)
            self._started = True
            await anyio.to_thread.run_sync(self._start_sync)

    def _start_sync(self) -> None:
        c = self._client()
        try:
            self._has_base = c.status().get("base_image") is not None
        except DaemonUnavailable as e:
            # (the create would wait as long again: each tool call says it instead)
            _log(f"no session checkpoint: {e}")
            return
        except SpriteError as e:
            _log(f"the daemon's status: {e}")
            self._has_base = None  # asked again on the next tools/list
        if not self.session_checkpoint:
            return
        who = self._client_name or self.actor or "agent"
        try:
            done = c.create(auto=True, reason=f"before {who} session")
        except SpriteError as e:
            _log(f"no session checkpoint: {e}")
            return
        if done.get("skipped"):
            _log(f"session checkpoint skipped: {done.get('skipped')}")
        else:
            _log(f"session checkpoint {done.get('id')} (before {who} session)")

    async def _initialized(
        self, ctx: ServerRequestContext[Any], params: mt.NotificationParams
    ) -> None:
        await self._session_start(ctx)

    # -- tools -----------------------------------------------------------------------------

    def offered(self) -> list[ToolSpec]:
        """The tools of this scope (``environment_reset`` only where a base image is)."""
        upto = SCOPES.index(self.scope)
        return [
            t
            for t in TOOLS
            if SCOPES.index(t.scope) <= upto and (t.name != "environment_reset" or self._has_base)
        ]

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: mt.PaginatedRequestParams | None
    ) -> mt.ListToolsResult:
        # Listing waits for no session checkpoint (a client may time out its start-up,
        # and a create scans the whole layer): only tool calls wait for it.
        self._learn_client(ctx)
        if self._has_base is None and self.scope == "full":
            self._has_base = await anyio.to_thread.run_sync(self._base_image)
        return mt.ListToolsResult(tools=[t.tool() for t in self.offered()])

    def _base_image(self) -> bool | None:
        try:
            c = Client(self.socket_path, actor=self.actor or self._client_name, wait=_LIST_WAIT)
            return c.status().get("base_image") is not None
        except SpriteError:
            return None

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: mt.CallToolRequestParams
    ) -> mt.CallToolResult:
        await self._session_start(ctx)
        spec = _BY_NAME.get(params.name)
        if spec is None:
            return _error("unknown_tool", f"no tool {params.name!r}")
        if spec not in self.offered():
            if spec.name == "environment_reset" and self.scope == "full":
                return _error("no_base_image", "the daemon has no base image to reset to")
            return _error(
                "out_of_scope",
                f"{spec.name} needs --scope {spec.scope}; this server runs with "
                f"--scope {self.scope}",
            )
        args = dict(params.arguments or {})
        wrong = _check_args(spec, args)
        if wrong is not None:
            return _error("invalid_arguments", wrong)
        restoring = spec.annotations.destructive_hint and spec.name != "checkpoint_delete"
        old = _hold_signals() if restoring else None
        try:
            result = await anyio.to_thread.run_sync(spec.run, self._client(), args)
        except ApiError as e:
            return _error(e.code, e.message)
        except DaemonUnavailable as e:  # no daemon answers, or a followed job was lost
            return _error("no_daemon", e.message)
        except SpriteError as e:  # bad input caught before sending (an actor, a wait)
            return _error(getattr(e, "code", None) or "bad_request", e.message)
        except Exception as e:  # a bug: said to the agent and logged, the server goes on
            traceback.print_exc(file=sys.stderr)
            return _error("internal", f"{spec.name} failed: {type(e).__name__}: {e}")
        finally:
            if old is not None:
                _release_signals(old)
        return mt.CallToolResult(
            content=[mt.TextContent(text=json.dumps(result))], structured_content=dict(result)
        )

    async def run(self) -> None:
        async with stdio_server() as (read, write):
            await self.server.run(read, write, self.server.create_initialization_options())


_Handlers = tuple[Any, Any]


def _hold_signals() -> _Handlers:
    """Under an overlay a restore ends the sessions using the layer with SIGTERM and a
    hang-up (SIGKILL 5 s later): this server may be among them, and must live to say the
    undo id (as ``sprite-env restore`` does)."""
    return (
        signal.signal(signal.SIGTERM, signal.SIG_IGN),
        signal.signal(signal.SIGHUP, signal.SIG_IGN),
    )


def _release_signals(old: _Handlers) -> None:
    signal.signal(signal.SIGTERM, old[0])
    signal.signal(signal.SIGHUP, old[1])


def serve(
    scope: str,
    *,
    actor: str | None = None,
    socket_path: str | None = None,
    session_checkpoint: bool = True,
) -> None:
    """Runs the server on stdin/stdout until the client closes them."""
    server = McpServer(
        scope, actor=actor, socket_path=socket_path, session_checkpoint=session_checkpoint
    )
    anyio.run(server.run)
