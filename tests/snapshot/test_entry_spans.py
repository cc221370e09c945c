"""A diff decodes only the entries that differ: ``tree.entry_spans`` and ``diff.Entries``."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from sprite_env.checkpoints import Engine
from sprite_env.errors import CorruptObject
from sprite_env.snapshot.diff import (
    Entries,
    diff_trees,
    differing,
    prefetch_trees,
    read_entries,
    top_entry,
)
from sprite_env.snapshot.tree import (
    MAGIC,
    Kind,
    decode_entry,
    decode_tree,
    encode_entry,
    entry_spans,
    entry_spans_py,
)
from tests.helpers import trees

if TYPE_CHECKING:
    from collections.abc import Callable

    from sprite_env.ids import ObjectId


def _all_trees(e: Engine, top: bytes) -> list[bytes]:
    out, stack = [], [top_entry(e.store.read, top).subtree]  # type: ignore[arg-type]
    while stack:
        blob = e.store.read(stack.pop())
        out.append(blob)
        stack.extend(x.subtree for x in decode_tree(blob) if x.kind is Kind.DIR)
    return out


#: entry_spans (in C where built) and its Python twin, the C one's oracle
SPANS = pytest.mark.parametrize("spans_of", [entry_spans, entry_spans_py], ids=["c", "py"])


@SPANS
def test_spans_are_the_encoded_entries(
    tmp_path: os.PathLike[str], spans_of: Callable[[bytes], dict[bytes, bytes]]
) -> None:
    root = os.path.join(os.fspath(tmp_path), "layer")
    trees.build_tree(root, trees.sample_spec())
    with Engine(root, os.path.join(os.fspath(tmp_path), "store")) as e:
        blobs = _all_trees(e, e.create("a").top_tree)
    assert len(blobs) > 3
    for blob in blobs:
        decoded = decode_tree(blob)
        spans = spans_of(blob)
        assert list(spans) == [x.name for x in decoded]
        assert spans == {x.name: encode_entry(x) for x in decoded}
        assert [decode_entry(raw) for raw in spans.values()] == decoded


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[:-1],  # cut short
        lambda b: b + b"\0",  # trailing bytes
        lambda b: b"SPT9" + b[4:],  # not a tree
        lambda b: b[:20],  # cut inside an entry header
    ],
)
@SPANS
def test_a_damaged_tree_is_corrupt(
    tmp_path: os.PathLike[str], damage: object, spans_of: Callable[[bytes], dict[bytes, bytes]]
) -> None:
    root = os.path.join(os.fspath(tmp_path), "layer")
    trees.build_tree(root, {"a": trees.File(b"x"), "b": trees.File(b"y")})
    with Engine(root, os.path.join(os.fspath(tmp_path), "store")) as e:
        (blob,) = [b for b in _all_trees(e, e.create("a").top_tree) if b.startswith(MAGIC)]
    with pytest.raises(CorruptObject):
        spans_of(damage(blob))  # type: ignore[operator]


def test_the_c_spans_refuse_every_cut_and_equal_the_python_ones(
    tmp_path: os.PathLike[str],
) -> None:
    """Every tree of the sample layer (xattrs, links, symlinks, devices, holes, non-UTF-8
    names), whole and cut short at every byte: the same spans, or both refuse it."""
    root = os.path.join(os.fspath(tmp_path), "layer")
    trees.build_tree(root, trees.sample_spec())
    with Engine(root, os.path.join(os.fspath(tmp_path), "store")) as e:
        blobs = _all_trees(e, e.create("a").top_tree)
    for blob in blobs:
        assert entry_spans(blob) == entry_spans_py(blob)
        for cut in range(len(blob)):
            for f in (entry_spans, entry_spans_py):
                with pytest.raises(CorruptObject):
                    f(blob[:cut])


def test_a_diff_decodes_only_the_entries_that_differ(tmp_path: os.PathLike[str]) -> None:
    """One file edited in a directory of 300: the diff's memo holds both sides' trees of
    the directories on its path, yet decoded only the entries that differ there."""
    root = os.path.join(os.fspath(tmp_path), "layer")
    spec = {f"d/sub/f{i:03d}": trees.File(b"%d" % i) for i in range(300)}
    spec.update({f"d/g{i}": trees.File(b"g") for i in range(50)})
    trees.build_tree(root, spec)
    with Engine(root, os.path.join(os.fspath(tmp_path), "store")) as e:
        a = e.create("a").top_tree
        with open(os.path.join(root, "d/sub/f123"), "wb") as f:
            f.write(b"changed")
        b = e.create("b").top_tree
        memo: dict = {}  # type: ignore[type-arg]
        changes = list(diff_trees(e.store.read, a, b, memo))
    assert [(d.path, d.change.value) for d in changes] == [(b"d/sub/f123", "modified")]
    sides = [m for m in memo.values() if isinstance(m, Entries)]
    assert sum(len(m) for m in sides) > 600  # both sides of d/sub and d were read
    assert sum(len(m._done) for m in sides) <= 6  # their changed entries only


def test_differing_names_for_plain_mappings_and_entries(tmp_path: os.PathLike[str]) -> None:
    root = os.path.join(os.fspath(tmp_path), "layer")
    trees.build_tree(root, {"x": trees.File(b"1"), "y": trees.File(b"2"), "z": trees.File(b"3")})
    with Engine(root, os.path.join(os.fspath(tmp_path), "store")) as e:
        a = e.create("a").top_tree
        os.unlink(os.path.join(root, "x"))
        with open(os.path.join(root, "w"), "wb") as f:
            f.write(b"new")
        os.chmod(os.path.join(root, "z"), 0o600)
        b = e.create("b").top_tree
        ea = read_entries(e.store.read, top_entry(e.store.read, a).subtree)
        eb = read_entries(e.store.read, top_entry(e.store.read, b).subtree)
    assert differing(ea, eb) == [b"w", b"x", b"z"]
    assert differing(dict(ea), dict(eb)) == [b"w", b"x", b"z"]
    # remembered per pair (a check's plan, its diff and the restore walk the same pairs):
    # the same answer again, a list of the caller's own, and another pair its own answer
    again = differing(ea, eb)
    assert again == [b"w", b"x", b"z"]
    again.append(b"mine")
    assert differing(ea, eb) == [b"w", b"x", b"z"]
    assert differing(eb, ea) == [b"w", b"x", b"z"]
    assert differing(ea, Entries(dict(ea.raw))) == []
    assert differing(ea, Entries({})) == [b"x", b"y", b"z"]


def test_prefetch_reads_the_changed_directories_a_level_at_a_time(
    tmp_path: os.PathLike[str],
) -> None:
    """One ``read_many`` per level of the changed directories; the diff after it reads
    no tree but the two tops, and finds the same differences."""
    root = os.path.join(os.fspath(tmp_path), "layer")
    spec = {f"a{i}/b{j}/c/f": trees.File(b"%d%d" % (i, j)) for i in range(6) for j in range(6)}
    trees.build_tree(root, spec)
    with Engine(root, os.path.join(os.fspath(tmp_path), "store")) as e:
        old = e.create("a").top_tree
        for i in range(0, 6, 2):
            with open(os.path.join(root, f"a{i}/b{i}/c/f"), "ab") as f:
                f.write(b" edited")
        new = e.create("b").top_tree
        expected = list(diff_trees(e.store.read, old, new))
        calls: list[int] = []

        def read_many(oids: list[ObjectId]) -> list[bytes]:
            calls.append(len(oids))
            return e.store.read_many(oids)

        memo: dict = {}  # type: ignore[type-arg]
        prefetch_trees(read_many, old, new, memo)
        tops = {old, new}

        def read_tree(oid: ObjectId) -> bytes:
            assert oid in tops, "a tree read one by one after the prefetch"
            return e.store.read(oid)

        got = list(diff_trees(read_tree, old, new, memo))
    assert [(d.path, d.change) for d in got] == [(d.path, d.change) for d in expected]
    assert len(expected) == 3
    # the two tops, then the root's, a{i}'s, b{i}'s and c's level: both sides each
    assert calls == [1, 1, 2, 6, 6, 6]
