"""Hypothesis strategies for directory trees (specs for :func:`tests.helpers.trees.build_tree`)."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from hypothesis import strategies as st

from tests.helpers.trees import (
    BlockDev,
    CharDev,
    Dir,
    Fifo,
    File,
    HardLink,
    Sparse,
    Symlink,
)

if TYPE_CHECKING:
    from tests.helpers.trees import Node

#: Bytes names are drawn from: ASCII, shell-hostile characters and bytes that are not UTF-8.
NAME_ALPHABET = b"abcxyzABC019._-~ '\"\\*?$:\n\t\x01\x7f\x80\xc3\xa9\xfe\xff"
#: uids/gids: the usual ones, plus anything up to 2**32 - 2 (2**32 - 1 means "unchanged").
IDS = st.sampled_from([0, 1, 1000, 65534]) | st.integers(0, 2**32 - 2)
#: ext4 (256-byte inodes) holds -2**31 s .. 15032385535 s (1901-12-13 .. 2446-05-10) but
#: clamps times beyond and drops the nanoseconds of the very first second; stay inside.
MTIMES = st.integers(-(2**31 - 1) * 10**9, 2**33 * 10**9) | st.sampled_from(
    [0, 1_700_000_000_123_456_789, 1_600_000_000_000_000_000]
)
MODES = st.integers(0, 0o7777) | st.sampled_from([0o644, 0o755, 0o600, 0o4755, 0o2755, 0o1777])

_KINDS = ["file", "file", "file", "dir", "dir", "symlink", "hardlink", "fifo", "dev", "sparse"]


# One draw of raw bytes mapped onto the alphabet: much cheaper than a list of sampled bytes.
_SHORT_NAMES = st.binary(min_size=1, max_size=16).map(
    lambda raw: bytes(NAME_ALPHABET[b % len(NAME_ALPHABET)] for b in raw)
)
_LONG_NAMES = st.sampled_from([b"L" * 255, b"\xff" * 255, b"x" * 254 + b"\xc3"])
_ONE_IN_16 = st.integers(0, 15)


def _draw_name(draw: st.DrawFn) -> bytes:
    while True:
        name = draw(_LONG_NAMES if draw(_ONE_IN_16) == 0 else _SHORT_NAMES)
        if name not in (b".", b".."):
            return name


@st.composite
def names(draw: st.DrawFn) -> bytes:
    """One path component: never ``/`` or NUL, never ``.`` or ``..``; 1..16 bytes, or
    (one time in 16) the maximum of 255."""
    return _draw_name(draw)


def xattr_dicts(*, user: bool) -> st.SearchStrategy[dict[bytes, bytes]]:
    """0..3 xattrs in the trusted. namespace and, if ``user``, the user. one."""
    prefixes = [b"user.", b"trusted."] if user else [b"trusted."]
    key = st.builds(
        lambda p, n: p + n,
        st.sampled_from(prefixes),
        st.binary(min_size=1, max_size=20).map(lambda b: b.replace(b"\0", b"_")),
    )
    return st.dictionaries(key, st.binary(max_size=64), max_size=3)


_XATTRS = {True: xattr_dicts(user=True), False: xattr_dicts(user=False)}
_TARGETS = st.binary(min_size=1, max_size=80).map(lambda b: b.replace(b"\0", b"/"))
_SMALL_CONTENT = st.binary(max_size=300)
_SEEDS = st.integers(0, 2**32)


def _random_bytes(draw: st.DrawFn, lo: int, hi: int) -> bytes:
    """Incompressible bytes of a drawn size (from a drawn seed, so they shrink cheaply and
    never contain a page of zeros, which a sparse-aware copy would turn into a hole)."""
    size = draw(st.integers(lo, hi))
    seed = draw(_SEEDS)
    return random.Random(seed).randbytes(size)


@st.composite
def trees(
    draw: st.DrawFn,
    *,
    max_entries: int = 40,
    special_files: bool = True,
    sparse: bool = True,
) -> dict[bytes, Node]:
    """A tree spec for :func:`~tests.helpers.trees.build_tree` of up to ``max_entries`` nodes
    (plus implicit parents): nested dirs, files with small (sometimes larger) contents,
    sparse files, symlinks with arbitrary targets, hard links to earlier files, fifos and
    device nodes (incl. whiteouts), random modes incl. special bits, owners, ns mtimes, and
    xattrs in the user. and trusted. namespaces."""
    kinds = [k for k in _KINDS if (special_files or k not in ("fifo", "dev"))]
    if not sparse:
        kinds.remove("sparse")
    n = draw(st.integers(0, max_entries))
    dirs: list[bytes] = [b""]
    taken: set[bytes] = set()
    files: list[bytes] = []
    spec: dict[bytes, Node] = {}
    if draw(st.booleans()):
        spec[b"."] = Dir(mode=draw(MODES), uid=draw(IDS), gid=draw(IDS), mtime_ns=draw(MTIMES))
    for _ in range(n):
        parent = dirs[draw(st.integers(0, len(dirs) - 1))]
        path = parent + _draw_name(draw)
        if path in taken or len(path) > 3000:
            continue
        kind = draw(st.sampled_from(kinds))
        if kind == "hardlink" and not files:
            kind = "file"
        node: Node
        if kind == "hardlink":
            node = HardLink(draw(st.sampled_from(files)))
        else:
            uid, gid, mtime_ns = draw(IDS), draw(IDS), draw(MTIMES)
            xattrs = draw(_XATTRS[kind in ("file", "dir", "sparse")])
            if kind == "symlink":
                target = draw(_TARGETS)
                node = Symlink(target, uid=uid, gid=gid, mtime_ns=mtime_ns, xattrs=xattrs)
            else:
                mode = draw(MODES)
                if kind == "file":
                    content: bytes
                    if draw(st.integers(0, 9)) == 0:
                        content = _random_bytes(draw, 4096, 200_000)
                    else:
                        content = draw(_SMALL_CONTENT)
                    node = File(
                        content, mode=mode, uid=uid, gid=gid, mtime_ns=mtime_ns, xattrs=xattrs
                    )
                elif kind == "sparse":
                    size = draw(st.integers(1, 4 << 20))
                    data: dict[int, bytes] = {}
                    for _ in range(draw(st.integers(0, 3))):
                        off = draw(st.integers(0, size - 1))
                        piece = _random_bytes(draw, 1, min(10_000, size - off))
                        if all(off + len(piece) <= o or o + len(d) <= off for o, d in data.items()):
                            data[off] = piece
                    node = Sparse(
                        size=size,
                        data=data,
                        mode=mode,
                        uid=uid,
                        gid=gid,
                        mtime_ns=mtime_ns,
                        xattrs=xattrs,
                    )
                elif kind == "dir":
                    node = Dir(mode=mode, uid=uid, gid=gid, mtime_ns=mtime_ns, xattrs=xattrs)
                elif kind == "fifo":
                    node = Fifo(mode=mode, uid=uid, gid=gid, mtime_ns=mtime_ns, xattrs=xattrs)
                else:
                    whiteout = draw(st.integers(0, 3)) == 0
                    major = 0 if whiteout else draw(st.integers(0, 4095))
                    minor = 0 if whiteout else draw(st.integers(0, 0xFFFFF))
                    cls = CharDev if whiteout or draw(st.booleans()) else BlockDev
                    node = cls(
                        major, minor, mode=mode, uid=uid, gid=gid, mtime_ns=mtime_ns, xattrs=xattrs
                    )
        spec[path] = node
        taken.add(path)
        if kind == "dir":
            dirs.append(path + b"/")
        elif kind in ("file", "sparse"):
            files.append(path)
    return spec
