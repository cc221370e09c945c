"""Differences between two trees, in proportion to the change.

Two directories with the same tree id are equal, whole subtrees included, so the walk
descends only where ids differ. The same per-entry comparison (:func:`classify`) drives
restore, so a preview and the restore it previews agree by construction.

Counting: a difference stands for every entry it touches, recursively (:class:`Counted`):
an added directory of 50 files is 51 added entries, and a directory replaced by a file
is one modified entry plus its contents removed. The restore's counters
(``restore.RestoreStats``) count the same way, from the same trees. The root's own mtime
changes with any change in it, so it alone is not a difference worth reporting
(:func:`root_news`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum

from sprite_env.errors import SpriteError
from sprite_env.ids import ID_LEN, ObjectId
from sprite_env.snapshot.tree import Kind, TreeEntry, decode_entry, entry_spans

ReadTree = Callable[[ObjectId], bytes]


class Entries(Mapping[bytes, TreeEntry]):
    """A tree's entries by name, each decoded when first asked for: a diff compares the
    encoded bytes (``raw``) and decodes only the entries that differ (``tree.entry_spans``).
    """

    __slots__ = ("__weakref__", "_done", "_vs", "raw")

    def __init__(self, raw: dict[bytes, bytes]) -> None:
        self.raw = raw
        self._done: dict[bytes, TreeEntry] = {}
        #: :func:`differing` against other trees (by id(), with a weak reference to tell a
        #: reused id apart): a restore's check walks the same pairs twice (the plan's reads
        #: ahead, then its diff) and the restore a third time; on the medium undo each
        #: comparison runs over every entry of directories up to 21k entries.
        self._vs: dict[int, tuple[weakref.ref[Entries], list[bytes]]] = {}

    def __getitem__(self, name: bytes) -> TreeEntry:
        e = self._done.get(name)
        if e is None:
            e = self._done[name] = decode_entry(self.raw[name])
        return e

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    def __contains__(self, name: object) -> bool:
        return name in self.raw


#: Trees read so far, by id (a tree's id is the hash of its bytes, so an entry never goes
#: stale): a restore's check, its preflight and the restore itself walk the same diff, and
#: decoding was the biggest part of each (1.2 s of the 4 s an undo on the medium layer was
#: down). The mappings are shared: callers must not change them.
TreeMemo = dict[ObjectId, Entries]
#: Both sides of a directory that differs, read together (old id, new id), or None to read
#: each whole. A reader may leave out names whose entries are equal on both sides: the diff
#: is the same. It must not change what the ids stand for (an added or removed directory is
#: still read whole, by ``read_tree``, to be counted). MergedTrees.read_pair is one: it
#: leaves out LOWER's entries that neither side's UPPER touches.
ReadPair = Callable[
    [ObjectId, ObjectId], tuple[dict[bytes, TreeEntry], dict[bytes, TreeEntry]] | None
]


class Change(Enum):
    """What happened to a path between tree A (old) and tree B (new)."""

    ADDED = "added"
    REMOVED = "removed"
    MODIFIED = "modified"  # content (file bytes, symlink target, device number) or type
    META = "meta"  # only owner, mode, mtime, xattrs or hard-link grouping


@dataclass(frozen=True, slots=True)
class Difference:
    path: bytes  # relative to the root; b"." is the root itself
    change: Change
    old: TreeEntry | None
    new: TreeEntry | None

    def to_json(self) -> dict[str, object]:
        e = self.new or self.old
        assert e is not None
        return {
            "path": self.path.decode(errors="backslashreplace"),
            "change": self.change.value,
            "type": e.kind.name.lower(),
            "size": e.size if e.kind is Kind.FILE else None,
        }


def classify(old: TreeEntry | None, new: TreeEntry | None) -> Change | None:
    """How one entry changed; None when equal (for a dir: same tree and same metadata)."""
    if old is None:
        return None if new is None else Change.ADDED
    if new is None:
        return Change.REMOVED
    if old.kind is not new.kind:
        return Change.MODIFIED
    if old.kind is not Kind.DIR and (
        not old.same_content(new) or old.rdev != new.rdev or old.size != new.size
    ):
        return Change.MODIFIED
    if not old.same_meta(new) or old.link != new.link:
        return Change.META
    return None


def read_entries(
    read_tree: ReadTree, tree: ObjectId | None, memo: TreeMemo | None = None
) -> Entries:
    """A tree's entries by name, decoded as they are asked for (``memo``: read once, then
    shared; do not change)."""
    if tree is None:
        return Entries({})
    if memo is not None:
        got = memo.get(tree)
        if got is None:
            got = memo[tree] = Entries(entry_spans(read_tree(tree)))
        return got
    return Entries(entry_spans(read_tree(tree)))


def differing(a: Mapping[bytes, TreeEntry], b: Mapping[bytes, TreeEntry]) -> list[bytes]:
    """The names of ``a`` and ``b`` whose entries differ (or exist on one side), sorted:
    for :class:`Entries` by their encoded bytes, so that equal entries are never decoded."""
    if isinstance(a, Entries) and isinstance(b, Entries):
        done = a._vs.get(id(b))
        if done is not None and done[0]() is b:
            return list(done[1])
        ra, rb = a.raw, b.raw
        names = [n for n, raw in ra.items() if rb.get(n) != raw]
        names += [n for n in rb if n not in ra]
        names.sort()
        a._vs[id(b)] = (weakref.ref(b), names)
        return list(names)
    return sorted(n for n in a.keys() | b.keys() if a.get(n) != b.get(n))


def top_entry(read_tree: ReadTree, top: ObjectId) -> TreeEntry:
    """The root directory's entry (``.``) of a checkpoint's top tree."""
    return read_entries(read_tree, top)[b"."]


def root_news(old: TreeEntry, new: TreeEntry) -> bool:
    """True when the root's owner, mode or xattrs differ: its mtime alone is not news
    (every entry added or removed right below it changes it)."""
    return (old.mode, old.uid, old.gid, old.xattrs) != (new.mode, new.uid, new.gid, new.xattrs)


def entries_below(read_tree: ReadTree, e: TreeEntry) -> int:
    """How many entries a directory holds, recursively (0 for anything else)."""
    if e.kind is not Kind.DIR:
        return 0
    n = 0
    stack = [e.subtree]
    while stack:
        for raw in entry_spans(read_tree(stack.pop())).values():
            n += 1
            if raw[2] == Kind.DIR:  # the kind byte; a directory's payload ends the entry
                stack.append(ObjectId(raw[-ID_LEN:]))
    return n


@dataclass(frozen=True, slots=True)
class Counted:
    """A difference with the entries it stands for, by kind of change: an added directory
    counts itself and everything in it; a type change is one modified entry, plus the old
    directory's contents removed or the new one's added."""

    difference: Difference
    effects: tuple[tuple[Change, int], ...]

    @property
    def path(self) -> bytes:
        return self.difference.path

    @property
    def entries(self) -> int:
        """The entries counted under the difference's own change (itself included)."""
        return next(n for c, n in self.effects if c is self.difference.change)

    def to_json(self) -> dict[str, object]:
        out = {**self.difference.to_json(), "entries": self.entries}
        inner = [(c, n) for c, n in self.effects if c is not self.difference.change]
        if inner:
            out["inner"] = {c.value: n for c, n in inner}
        return out


def count(read_tree: ReadTree, d: Difference) -> Counted:
    """The entries ``d`` stands for; reads the trees of added or removed directories."""
    effects: list[tuple[Change, int]] = []
    if d.change is Change.ADDED:
        assert d.new is not None
        effects.append((Change.ADDED, 1 + entries_below(read_tree, d.new)))
    elif d.change is Change.REMOVED:
        assert d.old is not None
        effects.append((Change.REMOVED, 1 + entries_below(read_tree, d.old)))
    else:
        effects.append((d.change, 1))
        if d.change is Change.MODIFIED:  # a type change: a directory's contents go or come
            assert d.old is not None
            assert d.new is not None
            gone, came = entries_below(read_tree, d.old), entries_below(read_tree, d.new)
            if gone:
                effects.append((Change.REMOVED, gone))
            if came:
                effects.append((Change.ADDED, came))
    return Counted(d, tuple(effects))


def count_changes(
    read_tree: ReadTree,
    old_top: ObjectId | None,
    new_top: ObjectId,
    *,
    pair: ReadPair | None = None,
) -> Iterator[Counted]:
    """:func:`diff_trees`, each difference counted (:func:`count`), without the root's
    own mtime (see :func:`root_news`)."""
    for d in diff_trees(read_tree, old_top, new_top, pair=pair):
        if d.path == b"." and d.old and d.new and not root_news(d.old, d.new):
            continue
        yield count(read_tree, d)


def totals(items: Iterator[Counted] | list[Counted]) -> dict[Change, int]:
    """The entries of ``items`` by change (every change present, zeros included)."""
    out = dict.fromkeys(Change, 0)
    for it in items:
        for c, n in it.effects:
            out[c] += n
    return out


def diff_trees(
    read_tree: ReadTree,
    old_top: ObjectId | None,
    new_top: ObjectId,
    memo: TreeMemo | None = None,
    *,
    pair: ReadPair | None = None,
) -> Iterator[Difference]:
    """Yields every difference from ``old_top`` to ``new_top``, depth first, names sorted.

    An added or removed directory is reported once, not entry by entry. Equal subtrees are
    never read. ``memo``: the trees decoded are kept there (see :data:`TreeMemo`);
    ``pair``: reads the two sides of a changed directory together (see :data:`ReadPair`).
    """
    if old_top == new_top:
        return
    new = top_entry(read_tree, new_top)
    old = top_entry(read_tree, old_top) if old_top is not None else None
    c = classify(old, new)
    if c is Change.META:
        yield Difference(b".", c, old, new)
    yield from _diff_dir(read_tree, b"", old.subtree if old else None, new.subtree, memo, pair)


def prefetch_trees(
    read_many: Callable[[list[ObjectId]], list[bytes]],
    old_top: ObjectId | None,
    new_top: ObjectId,
    memo: TreeMemo,
) -> None:
    """Reads into ``memo`` both sides of every directory where the two trees differ, one
    level at a time with one ``read_many`` a level, so that :func:`diff_trees` after it
    reads none of them one by one (the medium step's check read 2,200 trees that way, a
    catalog lookup each: most of its diff). Stops at the first error: the diff then reads
    the rest itself, and names what is damaged.
    """
    if old_top is None or old_top == new_top:
        return
    try:
        level = [(top_entry(read_many_one(read_many), old_top).subtree,
                  top_entry(read_many_one(read_many), new_top).subtree)]  # fmt: skip
        while level:
            want = list(dict.fromkeys(t for pair in level for t in pair if t not in memo))
            for t, blob in zip(want, read_many(want) if want else [], strict=True):
                memo[t] = Entries(entry_spans(blob))
            deeper = []
            for old, new in level:
                a, b = memo[old], memo[new]
                for name in differing(a, b):
                    ea, eb = a.get(name), b.get(name)
                    if (
                        ea is not None
                        and eb is not None
                        and ea.kind is Kind.DIR
                        and eb.kind is Kind.DIR
                        and ea.payload != eb.payload
                    ):
                        deeper.append((ea.subtree, eb.subtree))
            level = deeper
    except SpriteError:
        return


def read_many_one(read_many: Callable[[list[ObjectId]], list[bytes]]) -> ReadTree:
    """One object at a time through ``read_many``."""
    return lambda oid: read_many([oid])[0]


def _diff_dir(
    read_tree: ReadTree,
    rel: bytes,
    old: ObjectId | None,
    new: ObjectId | None,
    memo: TreeMemo | None = None,
    pair: ReadPair | None = None,
) -> Iterator[Difference]:
    if old == new:
        return
    both = pair(old, new) if pair is not None and old is not None and new is not None else None
    a: Mapping[bytes, TreeEntry]
    b: Mapping[bytes, TreeEntry]
    if both is not None:
        a, b = both
    else:
        a = read_entries(read_tree, old, memo)
        b = read_entries(read_tree, new, memo)
    for name in differing(a, b):  # equal entries: no difference, no subtree to walk
        ea, eb = a.get(name), b.get(name)
        path = name if not rel else rel + b"/" + name
        c = classify(ea, eb)
        if c is not None:
            yield Difference(path, c, ea, eb)
        both_dirs = (
            ea is not None and eb is not None and ea.kind is Kind.DIR and eb.kind is Kind.DIR
        )
        if both_dirs and ea.payload != eb.payload:  # type: ignore[union-attr]
            yield from _diff_dir(read_tree, path, ea.subtree, eb.subtree, memo, pair)  # type: ignore[union-attr]
