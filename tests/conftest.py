from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest

from sprite_env.store import Store, open_store

if TYPE_CHECKING:
    from collections.abc import Iterator

pytest_plugins = ["tests.plugins.checklogs"]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def store_dir(tmp_path: os.PathLike[str]) -> str:
    return os.path.join(os.fspath(tmp_path), "store")


@pytest.fixture
def store(store_dir: str) -> Iterator[Store]:
    with open_store(store_dir, create=True) as s:
        yield s


@pytest.fixture
def daemon_factory(tmp_path: os.PathLike[str]) -> Iterator[Any]:
    """Starts real daemons (``daemon_factory(*args)``); each is stopped, and must stop
    cleanly (exit 0, no traceback in its log), at the end of the test."""
    from tests.helpers.daemon import DaemonProcess, start_daemon

    started: list[DaemonProcess] = []

    def make(
        *args: str,
        root: str | None = None,
        state: str | None = None,
        wait: bool = True,
        env: dict[str, str] | None = None,
    ) -> DaemonProcess:
        base = os.fspath(tmp_path)
        r = root or os.path.join(base, "root")
        os.makedirs(r, exist_ok=True)
        d = start_daemon(r, state or os.path.join(base, "state"), *args, wait=wait, env=env)
        started.append(d)
        return d

    yield make
    for d in started:
        if d.proc is not None and d.proc.returncode is None:
            code = d.stop()
            assert code == 0, f"daemon exited with {code}:\n{d.log()}"
        # a daemon a test killed leaves its view mounted and dead; pytest's clean-up of
        # old tmp dirs would then fail on it (ENOTCONN) in a later session
        d.sweep_mount()
        assert "Traceback" not in d.log(), d.log()


@pytest.fixture
def daemon(daemon_factory: Any) -> Any:
    """One real daemon on tmp_path/root with state tmp_path/state."""
    return daemon_factory()
