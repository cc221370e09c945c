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
    from sprite_env.ids import ObjectId


class HashOnlySink:
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
