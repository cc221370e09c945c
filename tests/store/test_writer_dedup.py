"""The writer asks the catalog about the objects put without ``known`` on its encoding
threads, one query a batch, and stores exactly those the catalog lacks."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from sprite_env.store import ObjectKind, check
from sprite_env.store.codec import object_id
from sprite_env.store.writer import BATCH_OBJECTS

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pytest

    from sprite_env.ids import ObjectId
    from sprite_env.store import Store


def test_one_query_a_batch_on_the_encoding_threads(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = [os.urandom(1000) for _ in range(100)]
    with store.writer() as w:
        for data in old:
            w.put(data)
        w.commit()
    cat = store.catalog
    one: list[ObjectId] = []
    many: list[tuple[str, int]] = []
    real_many = cat.has_many

    def has(oid: ObjectId) -> bool:
        one.append(oid)
        raise AssertionError("asked one by one")

    def has_many(oids: Sequence[ObjectId]) -> set[ObjectId]:
        many.append((threading.current_thread().name, len(oids)))
        return real_many(oids)

    monkeypatch.setattr(cat, "has", has)
    monkeypatch.setattr(cat, "has_many", has_many)
    new = [os.urandom(1000) for _ in range(100)]
    mixed = [d for pair in zip(old, new, strict=True) for d in pair]
    with store.writer() as w:
        for data in mixed:
            w.put_known(object_id(data), data, ObjectKind.DATA)
        w.put_known(object_id(new[0]), new[0], ObjectKind.DATA)  # pending: dropped at once
        w.commit()
        assert w.stats.objects_offered == 201
        assert w.stats.objects_new == 100
        assert w.stats.bytes_new == 100_000
    assert one == []
    assert sum(n for _, n in many) == 200  # each object asked about once
    assert len(many) == -(-200 // BATCH_OBJECTS)  # one query per batch of 64
    assert all(name.startswith("store-encode") for name, _ in many)
    assert cat.object_count() == 200
    for data in mixed:
        assert store.read(object_id(data)) == data
    assert check(store, read_data=True).ok


def test_a_caller_that_asked_is_not_asked_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``put_many`` asks the catalog itself: the encoding threads do not ask again."""
    with store.writer() as w:
        w.put(b"x" * 3000)
        w.commit()
    asked: list[int] = []
    real_many = store.catalog.has_many

    def has_many(oids: Sequence[ObjectId]) -> set[ObjectId]:
        asked.append(len(oids))
        return real_many(oids)

    monkeypatch.setattr(store.catalog, "has_many", has_many)
    with store.writer() as w:
        w.put_many([b"x" * 3000, b"y" * 3000, b"z" * 3000])
        w.commit()
        assert w.stats.objects_new == 2
    assert asked == [3]
    assert store.catalog.object_count() == 3
