"""What each checkpoint costs: the bytes stored that no other checkpoint holds (ZFS's
``used``), which is what deleting it alone would free.

One pass over the trees of every checkpoint gives each object an owner: the one
checkpoint that reaches it, or SHARED. A checkpoint's walk descends into an object only
the first time anyone reaches it; reaching one owned by another checkpoint makes it (and
so everything below it, which both reach too) SHARED, and a SHARED object is never
descended into again. Each tree is therefore decoded about twice at most, whatever the
number of checkpoints: the cost follows the distinct trees in the store, not the
checkpoints times their size. Data packs are never read.

The figure is the stored (compressed) size of the objects a checkpoint owns, its record
included. What a delete then frees can be less when the prune keeps a pack whose garbage
is under its rewrite threshold; ``Engine.delete(dry_run=True)`` gives that exact figure.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from sprite_env.errors import SpriteError
from sprite_env.ids import ObjectId
from sprite_env.snapshot.tree import REF_CHUNKS, REF_DATA, REF_TREE, decode_chunks, references

if TYPE_CHECKING:
    from sprite_env.checkpoints.registry import Checkpoint

ReadObject = Callable[[ObjectId], bytes]
#: Sizes of objects in the store: id -> stored bytes (absent: not in the store).
StoredSizes = Callable[[Iterable[ObjectId]], dict[ObjectId, int]]
_SHARED = ""
_TREE, _CHUNKS, _DATA = REF_TREE, REF_CHUNKS, REF_DATA


#: Decoded trees and chunk lists, by id: objects never change, so a caller may keep this
#: between calls and decode only the trees of new checkpoints (27k files in 3k dirs:
#: 0.22 s the first time, most of it decoding).
Children = dict[ObjectId, list[tuple[ObjectId, int]]]
#: Entries past which a kept :data:`Children` is dropped (about 100 B each).
MAX_KEPT = 2_000_000


def unique_bytes(
    read: ReadObject,
    stored: StoredSizes,
    checkpoints: list[Checkpoint],
    children: Children | None = None,
) -> dict[str, int | None]:
    """Each checkpoint's bytes that no other checkpoint holds; see the module docstring.

    Error handling:
        A tree or chunk list that cannot be read or decoded (a damaged store) is treated
        as naming nothing, and every checkpoint whose walk met one gets None (unknown)
        rather than a figure: listing a damaged store must work (issue 15).
    """
    owner: dict[ObjectId, str] = {}
    if children is None or len(children) > MAX_KEPT:
        children = {}
    unknown: set[str] = set()
    walking = ""

    def below(oid: ObjectId, kind: int) -> list[tuple[ObjectId, int]]:
        if kind == _DATA:
            return []
        got = children.get(oid)
        if got is None:
            try:
                got = children[oid] = _children(read(oid), kind)
            except (SpriteError, ValueError):
                unknown.add(walking)
                return []
        return got

    def share(start: ObjectId, kind: int) -> None:
        stack = [(start, kind)]
        while stack:
            oid, k = stack.pop()
            if owner.get(oid) == _SHARED:
                continue
            owner[oid] = _SHARED
            stack.extend(below(oid, k))

    for c in checkpoints:
        walking = c.id
        if c.record is not None:
            owner[c.record] = c.id
        todo = [(c.top_tree, _TREE)]
        while todo:
            oid, kind = todo.pop()
            held = owner.get(oid)
            if held is None:
                owner[oid] = c.id
                todo.extend(below(oid, kind))
            elif held not in (c.id, _SHARED):
                share(oid, kind)
    # Only owned objects need a size: in a chain of incremental checkpoints nearly
    # everything is shared, so this asks the catalog about the changes only.
    sizes = stored([oid for oid, cid in owner.items() if cid != _SHARED])
    out: dict[str, int | None] = {c.id: 0 for c in checkpoints}
    for oid, cid in owner.items():
        total = out.get(cid)
        if cid != _SHARED and total is not None:
            out[cid] = total + sizes.get(oid, 0)
    out.update(dict.fromkeys(unknown & out.keys()))
    return out


class Usage:
    """:func:`unique_bytes` kept between calls and brought up to date from what changed.

    A checkpoint added since the last call is walked alone, on the ownership the others
    left: it descends only into objects no checkpoint reached before (its change), and a
    subtree it meets that one other checkpoint owns becomes SHARED down to where it already
    was; only the objects it newly owns are looked up for their size. On the medium layer
    (130k objects, two checkpoints) a call after a step took 155 ms as a full pass, every
    time, and grew with the store. Any other change of the set (a checkpoint gone, a row
    that is not the one seen) and :meth:`forget` (objects left the catalog) start over.
    The result equals :func:`unique_bytes` of the same checkpoints (a test proves it).
    """

    def __init__(self) -> None:
        #: Decoded trees and chunk lists (see :data:`Children`), kept across a start over.
        self.children: Children = {}
        #: Objects the last call walked (for tests and benchmarks).
        self.visited = 0
        self._lock = threading.Lock()  # the daemon's answers and its jobs call from threads
        self.forget()

    def forget(self) -> None:
        """Starts over at the next call (objects left the catalog: lost packs)."""
        self._owner: dict[ObjectId, str] = {}
        self._size: dict[ObjectId, int] = {}  # of owned objects, counted in _totals
        self._unsized: set[ObjectId] = set()  # owned objects whose size is not asked yet
        self._totals: dict[str, int] = {}
        self._unknown: set[str] = set()
        self._seen: dict[str, tuple[ObjectId, ObjectId | None]] = {}

    def unique_bytes(
        self, read: ReadObject, stored: StoredSizes, checkpoints: list[Checkpoint]
    ) -> dict[str, int | None]:
        """Each checkpoint's bytes that no other holds (see :func:`unique_bytes`)."""
        with self._lock:
            return self._update(read, stored, checkpoints)

    def _update(
        self, read: ReadObject, stored: StoredSizes, checkpoints: list[Checkpoint]
    ) -> dict[str, int | None]:
        rows = {c.id: (c.top_tree, c.record) for c in checkpoints}
        if any(rows.get(cid) != seen for cid, seen in self._seen.items()):
            self.forget()
        if len(self.children) > MAX_KEPT:
            self.children = {}
        self.visited = 0
        for c in checkpoints:
            if c.id not in self._seen:
                self._add(read, c)
                self._seen[c.id] = rows[c.id]
        if self._unsized:
            todo, self._unsized = list(self._unsized), set()
            sizes = stored(todo)
            for oid in todo:
                n = self._size[oid] = sizes.get(oid, 0)
                self._totals[self._owner[oid]] += n
        out: dict[str, int | None] = {c.id: self._totals[c.id] for c in checkpoints}
        out.update(dict.fromkeys(self._unknown & out.keys()))
        return out

    def _add(self, read: ReadObject, c: Checkpoint) -> None:
        owner, children = self._owner, self.children
        sizes, unsized, totals = self._size, self._unsized, self._totals
        totals[c.id] = 0
        visited = 0

        def below(oid: ObjectId, kind: int) -> list[tuple[ObjectId, int]]:
            if kind == _DATA:
                return []
            got = children.get(oid)
            if got is None:
                try:
                    got = children[oid] = _children(read(oid), kind)
                except (SpriteError, ValueError):
                    self._unknown.add(c.id)
                    return []
            return got

        def share(start: ObjectId, kind: int) -> int:
            stack = [(start, kind)]
            n = 0
            while stack:
                oid, k = stack.pop()
                held = owner.get(oid)
                if held == _SHARED:
                    continue
                n += 1
                if held is not None:
                    size = sizes.pop(oid, None)
                    if size is None:
                        unsized.discard(oid)
                    else:
                        totals[held] -= size
                owner[oid] = _SHARED
                stack.extend(below(oid, k))
            return n

        if c.record is not None and c.record not in owner:  # a record is its row's alone
            owner[c.record] = c.id
            unsized.add(c.record)
        todo = [(c.top_tree, _TREE)]
        while todo:
            oid, kind = todo.pop()
            visited += 1
            held = owner.get(oid)
            if held is None:
                owner[oid] = c.id
                unsized.add(oid)
                todo.extend(below(oid, kind))
            elif held != c.id and held != _SHARED:
                visited += share(oid, kind)
        self.visited += visited


def _children(data: bytes, kind: int) -> list[tuple[ObjectId, int]]:
    """The objects a tree or a chunk list names directly, with their kinds."""
    if kind == _CHUNKS:
        return [(oid, _DATA) for oid, _, _ in decode_chunks(data) if oid is not None]
    # The ids only, entries left undecoded: a step's 1,100 changed directories of the
    # medium layer (about 120k entries) were most of this module's time after a step.
    return references(data)
