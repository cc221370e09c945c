"""Reachability: the objects the remaining checkpoints need.

Marking walks tree objects only (and the chunk lists of large files, which live in
metadata packs too), memoized by tree id, so a subtree shared by many checkpoints is read
once and data packs are never read. The store's ``plan_prune`` does the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from sprite_env.errors import SpriteError
from sprite_env.ids import ObjectId
from sprite_env.snapshot.tree import Kind, decode_chunks, decode_tree

if TYPE_CHECKING:
    from sprite_env.store import Store

ReadObject = Callable[[ObjectId], bytes]


def mark(read: ReadObject, tops: Iterable[ObjectId]) -> set[ObjectId]:
    """Returns every object reachable from the top trees ``tops`` (themselves included)."""
    live: set[ObjectId] = set()
    stack = list(tops)
    while stack:
        tree = stack.pop()
        if tree in live:
            continue
        live.add(tree)
        for e in decode_tree(read(tree)):
            if e.kind is Kind.DIR:
                if e.subtree not in live:
                    stack.append(e.subtree)
            elif e.kind is Kind.FILE:
                payload = e.payload
                if e.indirect:
                    clist = ObjectId(e.payload)
                    if clist in live:
                        continue  # a hard-link sibling or a copy: its chunks are marked
                    live.add(clist)
                    payload = read(clist)
                live.update(oid for oid, _, _ in decode_chunks(payload) if oid is not None)
    return live


def verify(store: Store) -> tuple[int, list[str]]:
    """Checks that every checkpoint's trees, chunk lists and chunks are in the catalog.

    Returns:
        The number of objects the checkpoints reach, and one error line per problem.
    """
    errors: list[str] = []
    reached: set[ObjectId] = set()
    rows = store.catalog.query("SELECT id, top_tree, record FROM checkpoints ORDER BY id")
    for cid, top, record in rows:
        try:
            objs = mark(store.read, [ObjectId(bytes(top))])
        except SpriteError as e:
            errors.append(f"checkpoint {cid}: {e}")
            continue
        objs.add(ObjectId(bytes(record)))
        missing = [o for o in objs - reached if not store.has(o)]
        if missing:
            errors.append(
                f"checkpoint {cid}: {len(missing)} objects missing (first {missing[0].hex()})"
            )
        reached |= objs
    return len(reached), errors
