"""Reachability: the objects the remaining checkpoints need.

Marking walks tree objects only (and the chunk lists of large files, which live in
metadata packs too), memoized by tree id, so a subtree shared by many checkpoints is read
once and data packs are never read. The store's ``plan_prune`` does the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sprite_env.ids import ObjectId
from sprite_env.snapshot.tree import Kind, decode_chunks, decode_tree

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
                live.update(oid for oid, _ in decode_chunks(payload) if oid is not None)
    return live
