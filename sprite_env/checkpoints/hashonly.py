"""A sink that names objects without storing their data, for previews and live diffs.

A capture into it computes the same tree ids a real checkpoint would, reading only what
changed (the files cache still applies), and keeps the tree and chunk-list objects in
memory so the result can be diffed; data chunks are hashed and dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sprite_env.store import ObjectKind, Store
from sprite_env.store.codec import object_id

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sprite_env.ids import ObjectId


class HashOnlySink:
    """An :class:`~sprite_env.store.ports.ObjectSink` that stores nothing, and an
    :class:`~sprite_env.store.ports.ObjectReader` of what it was given and the store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.meta: dict[ObjectId, bytes] = {}

    def put(self, data: bytes, kind: ObjectKind = ObjectKind.DATA) -> ObjectId:
        oid = object_id(data)
        if kind is not ObjectKind.DATA:
            self.meta[oid] = data
        return oid

    def read(self, oid: ObjectId) -> bytes:
        data = self.meta.get(oid)
        return data if data is not None else self.store.read(oid)

    def read_many(self, oids: Sequence[ObjectId]) -> list[bytes]:
        """As :meth:`read` for each (an :class:`~sprite_env.store.ports.ObjectReader`):
        the store's objects in one batch."""
        stored = [o for o in oids if o not in self.meta]
        got = dict(zip(stored, self.store.read_many(stored), strict=True))
        return [self.meta[o] if o in self.meta else got[o] for o in oids]
