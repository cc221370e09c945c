"""Listing a directory loads its subdirectories' trees in one batch (one pin, one catalog
query), not one ``read`` each."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from sprite_env.fuse import StoreSource, ViewConfig
from sprite_env.snapshot.diff import top_entry
from sprite_env.snapshot.tree import decode_tree
from tests.fuse.mounting import Mounted, requires_fuse, wait_until

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sprite_env.checkpoints import Engine
    from sprite_env.ids import ObjectId
    from sprite_env.store.ports import PinnedReader

pytestmark = [pytest.mark.fuse, requires_fuse]


class _CountingSource(StoreSource):
    """Records every object read one by one and every set of objects pinned."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.reads: list[ObjectId] = []
        self.pins: list[set[ObjectId]] = []

    def read(self, oid: ObjectId) -> bytes:
        self.reads.append(oid)
        return super().read(oid)

    def pin(self, oids: Iterable[ObjectId]) -> PinnedReader:
        oids = list(oids)
        self.pins.append(set(oids))
        return super().pin(oids)


def test_subdirectory_trees_are_read_in_one_pin(root: str, engine: Engine, mountpoint: str) -> None:
    names = [f"d{i}" for i in range(6)]
    for name in names:
        os.makedirs(os.path.join(root, "top", name))
        with open(os.path.join(root, "top", name, "f"), "w") as f:
            f.write(name)
    engine.create()
    read = engine.store.read
    checkpoint_root = top_entry(read, engine.info("v0").top_tree)
    top = next(e for e in decode_tree(read(checkpoint_root.subtree)) if e.name == b"top")
    subtrees = {e.subtree for e in decode_tree(read(top.subtree))}
    assert len(subtrees) == len(names)  # each holds a different file: six trees
    source = _CountingSource(engine.store, engine.registry)
    with Mounted(source, mountpoint, ViewConfig()) as m:
        assert sorted(os.listdir(m.path("v0", "top"))) == names
        wait_until(lambda: m.call(lambda: all(t in m.ops.trees for t in subtrees)))
        wait_until(lambda: m.call(lambda: m.ops.trees.loading == 0))
        assert any(subtrees <= pinned for pinned in source.pins)
        assert not subtrees & set(source.reads)
        for name in names:  # and the view serves them from those trees
            assert os.listdir(m.path("v0", "top", name)) == ["f"]
        assert not subtrees & set(source.reads)
