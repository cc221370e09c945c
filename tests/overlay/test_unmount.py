"""Unmounting MERGED returns once the overlay is out of the mount table
(``Overlay.start_unmount``); the kernel's teardown of its super block goes on beside the
restore, and is waited for (``Unmounting.finish``) before MERGED is mounted again."""

from __future__ import annotations

import contextlib
import os
import subprocess
from typing import TYPE_CHECKING

import pytest
import trio

from sprite_env.daemon.environment import Environment
from sprite_env.overlay import Overlay, OverlayError
from sprite_env.overlay.mount import Unmounting

from .test_flush import _Job, _Supervisor

if TYPE_CHECKING:
    from collections.abc import Iterator


def _files_through(overlay: Overlay, n: int) -> None:
    """``n`` files written and looked at through MERGED: dentries and inodes the overlay's
    teardown evicts."""
    d = os.path.join(overlay.merged, "d")
    os.mkdir(d)
    for i in range(n):
        with open(os.path.join(d, f"f{i}"), "wb") as f:
            f.write(b"%d\n" % i)
    for name in os.listdir(d):
        os.lstat(os.path.join(d, name))


def test_it_returns_unmounted_and_the_files_are_in_upper(overlay: Overlay) -> None:
    overlay.mount()
    _files_through(overlay, 2_000)
    unmounting = overlay.start_unmount()
    assert not overlay.is_mounted()
    assert unmounting.finish() is unmounting
    assert len(os.listdir(os.path.join(overlay.upper, "d"))) == 2_000
    overlay.mount()  # again, after the teardown: the kernel refuses nothing
    assert overlay.is_mounted()
    with open(os.path.join(overlay.merged, "d", "f7"), "rb") as f:
        assert f.read() == b"7\n"


def test_a_process_inside_makes_it_fail_and_merged_stays_mounted(overlay: Overlay) -> None:
    overlay.mount()
    inside = subprocess.Popen(["sleep", "60"], cwd=overlay.merged)
    try:
        with pytest.raises(OverlayError, match="busy: a process still uses it"):
            overlay.start_unmount()
        assert overlay.is_mounted()
        with open(os.path.join(overlay.merged, "still"), "w") as f:  # and usable
            f.write("x")
    finally:
        inside.kill()
        inside.wait()
    overlay.unmount()
    assert not overlay.is_mounted()
    assert os.path.exists(os.path.join(overlay.upper, "still"))


def test_nothing_mounted_is_nothing_to_do(overlay: Overlay) -> None:
    assert not overlay.is_mounted()
    overlay.start_unmount().finish()
    overlay.unmount()


def test_the_teardown_is_waited_for_after_the_block_and_before_the_mount(
    overlay: Overlay, monkeypatch: pytest.MonkeyPatch
) -> None:
    overlay.mount()
    _files_through(overlay, 500)
    log: list[str] = []
    real_finish, real_mount = Unmounting.finish, Overlay.mount

    def finish(self: Unmounting) -> Unmounting:
        log.append("teardown waited for")
        return real_finish(self)

    def mount(self: Overlay) -> None:
        log.append("mounted")
        real_mount(self)

    monkeypatch.setattr(Unmounting, "finish", finish)
    monkeypatch.setattr(Overlay, "mount", mount)
    env = Environment(_Supervisor(log), overlay)  # type: ignore[arg-type]

    async def restore() -> None:
        async with env.down(_Job(log)):  # type: ignore[arg-type]
            log.append(f"down: mounted {overlay.is_mounted()}")
            # written into UPPER while the overlay may still be torn down
            fd = os.open(os.path.join(overlay.upper, "restored"), os.O_WRONLY | os.O_CREAT, 0o644)
            os.close(fd)

    trio.run(restore)
    assert log == [
        "Stopping services...",
        "services stopped",
        "Restoring filesystem...",
        "down: mounted False",
        "teardown waited for",
        "mounted",
        "services started",
        "Services started",
    ]
    assert overlay.is_mounted()
    assert os.path.exists(os.path.join(overlay.merged, "restored"))
    assert len(os.listdir(os.path.join(overlay.merged, "d"))) == 500


class _QuietJournal:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        self.log.append("journal quiet")
        try:
            yield
        finally:
            self.log.append("journal reads again")


def test_the_journal_is_quiet_until_the_services_run_again(overlay: Overlay) -> None:
    """The restore's events are read once the services have started, not while they start
    (their decoding would hold the interpreter the start needs)."""
    overlay.mount()
    log: list[str] = []
    env = Environment(_Supervisor(log), overlay, _QuietJournal(log))  # type: ignore[arg-type]

    async def restore() -> None:
        async with env.down(_Job(log)):  # type: ignore[arg-type]
            log.append("restored")

    trio.run(restore)
    assert log == [
        "Stopping services...",
        "journal quiet",
        "services stopped",
        "Restoring filesystem...",
        "restored",
        "services started",
        "Services started",
        "journal reads again",
    ]
