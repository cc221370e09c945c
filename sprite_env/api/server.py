"""HTTP/1.1 on a Unix socket, with h11 on trio: framing, limits and timeouts, no routing.

h11 does all the parsing; this module feeds it bytes and enforces what h11 leaves to the
server: a body size limit, a deadline for a request to arrive whole (a client that never
finishes sending is dropped with 408), keep-alive, ``Expect: 100-continue``, ``HEAD`` (the
``GET`` answer's head), and streamed responses (chunked) whose writer may vanish at any
moment without harming the producer. How many connections are served at once, and which
idle one is closed to make room, is ``connections.py``'s.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import http
import logging
import os
import socket as stdsocket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

import h11
import trio

from sprite_env import __version__
from sprite_env.api.connections import ConnectionTable, Slot, peer_of
from sprite_env.api.problems import Problem, problem_for

if TYPE_CHECKING:
    from sprite_env.api.front import Front

log = logging.getLogger(__name__)

#: Largest request head (request line plus headers).
MAX_HEAD = 16 * 1024
#: After an error answer, how long and how much of the rest of a request is read and dropped.
LINGER_S = 2.0
LINGER_BYTES = 16 << 20
#: accept() errors that mean "out of descriptors or memory for now": the loop waits
#: ``ACCEPT_BACKOFF_S`` and tries again, as trio's ``serve_listeners`` does, rather than
#: ending the daemon (the pending connection stays in the backlog meanwhile).
ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
ACCEPT_BACKOFF_S = 0.1
#: At most one log line per this many seconds while accept keeps failing (10 a second).
ACCEPT_LOG_EVERY_S = 10.0
#: Connections refused at once (over their client's bound), each for at most
#: ``REFUSE_LINGER_S``; more are closed without an answer.
MAX_REFUSING = 16
REFUSE_LINGER_S = 1.0


@dataclass(frozen=True)
class Limits:
    #: Largest request body accepted (the API's bodies are a comment and a few flags).
    max_body: int = 64 * 1024
    #: Seconds a request may take to arrive whole, from its first byte.
    request_timeout: float = 10.0
    #: Seconds an idle keep-alive connection is kept open.
    idle_timeout: float = 60.0


SERVER = f"sprite-env/{__version__}".encode()


@dataclass
class Request:
    method: str
    path: str  # as sent (percent-encoded), without the query: the router decodes segments
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    body: bytes
    #: The client process's user (SO_PEERCRED); None where unknown (memory streams).
    peer_uid: int | None = None
    #: The request target as sent (path and query): what a shared answer is found by.
    target: str = ""


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)
    #: The same for every GET of this target until the daemon's answers change (list,
    #: info): the front process may repeat it (``front.py``).
    shareable: bool = False


@dataclass
class StreamResponse:
    """A chunked response of NDJSON lines; the iterator is closed if the client leaves.

    With ``length``, the body's size is sent as Content-Length instead of chunking (a
    checkpoint's file): a body that ends short of it closes the connection, so the client
    sees a cut answer, never a shorter file."""

    status: int
    lines: AsyncIterator[bytes]
    content_type: str = "application/x-ndjson"
    length: int | None = None


Handler = Callable[[Request], Awaitable[Response | StreamResponse]]


def _reason(status: int) -> bytes:
    try:
        return http.HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


class _ClientGone(Exception):
    pass


#: h11's error hints for a malformed request -> the problem answered.
_PROTOCOL_CODES = {413: "body_too_large", 431: "headers_too_large", 501: "not_implemented"}


class _Connection:
    def __init__(
        self,
        stream: trio.abc.Stream,
        handler: Handler,
        limits: Limits,
        slot: Slot | None = None,
        front: Front | None = None,
        primed: bytes = b"",
    ) -> None:
        self.stream = stream
        self.handler = handler
        self.limits = limits
        self.slot = slot or Slot(None)
        self.front = front
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        if primed:  # what the front read before handing the connection over
            self.conn.receive_data(primed)
        self.head_only = False  # answering HEAD: the head of the GET answer, no body

    async def _send(self, event: h11.Event) -> None:
        data = self.conn.send(event)
        if data:
            try:
                await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise _ClientGone from None

    async def _next_event(self) -> Any:
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            if self.conn.they_are_waiting_for_100_continue:
                await self._send(h11.InformationalResponse(status_code=100, headers=[]))
            try:
                data = await self.stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise _ClientGone from None
            self.conn.receive_data(bytes(data))

    async def serve(self) -> None:
        try:
            while (request := await self._receive()) is not None:
                await self._answer(request)
                if self.conn.our_state is not h11.DONE or self.conn.their_state is not h11.DONE:
                    return  # MUST_CLOSE (HTTP/1.0, "Connection: close") or a broken exchange
                self.conn.start_next_cycle()
        except _ClientGone:
            return
        except h11.ProtocolError as e:  # our own misuse of h11 would be a bug: log it
            log.warning("HTTP protocol error: %s", e)
        finally:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await self.stream.aclose()

    async def _receive(self) -> Request | None:
        """The next request, read whole; None when the connection must end: the client
        left or sent a request that could not be read (answered with its problem), or
        the connection was closed to make room (``connections.py``: it was idle)."""
        self.head_only = False
        request: Request | None = None
        with self.slot.idle():  # (evicted: the block is cancelled; request stays None)
            request = await self._read_in_time() if await self._first_bytes() else None
        return None if self.slot.evicted else request

    async def _first_bytes(self) -> bool:
        """Waits (at most the idle timeout) for the next request to begin."""
        if self.conn.trailing_data[0]:  # pipelined: already here
            return True
        with trio.move_on_after(self.limits.idle_timeout):
            try:
                data = await self.stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return False
            self.conn.receive_data(bytes(data))
            return bool(data)
        return False

    async def _read_in_time(self) -> Request | None:
        """Reads one request within the request timeout; None (answered if possible) when
        it cannot be read."""
        try:
            with trio.fail_after(self.limits.request_timeout):
                return await self._read_request()
        except trio.TooSlowError:
            self._give_up_reading()
            await self._answer_problem(Problem("request_timeout", "request not received in time"))
        except h11.RemoteProtocolError as e:
            code = _PROTOCOL_CODES.get(e.error_status_hint, "bad_request")
            await self._answer_problem(Problem(code, f"malformed request: {e}"))
        except Problem as p:  # a body over the limit: answered, then closed
            self._give_up_reading()
            await self._answer_problem(p)
        return None

    async def _answer(self, request: Request) -> None:
        front = self.front
        generation = front.generation() if front is not None and front.alive else None
        try:
            response = await self.handler(request)
        except Exception as e:  # a handler's failure is the client's answer, not our crash
            problem = problem_for(e)
            if problem.code == "internal":
                log.exception("handler failed for %s %s", request.method, request.path)
            response = Response(problem.status, problem.body())
        if isinstance(response, StreamResponse):
            await self._stream(response)
            return
        if (
            front is not None
            and generation is not None
            and response.shareable
            and response.status == 200
            and request.method == "GET"
        ):  # valid since before the handler ran if no change happened since (offer checks)
            front.offer(request.target, response.content_type, response.body, generation)
        await self._respond(response)

    async def _read_request(self) -> Request | None:
        event = await self._next_event()
        if isinstance(event, h11.ConnectionClosed):
            return None
        assert isinstance(event, h11.Request), event
        self.head_only = event.method == b"HEAD"  # as h11 frames it (methods are case-sensitive)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
        length = headers.get("content-length")
        limit = self.limits.max_body
        if length is not None and length.isdigit() and int(length) > limit:
            raise Problem("body_too_large", f"request body over {limit} bytes")
        body = bytearray()
        while True:
            part = await self._next_event()
            if isinstance(part, h11.Data):
                body += part.data
                if len(body) > limit:
                    raise Problem("body_too_large", f"request body over {limit} bytes")
            elif isinstance(part, h11.EndOfMessage):
                break
            else:  # ConnectionClosed mid-body
                raise _ClientGone
        target = urlsplit(event.target.decode("latin-1"))
        return Request(
            method=event.method.decode("ascii", "replace").upper(),
            path=target.path,
            query=dict(parse_qsl(target.query, keep_blank_values=True)),
            headers=headers,
            body=bytes(body),
            peer_uid=self.slot.peer.uid if self.slot.peer is not None else None,
            target=event.target.decode("latin-1"),
        )

    def _headers(
        self, content_type: str, extra: list[tuple[str, str]]
    ) -> list[tuple[bytes, bytes]]:
        out = [(b"content-type", content_type.encode()), (b"server", SERVER)]
        out += [(k.encode(), v.encode()) for k, v in extra]
        return out

    def _give_up_reading(self) -> None:
        """Ends the request as h11 sees it (as if the peer hung up), so that an error
        response may be sent whatever state the half-read request left h11 in."""
        if self.conn.their_state is h11.ERROR:
            return
        self.conn.receive_data(b"")
        with contextlib.suppress(h11.RemoteProtocolError):
            while self.conn.next_event() not in (h11.NEED_DATA, h11.PAUSED):
                pass

    async def _respond(self, r: Response) -> None:
        if self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        headers = self._headers(r.content_type, r.headers)
        headers.append((b"content-length", str(len(r.body)).encode()))
        await self._send(
            h11.Response(status_code=r.status, headers=headers, reason=_reason(r.status))
        )
        if not self.head_only:
            await self._send(h11.Data(data=r.body))
        await self._send(h11.EndOfMessage())

    async def _answer_problem(self, p: Problem) -> None:
        """Answers an unreadable request, then drains what the client still sends for a
        moment: closing on unread data would reset the connection, and the client would
        never read the answer."""
        with contextlib.suppress(_ClientGone, h11.LocalProtocolError):
            await self._respond(Response(p.status, p.body(), headers=[("connection", "close")]))
        with trio.move_on_after(LINGER_S), contextlib.suppress(Exception):
            await self.stream.send_eof()  # type: ignore[attr-defined]
            drained = 0
            while drained < LINGER_BYTES:
                data = await self.stream.receive_some(65536)
                if not data:
                    break
                drained += len(data)

    async def _stream(self, r: StreamResponse) -> None:
        extra = [("cache-control", "no-cache")]
        if r.length is not None:
            extra.append(("content-length", str(r.length)))
        headers = self._headers(r.content_type, extra)
        try:
            await self._send(
                h11.Response(status_code=r.status, headers=headers, reason=_reason(r.status))
            )
            if not self.head_only:
                async for line in r.lines:
                    await self._send(h11.Data(data=line))
            await self._send(h11.EndOfMessage())
        finally:
            aclose = getattr(r.lines, "aclose", None)
            if aclose is not None:
                with trio.CancelScope(shield=True):
                    await aclose()


async def handle(
    stream: trio.abc.Stream,
    handler: Handler,
    limits: Limits | None = None,
    slot: Slot | None = None,
    front: Front | None = None,
    primed: bytes = b"",
) -> None:
    """Serves every request that arrives on one connection (until ``slot`` is evicted);
    ``primed``: the bytes the front read from it already."""
    await _Connection(stream, handler, limits or Limits(), slot, front, primed).serve()


async def serve_listener(
    listener: trio.abc.Listener[trio.abc.Stream],
    handler: Handler,
    *,
    limits: Limits | None = None,
    table: ConnectionTable | None = None,
    front: Front | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accepts connections on ``listener`` and serves each until cancelled, within the
    bounds of ``table`` (see ``connections.py``). With a started ``front``, the front
    accepts them and this serves those it hands over, until it ends; then this accepts.

    Error handling:
        accept() errors in :data:`ACCEPT_CAPACITY_ERRNOS` (out of descriptors or memory)
        close the longest-idle connection, if any, and are retried every
        :data:`ACCEPT_BACKOFF_S`, logged at most every :data:`ACCEPT_LOG_EVERY_S`; any
        other error ends the loop. A connection over its client's bound, with none of the
        client's connections idle, is answered 503 ``busy`` and closed.
    """
    table = table if table is not None else ConnectionTable()
    refusing = 0
    failures = 0
    logged_at = -ACCEPT_LOG_EVERY_S

    async def serve_one(stream: trio.abc.Stream, slot: Slot, primed: bytes = b"") -> None:
        try:
            await handle(stream, handler, limits, slot, front, primed)
        finally:
            table.release(slot)

    async def refuse(stream: trio.abc.Stream, message: str) -> None:
        nonlocal refusing
        refusing += 1
        try:
            with trio.move_on_after(REFUSE_LINGER_S), contextlib.suppress(Exception):
                await stream.send_all(_raw_problem(Problem("busy", message)))
                await stream.send_eof()  # type: ignore[attr-defined]
                while await stream.receive_some(65536):  # (closing on unread data resets)
                    pass
        finally:
            refusing -= 1
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await stream.aclose()

    async def close_quietly(stream: trio.abc.Stream) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.aclose()

    def place(stream: trio.abc.Stream, primed: bytes = b"") -> None:
        peer = peer_of(stream)
        slot = table.admit(peer)
        if slot is not None:
            nursery.start_soon(serve_one, stream, slot, primed)
        elif refusing < MAX_REFUSING:
            assert peer is not None  # only a known client has bounds of its own
            nursery.start_soon(
                refuse,
                stream,
                f"too many connections at once from process {peer.pid} (user {peer.uid}): "
                f"at most {table.per_pid} per process and {table.per_uid} per user; "
                "close some, or retry",
            )
        else:
            nursery.start_soon(close_quietly, stream)

    async def out_of_room(e: OSError) -> None:
        """Out of descriptors or memory: an idle connection closed, a pause, logged."""
        nonlocal failures, logged_at
        code = e.errno
        assert code is not None  # (one of ACCEPT_CAPACITY_ERRNOS)
        failures += 1
        if trio.current_time() - logged_at >= ACCEPT_LOG_EVERY_S:
            logged_at = trio.current_time()
            log.warning(
                "accept: %s (%s); retrying every %.1f s (%d failures so far)",
                errno.errorcode[code],
                os.strerror(code),
                ACCEPT_BACKOFF_S,
                failures,
            )
        table.evict_idle(lambda s: True)  # its descriptor is the one a new client needs
        await trio.sleep(ACCEPT_BACKOFF_S)

    async def room_for_one() -> bool:
        """Waits for a slot; False if no descriptor is free now (after backing off)."""
        await table.wait_for_room()
        try:
            os.close(os.dup(0))  # a connection passed by the front needs one descriptor
        except OSError as e:
            if e.errno not in ACCEPT_CAPACITY_ERRNOS:
                raise
            await out_of_room(e)
            return False
        return True

    async def refresh(front: Front) -> None:
        """Right after each change, the targets the front repeated are answered again (by
        the handler, as a request would be) and shared, so the front has them before
        clients ask (else the first requests after a change are all the daemon's)."""
        seen = 0
        while True:
            seen = await front.changed(seen)
            for target in front.wanted():
                url = urlsplit(target)
                query = dict(parse_qsl(url.query, keep_blank_values=True))
                request = Request("GET", url.path, query, {}, b"", None, target)
                generation = front.generation()
                try:
                    response = await handler(request)
                except Exception:  # (a deleted checkpoint's info): a client gets the error
                    front.forget(target)
                    continue
                if isinstance(response, Response) and response.shareable:
                    front.offer(target, response.content_type, response.body, generation)

    async with trio.open_nursery() as nursery:
        task_status.started()
        if front is not None and front.alive:
            nursery.start_soon(refresh, front)
            async for sock, primed in front.handed_back(room_for_one):
                place(trio.SocketStream(trio.socket.from_stdlib_socket(sock)), primed)
        while True:
            await table.wait_for_room()
            try:
                stream = await listener.accept()
            except OSError as e:
                if e.errno not in ACCEPT_CAPACITY_ERRNOS:
                    raise
                await out_of_room(e)
                continue
            place(stream)


def _raw_problem(p: Problem) -> bytes:
    """A whole HTTP answer for a connection that sent no request (h11 answers only one)."""
    body = p.body()
    head = (
        f"HTTP/1.1 {p.status} {_reason(p.status).decode()}\r\n"
        f"content-type: application/json\r\nserver: {SERVER.decode()}\r\n"
        f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def bind_unix_socket(path: str, *, group: str | None = None) -> trio.socket.SocketType:
    """A listening Unix socket at ``path``, mode 0600 (0660 and chgrp'ed with ``group``).

    The mode is set by the umask at bind time, so there is no moment when others may connect.
    The caller has made sure no live server owns ``path`` (the daemon lock), so a file left
    there is stale and replaced.
    """
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = stdsocket.socket(stdsocket.AF_UNIX, stdsocket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    if group is not None:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            sock.close()
            raise ValueError(f"unknown group {group!r}") from None
        os.chown(path, -1, gid)
        os.chmod(path, 0o660)
    # Connections wait here while the accept loop makes room (connections.py); a client
    # whose connect finds the backlog full gets EAGAIN (the CLI's client then retries).
    sock.listen(1024)
    return trio.socket.from_stdlib_socket(sock)


async def serve_unix(
    path: str,
    handler: Handler,
    *,
    group: str | None = None,
    limits: Limits | None = None,
    front: Front | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serves ``handler`` on a Unix socket at ``path`` until cancelled (then removes it);
    with ``front``, through a front process started on the socket (``front.py``)."""
    sock = bind_unix_socket(path, group=group)
    listener = trio.SocketListener(sock)
    try:
        if front is not None:
            front.start(sock.fileno())
        await serve_listener(listener, handler, limits=limits, front=front, task_status=task_status)
    finally:
        if front is not None:
            front.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        await listener.aclose()
