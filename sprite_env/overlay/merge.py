"""An overlay's checkpoints as the environment saw them: base image plus layer.

A checkpoint of an overlay holds UPPER only (whiteouts, opaque directories and all).
:class:`MergedTrees` merges its trees with LOWER, the read-only base image on disk, by
overlayfs' rules: an UPPER entry hides the LOWER one of the same name, a whiteout (a 0:0
character device) hides it and shows nothing, an opaque directory
(``trusted.overlay.opaque=y``) hides LOWER's whole directory below it, and two
directories merge. ``trusted.overlay.*`` attributes are not shown, as in MERGED. These
rules live here only: the FUSE view (``fuse.merged``) and the previews and diffs of an
overlay's checkpoints (``checkpoints.engine``) both read through it.

Merged trees are read by id like stored ones. Merged directories and LOWER files get
*synthetic* ids, derived from what they stand for (an UPPER tree id and a LOWER path; a
LOWER file's path and span) and remembered in a table, so reading one merges or reads
from disk on demand. Equal UPPER subtrees over the same LOWER directory get equal ids, so
a diff of two merged trees still skips what is equal. LOWER is the base image, which
never changes while the environment runs: reading it live is reading it as it was.
"""

from __future__ import annotations

import os
import stat
import threading
from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING

import blake3

from sprite_env.ids import ObjectId
from sprite_env.snapshot.fsmeta import read_xattrs
from sprite_env.snapshot.tree import (
    INLINE_CHUNKS,
    Kind,
    TreeEntry,
    decode_chunks,
    decode_entry,
    decode_tree,
    encode_chunks,
    encode_tree,
    entry_spans,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from sprite_env.snapshot.diff import TreeMemo

#: LOWER files are served in spans of this size (one synthetic object each).
SPAN = 1 << 20
_OVERLAY_XATTR = b"trusted.overlay."
_KINDS = {
    stat.S_IFREG: Kind.FILE,
    stat.S_IFDIR: Kind.DIR,
    stat.S_IFLNK: Kind.SYMLINK,
    stat.S_IFCHR: Kind.CHR,
    stat.S_IFBLK: Kind.BLK,
    stat.S_IFIFO: Kind.FIFO,
}

# What a synthetic id stands for.
_Tree = tuple[str, "ObjectId | None", bytes]  # ("tree", UPPER tree or None, LOWER path or b"")
_Span = tuple[str, bytes, int, int]  # ("span", LOWER path, offset, length)
_List = tuple[str, bytes]  # ("list", LOWER path): the chunk list of a big LOWER file

#: LOWER directories whose entries are kept (least recently merged dropped first). A diff
#: merges each changed directory twice, once a side, one right after the other; without
#: the cache both sides lstat and read the xattrs of every LOWER entry again: 1.9 of a
#: 3.1 s diff of the medium layer as LOWER with 1% of its files copied up (1,130 dirs).
LISTINGS = 256


def _synthetic(*parts: object) -> ObjectId:
    return ObjectId(blake3.blake3(repr(("merged", *parts)).encode()).digest())


def _is_whiteout(e: TreeEntry) -> bool:
    return e.kind is Kind.CHR and e.rdev == 0


def _is_opaque(e: TreeEntry) -> bool:
    return dict(e.xattrs).get(_OVERLAY_XATTR + b"opaque") == b"y"


def _shown_xattrs(xattrs: Iterable[tuple[bytes, bytes]]) -> tuple[tuple[bytes, bytes], ...]:
    return tuple((k, v) for k, v in xattrs if not k.startswith(_OVERLAY_XATTR))


class MergedTrees:
    """Trees of UPPER (read with ``read``) merged over the directory ``lower``; ``memo``:
    UPPER trees already read (``diff.TreeMemo``, by id: never stale), which
    :meth:`read_pair` takes from there instead of reading them again."""

    def __init__(
        self, read: Callable[[ObjectId], bytes], lower: str, memo: TreeMemo | None = None
    ) -> None:
        self.inner_read = read
        self.memo = memo
        self.lower = os.fsencode(os.path.abspath(lower))
        self._lock = threading.Lock()
        self._meaning: dict[ObjectId, _Tree | _Span | _List] = {}
        self._tops: dict[ObjectId, bytes] = {}  # a checkpoint's merged top tree, encoded
        self._listings: OrderedDict[bytes, list[TreeEntry]] = OrderedDict()

    def _remember(self, oid: ObjectId, meaning: _Tree | _Span | _List) -> ObjectId:
        with self._lock:
            self._meaning[oid] = meaning
        return oid

    def _tree_id(self, upper: ObjectId | None, lower_rel: bytes) -> ObjectId:
        return self._remember(_synthetic("tree", upper, lower_rel), ("tree", upper, lower_rel))

    def top(self, upper_top: ObjectId) -> ObjectId:
        """The merged top tree of UPPER's top tree ``upper_top`` (its root keeps the
        metadata of UPPER's root)."""
        top_id = _synthetic("top", upper_top)
        with self._lock:
            known = top_id in self._tops
        if not known:
            (dot,) = decode_tree(self.inner_read(upper_top))
            merged_root = self._tree_id(dot.subtree, b"/")
            shown = replace(dot, payload=bytes(merged_root), xattrs=_shown_xattrs(dot.xattrs))
            top = encode_tree([shown])
            with self._lock:
                self._tops[top_id] = top
        return top_id

    def owns(self, oid: ObjectId) -> bool:
        """True for a synthetic id below a top (read by :meth:`read`, not the store)."""
        with self._lock:
            return oid in self._meaning

    def read(self, oid: ObjectId) -> bytes:
        """A merged tree, chunk list or LOWER span by its synthetic id; else ``read``'s."""
        with self._lock:
            top = self._tops.get(oid)
            meaning = self._meaning.get(oid)
        if top is not None:
            return top
        if meaning is None:
            return self.inner_read(oid)
        if meaning[0] == "tree":
            _, upper, lower_rel = meaning  # type: ignore[misc]
            return encode_tree(self._merge(upper, lower_rel))
        if meaning[0] == "list":
            return encode_chunks(self._spans(meaning[1]))  # type: ignore[arg-type]
        _, rel, off, length = meaning  # type: ignore[misc]
        return self._read_span(rel, off, length)

    def read_pair(
        self, a: ObjectId, b: ObjectId
    ) -> tuple[dict[bytes, TreeEntry], dict[bytes, TreeEntry]] | None:
        """Two merged directories over the same LOWER directory (or both over none), for
        a diff (:data:`~sprite_env.snapshot.diff.ReadPair`), holding only the names whose
        merged entries may differ. Left out, never looked at: LOWER's entries that neither
        UPPER side names (equal on both sides), and the names whose UPPER entries have
        equal bytes on both sides (merged the same way over the same LOWER directory, they
        are equal: a directory's synthetic id is its subtree's and LOWER path's, and it
        hides the same LOWER entry). A diff of an agent's step then costs what the step
        touched: not every LOWER entry of each directory it touched (61k lstat and xattr
        reads for 1% of the medium layer's files copied up, in 1,130 directories), nor
        each UPPER entry decoded, re-encoded and read again (the overlay undo's merged
        diff of the medium step, LOWER empty: 143k UPPER entries in its 2,228 directories
        read, of which some 5k differ). None (read each whole) for anything else."""
        with self._lock:
            ma, mb = self._meaning.get(a), self._meaning.get(b)
        if ma is None or mb is None or ma[0] != "tree" or mb[0] != "tree":
            return None
        (_, upper_a, lower_a), (_, upper_b, lower_b) = ma, mb  # type: ignore[misc]
        if lower_a != lower_b:
            return None
        ra, rb = (self._upper_spans(u) for u in (upper_a, upper_b))
        named = {n for n, raw in ra.items() if rb.get(n) != raw}
        named.update(n for n in rb if n not in ra)
        sides = [
            self._merge_entries(
                [decode_entry(raw[n]) for n in sorted(named) if n in raw], lower_a, named
            )
            for raw in (ra, rb)
        ]
        return {e.name: e for e in sides[0]}, {e.name: e for e in sides[1]}

    def _upper_spans(self, upper: ObjectId | None) -> dict[bytes, bytes]:
        """An UPPER tree's entries, left encoded (``tree.entry_spans``)."""
        if upper is None:
            return {}
        known = self.memo.get(upper) if self.memo is not None else None
        return known.raw if known is not None else entry_spans(self.inner_read(upper))

    # -- content -------------------------------------------------------------------------

    def from_lower(self, e: TreeEntry) -> bool:
        """True for a non-empty file whose bytes are read from LOWER (the base image's)."""
        if e.kind is not Kind.FILE or not e.payload:
            return False
        if e.indirect:
            return self.owns(ObjectId(e.payload))
        pieces = decode_chunks(e.payload)
        return bool(pieces) and pieces[0][0] is not None and self.owns(pieces[0][0])

    def digest(self, e: TreeEntry, read_data: Callable[[ObjectId], bytes]) -> bytes:
        """BLAKE3 of a file entry's bytes: LOWER's read from disk, others with ``read_data``.

        A copy-up (a chmod of a base-image file, say) puts the same bytes in UPPER under
        other chunk ids than the LOWER file's synthetic ones; comparing bytes tells a
        metadata change from a content change.
        """
        pieces = decode_chunks(self.read(ObjectId(e.payload)) if e.indirect else e.payload)
        h = blake3.blake3()
        for oid, off, n in pieces:
            if oid is None:  # a hole
                for at in range(0, n, SPAN):
                    h.update(bytes(min(SPAN, n - at)))
                continue
            data = self.read(oid) if self.owns(oid) else read_data(oid)
            h.update(memoryview(data)[off : off + n])
        return h.digest()

    # -- merging ---------------------------------------------------------------------------

    def _merge(self, upper: ObjectId | None, lower_rel: bytes) -> list[TreeEntry]:
        """The merged directory of UPPER tree ``upper`` (None: none) over LOWER's
        directory ``lower_rel`` (b"/" its root, b"/a/b" below; b"": none, as below an
        opaque or an UPPER-only directory)."""
        upper_entries = decode_tree(self.inner_read(upper)) if upper is not None else []
        return self._merge_entries(upper_entries, lower_rel, None)

    def _merge_entries(
        self, upper_entries: list[TreeEntry], lower_rel: bytes, only: set[bytes] | None
    ) -> list[TreeEntry]:
        """:meth:`_merge` of decoded UPPER entries; ``only``: LOWER's entries of these
        names only (each looked up alone), None: all of LOWER's directory."""
        out: dict[bytes, TreeEntry] = {}
        hidden: set[bytes] = set()
        for e in upper_entries:
            if _is_whiteout(e):
                hidden.add(e.name)
                continue
            hidden.add(e.name)
            if e.kind is Kind.DIR:
                below = b"" if _is_opaque(e) else self._lower_dir(lower_rel, e.name)
                e = replace(
                    e,
                    xattrs=_shown_xattrs(e.xattrs),
                    payload=bytes(self._tree_id(e.subtree, below)),
                )
            elif e.xattrs and any(k.startswith(_OVERLAY_XATTR) for k, _ in e.xattrs):
                # the link (the path of the group's first member) is kept: every UPPER name
                # shows at the same path in MERGED, so the view gives the group one inode,
                # as overlayfs does. Replaced only where there is something to hide: a
                # ``dataclasses.replace`` each was 1.3 s of a 1.7 s merged diff of the
                # medium step (122k entries in its 2,228 directories).
                e = replace(e, xattrs=_shown_xattrs(e.xattrs))
            out[e.name] = e
        if lower_rel and only is None:
            for entry in self._lower_listing(lower_rel):
                if entry.name not in hidden:
                    out[entry.name] = entry
        elif lower_rel and only is not None:
            for name in sorted(only - hidden):
                found = self._lower_entry(lower_rel, name)
                if found is not None:
                    out[name] = found
        return list(out.values())

    def _lower_listing(self, rel: bytes) -> list[TreeEntry]:
        """LOWER's directory ``rel`` as entries, by name (see :data:`LISTINGS`). LOWER never
        changes while it is the base image, so a kept listing is never stale."""
        with self._lock:
            kept = self._listings.get(rel)
            if kept is not None:
                self._listings.move_to_end(rel)
                return kept
        entries = [
            e for name in self._lower_names(rel) if (e := self._lower_entry(rel, name)) is not None
        ]
        with self._lock:
            self._listings[rel] = entries
            while len(self._listings) > LISTINGS:
                self._listings.popitem(last=False)
        return entries

    @staticmethod
    def _child(parent_rel: bytes, name: bytes) -> bytes:
        return (b"" if parent_rel == b"/" else parent_rel) + b"/" + name

    def _lower_path(self, rel: bytes) -> bytes:
        return self.lower if rel == b"/" else self.lower + rel

    def _lower_dir(self, parent_rel: bytes, name: bytes) -> bytes:
        """``parent_rel/name`` if LOWER has a directory there, else b""."""
        if not parent_rel:
            return b""
        rel = self._child(parent_rel, name)
        try:
            return rel if stat.S_ISDIR(os.lstat(self._lower_path(rel)).st_mode) else b""
        except OSError:
            return b""

    def _lower_names(self, rel: bytes) -> list[bytes]:
        try:
            return sorted(os.listdir(self._lower_path(rel)))
        except OSError:
            return []

    def _lower_entry(self, parent_rel: bytes, name: bytes) -> TreeEntry | None:
        rel = self._child(parent_rel, name)
        path = self._lower_path(rel)
        try:
            st = os.lstat(path)
        except OSError:
            return None
        kind = _KINDS.get(stat.S_IFMT(st.st_mode))
        if kind is None:  # a socket: not shown, as a capture would not hold it
            return None
        base = TreeEntry(
            name,
            kind,
            stat.S_IMODE(st.st_mode),
            st.st_uid,
            st.st_gid,
            st.st_mtime_ns,
            xattrs=_shown_xattrs(read_xattrs(path)) if kind is not Kind.SYMLINK else (),
        )
        if kind is Kind.DIR:
            return replace(base, payload=bytes(self._tree_id(None, rel)))
        if kind is Kind.SYMLINK:
            target = os.readlink(path)
            return replace(base, size=len(target), payload=target)
        if kind in (Kind.CHR, Kind.BLK):
            return replace(base, rdev=st.st_rdev)
        if kind is Kind.FIFO:
            return base
        pieces = self._spans(rel, st.st_size)
        if len(pieces) > INLINE_CHUNKS:
            listed = self._remember(_synthetic("list", rel, st.st_size), ("list", rel))
            return replace(base, size=st.st_size, payload=bytes(listed), indirect=True)
        return replace(base, size=st.st_size, payload=encode_chunks(pieces))

    def _spans(self, rel: bytes, size: int | None = None) -> list[tuple[ObjectId, int, int]]:
        if size is None:
            size = os.lstat(self._lower_path(rel)).st_size
        out = []
        for off in range(0, size, SPAN):
            n = min(SPAN, size - off)
            oid = self._remember(_synthetic("span", rel, off, n), ("span", rel, off, n))
            out.append((oid, 0, n))
        return out

    def _read_span(self, rel: bytes, off: int, length: int) -> bytes:
        fd = os.open(self._lower_path(rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            data = os.pread(fd, length, off)
        finally:
            os.close(fd)
        return data.ljust(length, b"\0")  # a base file never shrinks; if it did: zeros
