"""Inodes of the view: stable numbers, lookup counts, and the attributes the kernel sees.

Numbering. An inode is named by a key, ``(checkpoint, path)``: the checkpoint's id and top
tree, and the entry's path relative to the checkpoint root (``b""`` for the root itself).
Every name of a hard-link group uses the path of the group's first member (the entry's
``link``, see ``snapshot/tree.py``), so all its names share one inode and ``st_ino``.
The number is the first 63 bits of the key's BLAKE3 hash: the same file gets the same
number every time the kernel looks it up, after the kernel forgot it, and in the next
mount too, without a table that grows with everything ever listed. Two live keys that
collide (about one chance in 10**7 for 10 million live inodes) are told apart by probing
the next numbers; only then does a number depend on the order of lookups.

Lifetime. A node lives while the kernel holds a lookup count on it (``lookup`` and each
``readdirplus`` entry add one, ``forget`` removes them) or a file handle; then it is
dropped. The kernel keeps a directory's count while any child is known, so a node's
parent is always there to answer ``..``.
"""

from __future__ import annotations

import math
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING

import blake3
import pyfuse3

from sprite_env.errors import SpriteError
from sprite_env.snapshot.tree import Kind, TreeEntry, decode_chunks

if TYPE_CHECKING:
    from sprite_env.fuse.source import CheckpointRef

ROOT_INODE: int = pyfuse3.ROOT_INODE
#: Numbers below this are never derived from a hash (the root is 1).
FIRST_HASHED_INODE = 1 << 16
_INO_MASK = (1 << 63) - 1
#: ``st_blksize`` of every inode (see :func:`entry_attributes`).
BLKSIZE = 4096

_TYPE_BITS = {
    Kind.FILE: stat.S_IFREG,
    Kind.DIR: stat.S_IFDIR,
    Kind.SYMLINK: stat.S_IFLNK,
    Kind.CHR: stat.S_IFCHR,
    Kind.BLK: stat.S_IFBLK,
    Kind.FIFO: stat.S_IFIFO,
}

#: The key of an inode: (checkpoint id NUL top tree, path of the entry or its group).
InodeKey = tuple[bytes, bytes]


def checkpoint_key(ref: CheckpointRef) -> bytes:
    """The first half of the keys of a checkpoint's inodes (its top tree included, so a
    reused automatic id never aliases the inodes of a deleted checkpoint)."""
    return ref.id.encode() + b"\0" + ref.top_tree


def hashed_inode(key: InodeKey) -> int:
    h = blake3.blake3(key[0] + b"\0/" + key[1]).digest()
    ino = int.from_bytes(h[:8], "little") & _INO_MASK
    return ino if ino >= FIRST_HASHED_INODE else ino + FIRST_HASHED_INODE


@dataclass(eq=False, slots=True)
class Node:
    """One inode the kernel knows.

    ``entry`` is None only for the mount's root; a checkpoint's root directory has the
    captured root's entry (``.`` of its top tree).
    """

    ino: int
    key: InodeKey
    entry: TreeEntry | None
    checkpoint: CheckpointRef | None
    parent: int
    path: bytes
    lookups: int = 0
    opens: int = 0

    @property
    def is_dir(self) -> bool:
        return self.entry is None or self.entry.kind is Kind.DIR

    def child_path(self, name: bytes) -> bytes:
        return name if not self.path else self.path + b"/" + name


class InodeTable:
    """The live inodes, by number and by key."""

    def __init__(self) -> None:
        root = Node(ROOT_INODE, (b"", b""), None, None, ROOT_INODE, b"", lookups=1)
        self._by_ino: dict[int, Node] = {ROOT_INODE: root}
        self._by_key: dict[InodeKey, Node] = {root.key: root}

    @property
    def root(self) -> Node:
        return self._by_ino[ROOT_INODE]

    def __len__(self) -> int:
        return len(self._by_ino)

    def get(self, ino: int) -> Node | None:
        return self._by_ino.get(ino)

    def checkpoint_root(self, ref: CheckpointRef, entry: TreeEntry) -> Node:
        """The node of a checkpoint's root directory (not counted: see :meth:`remember`)."""
        return self._node((checkpoint_key(ref), b""), entry, ref, ROOT_INODE, b"")

    def child(self, parent: Node, entry: TreeEntry) -> Node:
        """The node of ``entry``, a child of directory ``parent`` (not counted)."""
        assert parent.checkpoint is not None
        path = parent.child_path(entry.name)
        group = entry.link if entry.link and entry.kind is not Kind.DIR else path
        key = (checkpoint_key(parent.checkpoint), group)
        return self._node(key, entry, parent.checkpoint, parent.ino, path)

    def known_child(self, parent: Node, entry: TreeEntry) -> Node | None:
        """The node of ``entry`` if the kernel knows it (a lookup counted), else None."""
        assert parent.checkpoint is not None
        path = parent.child_path(entry.name)
        group = entry.link if entry.link and entry.kind is not Kind.DIR else path
        node = self._by_key.get((checkpoint_key(parent.checkpoint), group))
        return node if node is not None and node.lookups > 0 else None

    def _node(
        self, key: InodeKey, entry: TreeEntry, ref: CheckpointRef, parent: int, path: bytes
    ) -> Node:
        node = self._by_key.get(key)
        if node is not None:
            return node
        ino = hashed_inode(key)
        while ino in self._by_ino:  # a collision of two live keys: probe
            ino = ino + 1 if ino < _INO_MASK else FIRST_HASHED_INODE
        node = Node(ino, key, entry, ref, parent, path)
        self._by_ino[ino] = node
        self._by_key[key] = node
        return node

    def remember(self, node: Node) -> None:
        """Counts one lookup of ``node`` by the kernel."""
        node.lookups += 1

    def forget(self, ino: int, n: int) -> None:
        node = self._by_ino.get(ino)
        if node is None or node.ino == ROOT_INODE:
            return
        node.lookups = max(0, node.lookups - n)
        self.drop_if_unused(node)

    def drop_if_unused(self, node: Node) -> None:
        """Drops a node the kernel does not know and no open file uses."""
        unused = node.lookups == 0 and node.opens == 0 and node.ino != ROOT_INODE
        if unused and self._by_ino.get(node.ino) is node:
            del self._by_ino[node.ino]
            del self._by_key[node.key]


def entry_attributes(node: Node, timeout: float) -> pyfuse3.EntryAttributes:
    """What ``stat`` shows for a node of a checkpoint, exactly as captured.

    ``atime`` and ``ctime`` are the mtime (a checkpoint has no other times). A
    directory's ``st_nlink`` is 1, the usual "not counted" value (btrfs does the same),
    since counting subdirectories would read the directory's tree: tools (``find``) then
    do not infer anything from it. ``st_blocks`` counts the data a file holds, holes
    excepted, when its chunk list is inline; a large file's is taken from its size.
    """
    e = node.entry
    assert e is not None
    a = pyfuse3.EntryAttributes()
    a.st_ino = node.ino
    a.generation = 0
    a.entry_timeout = timeout
    a.attr_timeout = timeout
    a.st_mode = _TYPE_BITS[e.kind] | e.mode
    a.st_nlink = 1 if e.kind is Kind.DIR else max(1, e.nlink)
    a.st_uid = e.uid
    a.st_gid = e.gid
    a.st_rdev = e.rdev if e.kind in (Kind.CHR, Kind.BLK) else 0
    a.st_size = e.size if e.kind in (Kind.FILE, Kind.SYMLINK) else 0
    # What a disk's file system says (ext4, xfs): tools size their buffers by it. 1 MiB
    # (so that cat and cp read 1 MiB at a time) made each file GNU diff compares cost a
    # 1 MiB buffer: a warm diff -r of the benchmark layer took 0.71-0.89 s against the
    # disk's 0.55-0.63 s, and 0.47-0.53 s against 0.44-0.47 s with 4 KiB (same run). The
    # kernel's read-ahead (mount.READ_AHEAD_KIB), not this, sets the size of FUSE reads.
    a.st_blksize = BLKSIZE
    a.st_blocks = _blocks(e)
    a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = e.mtime_ns
    return a


def synthetic_attributes(
    ino: int, mode: int, mtime_ns: int, uid: int, gid: int, timeout: float
) -> pyfuse3.EntryAttributes:
    """An entry the view makes up (the root, its status file): one link, all three times
    ``mtime_ns``, ``timeout`` for both the entry and its attributes."""
    a = pyfuse3.EntryAttributes()
    a.st_ino = ino
    a.entry_timeout = timeout
    a.attr_timeout = timeout
    a.st_mode = mode
    a.st_nlink = 1
    a.st_uid = uid
    a.st_gid = gid
    a.st_blksize = BLKSIZE
    a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = mtime_ns
    return a


def root_attributes(mtime_ns: int, uid: int, gid: int, timeout: float) -> pyfuse3.EntryAttributes:
    """The mount's root: read-only, owned by the mounting user, dated by the newest
    checkpoint shown (a nanosecond later for each change of its listing that showed no
    newer one, such as a delete: a directory's mtime changes with its names)."""
    return synthetic_attributes(ROOT_INODE, stat.S_IFDIR | 0o555, mtime_ns, uid, gid, timeout)


def _blocks(e: TreeEntry) -> int:
    if e.kind is not Kind.FILE:
        return 0
    if e.indirect:
        return math.ceil(e.size / 512)
    try:
        data = sum(n for oid, _off, n in decode_chunks(e.payload) if oid is not None)
    except SpriteError:  # a corrupt chunk list: reading the file will say so
        data = e.size
    return math.ceil(data / 512)
