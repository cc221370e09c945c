"""Progress display: a rich bar on a terminal, plain lines or nothing otherwise.

rich loads only when a terminal will show a bar (about 30 ms of start-up otherwise spent
for nothing in scripts and pipes).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sprite_env.cli.render import print_json, size

if TYPE_CHECKING:
    from types import TracebackType

    from rich.progress import Progress

Update = Callable[[int, int], None]

# Fields every event has, which are not counters.
_NOT_COUNTERS = frozenset({"type", "time", "job", "phase", "data", "total", "done"})


@contextmanager
def progress_bar(label: str, *, enabled: bool = True) -> Iterator[Update]:
    """Yields ``update(done, total)``; draws a bar on stderr only when it is a terminal."""
    if not (enabled and sys.stderr.isatty()):
        yield lambda done, total: None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def describe_progress(event: dict[str, Any]) -> str:
    """One short line from a ``progress`` event (it shares a terminal line with a bar)."""
    c = {k: v for k, v in event.items() if isinstance(v, int) and not isinstance(v, bool)}
    phase = event.get("phase")
    if phase == "capture":
        return (
            f"capturing: {c.get('files', 0)} files, {size(c.get('bytes_read', 0))} read, "
            f"{c.get('dirs_reused', 0)}/{c.get('dirs', 0)} dirs unchanged"
        )
    if phase == "restore":
        return (
            f"restoring: {c.get('created', 0)} created, {c.get('modified', 0)} changed, "
            f"{c.get('removed', 0)} removed, {size(c.get('bytes_written', 0))} written"
        )
    if phase == "upload":  # create --wait-remote: the push to the bucket
        return (
            f"uploading: {c.get('packs', 0)}/{c.get('packs_total', 0)} packs, "
            f"{size(c.get('bytes', 0))} of {size(c.get('bytes_total', 0))}"
        )
    shown = [
        f"{size(v) if 'bytes' in k else v} {k.replace('_', ' ')}"
        for k, v in c.items()
        if k not in _NOT_COUNTERS and v
    ]
    return f"{phase or 'working'}: {', '.join(shown)}" if shown else str(phase or "working")


class EventDisplay:
    """Shows the events of a job's stream as they come; pass it as ``on_event``.

    - With ``as_json``: each event as one NDJSON line on stdout, flushed at once.
    - Else, when stderr is a terminal: ``info`` lines printed, ``progress`` as a live bar
      (removed when the job ends).
    - Else: the ``info`` lines on stderr; ``progress`` is not shown.

    The command prints the result (the ``complete`` event) itself. ``job`` is the number
    of the job seen last (None before its first event).
    """

    def __init__(self, *, as_json: bool) -> None:
        self.as_json = as_json
        self.job: int | None = None
        self._bar: Progress | None = None
        self._task: Any = None
        if not as_json and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self._bar = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(bar_width=20),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )

    def __enter__(self) -> EventDisplay:
        if self._bar is not None:
            self._bar.start()
            self._task = self._bar.add_task("starting", total=None)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __call__(self, event: dict[str, Any]) -> None:
        if isinstance(event.get("job"), int):
            self.job = event["job"]
        kind = event.get("type")
        if self.as_json:
            print_json(event)
        elif self._bar is not None:
            if kind == "info":
                self._bar.console.print(str(event.get("data", "")), markup=False, highlight=False)
            elif kind == "progress":
                total = event.get("total")
                self._bar.update(
                    self._task,
                    description=describe_progress(event),
                    total=total if isinstance(total, int) else None,
                    completed=event.get("done", 0) if isinstance(total, int) else 0,
                )
        elif kind == "info":
            print(str(event.get("data", "")), file=sys.stderr, flush=True)
