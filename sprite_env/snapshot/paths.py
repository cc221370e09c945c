"""Paths inside a checkpoint: reading a user's path, finding it in a tree, and grafting.

A path names an entry relative to the layer's root: ``/etc/hosts`` and ``etc/hosts`` are
the same entry. Components are bytes (names need not be UTF-8); empty and ``.`` components
are dropped, ``..`` is refused: a path never leaves the root.

Symlinks are never followed, here as anywhere in snapshot/: a component before the last
that is a symlink (or a file) in either tree is refused with a message naming it, so a
path can only ever mean the entry it spells.

:func:`graft` is how single paths are restored and exported with the whole-tree
machinery: it builds the top tree of "``base``, with these paths as in ``source``" (a path
absent in ``source`` is absent in the result), sharing every other subtree with ``base``.
A restore from ``base`` (the live tree) to that tree then touches only those paths, and
the directories above them keep their live metadata; an export of it (``base`` None)
holds only those paths and the directories leading to them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sprite_env.errors import UserError
from sprite_env.snapshot.diff import read_entries, top_entry
from sprite_env.snapshot.tree import Kind, TreeEntry, encode_tree

if TYPE_CHECKING:
    from sprite_env.ids import ObjectId
    from sprite_env.snapshot.diff import ReadTree

#: Stores a tree object's bytes and returns its id.
PutTree = Callable[[bytes], "ObjectId"]
Parts = tuple[bytes, ...]


class InvalidPath(UserError):
    """A path that cannot name an entry of a checkpoint (``..``, NUL, a symlink on the way)."""

    code = "invalid_path"


class PathNotFound(UserError):
    code = "not_found"


def parse_path(raw: str | bytes) -> Parts:
    """A user's path as components (empty for the root itself).

    Raises:
        InvalidPath: it holds ``..`` or a NUL byte.
    """
    data = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else raw
    if b"\0" in data:
        raise InvalidPath(f"path {show(data)} holds a NUL byte")
    parts = tuple(p for p in data.split(b"/") if p not in (b"", b"."))
    if b".." in parts:
        raise InvalidPath(f"path {show(data)} holds '..': paths never leave the layer's root")
    return parts


def show(path: bytes | Parts) -> str:
    """A path as a user reads it (non-UTF-8 bytes as ``\\xNN``)."""
    data = b"/".join(path) if isinstance(path, tuple) else path
    return "/" + data.lstrip(b"/").decode(errors="backslashreplace")


def lookup(read_tree: ReadTree, top: ObjectId, parts: Parts, where: str) -> TreeEntry | None:
    """The entry at ``parts`` in the tree ``top`` (the root's ``.`` entry for no parts), or
    None when there is none.

    Raises:
        InvalidPath: a component before the last is a symlink or not a directory
            (``where`` names the tree in the message: "v3", "the live layer").
    """
    entry = top_entry(read_tree, top)
    for depth, name in enumerate(parts):
        if entry.kind is not Kind.DIR:
            _refuse(parts[:depth], entry, where)
        found = read_entries(read_tree, entry.subtree).get(name)
        if found is None:
            return None
        entry = found
    return entry


def _refuse(upto: Parts, entry: TreeEntry, where: str) -> None:
    what = "a symlink" if entry.kind is Kind.SYMLINK else f"a {entry.kind.name.lower()}"
    extra = f" (to {show(entry.target)[1:]})" if entry.kind is Kind.SYMLINK else ""
    raise InvalidPath(
        f"{show(upto)} is {what}{extra} in {where}, not a directory: paths are not followed "
        f"through it; name {show(upto)} itself"
    )


def minimal(paths: Sequence[Parts]) -> list[Parts]:
    """The paths without duplicates and without those inside another one, sorted."""
    out: list[Parts] = []
    for p in sorted(set(paths)):
        if not any(p[: len(q)] == q for q in out):
            out.append(p)
    return out


def graft(
    read_tree: ReadTree,
    put_tree: PutTree,
    base_top: ObjectId | None,
    source_top: ObjectId,
    paths: Sequence[Parts],
) -> ObjectId:
    """The top tree of ``base_top`` (None: an empty tree) with each of ``paths`` as in
    ``source_top``; see the module docstring. Check the paths with :func:`lookup` in both
    trees first: components on the way that are not directories are refused there.

    A grafted file that is a hard link to an entry outside the grafted paths loses that
    link (every member of a group carries its content), so a restore never links it to
    a live file that may hold something else.
    """
    roots = minimal(paths)
    if not roots or () in roots:
        raise InvalidPath("graft: the root itself is not a path to graft")
    trie: dict[bytes, object] = {}
    for p in roots:
        node = trie
        for name in p[:-1]:
            node = node.setdefault(name, {})  # type: ignore[assignment]
        node[p[-1]] = None
    src = top_entry(read_tree, source_top)
    base = top_entry(read_tree, base_top) if base_top is not None else None
    g = _Grafter(read_tree, put_tree, [b"/".join(p) for p in roots])
    inner = g.dir(base.subtree if base else None, src.subtree, trie, b"")
    dot = replace(base or src, payload=bytes(inner))
    return put_tree(encode_tree([dot]))


class _Grafter:
    def __init__(self, read_tree: ReadTree, put_tree: PutTree, roots: list[bytes]) -> None:
        self.read_tree = read_tree
        self.put_tree = put_tree
        self.roots = roots

    def dir(
        self, base: ObjectId | None, src: ObjectId | None, trie: dict[bytes, object], rel: bytes
    ) -> ObjectId:
        a = read_entries(self.read_tree, base)
        b = read_entries(self.read_tree, src)
        out = dict(a)
        for name, sub in trie.items():
            ea, eb = a.get(name), b.get(name)
            path = name if not rel else rel + b"/" + name
            if sub is None:  # a grafted path: as in the source, or absent
                if eb is None:
                    out.pop(name, None)
                else:
                    out[name] = self.standalone(eb, path, ea)
                continue
            assert isinstance(sub, dict)
            if ea is None and eb is None:
                continue  # in neither: nothing to graft (the caller said so already)
            dirs = [e for e in (ea, eb) if e is not None and e.kind is Kind.DIR]
            if len(dirs) != len([e for e in (ea, eb) if e is not None]):
                raise InvalidPath(f"{show(path)} is not a directory on both sides")
            inner = self.dir(ea.subtree if ea else None, eb.subtree if eb else None, sub, path)
            keep = ea if ea is not None else eb  # a directory on the way keeps its live meta
            assert keep is not None
            out[name] = replace(keep, payload=bytes(inner))
        return self.put_tree(encode_tree(out.values()))

    def standalone(self, e: TreeEntry, path: bytes, live: TreeEntry | None) -> TreeEntry:
        """``e`` (at ``path``), with hard links to entries outside the grafted paths cut.
        Subtrees equal to ``live`` (the base's entry there) are returned unread: a restore
        skips them, so their links are never used."""
        if e.kind is Kind.DIR:
            if live is not None and live.kind is Kind.DIR and live.payload == e.payload:
                return e
            old = read_entries(self.read_tree, live.subtree) if live and _is_dir(live) else {}
            entries = list(read_entries(self.read_tree, e.subtree).values())
            fixed = [self.standalone(c, path + b"/" + c.name, old.get(c.name)) for c in entries]
            if all(f is c for f, c in zip(fixed, entries, strict=True)):
                return e
            return replace(e, payload=bytes(self.put_tree(encode_tree(fixed))))
        if e.link and not any(e.link == r or e.link.startswith(r + b"/") for r in self.roots):
            return replace(e, link=b"")
        return e


def _is_dir(e: TreeEntry | None) -> bool:
    return e is not None and e.kind is Kind.DIR


def entry_json(
    cid: str, path: bytes, e: TreeEntry, children: list[TreeEntry] | None
) -> dict[str, Any]:
    """The JSON of an entry of checkpoint ``cid`` (``GET /v1/checkpoints/{id}/files/{path}``
    for anything but a file): type, mode, owner, size, mtime, a symlink's target, and a
    directory's ``children`` as ``entries``. Names not UTF-8 show as ``\\xNN``."""
    out: dict[str, Any] = {"id": cid, "path": show(parse_path(path)), **_meta_json(e)}
    del out["name"]
    if children is not None:
        out["entries"] = [_meta_json(c) for c in children]
    return out


def _meta_json(e: TreeEntry) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": e.name.decode(errors="backslashreplace"),
        "type": e.kind.name.lower(),
        "size": e.size if e.kind is Kind.FILE else None,
        "mode": f"{e.mode:04o}",
        "uid": e.uid,
        "gid": e.gid,
        "mtime_ns": e.mtime_ns,
    }
    if e.kind is Kind.SYMLINK:
        out["target"] = e.target.decode(errors="backslashreplace")
    return out
