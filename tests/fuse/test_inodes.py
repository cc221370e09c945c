"""Inode numbers and file layouts, without a mount."""

from __future__ import annotations

import pytest

from sprite_env.errors import SnapshotError
from sprite_env.fuse import inodes
from sprite_env.fuse.content import FileLayout
from sprite_env.fuse.inodes import ROOT_INODE, InodeTable, hashed_inode
from sprite_env.fuse.source import CheckpointRef
from sprite_env.ids import ObjectId
from sprite_env.snapshot.tree import Kind, TreeEntry, encode_chunks

REF = CheckpointRef("v3", ObjectId(bytes(range(32))), 0, False)


def _dir(name: bytes) -> TreeEntry:
    return TreeEntry(name, Kind.DIR, 0o755, 0, 0, 0, payload=bytes(32))


def _file(name: bytes, link: bytes = b"") -> TreeEntry:
    return TreeEntry(name, Kind.FILE, 0o644, 0, 0, 0, nlink=2 if link else 1, link=link)


def test_a_path_gets_the_same_number_after_it_was_forgotten() -> None:
    table = InodeTable()
    top = table.checkpoint_root(REF, _dir(b"."))
    table.remember(top)
    etc = table.child(top, _dir(b"etc"))
    table.remember(etc)
    first = table.child(etc, _file(b"hosts")).ino
    table.remember(table.get(first))  # type: ignore[arg-type]
    table.forget(first, 1)
    assert table.get(first) is None
    assert table.child(etc, _file(b"hosts")).ino == first
    # and in another table (the next mount)
    other = InodeTable()
    top2 = other.checkpoint_root(REF, _dir(b"."))
    assert other.child(other.child(top2, _dir(b"etc")), _file(b"hosts")).ino == first


def test_hard_links_share_the_node_of_their_first_member() -> None:
    table = InodeTable()
    top = table.checkpoint_root(REF, _dir(b"."))
    a = table.child(top, _dir(b"a"))
    b = table.child(top, _dir(b"b"))
    leader = table.child(a, _file(b"one"))
    member = table.child(b, _file(b"two", link=b"a/one"))
    assert member is leader
    # a member seen first creates the node; the leader then finds it
    table2 = InodeTable()
    top2 = table2.checkpoint_root(REF, _dir(b"."))
    m2 = table2.child(table2.child(top2, _dir(b"b")), _file(b"two", link=b"a/one"))
    assert table2.child(table2.child(top2, _dir(b"a")), _file(b"one")) is m2
    assert m2.ino == leader.ino


def test_colliding_numbers_are_probed_and_live_nodes_keep_theirs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(inodes, "hashed_inode", lambda key: 1 << 20)
    table = InodeTable()
    top = table.checkpoint_root(REF, _dir(b"."))
    table.remember(top)
    x = table.child(top, _file(b"x"))
    table.remember(x)
    y = table.child(top, _file(b"y"))
    table.remember(y)
    assert top.ino == 1 << 20
    assert len({top.ino, x.ino, y.ino}) == 3
    table.forget(top.ino, 1)  # the owner of the hashed number goes; y keeps its own
    assert table.child(top, _file(b"y")) is y


def test_the_root_is_never_forgotten_and_numbers_avoid_it() -> None:
    table = InodeTable()
    table.forget(ROOT_INODE, 10)
    assert table.get(ROOT_INODE) is table.root
    assert hashed_inode((b"", b"")) >= inodes.FIRST_HASHED_INODE


def test_a_layout_finds_pieces_by_bisection() -> None:
    a, b = ObjectId(b"a" * 32), ObjectId(b"b" * 32)
    pieces = [(a, 0, 10), (None, 0, 5), (b, 3, 7)]
    entry = TreeEntry(b"f", Kind.FILE, 0o644, 0, 0, 0, size=22, payload=encode_chunks(pieces))
    lay = FileLayout.of(entry, lambda oid: pytest.fail("read"))
    assert lay.ends == [10, 15, 22]
    assert [lay.index(o) for o in (0, 9, 10, 14, 15, 21, 22)] == [0, 0, 1, 1, 2, 2, 3]
    assert lay.objects() == {a, b}
    bad = TreeEntry(b"f", Kind.FILE, 0o644, 0, 0, 0, size=23, payload=encode_chunks(pieces))
    with pytest.raises(SnapshotError, match="covers 22 bytes"):
        FileLayout.of(bad, lambda oid: b"")
