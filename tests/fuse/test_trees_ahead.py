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


def _trees(engine: Engine, *path: str) -> dict[str, ObjectId]:
    """The subtree of each directory under ``path`` in checkpoint v0, by name."""
    read = engine.store.read
    entry = top_entry(read, engine.info("v0").top_tree)
    for name in path:
        entry = next(e for e in decode_tree(read(entry.subtree)) if e.name == name.encode())
    return {e.name.decode(): e.subtree for e in decode_tree(read(entry.subtree)) if e.subtree}


def test_one_subdirectory_grandchildren_and_later_siblings_are_read_ahead(
    root: str, engine: Engine, mountpoint: str
) -> None:
    """Listing a directory loads its only subdirectory and that one's subdirectories (two
    levels), and the sibling directories after it: a walk that lists them next finds them
    in memory (no ``read`` of theirs)."""
    for rel in ("one/only/deeper/f", "one/only/other/g", "wide/a/x", "wide/b/y", "wide/c/z"):
        os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(root, rel), "w") as f:
            f.write(rel)
    engine.create()
    only = _trees(engine, "one")["only"]
    below_only = set(_trees(engine, "one", "only").values())
    wide = _trees(engine, "wide")
    assert len(below_only) == 2
    assert len(wide) == 3
    source = _CountingSource(engine.store, engine.registry)
    with Mounted(source, mountpoint, ViewConfig()) as m:

        def loaded(trees: set[ObjectId]) -> bool:
            return bool(m.call(lambda: all(t in m.ops.trees for t in trees)))

        assert os.listdir(m.path("v0", "one")) == ["only"]
        wait_until(lambda: loaded({only, *below_only}), what="two levels")
        assert os.listdir(m.path("v0", "wide", "a")) == ["x"]  # b and c are after it
        wait_until(lambda: loaded(set(wide.values())), what="the later siblings")
        wait_until(lambda: m.call(lambda: m.ops.trees.loading == 0))
        assert sorted(os.listdir(m.path("v0", "one", "only"))) == ["deeper", "other"]
        for name in ("deeper", "other"):
            assert len(os.listdir(m.path("v0", "one", "only", name))) == 1
        for name in ("b", "c"):
            assert len(os.listdir(m.path("v0", "wide", name))) == 1
        alone = {only, *below_only, *wide.values()} & set(source.reads)
        assert not alone, "a tree was read on its own, not ahead"
