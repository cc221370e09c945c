"""What the router needs of the daemon: a narrow :class:`Backend` protocol.

The router (``routes.py``) parses and checks a request, then calls one of these methods
with checked values. It depends on this protocol, never on ``daemon/service.py``'s class,
so the two modules import one another in neither direction but this one (the daemon
imports the router to serve it), and a test can serve the router with a fake backend,
in-process, with no store and no subprocess.

The protocol is to the API what ``fuse.source.CheckpointSource`` is to the view. Every
method may raise anything :func:`~sprite_env.api.problems.problem_for` maps to an answer
(an unknown id, a busy queue, a full disk...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from sprite_env.api import shapes


@dataclass
class FileBytes:
    """A file of a checkpoint being sent: its size, then its bytes as they are read."""

    size: int
    blocks: AsyncIterator[bytes]


class JobHandle(Protocol):
    """A submitted job as the router sees it: its JSON and its stream of events."""

    def to_json(self) -> dict[str, Any]:
        """The :class:`~sprite_env.api.shapes.Job` of this job."""
        ...

    def stream(self) -> AsyncIterator[bytes]:
        """Its NDJSON events from the first, then new ones, until the last."""
        ...


class Backend(Protocol):
    """The operations the API offers, each answering one endpoint.

    Reads answer JSON (``shapes`` names the shape); jobs answer a :class:`JobHandle`
    whose stream the router sends.
    """

    def busy(self) -> bool:
        """Whether a job runs now (the router then paces new connections)."""
        ...

    def job(self, number: int) -> JobHandle | None:
        """Job ``number``, running, queued or finished a short while ago; else None."""
        ...

    async def status(self) -> shapes.Status: ...

    async def checkpoints_json(self, include_auto: bool, history: str | None) -> bytes:
        """The list (``shapes.Checkpoint`` rows, newest first), encoded."""
        ...

    async def info_json(self, cid: str) -> bytes:
        """One ``shapes.Checkpoint``, encoded."""
        ...

    async def create(
        self,
        comment: str,
        actor: str,
        *,
        auto: bool = False,
        reason: str | None = None,
        wait_remote: bool = False,
    ) -> JobHandle:
        """A create job; with ``wait_remote`` its stream ends once the checkpoint is in
        the store's bucket (refused, ``no_remote``, with no bucket)."""
        ...

    async def restore(self, cid: str, actor: str) -> JobHandle: ...

    async def restore_paths(self, cid: str, paths: list[str], actor: str) -> JobHandle: ...

    async def reset(self, actor: str) -> JobHandle: ...

    async def export(
        self, cid: str, dest: str, paths: list[str], actor: str, *, uid: int | None = None
    ) -> JobHandle: ...

    async def delete(self, cid: str, actor: str, *, dry_run: bool = False) -> dict[str, Any]:
        """A ``shapes.DeleteReport``."""
        ...

    async def preview(self, cid: str, actor: str) -> dict[str, Any]:
        """A ``shapes.Preview``."""
        ...

    async def preview_paths(self, cid: str, paths: list[str], actor: str) -> dict[str, Any]:
        """A ``shapes.Preview`` of a restore of ``paths`` only."""
        ...

    async def diff(self, a: str, b: str | None, actor: str) -> shapes.Diff: ...

    async def read_path(self, cid: str, path: bytes) -> FileBytes | dict[str, Any]:
        """A file's bytes, or a ``shapes.Entry`` for anything else."""
        ...

    async def activity_entries(self, limit: int, action: str | None) -> list[dict[str, Any]]:
        """``shapes.ActivityEntry`` rows, newest first."""
        ...

    async def services(self) -> shapes.Services: ...

    async def service_start(self, name: str) -> dict[str, Any]: ...

    async def service_stop(self, name: str) -> dict[str, Any]: ...

    async def service_logs(self, name: str, lines: int) -> shapes.ServiceLogs: ...
