"""Building, snapshotting and comparing directory trees for capture/restore round trips.

* :func:`build_tree` makes a tree from a declarative spec of :class:`File`, :class:`Dir`,
  :class:`Symlink`, :class:`HardLink`, :class:`CharDev`, :class:`BlockDev`, :class:`Fifo`,
  :class:`Socket` and :class:`Sparse` nodes; :func:`sample_spec` is one that uses every feature.
* :func:`snapshot_tree` records every observable fact of a tree (never following symlinks).
* :func:`diff_trees` / :func:`assert_trees_equal` compare two trees or two snapshots.

Paths in specs and snapshots are relative to the root, ``/``-separated; the root is ``b"."``.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import random
import socket
import stat
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import blake3

if TYPE_CHECKING:
    from collections.abc import Iterable

# --------------------------------------------------------------------------------------------
# Snapshots

Kind: TypeAlias = Literal["file", "dir", "symlink", "chardev", "blockdev", "fifo", "socket"]
PathArg: TypeAlias = "str | bytes | os.PathLike[str] | os.PathLike[bytes]"

#: Granularity of the recorded data/hole map of regular files.
HOLE_GRANULARITY = 4096

_KINDS: dict[int, Kind] = {
    stat.S_IFREG: "file",
    stat.S_IFDIR: "dir",
    stat.S_IFLNK: "symlink",
    stat.S_IFCHR: "chardev",
    stat.S_IFBLK: "blockdev",
    stat.S_IFIFO: "fifo",
    stat.S_IFSOCK: "socket",
}


@dataclass(frozen=True)
class EntryFacts:
    """Everything :func:`snapshot_tree` observes about one entry.

    Fields that do not apply to the entry's kind are None.
    """

    kind: Kind
    mode: int  #: full ``st_mode``: type bits, permissions, setuid/setgid/sticky
    uid: int
    gid: int
    mtime_ns: int
    size: int | None = None  #: regular files only
    target: bytes | None = None  #: symlinks: ``os.readlink``
    rdev: tuple[int, int] | None = None  #: devices: (major, minor)
    xattrs: dict[bytes, bytes] = field(default_factory=dict)  #: every namespace, sorted by name
    digest: str | None = None  #: regular files: blake3 hex digest of the content
    #: regular files: data extents ``(start, end)`` rounded out to HOLE_GRANULARITY and merged;
    #: everything else below ``size`` rounded up is a hole
    data_extents: tuple[tuple[int, int], ...] | None = None
    #: non-directories with other names in the tree: number of the hard-link group (groups are
    #: numbered 0, 1, ... in the order of their smallest path)
    link_group: int | None = None
    nlink: int | None = None  #: non-directories: ``st_nlink`` (a directory's is fs-specific)


Snapshot: TypeAlias = "dict[bytes, EntryFacts]"


def _norm_rel(path: str | bytes) -> bytes:
    """``"a/b/"`` / ``b"./a//b"`` -> ``b"a/b"``; ``""`` and ``"."`` -> ``b"."``."""
    parts = [p for p in os.fsencode(path).split(b"/") if p not in (b"", b".")]
    if b".." in parts:
        raise ValueError(f"relative path may not contain '..': {path!r}")
    return b"/".join(parts) or b"."


def _is_under(path: bytes, prefixes: Iterable[bytes]) -> bool:
    return any(path == p or path.startswith(p + b"/") for p in prefixes)


def snapshot_tree(root: PathArg, *, ignore: Iterable[str | bytes] = ()) -> Snapshot:
    """Records the facts of ``root`` and everything below it, without following symlinks.

    Keys are paths relative to ``root`` (bytes; the root itself is ``b"."``). ``ignore`` lists
    relative paths whose whole subtree is left out. A mount point (a directory on another file
    system than ``root``) is recorded, with the facts of the mounted root, but not descended
    into.
    """
    top = os.fsencode(root)
    skip = {_norm_rel(p) for p in ignore}
    st = os.lstat(top)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "snapshot root is not a directory", root)
    inodes: dict[tuple[int, int], list[bytes]] = defaultdict(list)
    facts: dict[bytes, EntryFacts] = {b".": _facts(top, st)}
    stack: list[tuple[bytes, bytes]] = [(top, b"")]
    while stack:
        dirpath, reldir = stack.pop()
        with os.scandir(dirpath) as it:
            entries = list(it)
        for entry in entries:
            rel = reldir + entry.name
            if rel in skip:  # (and so is everything below it)
                continue
            path = os.path.join(dirpath, entry.name)
            est = os.lstat(path)
            facts[rel] = _facts(path, est)
            if stat.S_ISDIR(est.st_mode):
                if est.st_dev == st.st_dev:
                    stack.append((path, rel + b"/"))
            else:
                inodes[(est.st_dev, est.st_ino)].append(rel)
    groups = sorted(sorted(paths) for paths in inodes.values() if len(paths) > 1)
    for number, paths in enumerate(groups):
        for p in paths:
            facts[p] = dataclasses.replace(facts[p], link_group=number)
    return dict(sorted(facts.items()))


def _facts(path: bytes, st: os.stat_result) -> EntryFacts:
    kind = _KINDS.get(stat.S_IFMT(st.st_mode))
    if kind is None:
        raise ValueError(f"unknown file type {st.st_mode:#o} at {path!r}")
    names = sorted(os.listxattr(path, follow_symlinks=False))
    xattrs = {os.fsencode(n): os.getxattr(path, n, follow_symlinks=False) for n in names}
    # One construction per entry: a dataclasses.replace per kind cost a quarter of a
    # snapshot (the venv's 11k entries: 1.0 s against 0.7-0.9 s), and the suite snapshots
    # every tree it compares.
    size = digest = extents = target = rdev = None
    if kind == "file":
        size = st.st_size
        digest, extents = _read_file(path, size)
    elif kind == "symlink":
        target = os.readlink(path)
    elif kind in ("chardev", "blockdev"):
        rdev = (os.major(st.st_rdev), os.minor(st.st_rdev))
    return EntryFacts(
        kind=kind,
        mode=st.st_mode,
        uid=st.st_uid,
        gid=st.st_gid,
        mtime_ns=st.st_mtime_ns,
        size=size,
        target=target,
        rdev=rdev,
        xattrs=xattrs,
        digest=digest,
        data_extents=extents,
        nlink=None if kind == "dir" else st.st_nlink,
    )


def _read_file(path: bytes, size: int) -> tuple[str, tuple[tuple[int, int], ...]]:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        extents = data_extents_of_fd(fd, size)
        h = blake3.blake3()
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
        return h.hexdigest(), extents
    finally:
        os.close(fd)


def _round_up(n: int) -> int:
    return -(-n // HOLE_GRANULARITY) * HOLE_GRANULARITY


def data_extents_of_fd(fd: int, size: int) -> tuple[tuple[int, int], ...]:
    """The data extents of an open regular file per SEEK_DATA/SEEK_HOLE, as ``(start, end)``
    pairs rounded out to HOLE_GRANULARITY, clipped to ``size`` rounded up, merged.

    A file system without SEEK_DATA support reports the whole file as data. Leaves the file
    offset at 0.
    """
    limit = _round_up(size)
    out: list[tuple[int, int]] = []
    offset = 0
    try:
        while offset < size:
            try:
                start = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError as e:
                if e.errno == errno.ENXIO:  # only a hole remains
                    break
                raise
            end = os.lseek(fd, start, os.SEEK_HOLE)
            s = start // HOLE_GRANULARITY * HOLE_GRANULARITY
            e_ = min(_round_up(end), limit)
            if out and s <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], e_))
            elif s < e_:
                out.append((s, e_))
            if end <= offset:  # paranoia: never loop forever
                break
            offset = end
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
            raise
        out = [(0, limit)] if size else []
    finally:
        os.lseek(fd, 0, os.SEEK_SET)
    return tuple(out)


# --------------------------------------------------------------------------------------------
# Comparing


@dataclass(frozen=True)
class Difference:
    """One way two trees differ. ``a``/``b`` are the values of ``field`` (None if absent)."""

    path: bytes
    what: Literal["missing", "extra", "changed"]  #: missing: only in a; extra: only in b
    field: str | None = None  #: for "changed": an EntryFacts field name, or "xattr <name>"
    a: object = None
    b: object = None

    def __str__(self) -> str:
        p = show_path(self.path)
        if self.what == "missing":
            return f"missing in b: {p} ({self.a})"
        if self.what == "extra":
            return f"extra in b:   {p} ({self.b})"
        return f"changed:      {p}: {self.field}: {_show(self.field, self.a)} -> " + _show(
            self.field, self.b
        )


def show_path(path: bytes) -> str:
    """A path for humans: UTF-8 where possible; other bytes as ``\\xNN``, control characters
    and backslashes escaped."""
    out = []
    for ch in path.decode("utf-8", "surrogateescape"):
        if 0xDC80 <= ord(ch) <= 0xDCFF:
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        elif ch == "\\" or not ch.isprintable():
            out.append(repr(ch)[1:-1])
        else:
            out.append(ch)
    return "".join(out)


def _show(name: str | None, value: object) -> str:
    if value is None:
        return "(none)"
    if name == "mode" and isinstance(value, int):
        return f"{value:#o}"
    if name == "digest" and isinstance(value, str):
        return value[:16] + "…"
    if isinstance(value, frozenset):
        return "{" + ", ".join(show_path(p) for p in sorted(value)) + "}"
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + f"… ({len(text)} chars)"


_SCALAR_FIELDS = ("mode", "uid", "gid", "size", "mtime_ns", "target", "rdev", "digest", "nlink")


def diff_trees(
    a: PathArg | Snapshot,
    b: PathArg | Snapshot,
    *,
    check_holes: bool | Literal["exact", "kept"] = True,
    check_root_meta: bool = True,
    ignore: Iterable[str | bytes] = (),
) -> list[Difference]:
    """Every difference between two trees (roots or snapshots), sorted by path.

    ``check_holes``: True/"exact" compares the data/hole maps exactly; "kept" only requires
    every hole of ``a`` to still be a hole in ``b`` (``b`` may have more, e.g. runs of zeros
    that were punched out); False ignores them. ``check_root_meta=False`` skips the root
    entry itself. ``ignore`` leaves out subtrees (also of given snapshots).
    """
    skip = [_norm_rel(p) for p in ignore]
    sa = _as_snapshot(a, skip)
    sb = _as_snapshot(b, skip)
    if not check_root_meta:
        sa.pop(b".", None)
        sb.pop(b".", None)
    groups_a, groups_b = _link_groups(sa), _link_groups(sb)
    out: list[Difference] = []
    for path in sorted(sa.keys() | sb.keys()):
        fa, fb = sa.get(path), sb.get(path)
        if fb is None:
            assert fa is not None
            out.append(Difference(path, "missing", a=fa.kind))
            continue
        if fa is None:
            out.append(Difference(path, "extra", b=fb.kind))
            continue
        if fa.kind != fb.kind:
            out.append(Difference(path, "changed", "kind", fa.kind, fb.kind))
            continue
        for name in _SCALAR_FIELDS:
            va, vb = getattr(fa, name), getattr(fb, name)
            if va != vb:
                out.append(Difference(path, "changed", name, va, vb))
        for key in sorted(fa.xattrs.keys() | fb.xattrs.keys()):
            xa, xb = fa.xattrs.get(key), fb.xattrs.get(key)
            if xa != xb:
                out.append(Difference(path, "changed", f"xattr {show_path(key)}", xa, xb))
        if check_holes and not _holes_match(fa, fb, check_holes):
            out.append(
                Difference(path, "changed", "data_extents", fa.data_extents, fb.data_extents)
            )
        la = groups_a.get(path, frozenset())
        lb = groups_b.get(path, frozenset())
        if la != lb:
            out.append(Difference(path, "changed", "hard links", la or None, lb or None))
    return out


def assert_trees_equal(
    a: PathArg | Snapshot,
    b: PathArg | Snapshot,
    *,
    check_holes: bool | Literal["exact", "kept"] = True,
    check_root_meta: bool = True,
    ignore: Iterable[str | bytes] = (),
    max_shown: int = 50,
) -> None:
    """Raises AssertionError listing (at most ``max_shown`` of) the differences between two
    trees. ``a`` is the expected one (the original), ``b`` the actual one (the restored).
    See :func:`diff_trees` for the options."""
    diffs = diff_trees(
        a, b, check_holes=check_holes, check_root_meta=check_root_meta, ignore=ignore
    )
    if not diffs:
        return
    lines = [f"trees differ in {len(diffs)} way(s) (a = expected, b = actual):"]
    lines += ["  " + str(d) for d in diffs[:max_shown]]
    if len(diffs) > max_shown:
        lines.append(f"  … and {len(diffs) - max_shown} more difference(s)")
    raise AssertionError("\n".join(lines))


def _as_snapshot(t: PathArg | Snapshot, skip: list[bytes]) -> dict[bytes, EntryFacts]:
    if isinstance(t, dict):
        if not skip:
            return dict(t)  # a copy: the caller may pop the root
        return {p: f for p, f in t.items() if not _is_under(p, skip)}
    return snapshot_tree(t, ignore=skip)


def _link_groups(snap: Mapping[bytes, EntryFacts]) -> dict[bytes, frozenset[bytes]]:
    members: dict[int, set[bytes]] = defaultdict(set)
    for path, facts in snap.items():
        if facts.link_group is not None:
            members[facts.link_group].add(path)
    return {p: frozenset(ps) for ps in members.values() for p in ps}


def _holes_match(fa: EntryFacts, fb: EntryFacts, mode: Literal[True, "exact", "kept"]) -> bool:
    if fa.data_extents == fb.data_extents:
        return True
    if mode != "kept" or fa.data_extents is None or fb.data_extents is None:
        return False
    # Every data extent of b must lie inside one (merged, maximal) data extent of a.
    return all(any(s >= sa and e <= ea for sa, ea in fa.data_extents) for s, e in fb.data_extents)


# --------------------------------------------------------------------------------------------
# Building


@dataclass(frozen=True, kw_only=True, repr=False)
class Inode:
    """Metadata shared by all nodes but HardLink. ``mode`` is the permission bits (07777);
    None keeps the node type's default. ``mtime_ns`` None leaves the time of creation."""

    mode: int | None = None
    uid: int = 0
    gid: int = 0
    mtime_ns: int | None = None
    xattrs: Mapping[bytes, bytes] = field(default_factory=dict)
    path: str | bytes | None = None  #: only for specs given as a list of nodes

    def __repr__(self) -> str:
        """Only the fields that differ from their defaults; long bytes abbreviated (keeps
        hypothesis' falsifying examples readable)."""
        parts = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.default is not dataclasses.MISSING and value == f.default:
                continue
            if f.default_factory is not dataclasses.MISSING and value == f.default_factory():
                continue
            if f.name == "mode" and value is not None:
                parts.append(f"mode={value:#o}")
            else:
                parts.append(f"{f.name}={_abbrev(value)}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # hypothesis' pretty printer
        p.text(repr(self))


def _abbrev(value: object) -> str:
    if isinstance(value, bytes) and len(value) > 40:
        digest = blake3.blake3(value).hexdigest()[:12]
        return f"<{len(value)} bytes {value[:16]!r}… blake3 {digest}>"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_abbrev(k)}: {_abbrev(v)}" for k, v in value.items()) + "}"
    return repr(value)


@dataclass(frozen=True, repr=False)
class File(Inode):
    content: bytes = b""


@dataclass(frozen=True, repr=False)
class Sparse(Inode):
    """A file of ``size`` bytes that is a hole except for ``data`` (offset -> bytes)."""

    size: int = 0
    data: Mapping[int, bytes] = field(default_factory=dict)


@dataclass(frozen=True, repr=False)
class Dir(Inode):
    pass


@dataclass(frozen=True, repr=False)
class Symlink(Inode):
    """A symlink (its ``mode`` is always 0777 on Linux and must stay None)."""

    target: bytes | str = b""


@dataclass(frozen=True, repr=False)
class CharDev(Inode):
    """A character device; ``CharDev(0, 0)`` is an overlayfs whiteout."""

    major: int = 0
    minor: int = 0


@dataclass(frozen=True, repr=False)
class BlockDev(Inode):
    major: int = 0
    minor: int = 0


@dataclass(frozen=True, repr=False)
class Fifo(Inode):
    pass


@dataclass(frozen=True, repr=False)
class Socket(Inode):
    """A unix socket file (made by binding a socket, which is then closed)."""


@dataclass(frozen=True)
class HardLink:
    """Another name for the (non-directory) node at ``target`` (a path in the same spec)."""

    target: str | bytes
    path: str | bytes | None = field(default=None, kw_only=True)


Node: TypeAlias = "Inode | HardLink"  #: File, Sparse, Dir, Symlink, CharDev, ... or HardLink
Spec: TypeAlias = "Mapping[Any, Node] | Iterable[Node]"  #: keys: str or bytes paths

_DEFAULT_MODE: dict[type, int] = {
    File: 0o644,
    Sparse: 0o644,
    Dir: 0o755,
    Symlink: 0o777,
    CharDev: 0o600,
    BlockDev: 0o600,
    Fifo: 0o644,
    Socket: 0o755,
}
_TYPE_BITS: dict[type, int] = {
    File: stat.S_IFREG,
    Sparse: stat.S_IFREG,
    Dir: stat.S_IFDIR,
    Symlink: stat.S_IFLNK,
    CharDev: stat.S_IFCHR,
    BlockDev: stat.S_IFBLK,
    Fifo: stat.S_IFIFO,
    Socket: stat.S_IFSOCK,
}
_KIND_OF: dict[type, Kind] = {t: _KINDS[bits] for t, bits in _TYPE_BITS.items()}


def normalize_spec(spec: Spec) -> dict[bytes, Node]:
    """The spec as ``{normalized relative bytes path: node}`` (the root is ``b"."``),
    validated: hard links point at non-directory nodes of the spec, parents are directories."""
    items: list[tuple[str | bytes, Node]]
    if isinstance(spec, Mapping):
        items = list(spec.items())
    else:
        items = []
        for node in spec:
            if node.path is None:
                raise ValueError(f"a node in a list spec needs a path: {node!r}")
            items.append((node.path, node))
    out: dict[bytes, Node] = {}
    for raw, node in items:
        path = _norm_rel(raw)
        if path in out:
            raise ValueError(f"duplicate path in spec: {raw!r}")
        if path == b"." and not isinstance(node, Dir):
            raise ValueError("the root ('.') can only be a Dir")
        if isinstance(node, Symlink) and node.mode is not None:
            raise ValueError(f"a symlink has no mode of its own: {raw!r}")
        if isinstance(node, Inode) and node.mode is not None and node.mode & ~0o7777:
            raise ValueError(f"mode holds only permission bits (07777): {raw!r}")
        out[path] = node
    for path, node in out.items():
        parent = path.rpartition(b"/")[0]
        while parent:
            if parent in out and not isinstance(out[parent], Dir):
                raise ValueError(f"parent of {path!r} is not a directory in the spec")
            parent = parent.rpartition(b"/")[0]
        if isinstance(node, HardLink):
            target = out.get(_norm_rel(node.target))
            if target is None or isinstance(target, Dir | HardLink):
                raise ValueError(f"hard link {path!r} must point at a non-directory node")
    return out


def hard_link_target(spec: Mapping[bytes, Node], path: bytes) -> bytes:
    """The path of the node that owns the inode of ``path`` (itself unless a HardLink)."""
    node = spec[path]
    return _norm_rel(node.target) if isinstance(node, HardLink) else path


def expected_mode(node: Inode) -> int:
    """The full ``st_mode`` the builder gives a (non-HardLink) node."""
    perm = _DEFAULT_MODE[type(node)] if node.mode is None else node.mode
    return _TYPE_BITS[type(node)] | perm


def build_tree(root: PathArg, spec: Spec) -> dict[bytes, Node]:
    """Creates the tree described by ``spec`` under ``root`` (created if missing; may hold
    other entries). Returns the normalized spec (see :func:`normalize_spec`).

    Parents are made implicitly (0755, owned by root, time of creation). Contents first, then
    hard links, then metadata deepest first: owner, then mode (chown clears setuid/setgid and
    ``security.capability``), then xattrs, then mtime; directories last so their mtimes stick.
    """
    top = os.fsencode(root)
    nodes = normalize_spec(spec)
    os.makedirs(top, exist_ok=True)

    def full(rel: bytes) -> bytes:
        return top if rel == b"." else os.path.join(top, rel)

    dirs = {b"."}
    for path, node in nodes.items():
        parent = path.rpartition(b"/")[0]
        while parent and parent not in dirs:
            dirs.add(parent)
            parent = parent.rpartition(b"/")[0]
        if isinstance(node, Dir):
            dirs.add(path)
    for d in sorted(dirs, key=len):
        if d != b".":
            os.makedirs(full(d), exist_ok=True)
    for path, node in nodes.items():
        if not isinstance(node, Dir | HardLink):
            _create(full(path), node)
    for path, node in nodes.items():
        if isinstance(node, HardLink):
            os.link(full(_norm_rel(node.target)), full(path), follow_symlinks=False)

    def depth_first(p: bytes) -> tuple[int, bytes]:
        return (1 if p == b"." else -p.count(b"/"), p)  # the root last

    for path in sorted(nodes, key=depth_first):
        node = nodes[path]
        if not isinstance(node, Dir | HardLink):
            _apply_meta(full(path), node)
    for path in sorted(nodes, key=depth_first):
        node = nodes[path]
        if isinstance(node, Dir):
            _apply_meta(full(path), node)
    return nodes


def _create(path: bytes, node: Node) -> None:
    if isinstance(node, File | Sparse):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            if isinstance(node, File):
                view = memoryview(node.content)
                while view:
                    view = view[os.write(fd, view) :]
            else:
                for offset, data in sorted(node.data.items()):
                    if offset + len(data) > node.size:
                        raise ValueError(f"Sparse data at {offset} is past the size of {path!r}")
                    os.pwrite(fd, data, offset)
                os.ftruncate(fd, node.size)
        finally:
            os.close(fd)
    elif isinstance(node, Symlink):
        os.symlink(os.fsencode(node.target), path)
    elif isinstance(node, CharDev | BlockDev):
        os.mknod(path, _TYPE_BITS[type(node)] | 0o600, os.makedev(node.major, node.minor))
    elif isinstance(node, Fifo):
        os.mkfifo(path, 0o600)
    elif isinstance(node, Socket):
        _make_socket(path)
    else:  # pragma: no cover
        raise TypeError(node)


def _make_socket(path: bytes) -> None:
    """Binds a unix socket at ``path``; via a short name under /proc/self/fd/N and a rename,
    since sun_path holds only 108 bytes."""
    parent, name = os.path.split(path)
    dfd = os.open(parent or b".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        tmp = f".sock-{os.getpid()}-{random.getrandbits(32):08x}".encode()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(b"/proc/self/fd/%d/%s" % (dfd, tmp))
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        os.close(dfd)


def _apply_meta(path: bytes, node: Inode) -> None:
    os.chown(path, node.uid, node.gid, follow_symlinks=False)
    if not isinstance(node, Symlink):
        os.chmod(path, expected_mode(node) & 0o7777)
    for name, value in node.xattrs.items():
        os.setxattr(path, name, value, follow_symlinks=False)
    if node.mtime_ns is not None:
        os.utime(path, ns=(node.mtime_ns, node.mtime_ns), follow_symlinks=False)


def expected_data_extents(node: File | Sparse) -> tuple[tuple[int, int], ...]:
    """The data extents :func:`snapshot_tree` should see for a freshly built file (file systems
    allocate whole blocks wherever something was written, zeros included)."""
    if isinstance(node, File):
        return ((0, _round_up(len(node.content))),) if node.content else ()
    out: list[tuple[int, int]] = []
    for offset, data in sorted(node.data.items()):
        if not data:
            continue
        s = offset // HOLE_GRANULARITY * HOLE_GRANULARITY
        e = min(_round_up(offset + len(data)), _round_up(node.size))
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return tuple(out)


def _content(node: File | Sparse) -> bytes:
    if isinstance(node, File):
        return node.content
    buf = bytearray(node.size)
    for offset, data in node.data.items():
        buf[offset : offset + len(data)] = data
    return bytes(buf)


def spec_differences(spec: Spec, snap: Mapping[bytes, EntryFacts]) -> list[str]:
    """What ``spec`` declares but ``snap`` (a snapshot of a tree built from it) does not show:
    existence, kind, mode, owner, mtime, xattrs (exactly), size, content, data/hole map, symlink
    target, device numbers and hard-link groups (with ``st_nlink``). Entries the spec does not
    mention (implicit parents, extra entries) are not checked. Empty if all is as declared."""
    nodes = normalize_spec(spec)
    groups: dict[bytes, set[bytes]] = defaultdict(set)
    for path in nodes:
        groups[hard_link_target(nodes, path)].add(path)
    actual_groups = _link_groups(snap)
    out: list[str] = []
    for path in sorted(nodes):
        where = show_path(path)
        facts = snap.get(path)
        if facts is None:
            out.append(f"{where}: missing")
            continue
        owner = hard_link_target(nodes, path)
        decl = nodes[owner]
        assert not isinstance(decl, HardLink)
        expected: dict[str, object] = {
            "kind": _KIND_OF[type(decl)],
            "mode": expected_mode(decl),
            "uid": decl.uid,
            "gid": decl.gid,
            "xattrs": dict(sorted(decl.xattrs.items())),
        }
        if decl.mtime_ns is not None:
            expected["mtime_ns"] = decl.mtime_ns
        if isinstance(decl, File | Sparse):
            content = _content(decl)
            expected["size"] = len(content)
            expected["digest"] = blake3.blake3(content).hexdigest()
            expected["data_extents"] = expected_data_extents(decl)
        elif isinstance(decl, Symlink):
            expected["target"] = os.fsencode(decl.target)
        elif isinstance(decl, CharDev | BlockDev):
            expected["rdev"] = (decl.major, decl.minor)
        if not isinstance(decl, Dir):
            expected["nlink"] = len(groups[owner])
        for name, want in expected.items():
            got = getattr(facts, name)
            if got != want:
                out.append(f"{where}: {name}: declared {_show(name, want)}, got {_show(name, got)}")
        if not isinstance(decl, Dir):
            want_group = frozenset(groups[owner]) if len(groups[owner]) > 1 else frozenset()
            got_group = actual_groups.get(path, frozenset())
            if got_group != want_group:
                out.append(
                    f"{where}: hard links: declared {_show('', want_group or None)}, "
                    f"got {_show('', got_group or None)}"
                )
    return out


# --------------------------------------------------------------------------------------------
# The sample tree

#: A v2 ``security.capability`` blob granting cap_net_bind_service (permitted, not effective).
CAP_NET_BIND_SERVICE = b"\x01\x00\x00\x02\x00\x04\x00\x00" + bytes(12)
#: A nanosecond timestamp with all nine sub-second digits set (2023-11-14).
T0 = 1_700_000_000_123_456_789
DEEP_LEVELS = 60
#: Where ``sample_spec(socket=True)`` puts its unix socket.
SOCKET_PATH = b"run/app.sock"


def _rand(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


def sample_spec(*, socket: bool = False) -> dict[bytes, Node]:
    """A normalized spec that exercises every feature the engine must round-trip.

    Every node (parents included) has an explicit, distinct nanosecond mtime. With
    ``socket=True`` it also holds a unix socket at SOCKET_PATH (``run/app.sock``), which a
    capture is expected to skip with a warning, as sockets cannot be restored.
    """
    deep = "/".join(["deep"] + ["d"] * DEEP_LEVELS)
    spec: dict[str | bytes, Node] = {
        ".": Dir(mode=0o755),
        # owners, modes, setuid/setgid/sticky
        "etc/passwd": File(b"root:x:0:0::/root:/bin/sh\n", xattrs={b"user.mime": b"text/plain"}),
        "etc/shadow": File(b"root:*:19000::::::\n", mode=0o640, gid=42),
        "home/user": Dir(mode=0o750, uid=1000, gid=1000),
        "home/user/notes.txt": File(
            b"hello\n",
            mode=0o600,
            uid=1000,
            gid=1000,
            xattrs={b"user.k": b"v", b"user.empty": b"", b"trusted.bin": b"\x00\x01\xff"},
        ),
        "home/nobody": File(b"x", uid=65534, gid=65534, mode=0o000),
        "home/big-ids": File(b"y", uid=4_000_000_000, gid=2_000_000_000),
        "usr/bin/su": File(b"\x7fELF su", mode=0o4755),
        "usr/bin/wall": File(b"\x7fELF wall", mode=0o2755, gid=5),
        "usr/bin/all-bits": File(b"\x7fELF odd", mode=0o7777, uid=1000, gid=1000),
        "usr/bin/ping": File(
            b"\x7fELF ping", mode=0o755, xattrs={b"security.capability": CAP_NET_BIND_SERVICE}
        ),
        "usr/bin/suid-cap": File(
            b"\x7fELF both",
            mode=0o4711,
            uid=1000,
            gid=1000,
            xattrs={b"security.capability": CAP_NET_BIND_SERVICE, b"user.x": b"1"},
        ),
        "tmp": Dir(mode=0o1777),
        "srv/shared": Dir(mode=0o2775, gid=100),
        "srv/odd": Dir(mode=0o7000, uid=1000, gid=1000),
        # overlayfs: an opaque dir and a whiteout
        "upper/opaque": Dir(xattrs={b"trusted.overlay.opaque": b"y", b"user.dir": b"d"}),
        "upper/opaque/kept": File(b"kept"),
        "upper/deleted": CharDev(0, 0, mode=0o000),
        # special files
        "dev/null": CharDev(1, 3, mode=0o666),
        "dev/max": CharDev(4095, 0xFFFFF, mode=0o620, uid=1000, gid=5),
        "dev/loop0": BlockDev(7, 0, mode=0o660, gid=6, xattrs={b"trusted.blk": b"b"}),
        "run/fifo": Fifo(mode=0o620, uid=1000, gid=1000, xattrs={b"trusted.f": b"f"}),
        # symlinks
        "links/rel": Symlink(b"../etc/passwd"),
        "links/abs": Symlink(b"/etc/passwd"),
        "links/dangling": Symlink(b"does/not/exist"),
        "links/outside": Symlink(b"../../etc/passwd"),
        "links/to-dir": Symlink(b"../home"),
        "links/self": Symlink(b"self"),
        "links/owned": Symlink(b"x", uid=1000, gid=1000, xattrs={b"trusted.sym": b"1"}),
        "links/non-utf8": Symlink(b"\xff\xfe/\x80"),
        "links/long": Symlink(b"/".join([b"x" * 250] * 16)),
        # hard links: a group of two and one of three (one name in another directory)
        "hard/a1": File(b"group of two", mode=0o640, uid=1000, xattrs={b"user.h": b"a"}),
        "hard/a2": HardLink("hard/a1"),
        "hard/b1": File(b"group of three", mode=0o4750, gid=1000),
        "hard/sub/b2": HardLink("hard/b1"),
        "hard/b3": HardLink("hard/b1"),
        "hard/fifo1": Fifo(),
        "hard/fifo2": HardLink("hard/fifo1"),
        # sparse files
        "sparse/big": Sparse(size=8 << 20, data={0: _rand(1, 5000), 5 << 20: _rand(2, 100)}),
        "sparse/all-hole": Sparse(size=1 << 20),
        "sparse/tail": Sparse(size=3 * 4096 + 17, data={3 * 4096 + 1: b"z"}),
        "sparse/head-hole": Sparse(size=64 << 10, data={(64 << 10) - 4096: _rand(3, 4096)}),
        # empties
        "empty/file": File(b""),
        "empty/dir": Dir(),
        "empty/dir-with-xattr": Dir(xattrs={b"user.e": b""}),
        # names
        "names/" + "n" * 255: File(b"a 255-byte name"),
        b"names/\xff\xfe-not-utf8": File(b""),
        b"names/\xc3\x28 bad \x80": Dir(),
        b"names/\xc3\x28 bad \x80/inside\xff": File(b"in a non-UTF-8 dir"),
        "names/sp ace\nnewline\ttab\\": File(b"nl"),
        "names/ünïcödé": File(b"u"),
        "names/-dash": File(b"-"),
        "names/..dots": File(b"."),
        deep + "/leaf": File(b"deep"),
        # sizes around a 64 KiB boundary, and a few MiB of random bytes
        "sizes/64k-1": File(_rand(4, (64 << 10) - 1)),
        "sizes/64k": File(_rand(5, 64 << 10)),
        "sizes/64k+1": File(_rand(6, (64 << 10) + 1)),
        "sizes/random-3m": File(_rand(7, (3 << 20) + 12345)),
        "sizes/zeros": File(bytes(10000)),
        # times
        "times/epoch": File(b"0", mtime_ns=0),
        "times/pre-1970": File(b"-", mtime_ns=-1_000_000_001),
        "times/2100": File(b"f", mtime_ns=4_102_444_800_999_999_999),
        "times/whole-second": File(b"s", mtime_ns=1_600_000_000_000_000_000),
    }
    if socket:
        spec[SOCKET_PATH] = Socket(mode=0o777)
    nodes = normalize_spec(spec)
    # Make every implicit parent explicit and give every node a distinct ns mtime.
    for path in list(nodes):
        parent = path.rpartition(b"/")[0]
        while parent and parent not in nodes:
            nodes[parent] = Dir()
            parent = parent.rpartition(b"/")[0]
    out: dict[bytes, Node] = {}
    for i, path in enumerate(sorted(nodes)):
        node = nodes[path]
        if isinstance(node, Inode) and node.mtime_ns is None:
            node = dataclasses.replace(node, mtime_ns=T0 + i * 1_000_003)
        out[path] = node
    return out
