"""Pack files: immutable containers of many objects, readable without the catalog.

On-disk format (version 1; all integers little-endian). This docstring is the one place
the format is described.

::

    pack      := header entry* table footer
    header    := b"SPRPACK\\0" version:u8 kind:u8 pad:6           (16 bytes)
    entry     := b"SOBJ" kind:u8 codec:u8 pad:2 id:32 stored_len:u32 raw_len:u32   (48 bytes)
                 payload:stored_len
    table     := (id:32 offset:u64 stored_len:u32 raw_len:u32 kind:u8 codec:u8 pad:2)*
                 (52 bytes each; offset is that of the entry header)
    footer    := table_offset:u64 count:u32 table_hash:32 b"SPRPEND1"   (52 bytes)

- ``id`` is the BLAKE3-256 of the object's raw (decoded) bytes; ``codec`` is 0 for raw,
  1 for zstd (see ``codec.py``); ``kind`` is the object's kind (``ObjectKind``).
- ``table_hash`` is the BLAKE3-256 of the table bytes, so a damaged table is detected and
  the catalog can still be rebuilt by scanning the entry headers in order.
- The pack's name is the hex BLAKE3-256 of the whole file; the file is
  ``packs/<name>.pack``. A pack is written under ``tmp/``, fsync'd, renamed into
  ``packs/`` and the directory fsync'd; it never changes afterwards.
- A pack holds objects of one kind class: data chunks, or metadata (trees, chunk lists),
  so that reading metadata never drags data through the cache.
"""

from __future__ import annotations

import contextlib
import os
import struct
import uuid
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING

import blake3

from sprite_env import privacy
from sprite_env.errors import CorruptPack
from sprite_env.ids import ObjectId, PackName
from sprite_env.store.faults import crashpoint

if TYPE_CHECKING:
    from collections.abc import Iterator

VERSION = 1
HEADER = struct.Struct("<8sBB6x")
HEADER_MAGIC = b"SPRPACK\0"
ENTRY = struct.Struct("<4sBB2x32sII")
ENTRY_MAGIC = b"SOBJ"
TABLE_ROW = struct.Struct("<32sQIIBB2x")
FOOTER = struct.Struct("<QI32s8s")
FOOTER_MAGIC = b"SPRPEND1"

#: A pack is closed once it reaches this many bytes.
TARGET_PACK_SIZE = 32 * 1024 * 1024
#: A pack being written goes to its file in writes of this many bytes. Two ``os.write``
#: calls per object (header, payload) were 14k system calls for the 7.1k objects of the
#: medium layer's step, each a release of the GIL and a wait to take it back beside the
#: capture's thread: buffering made that checkpoint 0.87-0.91x (bench_capture_step, 3
#: rounds, load 2). Nothing reads a pack before it is sealed and published.
WRITE_BUFFER = 1 << 20


class ObjectKind(IntEnum):
    """What an object holds; decides which pack class it goes to."""

    DATA = 0  # file content chunk
    TREE = 1  # a directory listing
    CHUNKLIST = 2  # a large file's list of chunks
    META = 3  # other metadata records (e.g. checkpoint records)

    @property
    def pack_class(self) -> int:
        return 0 if self is ObjectKind.DATA else 1


@dataclass(frozen=True, slots=True)
class Entry:
    """Where one object sits in a pack."""

    id: ObjectId
    offset: int  # of the entry header
    stored_len: int
    raw_len: int
    kind: int
    codec: int

    @property
    def payload_offset(self) -> int:
        return self.offset + ENTRY.size


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PackWriter:
    """Appends objects to a new pack under a temporary name, then publishes it.

    Not thread-safe: callers serialize ``add`` and ``finish``. The bytes are buffered
    (``WRITE_BUFFER``) until :meth:`seal`, so an error writing them (a full disk) may be
    raised by a later :meth:`add` or by :meth:`seal`.
    """

    def __init__(self, tmp_dir: str, pack_class: int) -> None:
        self.pack_class = pack_class
        self.tmp_path = os.path.join(tmp_dir, f"{uuid.uuid4().hex}.tmp")
        # 0600: a pack holds the bytes of files whatever their own modes (sprite_env/privacy.py).
        self._fd = privacy.open_file(self.tmp_path, os.O_WRONLY | os.O_EXCL)
        self._hash = blake3.blake3()
        self.entries: list[Entry] = []
        self.size = 0  # bytes of the pack so far, buffered ones included
        self._buf = bytearray()
        self.name = PackName("")  # set by seal()
        self._write(HEADER.pack(HEADER_MAGIC, VERSION, pack_class))

    def _write(self, data: bytes | memoryview) -> None:
        self._buf += data
        self.size += len(data)
        if len(self._buf) >= WRITE_BUFFER:
            self._flush()

    def _flush(self) -> None:
        """Writes the buffered bytes to the file and into the pack's hash."""
        with memoryview(self._buf) as whole:
            done = 0
            while done < len(whole):
                done += os.write(self._fd, whole[done:])
        self._hash.update(self._buf)
        self._buf.clear()

    def add(self, oid: ObjectId, kind: int, codec: int, payload: bytes, raw_len: int) -> Entry:
        """Appends one encoded object; returns where it went."""
        entry = Entry(oid, self.size, len(payload), raw_len, kind, codec)
        self._write(ENTRY.pack(ENTRY_MAGIC, kind, codec, oid, len(payload), raw_len))
        self._write(payload)
        self.entries.append(entry)
        return entry

    def finish(self, packs_dir: str, *, sync_dir: bool = True) -> tuple[PackName, int]:
        """Writes the table and footer, makes the pack durable and gives it its name.

        Args:
            packs_dir: where the pack goes.
            sync_dir: fsync ``packs_dir`` after the rename. False for a caller that
                publishes several packs and fsyncs the directory once, before any catalog
                row names them (``StoreWriter.flush``): until then a pack whose name did
                not reach the disk is only an orphan that never existed.

        Returns:
            The pack's name and size in bytes.
        """
        name = self.seal()
        self.publish(packs_dir, sync_dir=sync_dir)
        return name, self.size

    def seal(self) -> PackName:
        """Writes the table and footer; returns the pack's name (the hash of its bytes), so
        a caller can name it in catalog rows while :meth:`publish` makes it durable."""
        table = b"".join(
            TABLE_ROW.pack(e.id, e.offset, e.stored_len, e.raw_len, e.kind, e.codec)
            for e in self.entries
        )
        table_offset = self.size
        self._write(table)
        self._write(
            FOOTER.pack(
                table_offset, len(self.entries), blake3.blake3(table).digest(), FOOTER_MAGIC
            )
        )
        self._flush()
        self.name = PackName(self._hash.hexdigest())
        return self.name

    def publish(self, packs_dir: str, *, sync_dir: bool = True) -> None:
        """Makes a sealed pack durable and renames it into ``packs_dir`` (see :meth:`finish`;
        may run on another thread than the one that sealed it)."""
        crashpoint("pack-before-fsync")
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        crashpoint("pack-before-rename")
        os.rename(self.tmp_path, pack_path(packs_dir, self.name))
        crashpoint("pack-after-rename")
        if sync_dir:
            _fsync_dir(packs_dir)

    def abort(self) -> None:
        """Drops the unfinished pack."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp_path)


def pack_path(packs_dir: str, name: str) -> str:
    return os.path.join(packs_dir, f"{name}.pack")


def read_header(fd: int, name: str) -> int:
    """Validates a pack's header; returns its pack class."""
    raw = os.pread(fd, HEADER.size, 0)
    if len(raw) != HEADER.size:
        raise CorruptPack(name, 0, "truncated header")
    magic, version, pack_class = HEADER.unpack(raw)
    if magic != HEADER_MAGIC:
        raise CorruptPack(name, 0, "not a pack (bad magic)")
    if version != VERSION:
        raise CorruptPack(name, 0, f"unsupported pack version {version}")
    return int(pack_class)


def read_table(fd: int, name: str) -> list[Entry]:
    """Reads and verifies a pack's trailing table.

    Raises:
        CorruptPack: truncated file, bad footer, or a table that does not match its hash.
    """
    size = os.fstat(fd).st_size
    read_header(fd, name)
    if size < HEADER.size + FOOTER.size:
        raise CorruptPack(name, size, "truncated (no footer)")
    table_offset, count, table_hash, magic = FOOTER.unpack(
        os.pread(fd, FOOTER.size, size - FOOTER.size)
    )
    if magic != FOOTER_MAGIC:
        raise CorruptPack(name, size - FOOTER.size, "bad footer (truncated pack?)")
    if table_offset + count * TABLE_ROW.size != size - FOOTER.size:
        raise CorruptPack(name, size - FOOTER.size, "footer does not match the file size")
    table = os.pread(fd, count * TABLE_ROW.size, table_offset)
    if blake3.blake3(table).digest() != table_hash:
        raise CorruptPack(name, table_offset, "table does not match its hash")
    entries = []
    for i in range(count):
        oid, off, slen, rlen, kind, codec = TABLE_ROW.unpack_from(table, i * TABLE_ROW.size)
        entries.append(Entry(ObjectId(oid), off, slen, rlen, kind, codec))
    return entries


def scan_entries(fd: int, name: str) -> Iterator[Entry]:
    """Walks the entry headers in order, for a pack whose table is damaged.

    Stops at the first header that does not parse (the table, or the damage).
    """
    size = os.fstat(fd).st_size
    read_header(fd, name)
    off = HEADER.size
    while off + ENTRY.size <= size:
        raw = os.pread(fd, ENTRY.size, off)
        magic, kind, codec, oid, slen, rlen = ENTRY.unpack(raw)
        if magic != ENTRY_MAGIC or off + ENTRY.size + slen > size:
            return
        yield Entry(ObjectId(oid), off, slen, rlen, kind, codec)
        off += ENTRY.size + slen


def parse_entry(
    buf: bytes | bytearray | memoryview, at: int, entry: Entry, name: str, *, strict: bool = False
) -> memoryview:
    """The stored payload of ``entry``, whose entry header starts at ``buf[at]``, once that
    header is checked against the catalog's row: the one parser of entries that readers
    use (the store's reads, the pinned readers, ``check`` and prune's copies).

    Args:
        buf: bytes read from the pack (perhaps several entries: a coalesced read).
        at: where ``entry``'s header is in ``buf``.
        entry: the catalog's row for the object.
        name: the pack's name, for errors.
        strict: also compare the kind (prune copies headers verbatim, so they must agree
            in every field; a read needs only what locates and decodes the payload).

    Raises:
        CorruptPack: ``buf`` ends before the object, or the header is not the expected
            object's.
    """
    end = at + ENTRY.size + entry.stored_len
    if at < 0 or len(buf) < end:
        raise CorruptPack(name, entry.offset, "truncated object")
    magic, kind, codec, oid, slen, rlen = ENTRY.unpack_from(buf, at)
    if (magic, oid, slen, rlen, codec) != (
        ENTRY_MAGIC,
        entry.id,
        entry.stored_len,
        entry.raw_len,
        entry.codec,
    ) or (strict and kind != entry.kind):
        raise CorruptPack(name, entry.offset, "object header does not match the catalog")
    return memoryview(buf)[at + ENTRY.size : end]


def read_payload(fd: int, name: str, entry: Entry, *, strict: bool = False) -> bytes:
    """Reads one object's stored payload, checking its entry header first (see
    :func:`parse_entry`).

    Raises:
        CorruptPack: the object is cut short, or the header at ``entry.offset`` is not the
            expected object's.
    """
    raw = os.pread(fd, ENTRY.size + entry.stored_len, entry.offset)
    return parse_entry(raw, 0, entry, name, strict=strict).tobytes()
