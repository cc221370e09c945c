"""A real daemon in this process, talked to over trio memory streams: the fuzz's backend.

The parts are the daemon's own (engine and store on temporary directories, activity log,
service supervisor, job runner, ``Router``) and every request goes through the server's
HTTP handling (``server.handle``), only the Unix socket is left out. The daemon's trio loop
runs on a background thread (``run()`` itself needs the main thread for its signal
handlers), so a synchronous test, hypothesis's included, sends bytes with
:meth:`InProcessDaemon.exchange`.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import h11
import trio
import trio.testing

from sprite_env.api import server
from sprite_env.api.routes import Router
from sprite_env.checkpoints import Engine
from sprite_env.daemon.activity import ActivityLog
from sprite_env.daemon.environment import Environment
from sprite_env.daemon.service import Daemon, DaemonConfig
from sprite_env.services import Supervisor

if TYPE_CHECKING:
    from types import TracebackType


@dataclass
class Answer:
    """One parsed HTTP response."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class InProcessDaemon:
    """``with InProcessDaemon(root, state) as d: d.exchange(b"GET /v1/status ...")``."""

    def __init__(self, root: str, state: str) -> None:
        os.makedirs(root, exist_ok=True)
        os.makedirs(state, exist_ok=True)
        self.config = DaemonConfig(root=root, state=state, view=False, auto_interval_s=0)
        self.limits = server.Limits(request_timeout=5.0, idle_timeout=5.0)
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.CancelScope | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)
        self.daemon: Daemon | None = None

    def __enter__(self) -> InProcessDaemon:
        self._thread.start()
        self._ready.wait(60)
        if self._error is not None:
            raise self._error
        assert self._token is not None, "the in-process daemon did not start"
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._token is not None and self._stop is not None:
            stop = self._stop
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(stop.cancel, trio_token=self._token)
        self._thread.join(60)

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as e:  # reported to the test thread
            self._error = e
            self._ready.set()

    async def _serve(self) -> None:
        config = self.config
        engine = await trio.to_thread.run_sync(
            lambda: Engine(config.layer, config.store_dir, exclude_dirs=[config.state])
        )
        try:
            supervisor = Supervisor(config.env_root, os.path.join(config.state, "services"))
            env = Environment(supervisor, None)
            activity = ActivityLog(os.path.join(config.state, "activity.jsonl"))
            self.daemon = daemon = Daemon(config, engine, activity, env)
            self.router = Router(daemon)
            with trio.CancelScope() as self._stop:
                async with trio.open_nursery() as nursery:
                    await nursery.start(supervisor.run)
                    nursery.start_soon(daemon.jobs.run)
                    self._token = trio.lowlevel.current_trio_token()
                    self._ready.set()
                    await trio.sleep_forever()
        finally:
            engine.close()

    # -- talking ----------------------------------------------------------------------------

    def exchange(self, data: bytes, seconds: float = 30.0, piece: int | None = None) -> bytes:
        """Sends ``data`` (then end of file) on a fresh connection, ``piece`` bytes at a
        time if given (the server then parses a request that arrives in parts); returns
        all it got (within ``seconds``, else ``trio.TooSlowError``)."""
        assert self._token is not None
        return trio.from_thread.run(self._exchange, data, seconds, piece, trio_token=self._token)

    async def _exchange(self, data: bytes, seconds: float, piece: int | None) -> bytes:
        client, server_end = trio.testing.memory_stream_pair()
        got = bytearray()
        step = piece or max(1, len(data))

        async def send() -> None:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                for i in range(0, len(data), step):
                    await client.send_all(data[i : i + step])
                    await trio.testing.wait_all_tasks_blocked()  # the server reads this part
                await client.send_eof()

        with trio.fail_after(seconds):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(server.handle, server_end, self.router.handle, self.limits)
                nursery.start_soon(send)
                while True:
                    try:
                        chunk = await client.receive_some(65536)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        break
                    if not chunk:
                        break
                    got += chunk
        await client.aclose()
        return bytes(got)

    def request(
        self,
        method: str,
        target: str,
        body: bytes = b"",
        headers: list[tuple[str, str]] | None = None,
    ) -> Answer:
        """One well-formed request; its parsed answer."""
        head = [("host", "sprite"), ("connection", "close"), *(headers or [])]
        if body:
            head.append(("content-length", str(len(body))))
        raw = f"{method} {target} HTTP/1.1\r\n".encode("latin-1")
        raw += b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in head) + b"\r\n" + body
        answers = parse_answers(self.exchange(raw), method)
        assert len(answers) == 1, answers
        return answers[0]


def parse_answers(data: bytes, method: str = "GET", *, first_only: bool = False) -> list[Answer]:
    """Every response in ``data`` (or the first), parsed by h11 as a client would
    (strictly: a malformed response raises ``h11.RemoteProtocolError``). ``method`` is the
    requests': a response to HEAD has no body."""
    answers: list[Answer] = []
    conn = h11.Connection(h11.CLIENT)
    conn.receive_data(data)
    conn.receive_data(b"")
    while conn.trailing_data[0]:  # (none left: the server closed a kept-alive connection)
        conn.send(h11.Request(method=method, target="/", headers=[("host", "sprite")]))
        conn.send(h11.EndOfMessage())
        response: h11.Response | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            elif event is h11.NEED_DATA or isinstance(event, h11.ConnectionClosed):
                if response is not None:
                    raise AssertionError(f"answer cut short after {bytes(body[:200])!r}")
                return answers
        assert response is not None
        headers = {k.decode().lower(): v.decode("latin-1") for k, v in response.headers}
        answers.append(Answer(response.status_code, headers, bytes(body)))
        if first_only or conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
            return answers
        conn.start_next_cycle()
    return answers
