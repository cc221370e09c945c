"""A restore reads its files' objects in batches through the store's reader (issue 12.1):
one ``read_many`` per batch of small files and per window of a big file, not one lookup
and one ``pread`` per object; and what it writes is still byte for byte the checkpoint."""

from __future__ import annotations

import os
import random
from typing import TYPE_CHECKING

import pytest

from sprite_env.errors import StoreError
from sprite_env.snapshot import restore as restore_mod
from sprite_env.snapshot.diff import read_entries, top_entry
from sprite_env.snapshot.tree import decode_chunks
from sprite_env.store.pack import ENTRY, pack_path
from tests.helpers import trees

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sprite_env.checkpoints import Engine
    from sprite_env.ids import ObjectId
    from sprite_env.store.catalog import Located

FILES = 300


def _layer(root: str) -> None:
    rng = random.Random(3)
    for d in range(3):
        os.mkdir(os.path.join(root, f"d{d}"))
        for i in range(FILES // 3):
            with open(os.path.join(root, f"d{d}", f"f{i}"), "wb") as f:
                f.write(rng.randbytes(rng.randrange(100, 20_000)))
    with open(os.path.join(root, "big"), "wb") as f:  # ~50 chunks, in two windows
        f.write(rng.randbytes(12 << 20))


def _count_lookups(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of each catalog lookup the store makes (the real one, counted)."""
    sizes: list[int] = []
    real = engine.store.locate_many

    def locate_many(oids: Iterable[ObjectId]) -> dict[ObjectId, Located]:
        ids = list(oids)
        sizes.append(len(ids))
        return real(ids)

    monkeypatch.setattr(engine.store, "locate_many", locate_many)
    return sizes


def test_an_export_reads_objects_in_batches(
    tmp_path: os.PathLike[str], root: str, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    _layer(root)
    engine.create()
    sizes = _count_lookups(engine, monkeypatch)
    dest = os.path.join(os.fspath(tmp_path), "out")
    os.mkdir(dest)
    engine.export("v0", dest)
    trees.assert_trees_equal(root, dest)
    data_lookups = [n for n in sizes if n > 1]
    # 300 small files in batches of at most BATCH_FILES, the big file in 8 MiB windows;
    # one object at a time this was a lookup per file and per chunk (350+)
    assert sum(data_lookups) >= FILES
    assert len(sizes) < FILES // 2
    assert max(sizes) > restore_mod.BATCH_FILES // 2


def test_a_damaged_object_fails_only_its_file_and_names_it(
    tmp_path: os.PathLike[str], root: str, engine: Engine
) -> None:
    """A batch that cannot be read whole is written file by file: the error is the
    damaged file's, as it was when each file read its own objects."""
    _layer(root)
    engine.create()
    store = engine.store
    top = top_entry(store.read, engine.info("v0").top_tree)
    d0 = read_entries(store.read, top.subtree)[b"d0"]
    f5 = read_entries(store.read, d0.subtree)[b"f5"]
    oid = next(o for o, _off, _n in decode_chunks(f5.payload) if o is not None)
    loc = store.catalog.locate(oid)
    assert loc is not None
    with open(pack_path(store.packs_dir, loc.pack), "r+b") as f:
        f.seek(loc.entry.offset + ENTRY.size + 3)
        b = f.read(1)
        f.seek(loc.entry.offset + ENTRY.size + 3)
        f.write(bytes([b[0] ^ 1]))
    dest = os.path.join(os.fspath(tmp_path), "out")
    os.mkdir(dest)
    with pytest.raises(StoreError, match="damaged"):
        engine.export("v0", dest)
    assert oid in store.damaged
    # the other files of its batch were written all the same
    assert os.path.getsize(os.path.join(dest, "d0", "f4")) == os.path.getsize(
        os.path.join(root, "d0", "f4")
    )
