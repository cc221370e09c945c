"""A small synchronous client of the sprite-env API, for scripts and for the CLI.

Standard library only: :class:`http.client.HTTPConnection` over an ``AF_UNIX`` socket (no
HTTP is parsed by hand). Every call opens a connection of its own, so a :class:`Client` holds
no resource and needs no closing; it may be shared by threads.

Example::

    from sprite_env.client import Client

    c = Client(actor="my-agent")
    done = c.create("before upgrading numpy")  # follows the stream to its end
    print(done["id"])                           # "v3"
    c.restore("v2")                             # returns the ``complete`` event

Concepts:

- **Socket**: the ``socket_path`` argument, else ``$SPRITE_API_SOCK``, else
  ``/.sprite/api.sock``.
- **Actor**: who asks, sent as header ``X-Sprite-Actor`` and recorded in the activity log:
  the ``actor`` argument, else ``$SPRITE_ACTOR``, else ``user``.
- **Reaching the daemon**: while the socket file is missing, refuses connections or the
  daemon answers 503 ``starting`` or ``stopping`` (it is starting, finishing a restore it
  was killed in, or shutting down before a new one starts), the client retries for
  ``wait`` seconds (default 30; ``$SPRITE_API_WAIT``; 0: no retry), saying once that it
  waits. Where no daemon runs for the socket's state directory (its ``daemon.lock`` names
  none alive, and /proc shows none starting) it gives up after ``NO_DAEMON_GRACE`` and
  says so, naming a dead one; that is judged again at every try, so a daemon seen starting
  later is waited for. No daemon acted on the request in any of those cases, so retrying a
  create cannot create twice. A connection that fails in any other way is not retried.
- **Streams**: create, restore and reset answer with NDJSON events (``info``, ``progress``,
  then ``complete`` or ``error``; each names its ``job``). The methods call ``on_event``
  for every event and return the ``complete`` one. When the connection drops mid-stream
  the client re-attaches with ``GET /v1/jobs/{job}/events`` (which replays the job's events
  from the start; those already seen are skipped), so a job is followed to its end. A
  client that stops listening does not stop the job.

Error handling:
    Every method raises :class:`~sprite_env.errors.ApiError` (``code``, ``message``,
    ``status``) when the daemon refuses a request or a stream ends with an ``error``
    event, and :class:`~sprite_env.errors.DaemonUnavailable` when no daemon answers
    within ``wait`` seconds, the connection fails otherwise, or a followed job is lost.
    Their ``exit_code`` is what the CLI exits with (table in ``sprite_env/cli/main.py``).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote, urlencode

from sprite_env import statelock
from sprite_env.errors import ApiError, DaemonUnavailable, UserError

if TYPE_CHECKING:
    import builtins
    from types import TracebackType

    from sprite_env.api import shapes

__all__ = [
    "DEFAULT_SOCKET",
    "ApiError",
    "Client",
    "DaemonUnavailable",
    "Event",
    "Reply",
    "resolve_actor",
    "resolve_socket",
]

DEFAULT_SOCKET = "/.sprite/api.sock"
DEFAULT_WAIT = 30.0
#: Seconds a connection may stay silent before an answer (a diff or a preview scans the
#: layer first, and may queue behind a restore). Streams wait without a limit once started.
DEFAULT_TIMEOUT = 300.0
#: Seconds to wait where no daemon holds STATE/daemon.lock (none ever ran, or it died):
#: one started just before this client may not have taken the lock yet.
NO_DAEMON_GRACE = 0.8
_POLL = 0.1  # seconds between attempts to reach a daemon that is not answering yet
_MAX_EMPTY_REATTACH = 3  # re-attaches in a row that bring nothing new: the stream is broken

#: 503 codes that mean "no daemon ready here yet": nothing was done; retry.
_NOT_READY = frozenset({"starting", "stopping"})

#: One event of an NDJSON stream (always ``type``, ``time`` and ``job``): a
#: :data:`sprite_env.api.shapes.Event`, read as a plain dict (callers pick fields by type).
Event = dict[str, Any]
OnEvent = Callable[[Event], None]
JsonObject = dict[str, Any]
JsonList = list[dict[str, Any]]
Lines = list[str]
#: Paths inside a checkpoint (``/etc/hosts``); a non-UTF-8 name as ``os.fsdecode`` gives it.
Paths = list[str]
Headers = list[tuple[str, str]]


def resolve_socket(socket_path: str | None = None) -> str:
    """The socket a client talks to: the argument, ``$SPRITE_API_SOCK``, or the default."""
    return socket_path or os.environ.get("SPRITE_API_SOCK") or DEFAULT_SOCKET


def resolve_actor(actor: str | None = None) -> str:
    """Who asks: the argument, ``$SPRITE_ACTOR``, or ``user``."""
    return actor or os.environ.get("SPRITE_ACTOR") or "user"


def _resolve_wait(wait: float | None) -> float:
    if wait is not None:
        return max(0.0, wait)
    text = os.environ.get("SPRITE_API_WAIT")
    if not text:
        return DEFAULT_WAIT
    try:
        return max(0.0, float(text))
    except ValueError:
        raise UserError(f"SPRITE_API_WAIT must be a number of seconds, not {text!r}") from None


class UnixHTTPConnection(http.client.HTTPConnection):
    """An HTTP/1.1 connection over a Unix socket (Host ``sprite``)."""

    def __init__(self, socket_path: str, timeout: float | None) -> None:
        super().__init__("sprite", timeout=timeout)
        self.socket_path = socket_path
        # http.client drops self.sock when the answer says "Connection: close", yet the
        # reply still reads from it: kept here to lift the timeout off a stream.
        self.unix_socket: socket.socket | None = None

    def connect(self) -> None:
        # A connect with a timeout fails at once with EAGAIN while the daemon's listen
        # backlog is full (a flood of connections), where a blocking one would wait for
        # the daemon to accept: wait likewise, within the timeout.
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(self.timeout)
                sock.connect(self.socket_path)
            except BlockingIOError:
                sock.close()
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"{self.socket_path}: listen backlog full") from None
                time.sleep(0.005)
                continue
            except OSError:
                sock.close()
                raise
            self.sock = self.unix_socket = sock
            return


class Reply:
    """One answer: status and headers at once, the body as it comes.

    Use as a context manager (or call :meth:`close`, which closes the connection). An
    answer the client had to read whole already (an error) replays from memory.
    """

    def __init__(
        self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse
    ) -> None:
        self.conn = conn
        self.response = response
        self.status: int = response.status
        self.reason: str = response.reason
        self.headers: http.client.HTTPMessage = response.headers
        self._body: bytes | None = None

    def __enter__(self) -> Reply:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self.conn.close()  # closes the response too

    def read(self) -> bytes:
        """The rest of the body."""
        if self._body is None:
            self._body = self.response.read()
        return self._body

    def chunks(self, size: int = 65536) -> Iterator[bytes]:
        """The body in pieces as they arrive (for printing a stream as it streams)."""
        if self._body is not None:
            yield self._body
            return
        while chunk := self.response.read1(size):
            yield chunk

    def events(self) -> Iterator[Event]:
        """The NDJSON events of a stream, until it ends or the connection drops (no error:
        the caller decides whether the stream was complete)."""
        try:
            while True:
                line = self.response.readline()
                if not line.endswith(b"\n"):  # EOF, possibly inside a line cut short
                    return
                if line.strip():
                    yield _decode_event(line, self.status)
        except (OSError, http.client.HTTPException):
            return

    def error(self) -> ApiError:
        """The :class:`ApiError` this (non-2xx) answer stands for."""
        body = self.read()
        try:
            problem = json.loads(body)
            code, message = str(problem["code"]), str(problem["message"])
        except (ValueError, KeyError, TypeError):
            text = body[:200].decode(errors="replace").strip()
            code, message = "http_error", f"HTTP {self.status} {self.reason}: {text}"
        return ApiError(code, message, self.status)


def _decode_event(line: bytes, status: int) -> Event:
    try:
        event = json.loads(line)
    except ValueError:
        event = None
    if not isinstance(event, dict) or "type" not in event:
        text = line[:200].decode(errors="replace").strip()
        raise ApiError("bad_response", f"not an event line: {text}", status)
    return event


class Client:
    """The sprite-env API, one method per endpoint.

    Args:
        socket_path: the daemon's socket (default: ``$SPRITE_API_SOCK``, else
            ``/.sprite/api.sock``).
        actor: who asks, recorded in the activity log (default: ``$SPRITE_ACTOR``, else
            ``user``).
        timeout: seconds a connection may stay silent before the answer starts.
        wait: seconds to keep trying a daemon that is not answering yet (default:
            ``$SPRITE_API_WAIT``, else 30; 0: fail at once).
        notice: called once with a line saying the client waits for the daemon; default:
            print it on stderr when stderr is a terminal.
    """

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        actor: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        wait: float | None = None,
        notice: Callable[[str], None] | None = None,
    ) -> None:
        self.socket_path = resolve_socket(socket_path)
        self.actor = resolve_actor(actor)
        self.timeout = timeout
        self.wait = _resolve_wait(wait)
        self.notice = notice

    # -- reading ---------------------------------------------------------------------------

    def status(self) -> shapes.Status:
        """``GET /v1/status``: version, pid, paths, the running job, the active checkpoint."""
        return cast("shapes.Status", self._object("GET", "/v1/status"))

    def list(
        self, include_auto: bool = False, history: str | None = None
    ) -> builtins.list[shapes.Checkpoint]:
        """Checkpoints, newest first; ``history``: only that id and its descendants."""
        query: dict[str, str] = {}
        if include_auto:
            query["include_auto"] = "true"
        if history is not None:
            query["history"] = history
        rows = self._list("GET", _path("/v1/checkpoints", query=query))
        return cast("builtins.list[shapes.Checkpoint]", rows)

    def info(self, id: str) -> shapes.Checkpoint:
        """One checkpoint's record (``not_found``, ``invalid_id``)."""
        return cast("shapes.Checkpoint", self._object("GET", _path("/v1/checkpoints", id)))

    def preview(self, id: str, *, paths: Paths | None = None) -> shapes.Preview:
        """What restoring ``id`` (only ``paths`` of it, if given) would do:
        ``{"id", "counts", "changes"}``."""
        url = _path("/v1/checkpoints", id, "preview")
        if paths:
            return cast("shapes.Preview", self._object("POST", url, {"paths": paths}))
        return cast("shapes.Preview", self._object("GET", url))

    def open_file(self, id: str, path: str | bytes) -> Reply:
        """``GET /v1/checkpoints/{id}/files/{path}`` of any checkpoint, automatic ones
        included: the :class:`Reply`, whose body is the file's bytes (Content-Type
        ``application/octet-stream``; read them with :func:`file_chunks`) or, for anything
        else, the entry's JSON (a directory with its ``entries``). Close it when done.

        Raises:
            ApiError: ``not_found`` (no such checkpoint or path), ``invalid_path`` (``..``,
                a symlink on the way), ``invalid_id``.
        """
        raw = path.encode("utf-8", "surrogateescape") if isinstance(path, str) else path
        url = _path("/v1/checkpoints", id, "files") + "/" + quote(raw.lstrip(b"/"), safe="/")
        reply = self._open("GET", url, None, [], stream=True)
        if reply.status >= 300:
            with reply:
                raise reply.error()
        return reply

    def diff(self, a: str, b: str | None = None) -> shapes.Diff:
        """Changes from checkpoint ``a`` to ``b`` (default: the live layer):
        ``{"from", "to", "counts", "changes"}``."""
        query = {"against": b} if b is not None else {}
        url = _path("/v1/checkpoints", a, "diff", query=query)
        return cast("shapes.Diff", self._object("GET", url))

    def activity(self, limit: int = 100) -> builtins.list[shapes.ActivityEntry]:
        """The activity log, newest first: ``{"time","action","id","actor","ok","detail"}``."""
        rows = self._list("GET", _path("/v1/activity", query={"limit": str(limit)}))
        return cast("builtins.list[shapes.ActivityEntry]", rows)

    def job(self, n: int) -> shapes.Job:
        """One job: ``{"id","kind","target","actor","state","result"?,"error"?}``."""
        return cast("shapes.Job", self._object("GET", _path("/v1/jobs", str(n))))

    # -- changing --------------------------------------------------------------------------

    def create(
        self,
        comment: str = "",
        *,
        auto: bool = False,
        reason: str | None = None,
        created_by: str | None = None,
        wait_remote: bool = False,
        on_event: OnEvent | None = None,
    ) -> Event:
        """Takes a checkpoint; returns the ``complete`` event (``id``, ``checkpoint``, or
        ``skipped`` for an auto checkpoint a recent one makes unnecessary). With
        ``wait_remote``, only once the checkpoint is durable in the store's bucket.

        Raises:
            ApiError: refused before the stream (``invalid_comment``, ``quota_exceeded``,
                ``busy``, ``no_remote``) or failed in it (an ``error`` event, e.g.
                ``store_error``, ``upload_failed``).
        """
        body: JsonObject = {"comment": comment}
        if wait_remote:
            body["wait_remote"] = True
        if auto:
            body["auto"] = True
        if reason is not None:
            body["reason"] = reason
        if created_by is not None:
            body["created_by"] = created_by
        return self._stream("POST", "/v1/checkpoint", body, on_event, detach=False)

    def restore(
        self,
        id: str,
        *,
        on_event: OnEvent | None = None,
        detach: bool = False,
        paths: Paths | None = None,
    ) -> Event:
        """Makes the layer equal to checkpoint ``id`` (only ``paths``, files or subtrees,
        if given: the rest stays as it is); returns the ``complete`` event (``undo`` names
        the automatic checkpoint that undoes it). With ``detach``, returns the first event
        instead: the job goes on; :meth:`follow` its ``job``."""
        body: JsonObject = {"paths": paths} if paths else {}
        return self._stream(
            "POST", _path("/v1/checkpoints", id, "restore"), body, on_event, detach=detach
        )

    def export(
        self,
        id: str,
        dest: str,
        *,
        paths: Paths | None = None,
        on_event: OnEvent | None = None,
    ) -> Event:
        """Has the daemon write checkpoint ``id`` (only ``paths``, if given) into ``dest``,
        an absolute directory on this machine that is missing or empty; returns the
        ``complete`` event (``stats``)."""
        body: JsonObject = {"dest": dest, "paths": paths or []}
        url = _path("/v1/checkpoints", id, "export")
        return self._stream("POST", url, body, on_event, detach=False)

    def reset(self, *, on_event: OnEvent | None = None, detach: bool = False) -> Event:
        """Empties the layer back to the base image (after an automatic checkpoint);
        returns as :meth:`restore` does."""
        return self._stream("POST", "/v1/reset", {}, on_event, detach=detach)

    def delete(self, id: str, *, dry_run: bool = False) -> shapes.DeleteReport:
        """Deletes a checkpoint and frees its space (``active_checkpoint``, ``not_found``);
        with ``dry_run``, only says what it would free."""
        query = {"dry_run": "true"} if dry_run else None
        url = _path("/v1/checkpoints", id, query=query)
        return cast("shapes.DeleteReport", self._object("DELETE", url))

    def follow(self, n: int, on_event: OnEvent | None = None) -> Event:
        """Follows job ``n`` from its first event to its end; returns its ``complete`` event
        and raises :class:`ApiError` if it ended with an ``error`` one."""
        return self._stream("GET", _path("/v1/jobs", str(n), "events"), None, on_event, False)

    # -- services --------------------------------------------------------------------------

    def services(self) -> shapes.Services:
        """``{"services": [status, ...], "errors": [bad definition files]}``."""
        return cast("shapes.Services", self._object("GET", "/v1/services"))

    def service_start(self, name: str) -> JsonObject:
        return self._object("POST", _path("/v1/services", name, "start"))

    def service_stop(self, name: str) -> JsonObject:
        return self._object("POST", _path("/v1/services", name, "stop"))

    def service_logs(self, name: str, lines: int = 100) -> Lines:
        """The last ``lines`` lines the service wrote (stdout and stderr)."""
        got = self._object("GET", _path("/v1/services", name, "logs", query={"lines": str(lines)}))
        return [str(line) for line in got["lines"]]

    # -- raw -------------------------------------------------------------------------------

    def request(
        self, method: str, path: str, body: bytes | str | None = None
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        """Any request; returns ``(status, headers, body)`` whatever the status."""
        with self.open_reply(method, path, body) as reply:
            return reply.status, reply.headers, reply.read()

    def open_reply(
        self,
        method: str,
        path: str,
        body: bytes | str | None = None,
        headers: Headers | None = None,
    ) -> Reply:
        """Any request; returns the :class:`Reply` as soon as its headers arrive, whatever
        the status (waiting for the daemon as every call does). ``headers`` add to or
        replace the client's (``X-Sprite-Actor``; ``Content-Type: application/json`` with
        a body)."""
        data = body.encode() if isinstance(body, str) else body
        return self._open(method, path, data, headers or [], stream=True)

    # -- internals -------------------------------------------------------------------------

    def _object(self, method: str, path: str, body: JsonObject | None = None) -> JsonObject:
        value = self._json(method, path, body)
        if not isinstance(value, dict):
            raise ApiError("bad_response", f"{method} {path}: expected an object", 200)
        return value

    def _list(self, method: str, path: str) -> JsonList:
        value = self._json(method, path)
        if not isinstance(value, list):
            raise ApiError("bad_response", f"{method} {path}: expected a list", 200)
        return value

    def _json(self, method: str, path: str, body: JsonObject | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        with self._open(method, path, data, [], stream=False) as reply:
            if reply.status >= 300:
                raise reply.error()
            raw = reply.read()
        try:
            return json.loads(raw)
        except ValueError:
            text = raw[:200].decode(errors="replace")
            raise ApiError("bad_response", f"{method} {path}: not JSON: {text}", 200) from None

    def _stream(
        self,
        method: str,
        path: str,
        body: JsonObject | None,
        on_event: OnEvent | None,
        detach: bool,
    ) -> Event:
        data = None if body is None else json.dumps(body).encode()
        reply = self._open(method, path, data, [], stream=True)
        if reply.status >= 300:
            with reply:
                raise reply.error()
        seen = 0  # events handed to on_event; a re-attach replays them first
        job: int | None = None
        empty = 0
        while True:
            skip, before = seen, seen
            with reply:
                for index, event in enumerate(reply.events()):
                    if index < skip:
                        continue
                    seen += 1
                    if isinstance(event.get("job"), int):
                        job = event["job"]
                    if on_event is not None:
                        on_event(event)
                    if event["type"] == "error":
                        code = str(event.get("code") or "internal")
                        raise ApiError(code, str(event.get("error") or code))
                    if event["type"] == "complete" or (detach and job is not None):
                        return event
            # The stream ended without its last event: the connection dropped (or the
            # daemon restarted). The job goes on in the daemon; follow it there.
            if job is None:
                raise DaemonUnavailable(
                    f"the daemon at {self.socket_path} closed the stream of {method} {path} "
                    "before naming its job"
                )
            empty = empty + 1 if seen == before else 0
            if empty > _MAX_EMPTY_REATTACH:
                raise DaemonUnavailable(f"the event stream of job {job} keeps ending early")
            time.sleep(_POLL * empty)
            reply = self._reattach(job)

    def _reattach(self, job: int) -> Reply:
        reply = self._open("GET", _path("/v1/jobs", str(job), "events"), None, [], stream=True)
        if reply.status < 300:
            return reply
        with reply:
            error = reply.error()
        if error.code == "not_found":
            raise DaemonUnavailable(
                f"lost job {job}: the daemon no longer knows it (restarted?); "
                "see sprite-env checkpoints log"
            )
        raise error

    def _open(
        self, method: str, path: str, body: bytes | None, headers: Headers, *, stream: bool
    ) -> Reply:
        """Sends one request, retrying while the daemon is not there yet (see the module
        docstring); returns the reply whatever its status."""
        start = time.monotonic()
        waiting = False
        doing = "starting or finishing a restore"
        gone: statelock.Holder | None = None
        while True:
            try:
                reply = self._attempt(method, path, body, headers, stream=stream)
            except (FileNotFoundError, ConnectionRefusedError):
                # Nobody listens (nothing was sent). Wait only for a daemon on its way.
                holder = statelock.read(os.path.dirname(self.socket_path))
                gone = holder if holder is not None and not holder.alive else None
                if gone is not None:
                    pid = statelock.starting_daemon(os.path.dirname(self.socket_path))
                    if pid is not None:
                        gone, doing = None, f"pid {pid} is starting"
                if holder is not None and holder.phase is not None:
                    doing = statelock.DOING[holder.phase]
            except TimeoutError:
                raise DaemonUnavailable(
                    f"the daemon at {self.socket_path} did not answer within {self.timeout:g} s"
                ) from None
            except (OSError, http.client.HTTPException) as e:
                raise DaemonUnavailable(
                    f"cannot talk to the daemon at {self.socket_path}: {e}"
                ) from None
            else:
                gone = None
                if reply.status != 503 or reply.error().code not in _NOT_READY:
                    return reply  # (an error's body was read whole; the reply replays it)
                reply.close()
            # Where none runs (none ever did, or it died: a stale socket), a short grace
            # for one launched a moment ago (it takes the lock about 0.3 s after it
            # starts), not the whole wait. Decided at each attempt from what is seen then:
            # a daemon spawned a moment ago can look like none in /proc (seen in the first
            # scan, 3 ms after its spawn), and a grace kept from that made a client give up
            # on a starting daemon after 0.8 s, saying it had waited the whole wait (4 in
            # 15 starts with the CPU busy; a flaky test in CI).
            grace = min(NO_DAEMON_GRACE, self.wait) if gone is not None else self.wait
            deadline = start + grace
            if time.monotonic() >= deadline:
                if gone is not None:
                    raise DaemonUnavailable(_no_daemon(self.socket_path, gone.pid))
                raise DaemonUnavailable(
                    f"no sprite-env daemon answers at {self.socket_path} after "
                    f"{self.wait:g} s; start one with: sprite-env daemon --overlay "
                    "LOWER:UPPER:WORK:MERGED (a sprite) or --root DIR"
                )
            if not waiting and gone is None:  # (the grace for no daemon passes silently)
                waiting = True
                self._say(f"waiting for the sprite-env daemon at {self.socket_path} ({doing})...")
            time.sleep(min(_POLL, max(0.0, deadline - time.monotonic())))

    def _attempt(
        self, method: str, path: str, body: bytes | None, extra: Headers, *, stream: bool
    ) -> Reply:
        # UTF-8 on the wire (http.client would send latin-1, or fail on other names).
        headers = {"X-Sprite-Actor": self.actor.encode().decode("latin-1")}
        if body is not None:
            headers["Content-Type"] = "application/json"
        lower = {k.lower(): k for k in headers}
        for key, value in extra:
            headers.pop(lower.get(key.lower(), key), None)
            headers[key] = value
        conn = UnixHTTPConnection(self.socket_path, self.timeout)
        with contextlib.ExitStack() as on_error:
            on_error.callback(conn.close)
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            on_error.pop_all()  # from here the reply owns the connection
        if stream and conn.unix_socket is not None:
            # a job may wait in the queue, or scan a large layer, between two events
            conn.unix_socket.settimeout(None)
        return Reply(conn, response)

    def _say(self, line: str) -> None:
        if self.notice is not None:
            self.notice(line)
        elif sys.stderr.isatty():
            print(line, file=sys.stderr, flush=True)


def file_chunks(reply: Reply, size: int = 1 << 20) -> Iterator[bytes]:
    """The bytes of a file answer (:meth:`Client.open_file`), as they arrive.

    Raises:
        DaemonUnavailable: the answer ended short of its Content-Length (the daemon met
            damage, or stopped): what came is not the whole file.
    """
    length = reply.headers.get("content-length")
    expected = int(length) if length is not None and length.isdigit() else None
    got = 0
    for chunk in reply.chunks(size):
        got += len(chunk)
        yield chunk
    if expected is not None and got != expected:
        raise DaemonUnavailable(
            f"the file's answer was cut after {got} of {expected} bytes (see the daemon's log)"
        )


def _no_daemon(socket_path: str, pid: int | None) -> str:
    last = f" (the last one, pid {pid}, is gone: stopped or killed)" if pid else ""
    return (
        f"no sprite-env daemon runs for {socket_path}{last}; start one with: sprite-env "
        "daemon --overlay LOWER:UPPER:WORK:MERGED (a sprite) or --root DIR"
    )


def _path(base: str, *parts: str, query: dict[str, str] | None = None) -> str:
    """``base/part/...?query`` with each part percent-encoded whole (``../x`` stays one
    segment, so the daemon sees an invalid id rather than another path)."""
    path = "/".join([base, *(quote(p, safe="") for p in parts)])
    return f"{path}?{urlencode(query)}" if query else path
