from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from sprite_env.checkpoints import Engine
from sprite_env.fuse import StoreSource, ViewConfig
from tests.fuse.mounting import Mounted, sweep_stale_mounts

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


@pytest.fixture(scope="session", autouse=True)
def _no_stale_mounts() -> Iterator[None]:
    """Mounts left by a killed test run are detached before and after this one."""
    sweep_stale_mounts()
    yield
    sweep_stale_mounts()


@pytest.fixture
def root(tmp_path: os.PathLike[str]) -> str:
    r = os.path.join(os.fspath(tmp_path), "layer")
    os.mkdir(r)
    return r


@pytest.fixture
def engine(tmp_path: os.PathLike[str], root: str) -> Iterator[Engine]:
    with Engine(root, os.path.join(os.fspath(tmp_path), "store")) as e:
        yield e


@pytest.fixture
def mountpoint(tmp_path: os.PathLike[str]) -> str:
    m = os.path.join(os.fspath(tmp_path), "mnt")
    os.mkdir(m)
    return m


@pytest.fixture
def mount(engine: Engine, mountpoint: str) -> Callable[..., Mounted]:
    """``with mount(**config) as m:`` mounts the engine's view (see ``ViewConfig``)."""

    def make(**config: object) -> Mounted:
        return Mounted(StoreSource.from_engine(engine), mountpoint, ViewConfig(**config))  # type: ignore[arg-type]

    return make
