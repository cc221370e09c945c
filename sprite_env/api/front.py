"""The front: a process of its own that answers repeated reads while a job runs.

The daemon is one Python process: every request it answers takes its interpreter (the
GIL) from the job's threads. Measured (``benchmarks/bench_daemon.py``, small layer, 20
client threads sending GET /v1/checkpoints back to back, each on a new connection): with
every answer already cached, serving still held the GIL in 53% of the samples of a
create and cost about 1 ms of it per request, so the create either ran 2-3x slower or,
paced to 500 requests a second (``pacing.py``), the answers waited 40 ms (20 clients /
500 per second) and up to 200-360 ms at p99.

So the daemon starts this module as a child process (``python -m sprite_env.api.front``)
that accepts every connection on the daemon's socket and reads its first request with
h11, as the daemon would. A GET or HEAD of a target whose answer the daemon has shared
(list and info: :attr:`~sprite_env.api.server.Response.shareable`) is answered here, with
the bytes the daemon would send; anything else, a request not whole within
:data:`GRACE_S`, or a connection left idle that long, is handed to the daemon with the
bytes read so far (``SCM_RIGHTS`` over a ``SOCK_SEQPACKET`` pair), and the daemon serves
it exactly as if it had accepted it (its bounds, timeouts and pacing apply from then).

Never stale: the daemon sends ``clear`` on the control socket in the same step as the
change that drops its own answers, before it can tell any client the job ended, and the
front reads every waiting control message before it answers a request; an answer is
shared only with the generation it was computed in, and one older than the front's is
ignored. If the front cannot be told (its control socket full) it is killed; if it dies,
the daemon accepts connections itself again, as without it.

Control messages (one per ``send``), daemon to front: ``C`` + generation (8 bytes): every
answer dropped; ``S`` + generation + target length (2) + content-type length (2) +
target + content type + body: an answer. Front to daemon: ``H`` + the bytes read from the
connection, with its descriptor.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import h11

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

log = logging.getLogger(__name__)

#: A connection with no whole request for this long is handed to the daemon (a slow or
#: idle client costs the front nothing; the daemon has the timeouts and bounds).
GRACE_S = 0.5
#: Connections held at once; past this the longest held is handed to the daemon.
MAX_HELD = 512
#: Targets answered again after each change (list variants, one per checkpoint asked of).
MAX_WANTED = 256
#: Largest request head, as the daemon's (``server.MAX_HEAD``).
MAX_HEAD = 16 * 1024
#: Control socket buffers (SO_SNDBUFFORCE as root): a shared answer must fit in one
#: message, and the list of a few hundred checkpoints is ~200 KB.
CTRL_BUFFER = 4 << 20
#: Largest hand-off message: a request head and one read past it.
HANDED_MAX = MAX_HEAD + 65536 + 1
#: Seconds an answer may take to be written to a slow reader before the front drops it.
SEND_TIMEOUT_S = 2.0

_HEAD = struct.Struct("!cQHH")
_CLEAR = struct.Struct("!cQ")


def _big_buffers(s: socket.socket) -> None:
    for force, plain in (
        (getattr(socket, "SO_SNDBUFFORCE", None), socket.SO_SNDBUF),
        (getattr(socket, "SO_RCVBUFFORCE", None), socket.SO_RCVBUF),
    ):
        try:
            s.setsockopt(socket.SOL_SOCKET, force if force is not None else plain, CTRL_BUFFER)
        except OSError:  # not root: the system's maximum
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, plain, CTRL_BUFFER)


# -- the daemon's side --------------------------------------------------------------------


class Front:
    """The daemon's handle on its front process.

    Args:
        generation: the daemon's answer generation now (bumped by every change).
        server: the ``Server`` header the daemon sends.
    """

    def __init__(self, generation: Callable[[], int], server: bytes) -> None:
        self.generation = generation
        self.server = server
        self.proc: subprocess.Popen[bytes] | None = None
        self._ctrl: socket.socket | None = None
        #: Answers shared, and connections handed back (tests and logs).
        self.shared = 0
        self.handed = 0
        #: Targets shared lately, oldest first: answered again after each change.
        self._wanted: dict[str, None] = {}
        self._clears = 0
        self._cleared: Any = None  # a trio.Event while someone waits in changed()

    @property
    def alive(self) -> bool:
        return self._ctrl is not None

    def start(self, listener: int) -> None:
        """Starts the front on ``listener`` (a bound, listening socket's descriptor)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        _big_buffers(ours)
        _big_buffers(theirs)
        # The same sprite_env as this process's, whatever the working directory holds.
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-P",
                    "-m",
                    "sprite_env.api.front",
                    str(listener),
                    str(theirs.fileno()),
                    self.server.decode(),
                ],
                pass_fds=(listener, theirs.fileno()),
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": path},
            )
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self._ctrl = ours
        self.clear(self.generation())

    def clear(self, generation: int) -> None:
        """Every shared answer is stale (called in the step that makes them so)."""
        if self._ctrl is None:
            return
        try:
            self._ctrl.send(_CLEAR.pack(b"C", generation))
        except OSError as e:  # cannot be told: it must not answer again
            log.warning("front: cannot clear its answers (%s): stopping it", e)
            self._kill()
        self._clears += 1
        if self._cleared is not None:
            self._cleared.set()

    async def changed(self, seen: int) -> int:
        """Waits until a :meth:`clear` after the ``seen``-th; returns how many there were."""
        import trio

        while self._clears == seen:
            self._cleared = trio.Event()
            await self._cleared.wait()
        return self._clears

    def wanted(self) -> list[str]:
        """The targets shared lately (to share again after a change)."""
        return list(self._wanted)

    def forget(self, target: str) -> None:
        self._wanted.pop(target, None)

    def offer(self, target: str, content_type: str, body: bytes, generation: int) -> None:
        """Shares the answer to ``target``, valid in ``generation`` (ignored if a change
        happened since, or if it does not fit in one control message)."""
        if self._ctrl is None or generation != self.generation():
            return
        t, c = target.encode("latin-1"), content_type.encode("latin-1")
        message = _HEAD.pack(b"S", generation, len(t), len(c)) + t + c + body
        self._wanted.pop(target, None)
        self._wanted[target] = None
        while len(self._wanted) > MAX_WANTED:
            del self._wanted[next(iter(self._wanted))]
        try:
            self._ctrl.send(message)
            self.shared += 1
        except OSError as e:  # full, or too big: the daemon keeps answering it itself
            if e.errno not in (errno.EAGAIN, errno.EMSGSIZE, errno.ENOBUFS):
                log.warning("front: %s", e)

    async def handed_back(
        self, room: Callable[[], Awaitable[bool]]
    ) -> AsyncIterator[tuple[socket.socket, bytes]]:
        """The connections the front hands to the daemon, with the bytes it read from
        each, until the front ends (then the daemon accepts connections itself).

        Args:
            room: waits for room for one more connection; False when there is none yet
                (no descriptor: a passed one would be lost), and it is called again.
        """
        import trio

        fd_size = struct.calcsize("i")
        while self._ctrl is not None:
            ctrl = self._ctrl
            # (as accept() does: the connections placed so far start, and are idle, so
            # the bounds may close them to make room for this one)
            await trio.lowlevel.checkpoint()
            if not await room():
                continue
            try:
                data, anc, _flags, _addr = ctrl.recvmsg(HANDED_MAX, socket.CMSG_SPACE(fd_size))
            except BlockingIOError:
                await trio.lowlevel.wait_readable(ctrl)
                continue
            except OSError as e:
                log.warning("front: %s", e)
                data, anc = b"", []
            fds = [
                fd
                for level, kind, raw in anc
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
                for (fd,) in struct.iter_unpack("i", raw[: len(raw) - len(raw) % fd_size])
            ]
            if not data:
                for fd in fds:
                    os.close(fd)
                log.warning("front: ended (exit %s); the daemon accepts itself", self._exit())
                self._close_ctrl()
                return
            for fd in fds[1:]:
                os.close(fd)
            if data[:1] == b"H" and fds:
                self.handed += 1
                yield socket.socket(fileno=fds[0]), data[1:]

    def close(self) -> None:
        """Stops the front (connections it holds are closed with it)."""
        self._close_ctrl()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # (its end of the control socket closes: handed_back ends)

    def _close_ctrl(self) -> None:
        if self._ctrl is not None:
            self._ctrl.close()
            self._ctrl = None

    def _exit(self) -> int | None:
        if self.proc is None:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.proc.wait(5)
        return None


# -- the front process --------------------------------------------------------------------


@dataclass
class _Held:
    sock: socket.socket
    since: float
    conn: h11.Connection = field(
        default_factory=lambda: h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    )
    #: Bytes read since the last request answered here (what the daemon gets if handed).
    pending: bytearray = field(default_factory=bytearray)


class _FrontLoop:
    def __init__(self, listener: socket.socket, ctrl: socket.socket, server: bytes) -> None:
        self.listener = listener
        self.ctrl = ctrl
        self.server = server
        self.sel = selectors.DefaultSelector()
        self.answers: dict[bytes, tuple[bytes, bytes]] = {}  # target -> (type, body)
        self.generation = 0
        self.held: dict[int, _Held] = {}
        self.ended = False
        self._buffer = bytearray(CTRL_BUFFER)  # (recv would allocate this much per call)

    def run(self) -> None:
        self.listener.setblocking(False)
        self.ctrl.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ)
        self.sel.register(self.ctrl, selectors.EVENT_READ)
        while not self.ended:
            now = time.monotonic()
            first = min((h.since for h in self.held.values()), default=None)
            timeout = None if first is None else max(0.0, first + GRACE_S - now)
            ready = self.sel.select(timeout)
            self._read_ctrl()  # every change the daemon made before these requests
            for key, _mask in ready:
                if self.ended:
                    return
                if key.fileobj is self.listener:
                    self._accept()
                elif key.fileobj is not self.ctrl:
                    held = self.held.get(key.fd)
                    if held is not None:
                        self._readable(held)
            deadline = time.monotonic() - GRACE_S
            for held in [h for h in self.held.values() if h.since <= deadline]:
                self._hand(held)

    def _read_ctrl(self) -> None:
        while True:
            try:
                n = self.ctrl.recv_into(self._buffer)
            except BlockingIOError:
                return
            except OSError:
                n = 0
            msg = bytes(memoryview(self._buffer)[:n])
            if not msg:  # the daemon is gone
                self.ended = True
                return
            kind = msg[:1]
            if kind == b"C":
                _, gen = _CLEAR.unpack_from(msg)
                self.generation = gen
                self.answers.clear()
            elif kind == b"S":
                _, gen, tn, cn = _HEAD.unpack_from(msg)
                if gen < self.generation:
                    continue
                if gen > self.generation:  # changes made before this front started
                    self.generation = gen
                    self.answers.clear()
                at = _HEAD.size
                target, ctype = msg[at : at + tn], msg[at + tn : at + tn + cn]
                self.answers[target] = (ctype, msg[at + tn + cn :])

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of descriptors: the daemon's backoff is not ours
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS):
                    oldest = min(self.held.values(), key=lambda h: h.since, default=None)
                    if oldest is not None:
                        self._hand(oldest)
                return
            sock.setblocking(False)
            held = _Held(sock, time.monotonic())
            self.held[sock.fileno()] = held
            self.sel.register(sock, selectors.EVENT_READ)
            if len(self.held) > MAX_HELD:
                self._hand(min(self.held.values(), key=lambda h: h.since))

    def _readable(self, held: _Held) -> None:
        try:
            data = held.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            if held.pending:
                self._hand(held)  # half a request, then EOF: the daemon answers that
            else:
                self._drop(held)
            return
        held.pending += data
        held.conn.receive_data(data)
        self._serve(held)

    def _serve(self, held: _Held) -> None:
        conn = held.conn
        while True:
            try:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    return  # (the grace period counts from the connection's last answer)
                if not isinstance(event, h11.Request):
                    if isinstance(event, h11.ConnectionClosed):
                        self._drop(held)
                    else:
                        self._hand(held)
                    return
                answer = self._answer_for(event)
                if answer is None or not isinstance(conn.next_event(), h11.EndOfMessage):
                    self._hand(held)  # not ours, or a body: the daemon reads it again
                    return
                ctype, body = answer
                headers = [
                    (b"content-type", ctype),
                    (b"server", self.server),
                    (b"content-length", str(len(body)).encode()),
                ]
                out = conn.send(h11.Response(status_code=200, headers=headers, reason=b"OK"))
                if event.method != b"HEAD":
                    out = (out or b"") + (conn.send(h11.Data(data=body)) or b"")
                out = (out or b"") + (conn.send(h11.EndOfMessage()) or b"")
            except h11.ProtocolError:
                self._hand(held)  # malformed: the daemon's h11 says why, as always
                return
            if not self._send(held, out):
                self._drop(held)
                return
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                self._drop(held)  # "Connection: close": answered, closed
                return
            conn.start_next_cycle()
            held.pending = bytearray(conn.trailing_data[0])
            held.since = time.monotonic()

    def _answer_for(self, request: h11.Request) -> tuple[bytes, bytes] | None:
        if request.method not in (b"GET", b"HEAD"):
            return None
        if any(name == b"expect" for name, _ in request.headers):
            return None
        return self.answers.get(request.target)

    def _send(self, held: _Held, data: bytes) -> bool:
        held.sock.settimeout(SEND_TIMEOUT_S)
        try:
            held.sock.sendall(data)
        except OSError:
            return False
        finally:
            with contextlib.suppress(OSError):
                held.sock.setblocking(False)
        return True

    def _hand(self, held: _Held) -> None:
        """Gives the connection to the daemon, with the bytes not answered here."""
        self._forget(held)
        message = b"H" + bytes(held.pending)
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", held.sock.fileno()))]
        deadline = time.monotonic() + 5.0
        while True:
            try:
                self.ctrl.sendmsg([message], rights)
                break
            except BlockingIOError:  # the daemon is behind: wait for room, a while
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                sel = selectors.DefaultSelector()
                sel.register(self.ctrl, selectors.EVENT_WRITE)
                sel.select(left)
                sel.close()
            except OSError:
                self.ended = True
                break
        held.sock.close()

    def _drop(self, held: _Held) -> None:
        self._forget(held)
        held.sock.close()

    def _forget(self, held: _Held) -> None:
        self.held.pop(held.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(held.sock)


def main(argv: list[str]) -> int:
    """``python -m sprite_env.api.front LISTEN_FD CTRL_FD SERVER_HEADER``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the daemon stops it (a ^C reaches both)
    listener = socket.socket(fileno=int(argv[1]))
    ctrl = socket.socket(fileno=int(argv[2]))
    _FrontLoop(listener, ctrl, argv[3].encode()).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
