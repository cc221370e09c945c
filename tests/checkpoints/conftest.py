from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from sprite_env.checkpoints import Engine

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def root(tmp_path: os.PathLike[str]) -> str:
    r = os.path.join(os.fspath(tmp_path), "layer")
    os.mkdir(r)
    return r


@pytest.fixture
def engine(tmp_path: os.PathLike[str], root: str) -> Iterator[Engine]:
    with Engine(root, os.path.join(os.fspath(tmp_path), "store")) as e:
        yield e
