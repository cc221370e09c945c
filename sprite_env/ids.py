"""Typed ids shared across packages."""

from __future__ import annotations

from typing import NewType

#: BLAKE3-256 of an object's uncompressed bytes (32 bytes).
ObjectId = NewType("ObjectId", bytes)
#: Name of a pack: the hex BLAKE3-256 of the pack file's bytes.
PackName = NewType("PackName", str)

ID_LEN = 32


def object_id_from_hex(text: str) -> ObjectId:
    """Parses a 64-digit hex object id.

    Raises:
        ValueError: if ``text`` is not 64 hex digits.
    """
    raw = bytes.fromhex(text)
    if len(raw) != ID_LEN:
        raise ValueError(f"object id must be {ID_LEN * 2} hex digits, got {len(text)}")
    return ObjectId(raw)
