"""The in-memory filter before the catalog's ``has``: never "absent" for an id the store
has, whatever was committed before, during or after it was built."""

from __future__ import annotations

import os
import threading

from sprite_env.store import known, open_store
from sprite_env.store.codec import object_id
from sprite_env.store.known import KnownIds
from sprite_env.store.pack import ObjectKind


def test_the_filter_rules_out_new_ids_and_keeps_every_stored_one() -> None:
    stored = [object_id(b"%d" % i) for i in range(5000)]
    f = KnownIds(stored[:4000])
    f.note(stored[4000:])
    assert all(f.may_have(o) for o in stored)
    fresh = [object_id(b"new %d" % i) for i in range(5000)]
    assert sum(f.may_have(o) for o in fresh) == 0  # 5000 * 5000 / 2**64: none expected


def test_merging_the_recent_ids_keeps_them() -> None:
    ids = [object_id(b"m%d" % i) for i in range(300)]
    f = KnownIds([])
    old = known.MERGE_AT
    known.MERGE_AT = 100
    try:
        for i in range(0, 300, 50):
            f.note(ids[i : i + 50])
    finally:
        known.MERGE_AT = old
    assert len(f) == 300
    assert all(f.may_have(o) for o in ids)


def test_the_store_answers_the_same_with_the_filter(tmp_path: os.PathLike[str]) -> None:
    """Objects committed before the filter is built, while it is built (a writer on another
    thread) and after it: ``has`` and ``has_many`` find every one, and no new id."""
    store = open_store(os.path.join(os.fspath(tmp_path), "s"), create=True)
    try:
        committed: list[bytes] = []

        def write(tag: bytes, n: int) -> None:
            with store.writer() as w:
                for i in range(n):
                    committed.append(w.put(tag + b"%d" % i, ObjectKind.DATA))
                w.commit()

        write(b"before ", 300)
        stop = threading.Event()

        def writer() -> None:
            k = 0
            while not stop.is_set() and k < 40:
                write(b"during %d " % k, 20)
                k += 1

        t = threading.Thread(target=writer)
        t.start()
        absent = [object_id(b"absent %d" % i) for i in range(known.BUILD_AFTER + 10)]
        try:
            assert not any(store.catalog.has(o) for o in absent)  # builds the filter
        finally:
            stop.set()
            t.join()
        assert store.catalog._known is not None
        write(b"after ", 300)
        assert all(store.catalog.has(o) for o in committed)
        assert store.catalog.has_many(committed) == set(committed)
        assert store.catalog.has_many(absent) == set()
    finally:
        store.close()
