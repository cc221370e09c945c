"""A throwaway HTTP server on a Unix socket that answers with canned replies (h11, a thread).

FOR PARSING TESTS ONLY: it knows nothing of the API; each connection gets the next
:class:`Canned` reply whatever it asked, and the requests are recorded. The end-to-end
tests run the CLI against the real daemon (``tests/cli/test_online_cli.py``).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import h11

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import TracebackType


@dataclass
class Canned:
    """One reply: a status, then ``parts`` (each sent as it is: a stream's pieces)."""

    status: int = 200
    parts: list[bytes] = field(default_factory=list)
    content_type: str = "application/json"
    chunked: bool = False
    drop: bool = False  # close the connection after the parts, the reply unfinished

    @classmethod
    def json(cls, value: Any, status: int = 200) -> Canned:
        return cls(status, [json.dumps(value).encode()])

    @classmethod
    def problem(cls, code: str, status: int, message: str = "") -> Canned:
        return cls.json({"code": code, "message": message or code, "status": status}, status)

    @classmethod
    def events(cls, *events: dict[str, Any], status: int = 200, drop: bool = False) -> Canned:
        return cls(
            status,
            [json.dumps(e).encode() + b"\n" for e in events],
            content_type="application/x-ndjson",
            chunked=True,
            drop=drop,
        )


@dataclass
class Seen:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


class CannedServer:
    """Serves ``replies`` in order, one per connection, on ``path``; records ``requests``."""

    def __init__(self, path: str, replies: list[Canned]) -> None:
        self.path = path
        self.replies = list(replies)
        self.requests: list[Seen] = []
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(8)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._stop = False

    def __enter__(self) -> CannedServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop = True
        # wake accept() up
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(self.path)
        self._thread.join(timeout=5)
        self._listener.close()

    def _serve(self) -> None:
        while True:
            sock, _ = self._listener.accept()
            with sock:
                if self._stop:
                    return
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self._answer(sock)  # (a client may leave before the end)

    def _answer(self, sock: socket.socket) -> None:
        conn = h11.Connection(h11.SERVER)
        request: h11.Request | None = None
        body = b""
        for event in _events(conn, sock):
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
        assert request is not None
        self.requests.append(
            Seen(
                request.method.decode(),
                request.target.decode(),
                {k.decode().lower(): v.decode() for k, v in request.headers},
                body,
            )
        )
        reply = self.replies.pop(0)
        headers = [("content-type", reply.content_type)]
        if reply.chunked:
            headers.append(("transfer-encoding", "chunked"))
        else:
            headers.append(("content-length", str(sum(map(len, reply.parts)))))
        sock.sendall(conn.send(h11.Response(status_code=reply.status, headers=headers)) or b"")
        for part in reply.parts:
            sock.sendall(conn.send(h11.Data(data=part)) or b"")
            if reply.chunked:
                time.sleep(0.01)  # separate chunks, as a real stream arrives
        if not reply.drop:
            sock.sendall(conn.send(h11.EndOfMessage()) or b"")


def _events(conn: h11.Connection, sock: socket.socket) -> Iterator[h11.Event]:
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(sock.recv(65536))
            continue
        assert isinstance(event, h11.Event)
        yield event
        if isinstance(event, h11.EndOfMessage):
            return
