"""The tree oracle of the benchmarks: every entry of a tree, compared entry by entry.

A restore is right when the restored tree equals the saved one in kind, content (a hash of
every byte), mode, owner, mtime, device number (whiteouts) and xattrs (opaque
directories); :func:`manifest` records those, :func:`compare` says what differs.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layer  # noqa: E402

#: kind, mode, uid, gid, size, content digest (symlink: target), mtime ns, rdev, xattrs
Entry = tuple[str, int, int, int, int, str, int, int, str]
FIELDS = ["kind", "mode", "uid", "gid", "size", "content", "mtime", "rdev", "xattrs"]


def _xattrs(path: str) -> str:
    try:
        names = sorted(os.listxattr(path, follow_symlinks=False))
        if not names:
            return ""
        h = hashlib.blake2b(digest_size=8)
        for n in names:
            h.update(n.encode() + b"\0" + os.getxattr(path, n, follow_symlinks=False) + b"\0")
    except OSError as e:
        return f"error {e.errno}"
    return ",".join(names) + "=" + h.hexdigest()


def manifest(root: str, *, content: bool = True) -> dict[str, Entry]:
    """Every entry under root (root itself left out). Directory sizes and link counts are
    not compared (overlayfs links whiteouts to one inode in WORK). ``content=False``
    leaves files' bytes unhashed (their digests empty): the rest of every entry of the
    medium layer in 1.6 s warm, where hashing its 1.7 GB too takes about 28 s."""
    out: dict[str, Entry] = {}
    for rel, st in layer.walk(root):
        full = os.path.join(root, rel)
        mode = st.st_mode
        size, digest, rdev = 0, "", 0
        if stat.S_ISREG(mode) and not content:
            kind, size = "file", st.st_size
        elif stat.S_ISREG(mode):
            h = hashlib.blake2b()
            with open(full, "rb", buffering=0) as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            kind, size, digest = "file", st.st_size, h.hexdigest()
        elif stat.S_ISDIR(mode):
            kind = "dir"
        elif stat.S_ISLNK(mode):
            kind, digest = "symlink", os.readlink(full)
        else:
            kind, rdev = f"special:{stat.S_IFMT(mode):o}", st.st_rdev
        out[rel] = (
            kind,
            stat.S_IMODE(mode),
            st.st_uid,
            st.st_gid,
            size,
            digest,
            st.st_mtime_ns,
            rdev,
            _xattrs(full),
        )
    return out


def tree_digest(m: dict[str, Entry]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for rel in sorted(m):
        h.update(json.dumps([rel, *m[rel]]).encode() + b"\n")
    return h.hexdigest()


def compare(expected: dict[str, Entry], actual: dict[str, Entry]) -> dict[str, Any]:
    """Entry by entry: ``{"ok", "digest", "counts", "examples"}``."""
    counts: dict[str, int] = {}
    examples: dict[str, list[str]] = {}

    def bad(what: str, path: str) -> None:
        counts[what] = counts.get(what, 0) + 1
        if len(examples.setdefault(what, [])) < 5:
            examples[what].append(path)

    for path, e in expected.items():
        a = actual.get(path)
        if a is None:
            bad("missing", path)
        elif a[0] != e[0]:
            bad("kind", path)
        else:
            for i, name in enumerate(FIELDS[1:], 1):
                if a[i] != e[i]:
                    bad(name, path)
    for path in actual.keys() - expected.keys():
        bad("extra", path)
    return {
        "ok": not counts,
        "digest": tree_digest(actual),
        "expected_digest": tree_digest(expected),
        "entries": len(actual),
        "counts": counts,
        "examples": examples,
    }


def verdict(v: dict[str, Any] | None) -> str:
    if v is None:
        return "-"
    if v["ok"]:
        return f"ok ({v['entries']:,} entries, digest {v['digest'][:12]})"
    return "**MISMATCH** " + " ".join(f"{k}={n}" for k, n in v["counts"].items())


def du(path: str) -> int:
    out = subprocess.run(["du", "-sb", path], check=True, capture_output=True, text=True)
    return int(out.stdout.split()[0])
