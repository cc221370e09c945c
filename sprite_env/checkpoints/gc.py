"""Reachability: the objects the remaining checkpoints need.

Marking walks tree objects only (and the chunk lists of large files, which live in
metadata packs too), memoized by tree id, so a subtree shared by many checkpoints is read
once and data packs are never read; it reads them in batches through the store's reader
(``ObjectReader.read_many``), a level of the trees at a time. The store's ``plan_prune``
does the rest.

A damaged store (issue 15): :func:`reach` never raises for a tree or chunk list it cannot
read or decode. Such an object stays live, and the result is marked incomplete: its
children are unknown, so any object in the store might be one of them, and no object can
be proved dead. The caller then deletes nothing (see ``Engine.collect``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sprite_env.errors import SpriteError
from sprite_env.ids import ObjectId
from sprite_env.snapshot.tree import Kind, decode_chunks, decode_tree
from sprite_env.store.ports import ObjectReader, reader_of

ReadObject = Callable[[ObjectId], bytes]


@dataclass
class Reachability:
    """What :func:`reach` found."""

    #: Every object reached, the unreadable ones included (they are kept, never judged).
    live: set[ObjectId] = field(default_factory=set)
    #: Trees and chunk lists that could not be read or decoded: id -> (the checkpoint
    #: whose marking met it first, the error). Their children are unknown.
    unreadable: dict[ObjectId, tuple[str, str]] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """True when every reached object was read: only then is the rest provably dead."""
        return not self.unreadable

    def problems(self) -> list[str]:
        """One line per unreadable object, naming the checkpoint and the object."""
        return [
            f"checkpoint {cid}: object {oid.hex()[:16]} unreadable ({why})"
            for oid, (cid, why) in self.unreadable.items()
        ]


#: Trees (or chunk lists) read per ``read_many`` while marking.
MARK_BATCH = 256


def _mark_from(
    read: ObjectReader | ReadObject,
    top: ObjectId,
    live: set[ObjectId],
    on_error: Callable[[ObjectId, SpriteError], None] | None,
) -> None:
    """Adds what ``top`` reaches to ``live``; an unreadable object goes to ``on_error``
    (it stays in ``live``) or, without one, raises.

    The walk goes level by level, reading each level's new trees (then their chunk lists)
    ``MARK_BATCH`` at a time with ``read_many``: one catalog query and a few coalesced
    reads per batch instead of one of each per tree."""
    reader = reader_of(read)

    def failed(oid: ObjectId, e: SpriteError) -> None:
        if on_error is None:
            raise e
        on_error(oid, e)

    def load_many(oids: list[ObjectId]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for i in range(0, len(oids), MARK_BATCH):
            part = oids[i : i + MARK_BATCH]
            try:
                out.extend(reader.read_many(part))
            except SpriteError:  # one by one, to know which are unreadable
                for oid in part:
                    try:
                        out.append(reader.read(oid))
                    except SpriteError as e:
                        failed(oid, e)
                        out.append(None)
        return out

    def mark_chunks(payload: bytes, owner: ObjectId) -> None:
        try:
            live.update(oid for oid, _, _ in decode_chunks(payload) if oid is not None)
        except SpriteError as err:
            failed(owner, err)

    level = [top] if top not in live else []
    live.update(level)
    while level:
        below: list[ObjectId] = []
        lists: list[ObjectId] = []
        for tree, raw in zip(level, load_many(level), strict=True):
            if raw is None:
                continue
            try:
                entries = decode_tree(raw)
            except SpriteError as err:
                failed(tree, err)
                continue
            for ent in entries:
                if ent.kind is Kind.DIR:
                    if ent.subtree not in live:
                        live.add(ent.subtree)
                        below.append(ent.subtree)
                elif ent.kind is Kind.FILE:
                    if not ent.indirect:
                        mark_chunks(ent.payload, tree)
                        continue
                    clist = ObjectId(ent.payload)
                    if clist in live:
                        continue  # a hard-link sibling or a copy: its chunks are marked
                    live.add(clist)
                    lists.append(clist)
        for clist, payload in zip(lists, load_many(lists), strict=True):
            if payload is not None:
                mark_chunks(payload, clist)
        level = below


def mark(read: ObjectReader | ReadObject, tops: Iterable[ObjectId]) -> set[ObjectId]:
    """Returns every object reachable from the top trees ``tops`` (themselves included).

    Raises:
        SpriteError: an object could not be read or decoded (see :func:`reach`).
    """
    live: set[ObjectId] = set()
    for top in tops:
        _mark_from(read, top, live, None)
    return live


def reach(
    read: ObjectReader | ReadObject, checkpoints: Iterable[tuple[str, ObjectId]]
) -> Reachability:
    """Like :func:`mark` over ``(checkpoint id, top tree)`` pairs, but never raises for
    damage: see the module docstring.

    A subtree shared by several checkpoints is read once, so an unreadable object is
    named with the first checkpoint that met it (``verify.verify_store`` names every
    checkpoint and path that needs it).
    """
    out = Reachability()
    for cid, top in checkpoints:

        def note(oid: ObjectId, e: SpriteError, cid: str = cid) -> None:
            out.unreadable.setdefault(oid, (cid, str(e)))

        _mark_from(read, top, out.live, note)
    return out
