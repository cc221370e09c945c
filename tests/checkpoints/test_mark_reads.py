"""Marking (``checkpoints/gc.py``) reads trees in batches through the store's reader, and
finds the same objects as reading them one at a time."""

from __future__ import annotations

import os
import random
from typing import TYPE_CHECKING

from sprite_env.checkpoints.gc import mark, reach
from sprite_env.store.pack import ENTRY, pack_path

if TYPE_CHECKING:
    from collections.abc import Iterable

    import pytest

    from sprite_env.checkpoints import Engine
    from sprite_env.ids import ObjectId
    from sprite_env.store.catalog import Located


def _layer(root: str) -> None:
    rng = random.Random(8)
    for a in range(12):
        for b in range(12):
            d = os.path.join(root, f"a{a}", f"b{b}")
            os.makedirs(d)
            with open(os.path.join(d, "f"), "wb") as f:
                f.write(rng.randbytes(300))
    with open(os.path.join(root, "big"), "wb") as f:  # an indirect chunk list
        f.write(rng.randbytes(6 << 20))


def test_marking_reads_a_level_of_trees_per_lookup(
    root: str, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    _layer(root)
    engine.create()
    top = engine.info("v0").top_tree
    one_by_one = mark(lambda oid: engine.store.read(oid), [top])  # a plain callable
    sizes: list[int] = []
    real = engine.store.locate_many

    def locate_many(oids: Iterable[ObjectId]) -> dict[ObjectId, Located]:
        ids = list(oids)
        sizes.append(len(ids))
        return real(ids)

    monkeypatch.setattr(engine.store, "locate_many", locate_many)
    assert mark(engine.store, [top]) == one_by_one
    # 158 trees and a chunk list: a few lookups per level, not one per tree
    assert len(sizes) < 12
    assert max(sizes) >= 144


def test_an_unreadable_tree_in_a_batch_is_named_and_kept(root: str, engine: Engine) -> None:
    _layer(root)
    engine.create()
    store = engine.store
    top = engine.info("v0").top_tree
    live = mark(store, [top])
    trees = [o for o in live if (loc := store.catalog.locate(o)) and loc.entry.kind == 1]
    bad = sorted(trees)[len(trees) // 2]
    loc = store.catalog.locate(bad)
    assert loc is not None
    with open(pack_path(store.packs_dir, loc.pack), "r+b") as f:
        f.seek(loc.entry.offset + ENTRY.size)
        b = f.read(1)
        f.seek(loc.entry.offset + ENTRY.size)
        f.write(bytes([b[0] ^ 0xFF]))
    found = reach(store, [("v0", top)])
    assert set(found.unreadable) == {bad}
    assert bad in found.live
    assert found.live <= live
