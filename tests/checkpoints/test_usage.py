"""``unique_bytes`` kept up to date between calls (``usage.Usage``) equals the full pass
(``usage.unique_bytes``) after every create and delete, and a create after a small change
walks in proportion to that change, not to the layer."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from sprite_env.checkpoints import usage
from sprite_env.errors import CorruptObject
from sprite_env.ids import ObjectId
from sprite_env.snapshot import tree

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sprite_env.checkpoints import Engine

KiB = 1024


def _full(engine: Engine) -> dict[str, int | None]:
    def stored(oids: Iterable[ObjectId]) -> dict[ObjectId, int]:
        return {o: loc.entry.stored_len for o, loc in engine.store.locate_many(oids).items()}

    return usage.unique_bytes(engine.store.read, stored, engine.registry.all())


def _write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def test_kept_figures_equal_the_full_pass_after_every_change(engine: Engine, root: str) -> None:
    _write(os.path.join(root, "shared.bin"), os.urandom(64 * KiB))
    _write(os.path.join(root, "d", "data.bin"), os.urandom(200 * KiB))
    seen = []
    engine.create("v0")
    seen.append(engine.unique_bytes())
    _write(os.path.join(root, "d", "data.bin"), os.urandom(300 * KiB))  # v0's goes away
    engine.create("v1")
    seen.append(engine.unique_bytes())
    assert seen[-1] == _full(engine)
    _write(os.path.join(root, "notes"), b"tiny")
    engine.create("v2")  # shares v1's data.bin
    _write(os.path.join(root, "d", "data.bin"), os.urandom(10 * KiB))
    os.unlink(os.path.join(root, "shared.bin"))
    engine.create("v3")
    got = engine.unique_bytes()
    assert got == _full(engine)
    assert (got["v0"] or 0) >= 200 * KiB  # its data.bin is its own
    assert got["v1"] is not None
    assert got["v1"] < 8 * KiB  # its data.bin is v2's too
    assert (seen[0]["v0"] or 0) >= 264 * KiB  # alone, it owned all
    engine.delete("v1")  # the set changed other than by an addition: starts over
    assert engine.unique_bytes() == _full(engine)
    _write(os.path.join(root, "e", "more.bin"), os.urandom(20 * KiB))
    engine.create("v4")
    assert engine.unique_bytes() == _full(engine)


def test_a_small_change_walks_only_what_changed(engine: Engine, root: str) -> None:
    for d in range(40):
        for f in range(5):
            _write(os.path.join(root, f"dir{d}", f"f{f}"), b"%d %d\n" % (d, f) * 50)
    engine.create("v0")
    engine.unique_bytes()
    first = engine._usage.visited
    _write(os.path.join(root, "dir7", "f1"), b"changed\n")
    engine.create("v1")
    engine.unique_bytes()  # v1 meets v0's unchanged subtrees: they become SHARED once
    _write(os.path.join(root, "dir9", "f2"), b"changed too\n")
    engine.create("v2")
    got = engine.unique_bytes()
    # v2's top tree, root tree, dir9's tree and its new chunk, and the subtrees it meets
    # that are v1's alone (v1's root and dir7), not the 40 directories and 200 files.
    assert first > 200
    assert engine._usage.visited < 60
    assert got == _full(engine)
    assert engine.unique_bytes() == got
    assert engine._usage.visited == 0  # nothing new: nothing walked


def _children_by_decoding(data: bytes) -> list[tuple[ObjectId, int]]:
    """What usage took from a tree before ``tree.references``: every entry decoded."""
    out: list[tuple[ObjectId, int]] = []
    for e in tree.decode_tree(data):
        if e.kind is tree.Kind.DIR:
            out.append((e.subtree, tree.REF_TREE))
        elif e.kind is tree.Kind.FILE:
            if e.indirect:
                out.append((ObjectId(e.payload), tree.REF_CHUNKS))
            else:
                out.extend(
                    (oid, tree.REF_DATA)
                    for oid, _, _ in tree.decode_chunks(e.payload)
                    if oid is not None
                )
    return out


def test_references_name_what_decoding_every_entry_names(engine: Engine, root: str) -> None:
    _write(os.path.join(root, "a", "small"), b"x" * 100)
    _write(os.path.join(root, "a", "b", "big.bin"), os.urandom(3 << 20))  # > 32 chunks
    with open(os.path.join(root, "sparse"), "wb") as f:
        f.truncate(1 << 20)
        f.seek(512 << 10)
        f.write(b"data in the middle")
    os.symlink("a/small", os.path.join(root, "link"))
    os.setxattr(os.path.join(root, "a", "small"), "user.note", b"kept")
    os.mkdir(os.path.join(root, "empty"))
    os.link(os.path.join(root, "a", "small"), os.path.join(root, "hard"))
    cp = engine.create("v0")
    trees = [cp.top_tree]
    seen, kinds = 0, set()
    while trees:
        data = engine.store.read(trees.pop())
        refs = tree.references(data)
        assert refs == _children_by_decoding(data)
        trees.extend(oid for oid, what in refs if what == tree.REF_TREE)
        kinds.update(what for _, what in refs)
        seen += 1
    assert seen == 5  # the top tree, the root, a, a/b, empty
    assert kinds == {tree.REF_TREE, tree.REF_CHUNKS, tree.REF_DATA}
    kinds = {what for oid, what in tree.references(engine.store.read(cp.top_tree))}
    assert kinds == {tree.REF_TREE}
    with pytest.raises(CorruptObject):
        tree.references(engine.store.read(cp.top_tree)[:-3])
