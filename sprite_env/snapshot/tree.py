"""Tree objects: one per directory, a deterministic encoding of its entries.

Format (version 2; little-endian). This docstring is the one place it is described.
Version 1 (magic ``SPT1``, chunk entries without an offset) is refused with a clear error.

::

    tree   := b"SPT2" count:u32 entry*          entries sorted by name (bytes)
    entry  := name_len:u16 kind:u8 flags:u8 mode:u32 uid:u32 gid:u32 mtime_ns:i64
              size:u64 rdev:u64 nlink:u32 nxattr:u16 link_len:u16 payload_len:u32
              name link xattr* payload
    xattr  := name_len:u16 value_len:u32 name value          sorted by name
    payload:  FILE: a chunk list, or (flag INDIRECT) the 32-byte id of a CHUNKLIST object
              DIR: the 32-byte id of its tree; SYMLINK: the target; others: empty
    chunks := (id:32 offset:u32 length:u32)*   bytes [offset, offset+length) of object id;
                                             an all-zero id is a hole of that length

- ``mode`` holds the permission bits with setuid/setgid/sticky (``st_mode & 0o7777``);
  the file type is ``kind``. ``mtime_ns`` is nanoseconds since the epoch.
- ``link`` is empty, or for the second and later members of a hard-link group (in walk
  order: depth first, names sorted) the path of the group's first member relative to the
  capture root. Every member carries the full content, so each entry stands alone; the
  link is what restore and the FUSE view use to share one inode. Inode numbers are never
  stored, so a tree's id depends only on what a user can see.
- A piece is usually a whole chunk (offset 0). A large file changed in place (a database)
  is compared with its previous version page by page, and its new chunk list keeps slices
  of the old chunks where the bytes did not change: only changed pages are stored.
- A file with more than ``INLINE_CHUNKS`` chunks keeps its chunk list in a CHUNKLIST
  object of its own, so a directory of large files stays small.
- The encoding is canonical: equal directories give equal bytes, hence equal tree ids,
  which lets diff and restore skip equal subtrees without reading them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING

from sprite_env.errors import CorruptObject, SnapshotError
from sprite_env.ids import ID_LEN, ObjectId

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

_tree_spans: Callable[[bytes], dict[bytes, bytes]] | None
try:
    from sprite_env._native import tree_spans as _tree_spans
except ImportError:  # built without the extension: entry_spans_py does the same
    _tree_spans = None

MAGIC = b"SPT2"
_HEAD = struct.Struct("<4sI")
_ENTRY = struct.Struct("<HBBIIIqQQIHHI")
_XATTR = struct.Struct("<HI")
_CHUNK = struct.Struct("<32sII")
#: One piece of a file: (object id, or None for a hole; offset in the object; length).
Piece = tuple[ObjectId | None, int, int]
HOLE = ObjectId(bytes(ID_LEN))
#: Files with more chunks than this keep their chunk list in a separate object.
INLINE_CHUNKS = 32
FLAG_INDIRECT = 1


class Kind(IntEnum):
    """The type of a tree entry (one byte on disk)."""

    FILE = 1
    DIR = 2
    SYMLINK = 3
    CHR = 4
    BLK = 5
    FIFO = 6


@dataclass(frozen=True, slots=True)
class TreeEntry:
    """One directory entry as captured. Fields not meaningful for a kind are zero/empty."""

    name: bytes
    kind: Kind
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    size: int = 0
    rdev: int = 0
    nlink: int = 1
    xattrs: tuple[tuple[bytes, bytes], ...] = ()
    link: bytes = b""
    #: FILE: encoded chunk list (or a CHUNKLIST id if ``indirect``); DIR: tree id;
    #: SYMLINK: target.
    payload: bytes = b""
    indirect: bool = False
    # The bytes this entry was decoded from: re-encoding an unchanged entry is a copy.
    # init=False, so dataclasses.replace() never carries stale bytes into a changed entry.
    _encoded: bytes | None = field(default=None, init=False, compare=False, repr=False)

    @property
    def subtree(self) -> ObjectId:
        if self.kind is not Kind.DIR:
            raise ValueError("not a directory")
        return ObjectId(self.payload)

    @property
    def target(self) -> bytes:
        return self.payload if self.kind is Kind.SYMLINK else b""

    def same_content(self, other: TreeEntry) -> bool:
        """True if a file's bytes (or a dir's tree, a symlink's target) are the same."""
        return (
            self.kind is other.kind
            and self.payload == other.payload
            and (self.indirect == other.indirect)
        )

    def same_meta(self, other: TreeEntry) -> bool:
        """True if owner, mode, mtime and xattrs are the same."""
        return (self.mode, self.uid, self.gid, self.mtime_ns, self.xattrs) == (
            other.mode,
            other.uid,
            other.gid,
            other.mtime_ns,
            other.xattrs,
        )


def placed(pieces: Iterable[Piece]) -> tuple[list[tuple[int, Piece]], int]:
    """A chunk list's data pieces at their offsets in the file, and the file's length.
    Holes are left out: a restore never writes them, so the file stays sparse."""
    out: list[tuple[int, Piece]] = []
    pos = 0
    for piece in pieces:
        if piece[0] is not None:
            out.append((pos, piece))
        pos += piece[2]
    return out, pos


def encode_chunks(pieces: Iterable[Piece]) -> bytes:
    """Encodes a chunk list; ``None`` ids are holes."""
    return b"".join(_CHUNK.pack(oid or HOLE, off, n) for oid, off, n in pieces)


def decode_chunks(data: bytes) -> list[Piece]:
    """Inverts :func:`encode_chunks`."""
    if len(data) % _CHUNK.size:
        raise CorruptObject("corrupt chunk list (length)")
    out: list[Piece] = []
    for oid, off, n in _CHUNK.iter_unpack(data):
        out.append((None if oid == HOLE else ObjectId(oid), off, n))
    return out


def chunk_count(payload: bytes) -> int:
    return len(payload) // _CHUNK.size


def encode_entry(e: TreeEntry) -> bytes:
    parts = [
        _ENTRY.pack(
            len(e.name),
            e.kind,
            FLAG_INDIRECT if e.indirect else 0,
            e.mode,
            e.uid,
            e.gid,
            e.mtime_ns,
            e.size,
            e.rdev,
            e.nlink,
            len(e.xattrs),
            len(e.link),
            len(e.payload),
        ),
        e.name,
        e.link,
    ]
    for k, v in e.xattrs:
        parts.append(_XATTR.pack(len(k), len(v)))
        parts.append(k)
        parts.append(v)
    parts.append(e.payload)
    return b"".join(parts)


def encode_tree(entries: Iterable[TreeEntry]) -> bytes:
    """Encodes a directory; entries are sorted by name here, duplicates are refused."""
    ordered = sorted(entries, key=lambda e: e.name)
    for a, b in zip(ordered, ordered[1:], strict=False):
        if a.name == b.name:
            raise SnapshotError(f"duplicate name in directory: {a.name!r}")
    body = [e._encoded or encode_entry(e) for e in ordered]
    return _HEAD.pack(MAGIC, len(ordered)) + b"".join(body)


def decode_tree(data: bytes) -> list[TreeEntry]:
    """Parses a tree object.

    Raises:
        CorruptObject: the bytes are not a valid tree (exit code 3, like other damage).
    """
    try:
        return list(_iter_tree(bytes(data)))  # bytes: its slices are the entries' fields
    except (struct.error, ValueError, IndexError) as e:
        raise CorruptObject(f"corrupt tree object: {e}") from None


def entry_meta(raw: bytes) -> tuple[int, int, int, int, int, int]:
    """(kind, mode, uid, gid, mtime_ns, size) of one encoded entry, from its fixed header
    alone: a restore's files-cache refresh compares them with each entry's stat, and
    decoding the whole entry (names, xattrs, payload) for that tripled its time on a
    directory of many files (74k entries: 0.23 -> 0.76 s).

    Raises:
        CorruptObject: the bytes are shorter than an entry's header.
    """
    try:
        _n, kind, _flags, mode, uid, gid, mtime, size, *_rest = _ENTRY.unpack_from(raw)
    except struct.error as e:
        raise CorruptObject(f"tree entry: {e}") from None
    return kind, mode, uid, gid, mtime, size


def with_payload(raw: bytes, payload: bytes) -> bytes:
    """One encoded entry with its payload (last in the entry: a directory's tree id) set
    to ``payload``, the rest byte for byte: what ``encode_entry(replace(decode_entry(raw),
    payload=payload))`` gives, without decoding names and xattrs (a capture gives each
    changed subdirectory of a changed directory its new tree id so).

    Raises:
        CorruptObject: the bytes are not one entry of this format.
    """
    try:
        fields = list(_ENTRY.unpack_from(raw))
    except struct.error as e:
        raise CorruptObject(f"tree entry: {e}") from None
    old = fields[-1]
    if old > len(raw) - _ENTRY.size:
        raise CorruptObject("tree entry: payload longer than the entry")
    fields[-1] = len(payload)
    return _ENTRY.pack(*fields) + raw[_ENTRY.size : len(raw) - old] + payload


def decode_entry(raw: bytes) -> TreeEntry:
    """Parses one encoded entry (as :func:`encode_entry` makes, or ``tree_find`` returns).

    Parsed in place, not as a tree of one entry: a restore's check decodes each entry of
    the diff it walks (9.7k for the medium step), and the copy into a tree, its header
    and a generator cost as much as the fields.

    Raises:
        CorruptObject: the bytes are not one valid entry.
    """
    raw = bytes(raw)  # (no copy of bytes) its slices are the entry's fields
    try:
        entry, end = _entry_at(raw, 0)
    except (struct.error, ValueError, IndexError) as e:
        raise CorruptObject(f"corrupt tree object: {e}") from None
    if end != len(raw):
        raise CorruptObject("corrupt tree object: trailing bytes")
    return entry


def entry_spans(data: bytes) -> dict[bytes, bytes]:
    """A tree's entries by name, each left encoded (as :func:`encode_entry` makes it):
    equal bytes are equal entries, so a diff decodes only the names whose bytes differ
    (:func:`decode_entry`). About 6x cheaper than :func:`decode_tree` per entry (0.65 us
    against 4.1 us, medium layer's trees); a restore's diff decoded 120k entries of the
    typical step's 1,100 changed directories to find the 3k that changed. In C where the
    extension is built (``tree_spans``): this loop was still 0.14 s of the medium undo's
    check (py-spy, load 1), its largest share after the reads.

    Raises:
        CorruptObject: the bytes are not a valid tree.
    """
    if _tree_spans is None:
        return entry_spans_py(data)
    try:
        return _tree_spans(data)
    except ValueError as e:
        raise CorruptObject(f"corrupt tree object: {e}") from None


def entry_spans_py(data: bytes) -> dict[bytes, bytes]:
    """:func:`entry_spans` in Python (no extension; the native one's oracle)."""
    try:
        magic, count = _HEAD.unpack_from(data, 0)
        if magic != MAGIC:
            raise ValueError("bad magic" if magic != b"SPT1" else "tree format 1")
        out: dict[bytes, bytes] = {}
        unpack, size, xunpack, xsize = (
            _ENTRY.unpack_from,
            _ENTRY.size,
            _XATTR.unpack_from,
            _XATTR.size,
        )
        off = _HEAD.size
        for _ in range(count):
            start = off
            h = unpack(data, off)
            off += size
            name = data[off : off + h[0]]
            off += h[0] + h[11]  # name, link
            for _x in range(h[10]):
                kl, vl = xunpack(data, off)
                off += xsize + kl + vl
            off += h[12]  # payload
            if off > len(data):
                raise ValueError("truncated")
            out[name] = data[start:off]
        if off != len(data):
            raise ValueError("trailing bytes")
        return out
    except (struct.error, ValueError) as e:
        raise CorruptObject(f"corrupt tree object: {e}") from None


#: What :func:`references` says an id is.
REF_TREE, REF_CHUNKS, REF_DATA = 0, 1, 2
_KINDS = frozenset(int(k) for k in Kind)


def references(data: bytes) -> list[tuple[ObjectId, int]]:
    """The objects a tree names directly, without decoding its entries: each
    subdirectory's tree (``REF_TREE``), each file's chunk list object (``REF_CHUNKS``) or
    inline chunks (``REF_DATA``; holes left out), in entry order. For the store's
    accounting (``checkpoints/usage.py``), which decoded a step's 1,100 changed
    directories entry by entry with :func:`decode_tree`.

    Raises:
        CorruptObject: the bytes are not a valid tree.
    """
    try:
        magic, count = _HEAD.unpack_from(data, 0)
        if magic != MAGIC:
            raise ValueError("bad magic" if magic != b"SPT1" else "tree format 1")
        out: list[tuple[ObjectId, int]] = []
        unpack, size, xunpack, xsize = (
            _ENTRY.unpack_from,
            _ENTRY.size,
            _XATTR.unpack_from,
            _XATTR.size,
        )
        step, end = _CHUNK.size, len(data)
        off = _HEAD.size
        for _ in range(count):
            h = unpack(data, off)
            off += size + h[0] + h[11]  # the header, name, link
            for _x in range(h[10]):
                kl, vl = xunpack(data, off)
                off += xsize + kl + vl
            start, off = off, off + h[12]
            if off > end:
                raise ValueError("truncated")
            kind = h[1]
            if kind not in _KINDS:
                raise ValueError(f"unknown entry kind {kind}")
            if kind == Kind.DIR:
                if h[12] != ID_LEN:
                    raise ValueError("directory entry without a tree id")
                out.append((ObjectId(data[start:off]), REF_TREE))
            elif kind == Kind.FILE:
                if h[2] & FLAG_INDIRECT:
                    if h[12] != ID_LEN:
                        raise ValueError("indirect file entry without a chunk list id")
                    out.append((ObjectId(data[start:off]), REF_CHUNKS))
                else:
                    if h[12] % step:
                        raise ValueError("corrupt chunk list (length)")
                    for at in range(start, off, step):
                        oid = data[at : at + ID_LEN]
                        if oid != HOLE:
                            out.append((ObjectId(oid), REF_DATA))
        if off != end:
            raise ValueError("trailing bytes")
        return out
    except (struct.error, ValueError) as e:
        raise CorruptObject(f"corrupt tree object: {e}") from None


#: Kind by its byte (an IndexError, or None, for a byte that is no kind): ``Kind(k)`` goes
#: through the enum's ``__call__``, 1.6 us of each entry decoded.
_KIND_OF: list[Kind | None] = [None] * (max(Kind) + 1)
for _k in Kind:
    _KIND_OF[_k] = _k


def _entry_at(data: bytes, off: int) -> tuple[TreeEntry, int]:
    """The entry encoded at ``off`` of ``data``, and where it ends.

    Raises:
        struct.error, ValueError, IndexError: the bytes are no entry of this format.
    """
    start = off
    (nlen, kind, flags, mode, uid, gid, mtime, size, rdev, nlink, nx, llen, plen) = (
        _ENTRY.unpack_from(data, off)
    )
    off += _ENTRY.size
    name = data[off : off + nlen]
    off += nlen
    link = data[off : off + llen]
    off += llen
    xattrs: list[tuple[bytes, bytes]] = []
    for _x in range(nx):
        kl, vl = _XATTR.unpack_from(data, off)
        off += _XATTR.size
        xattrs.append((data[off : off + kl], data[off + kl : off + kl + vl]))
        off += kl + vl
    payload = data[off : off + plen]
    off += plen
    if off > len(data):
        raise ValueError("truncated")
    k = _KIND_OF[kind]
    if k is None:
        raise ValueError(f"{kind} is not a valid Kind")
    entry = TreeEntry(
        name,
        k,
        mode,
        uid,
        gid,
        mtime,
        size,
        rdev,
        nlink,
        tuple(xattrs),
        link,
        payload,
        bool(flags & FLAG_INDIRECT),
    )
    object.__setattr__(
        entry, "_encoded", data if start == 0 and off == len(data) else data[start:off]
    )
    return entry, off


def _iter_tree(data: bytes) -> Iterator[TreeEntry]:
    magic, count = _HEAD.unpack_from(data, 0)
    if magic == b"SPT1":
        raise ValueError("tree format 1 (an early development version) is no longer read")
    if magic != MAGIC:
        raise ValueError("bad magic")
    off = _HEAD.size
    for _ in range(count):
        entry, off = _entry_at(data, off)
        yield entry
    if off != len(data):
        raise ValueError("trailing bytes")
