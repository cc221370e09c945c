"""Fixtures shared by the snapshot tests."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from sprite_env.checkpoints import Engine

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def engine_layer(tmp_path: os.PathLike[str]) -> Iterator[tuple[str, Engine]]:
    """An empty layer directory and an engine on it with its own store."""
    root = os.path.join(os.fspath(tmp_path), "layer")
    os.mkdir(root)
    with Engine(root, os.path.join(os.fspath(tmp_path), "store")) as e:
        yield root, e
