"""Progress display: a rich bar on a terminal, nothing otherwise (and never with --json)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

Update = Callable[[int, int], None]


@contextmanager
def progress_bar(label: str, *, enabled: bool = True) -> Iterator[Update]:
    """Yields ``update(done, total)``; draws a bar on stderr only when it is a terminal."""
    if not (enabled and sys.stderr.isatty()):
        yield lambda done, total: None
        return
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
