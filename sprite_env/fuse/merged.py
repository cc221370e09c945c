"""The view of an overlay's checkpoints as the environment saw them: base image plus layer.

A checkpoint of an overlay holds UPPER only (whiteouts, opaque directories and all). This
:class:`CheckpointSource` wraps the store's and shows each checkpoint's trees merged with
LOWER, the read-only base image on disk, by overlayfs' rules; the rules and the synthetic
ids of merged directories and LOWER files live in ``sprite_env.overlay.merge`` (shared with
the previews and diffs of an overlay's checkpoints). The view itself is unchanged: it reads
trees and chunk lists by id.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from sprite_env.errors import ObjectNotFound
from sprite_env.overlay.merge import SPAN, MergedTrees

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from sprite_env.fuse.source import CheckpointRef, CheckpointSource
    from sprite_env.ids import ObjectId
    from sprite_env.store.ports import PinnedReader

__all__ = ["SPAN", "MergedSource"]


class MergedSource:
    """A :class:`CheckpointSource` showing ``inner``'s checkpoints merged over ``lower``."""

    def __init__(self, inner: CheckpointSource, lower: str) -> None:
        self.inner = inner
        self.trees = MergedTrees(inner.read, lower)
        self.lower = self.trees.lower

    # -- CheckpointSource ------------------------------------------------------------------

    def checkpoints(self) -> Sequence[CheckpointRef]:
        return [
            replace(ref, top_tree=self.trees.top(ref.top_tree)) for ref in self.inner.checkpoints()
        ]

    def read(self, oid: ObjectId) -> bytes:
        return self.trees.read(oid)

    def pin(self, oids: Iterable[ObjectId]) -> PinnedReader:
        ours: list[ObjectId] = []
        theirs: list[ObjectId] = []
        for oid in oids:
            (ours if self.trees.owns(oid) else theirs).append(oid)
        return _MergedReader(self, self.inner.pin(theirs) if theirs else None, set(ours))


class _MergedReader:
    """Pinned store objects plus LOWER spans (read from disk on demand)."""

    def __init__(self, source: MergedSource, inner: PinnedReader | None, ours: set[ObjectId]):
        self._source = source
        self._inner = inner
        self._ours = ours

    def read(self, oid: ObjectId) -> bytes:
        return self.read_many([oid])[0]

    def read_many(self, oids: Sequence[ObjectId]) -> list[bytes]:
        theirs = [o for o in oids if o not in self._ours]
        got = iter(self._inner.read_many(theirs) if theirs and self._inner else [])
        out = []
        for o in oids:
            if o in self._ours:
                out.append(self._source.read(o))
            else:
                try:
                    out.append(next(got))
                except StopIteration:
                    raise ObjectNotFound(o) from None
        return out

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()
