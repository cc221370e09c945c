from __future__ import annotations

import os
from typing import TYPE_CHECKING

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
