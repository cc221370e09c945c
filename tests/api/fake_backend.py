"""A fake :class:`~sprite_env.api.backend.Backend` and a way to talk to a real ``Router``
over trio memory streams: the server's own HTTP handling, no socket, no store, no daemon.

The fake keeps checkpoints in a dict, answers in the shapes of ``api/shapes.py``, raises
what the engine raises for an unknown id, and records every call, so a test can say that
a bad request never reached the backend.
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Any

import trio
import trio.testing

from sprite_env.api import events, server, shapes
from sprite_env.api.backend import FileBytes
from sprite_env.api.routes import Router
from sprite_env.checkpoints.registry import UnknownCheckpoint
from tests.api.inprocess import Answer, parse_answers

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


def checkpoint(cid: str) -> shapes.Checkpoint:
    return {
        "id": cid,
        "create_time": "2026-12-01T00:00:00.000000Z",
        "comment": "",
        "is_auto": False,
        "history": [],
        "created_by": "user",
        "parent": None,
        "files": 1,
        "dirs": 1,
        "bytes": 3,
        "bytes_added": 3,
        "warnings": [],
        "walk": "full",
        "walk_reason": "",
        "is_active": True,
        "unique_bytes": 3,
    }


class FakeJob:
    def __init__(self, number: int, kind: str, target: str | None) -> None:
        self.number, self.kind, self.target = number, kind, target

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.number,
            "kind": self.kind,
            "target": self.target,
            "actor": "user",
            "state": "done",
            "submitted": events.now_rfc3339(),
        }

    async def stream(self) -> AsyncIterator[bytes]:
        yield events.encode(events.complete(self.number, "done", id=self.target))


class FakeBackend:
    """Checkpoints ``v0`` (a file ``/a``) and whatever a test adds to ``checkpoints``."""

    def __init__(self) -> None:
        self.checkpoints: dict[str, shapes.Checkpoint] = {"v0": checkpoint("v0")}
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.jobs: dict[int, FakeJob] = {}

    def _call(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))

    def _known(self, cid: str) -> shapes.Checkpoint:
        if cid not in self.checkpoints:
            raise UnknownCheckpoint(cid)
        return self.checkpoints[cid]

    def _submit(self, kind: str, target: str | None) -> FakeJob:
        job = FakeJob(len(self.jobs) + 1, kind, target)
        self.jobs[job.number] = job
        return job

    # -- the protocol -------------------------------------------------------------------

    def busy(self) -> bool:
        return False

    def job(self, number: int) -> FakeJob | None:
        self._call("job", number)
        return self.jobs.get(number)

    async def status(self) -> shapes.Status:
        self._call("status")
        return {
            "version": "0",
            "pid": 1,
            "root": "/",
            "state": "/.sprite",
            "store": "/.sprite/store",
            "started": events.now_rfc3339(),
            "active": "v0",
            "job": None,
            "queued": 0,
            "mount": None,
            "base_image": None,
            "interrupted_restore": None,
            "auto_interval_s": 0.0,
            "max_checkpoints": 200,
            "store_usage": {},
            "remote": None,
        }

    async def checkpoints_json(self, include_auto: bool, history: str | None) -> bytes:
        self._call("checkpoints_json", include_auto, history)
        return json.dumps(list(self.checkpoints.values())).encode()

    async def info_json(self, cid: str) -> bytes:
        self._call("info_json", cid)
        return json.dumps(self._known(cid)).encode()

    async def create(
        self,
        comment: str,
        actor: str,
        *,
        auto: bool = False,
        reason: str | None = None,
        wait_remote: bool = False,
    ) -> FakeJob:
        self._call(
            "create", comment, actor, auto, reason, *(("wait_remote",) if wait_remote else ())
        )
        return self._submit("create", None)

    async def restore(self, cid: str, actor: str) -> FakeJob:
        self._call("restore", cid, actor)
        self._known(cid)
        return self._submit("restore", cid)

    async def restore_paths(self, cid: str, paths: list[str], actor: str) -> FakeJob:
        self._call("restore_paths", cid, paths, actor)
        self._known(cid)
        return self._submit("restore", cid)

    async def reset(self, actor: str) -> FakeJob:
        self._call("reset", actor)
        return self._submit("reset", None)

    async def export(
        self, cid: str, dest: str, paths: list[str], actor: str, *, uid: int | None = None
    ) -> FakeJob:
        self._call("export", cid, dest, paths, actor, uid)
        self._known(cid)
        return self._submit("export", cid)

    async def delete(self, cid: str, actor: str, *, dry_run: bool = False) -> dict[str, Any]:
        self._call("delete", cid, actor, dry_run)
        self._known(cid)
        return {
            "id": cid,
            "ids": [cid],
            "bytes_freed": 0,
            "objects_removed": 0,
            "packs_deleted": 0,
            "packs_written": 0,
            "problems": [],
            "dry_run": dry_run,
        }

    async def preview(self, cid: str, actor: str) -> dict[str, Any]:
        self._call("preview", cid, actor)
        self._known(cid)
        counts = {"delete": 0, "create": 0, "change": 0, "metadata": 0, "remove": 0}
        return {"id": cid, "counts": counts, "changes": []}

    async def preview_paths(self, cid: str, paths: list[str], actor: str) -> dict[str, Any]:
        self._call("preview_paths", cid, paths, actor)
        return await self.preview(cid, actor)

    async def diff(self, a: str, b: str | None, actor: str) -> shapes.Diff:
        self._call("diff", a, b, actor)
        self._known(a)
        return shapes.diff(a, b, [])

    async def read_path(self, cid: str, path: bytes) -> FileBytes | dict[str, Any]:
        self._call("read_path", cid, path)
        self._known(cid)

        async def blocks() -> AsyncIterator[bytes]:
            yield b"one"

        return FileBytes(3, blocks())

    async def activity_entries(self, limit: int, action: str | None) -> list[dict[str, Any]]:
        self._call("activity_entries", limit, action)
        return []

    async def services(self) -> shapes.Services:
        self._call("services")
        return {"services": [], "errors": []}

    async def service_start(self, name: str) -> dict[str, Any]:
        self._call("service_start", name)
        return {"name": name}

    async def service_stop(self, name: str) -> dict[str, Any]:
        self._call("service_stop", name)
        return {"name": name}

    async def service_logs(self, name: str, lines: int) -> shapes.ServiceLogs:
        self._call("service_logs", name, lines)
        return {"name": name, "lines": []}


LIMITS = server.Limits(request_timeout=5.0, idle_timeout=5.0)


def exchange(backend: FakeBackend, data: bytes, limits: server.Limits = LIMITS) -> bytes:
    """Sends ``data`` to a ``Router`` over ``backend`` through the server's HTTP handling;
    returns all it answered until it closed."""

    async def run() -> bytes:
        router = Router(backend)  # in trio: its pacer reads trio's clock
        client, server_end = trio.testing.memory_stream_pair()
        got = bytearray()
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(server.handle, server_end, router.handle, limits)
                await client.send_all(data)
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await client.send_eof()
                while chunk := await client.receive_some(65536):
                    got += chunk
        return bytes(got)

    return trio.run(run)


def request(
    backend: FakeBackend,
    method: str,
    target: str,
    body: bytes = b"",
    headers: list[tuple[str, str]] | None = None,
) -> Answer:
    """One request to a ``Router`` over ``backend``; its parsed answer."""
    head = [("host", "sprite"), ("connection", "close"), *(headers or [])]
    if body:
        head.append(("content-length", str(len(body))))
    raw = f"{method} {target} HTTP/1.1\r\n".encode("latin-1")
    raw += b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in head) + b"\r\n" + body
    answers = parse_answers(exchange(backend, raw), method)
    assert len(answers) == 1, answers
    return answers[0]
