"""A fault-injecting HTTP proxy on 127.0.0.1, in front of the test Swift.

The client under test talks to the proxy as to the server. Each request is read whole,
matched against the script (:meth:`FaultProxy.script`: a method, a substring of the path,
how many times), and then forwarded untouched (``"pass"``, also what an unmatched
request gets) or answered with a fault:

- ``"500"``: HTTP 500 InternalError, never forwarded;
- ``"503"``: HTTP 503 SlowDown (S3's "reduce your request rate"), never forwarded;
- ``"reset"``: the connection reset (RST) before anything is forwarded;
- ``"reset-after"``: forwarded (the server does the request: a PUT is stored), then the
  connection reset instead of the answer, so the client cannot know it succeeded;
- ``"cut"``: forwarded, then the answer's headers and half its body, then a reset;
- ``"stall"``: no answer for ``stall_seconds`` (the client's read timeout fires), then
  closed, never forwarded.

:meth:`down` closes the listening socket (connections are refused, as by a stopped
server) and :meth:`up` opens it again on the same port. Every request is recorded in
:attr:`seen` with what was done to it. One request per connection: the proxy says
``Connection: close`` both ways, so a fault never hits a request it was not meant for.
"""

from __future__ import annotations

import contextlib
import re
import socket
import struct
import threading
from dataclasses import dataclass, field

ACTIONS = ("pass", "500", "503", "reset", "reset-after", "cut", "stall")

_ERRORS = {
    "500": (500, "Internal Server Error", "InternalError", "We encountered an internal error."),
    "503": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
}


@dataclass
class Rule:
    action: str
    method: str | None
    path: str | None
    times: float  # how many more requests it takes (math.inf: until cleared)


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    action: str  # "pass" when forwarded untouched


@dataclass
class FaultProxy:
    """The proxy; ``url`` is its address. Use as a context manager, or call :meth:`close`.

    Args:
        upstream: the server's ``http://127.0.0.1:PORT``.
        stall_seconds: how long a ``"stall"`` holds a request before it closes it.
    """

    upstream: str
    stall_seconds: float = 30.0
    seen: list[Seen] = field(default_factory=list)
    _rules: list[Rule] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closing: threading.Event = field(default_factory=threading.Event)
    _listener: socket.socket | None = None
    port: int = 0

    def __post_init__(self) -> None:
        m = re.fullmatch(r"http://127\.0\.0\.1:(\d+)/?", self.upstream)
        if m is None:  # never anything but this machine's loopback
            raise ValueError(f"upstream must be http://127.0.0.1:PORT, not {self.upstream}")
        self._upstream = ("127.0.0.1", int(m[1]))
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def script(
        self,
        action: str,
        *,
        method: str | None = None,
        path: str | None = None,
        times: float = 1,
    ) -> None:
        """The next ``times`` requests matching ``method`` and ``path`` (a substring of
        the request target, query included) get ``action``; rules apply in order."""
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}")
        with self._lock:
            self._rules.append(Rule(action, method, path, times))

    def clear(self) -> None:
        """Forget every scripted fault: all requests pass from now on."""
        with self._lock:
            self._rules.clear()

    def count(self, action: str | None = None, method: str | None = None) -> int:
        with self._lock:
            return sum(
                1
                for s in self.seen
                if (action is None or s.action == action) and (method is None or s.method == method)
            )

    def down(self) -> None:
        """Stop listening: new connections are refused until :meth:`up`."""
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            # shutdown first: a close alone leaves a thread blocked in accept() on it,
            # still accepting.
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()

    def up(self) -> None:
        """Listen again (on the same port once one was chosen)."""
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self.port = s.getsockname()[1]
        with self._lock:
            self._listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def close(self) -> None:
        self._closing.set()
        self.down()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed by down() or close()
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _take(self, method: str, target: str) -> str:
        with self._lock:
            for rule in self._rules:
                if rule.times <= 0:
                    continue
                if rule.method is not None and rule.method != method:
                    continue
                if rule.path is not None and rule.path not in target:
                    continue
                rule.times -= 1
                action = rule.action
                break
            else:
                action = "pass"
            self.seen.append(Seen(method, target, action))
            return action

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                request = _read_request(conn)
            except (OSError, ValueError):
                return
            if request is None:
                return
            head, body = request
            method, target = head.split(b" ", 2)[:2]
            action = self._take(method.decode(), target.decode())
            if action == "reset":
                _reset(conn)
                return
            if action == "stall":
                self._closing.wait(self.stall_seconds)
                return
            if action in _ERRORS:
                conn.sendall(_error_response(*_ERRORS[action]))
                return
            response = self._forward(head, body)
            if action == "reset-after":
                _reset(conn)
                return
            if action == "cut":
                split = response.index(b"\r\n\r\n") + 4
                conn.sendall(response[: split + (len(response) - split) // 2])
                _reset(conn)
                return
            with contextlib.suppress(OSError):
                conn.sendall(response)

    def _forward(self, head: bytes, body: bytes) -> bytes:
        lines = head.split(b"\r\n")
        kept = [
            ln
            for ln in lines[1:]
            if not ln.lower().startswith((b"connection:", b"expect:", b"keep-alive:"))
        ]
        out = b"\r\n".join([lines[0], *kept, b"Connection: close"]) + b"\r\n\r\n" + body
        with socket.create_connection(self._upstream) as up:
            up.sendall(out)
            chunks = []
            while chunk := up.recv(1 << 16):
                chunks.append(chunk)
        response = b"".join(chunks)
        split = response.index(b"\r\n\r\n")
        rlines = response[:split].split(b"\r\n")
        rkept = [ln for ln in rlines[1:] if not ln.lower().startswith(b"connection:")]
        return b"\r\n".join([rlines[0], *rkept, b"Connection: close"]) + response[split:]


def _read_request(conn: socket.socket) -> tuple[bytes, bytes] | None:
    """One request: its head (without the blank line) and its body. A client that asks
    for ``100 Continue`` is told to go on here, so the body is read whatever follows."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(1 << 16)
        if not chunk:
            return None
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    expects_continue = False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value.strip())
        elif name == b"transfer-encoding":
            raise ValueError("chunked requests are not supported by the fault proxy")
        elif name == b"expect" and value.strip().lower() == b"100-continue":
            expects_continue = True
    if expects_continue and len(rest) < length:
        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
    while len(rest) < length:
        chunk = conn.recv(1 << 16)
        if not chunk:
            return None
        rest += chunk
    return head, rest[:length]


def _error_response(status: int, reason: str, code: str, message: str) -> bytes:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    return head + body


def _reset(conn: socket.socket) -> None:
    """Close with RST, not FIN: the client sees ``Connection reset by peer``."""
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()
