"""The view's source (``fuse/source.py``) without a mount: pinned readers from the store,
batched reads, failures (more of the reader in ``tests/store/test_reader.py``)."""

from __future__ import annotations

import os
import random
from typing import TYPE_CHECKING

import pytest

from sprite_env.errors import CorruptPack, ObjectNotFound
from sprite_env.fuse import StoreSource
from sprite_env.ids import ObjectId
from sprite_env.snapshot.diff import top_entry
from sprite_env.snapshot.tree import decode_chunks, decode_tree
from sprite_env.store import repository

if TYPE_CHECKING:
    from sprite_env.checkpoints import Engine

MiB = 1 << 20


def _pieces(engine: Engine, name: bytes) -> list[ObjectId]:
    """The objects of file ``name`` of v0, in file order."""
    read = engine.store.read
    top = top_entry(read, engine.info("v0").top_tree)
    entry = next(e for e in decode_tree(read(top.subtree)) if e.name == name)
    payload = read(ObjectId(entry.payload)) if entry.indirect else entry.payload
    return [oid for oid, _off, _n in decode_chunks(payload) if oid is not None]


@pytest.fixture
def big(root: str, engine: Engine) -> list[ObjectId]:
    """An 8 MiB file, half random bytes (stored raw), half text (zstd); its objects."""
    rng = random.Random(11)
    text = b"".join(
        b"%6d %s\n" % (i, rng.choice([b"alpha", b"beta", b"gamma"]) * 9) for i in range(80_000)
    )
    with open(os.path.join(root, "big"), "wb") as f:
        f.write(rng.randbytes(4 * MiB) + text[: 4 * MiB])
    engine.create()
    return _pieces(engine, b"big")


def test_pinned_objects_read_back_in_any_batches(
    engine: Engine, big: list[ObjectId], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(repository, "LOCATE_BATCH", 7)  # several catalog queries
    source = StoreSource(engine.store)
    reader = source.pin(reversed(big))
    try:
        want = {oid: engine.store.read(oid) for oid in big}
        codecs = {loc.entry.codec for loc in engine.store.locate_many(big).values()}
        assert codecs == {0, 1}  # stored raw and compressed
        # all at once: runs larger than the scratch buffer; then read-ahead-sized batches
        assert reader.read_many(big) == [want[o] for o in big]
        for n in (1, 5, 16):
            for i in range(0, len(big), n):
                assert reader.read_many(big[i : i + n]) == [want[o] for o in big[i : i + n]]
        assert source.open_pack_fds >= 1
    finally:
        reader.close()
    assert source.open_pack_fds == 0


def test_pinning_a_missing_object_fails_and_holds_nothing(
    engine: Engine, big: list[ObjectId]
) -> None:
    source = StoreSource(engine.store)
    with pytest.raises(ObjectNotFound):
        source.pin([*big, ObjectId(bytes(32))])
    assert source.open_pack_fds == 0


def test_a_truncated_pack_is_reported(engine: Engine, big: list[ObjectId]) -> None:
    source = StoreSource(engine.store)
    reader = source.pin(big)
    try:
        loc = engine.store.catalog.locate(big[-1])
        assert loc is not None
        os.truncate(os.path.join(engine.store.packs_dir, f"{loc.pack}.pack"), loc.entry.offset + 10)
        with pytest.raises(CorruptPack, match="truncated object"):
            reader.read_many(big[-3:])
    finally:
        reader.close()
