"""A restore flushes UPPER before it takes the environment down (``Overlay.flush``): the
unmount of MERGED syncs UPPER's file system, and what is left to flush then is downtime."""

from __future__ import annotations

import contextlib
import ctypes
import os
from typing import TYPE_CHECKING, Any

import pytest
import trio

from sprite_env.daemon.environment import Environment
from sprite_env.overlay import Overlay

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

_SYS_CACHESTAT = 451  # x86-64 and aarch64, Linux 6.5


class _CacheStat(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_uint64) for n in ("cache", "dirty", "writeback", "evicted", "recently_evicted")
    ]


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


def _dirty_pages(path: str) -> int:
    """The file's dirty pages in the page cache (``cachestat(2)``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        st, rng = _CacheStat(), _Range(0, 0)  # len 0: to the end of the file
        if libc.syscall(_SYS_CACHESTAT, fd, ctypes.byref(rng), ctypes.byref(st), 0) != 0:
            e = ctypes.get_errno()
            pytest.skip(f"no cachestat here: {os.strerror(e)}")
        return int(st.dirty)
    finally:
        os.close(fd)


def _write_through(overlay: Overlay, name: str) -> str:
    with open(os.path.join(overlay.merged, name), "wb") as f:
        f.write(os.urandom(4 << 20))
    return os.path.join(overlay.upper, name)


def test_flush_writes_uppers_dirty_data_back(overlay: Overlay) -> None:
    overlay.mount()
    upper_file = _write_through(overlay, "written")
    if _dirty_pages(upper_file) == 0:
        pytest.skip("written back already (the machine flushed meanwhile)")
    overlay.flush()
    assert _dirty_pages(upper_file) == 0


class _Supervisor:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        self.log.append("services stopped")
        yield

    async def start_all(self) -> list[Any]:
        self.log.append("services started")
        return []


class _Job:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def info(self, text: str) -> None:
        self.log.append(text)


def test_the_environment_goes_down_after_upper_is_flushed(
    overlay: Overlay, monkeypatch: pytest.MonkeyPatch
) -> None:
    overlay.mount()
    upper_file = _write_through(overlay, "written")
    log: list[str] = []
    real = Overlay.flush

    def flush(self: Overlay) -> None:
        real(self)
        log.append(f"flushed, {_dirty_pages(upper_file)} dirty pages")

    monkeypatch.setattr(Overlay, "flush", flush)
    env = Environment(_Supervisor(log), overlay)  # type: ignore[arg-type]

    async def restore() -> None:
        async with env.down(_Job(log)):  # type: ignore[arg-type]
            log.append(f"down: mounted {overlay.is_mounted()}")

    trio.run(restore)
    assert log == [
        "flushed, 0 dirty pages",
        "Stopping services...",
        "services stopped",
        "Restoring filesystem...",
        "down: mounted False",
        "services started",
        "Services started",
    ]
    assert overlay.is_mounted()
