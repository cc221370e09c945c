"""An agent's step undone by a restore while another process changes the layer: the
refresh's oracle (``tests/snapshot/test_refresh_oracle.py``, and with the change journal
``tests/journal/test_refresh_oracle.py``).

After a restore, its refresh (``Restorer._refresh_cache``) signs files-cache rows for what
it wrote, so that the next checkpoint reads none of it again. A row vouches that its file
still holds the bytes it names, so it must never vouch for what another process changed
while the restore ran (only the services are stopped): the changes here are made just
before the refresh, past the racy window, and the next checkpoint, exported, must be the
layer as it is, entry for entry (content, holes, modes, owners, ns mtimes, xattrs, hard
links). Not its tree id against a capture that trusts no files cache: a big file changed
in place keeps its unchanged pages as slices of its old objects, which a fresh capture
chunks anew (the same bytes, another chunk list).
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from typing import TYPE_CHECKING, Any
from unittest import mock

from hypothesis import strategies as st

from sprite_env.checkpoints import Engine
from sprite_env.snapshot import dircache
from sprite_env.snapshot import restore as restore_mod
from tests.helpers.trees import assert_trees_equal, build_tree, snapshot_tree

if TYPE_CHECKING:
    from sprite_env.checkpoints.registry import Checkpoint
    from sprite_env.journal import ChangeJournal

#: Past the racy window (``dircache.RACY_NS``): rows signed after it vouch.
PAST_RACY_S = dircache.RACY_NS / 1e9 * 1.2
EDITS = ("append", "rewrite", "chmod", "remove", "add")
FOREIGN = (
    "append",
    "chmod",
    "xattr",
    "same size, mtime set back",
    "touch",
    "remove",
    "create",
    "rename",
)
#: (index, op) lists: the index picks the entry (modulo how many there are).
edit_lists = st.lists(
    st.tuples(st.integers(0, 10**6), st.sampled_from(EDITS)), min_size=1, max_size=6
)
foreign_lists = st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(FOREIGN)), max_size=4)


def _entries(root: str) -> list[tuple[bytes, os.stat_result]]:
    """Every entry under ``root`` (sorted, the root left out), lstat'ed. Paths as bytes:
    a str path of a name that is not UTF-8 holds surrogates, and an error that names it
    cannot be sent back by pytest-xdist (a worker's INTERNALERROR ends the whole run)."""
    out = []
    for d, dirs, files in os.walk(os.fsencode(root)):
        dirs.sort()
        for name in sorted(dirs + files):
            p = os.path.join(d, name)
            out.append((p, os.lstat(p)))
    return out


def _pick(root: str, i: int, kinds: tuple[int, ...]) -> tuple[bytes, os.stat_result] | None:
    found = [(p, st) for p, st in _entries(root) if stat.S_IFMT(st.st_mode) in kinds]
    return found[i % len(found)] if found else None


def change(root: str, i: int, op: str, note: bytes) -> None:
    """One change of ``op`` (of ``EDITS`` or ``FOREIGN``) to the ``i``-th entry it applies
    to; ``note``: the bytes it writes."""
    if op in ("add", "create"):  # a new file, at the top or in the i-th directory
        d = _pick(root, i, (stat.S_IFDIR,)) if op == "create" else None
        with open(os.path.join(d[0] if d else os.fsencode(root), b"new-%d" % i), "wb") as f:
            f.write(note)
        return
    kinds = (stat.S_IFREG, stat.S_IFDIR) if op in ("xattr", "touch") else (stat.S_IFREG,)
    hit = _pick(root, i, kinds)
    if hit is None:
        return
    p, st = hit
    if op == "append":
        with open(p, "ab") as f:
            f.write(note)
    elif op == "rewrite":
        with open(p, "r+b") as f:
            f.write(note[: min(3, st.st_size)])
    elif op == "chmod":
        os.chmod(p, stat.S_IMODE(st.st_mode) ^ 0o040)
    elif op == "xattr":
        with contextlib.suppress(OSError):  # a file system or a name that takes none
            os.setxattr(p, "user.by-another", note, follow_symlinks=False)
    elif op == "same size, mtime set back":
        with open(p, "r+b") as f:
            f.write(note[: min(2, st.st_size)])
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
    elif op == "touch":
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000), follow_symlinks=False)
    elif op == "rename":  # a short new name: the old one may be 255 bytes already
        os.rename(p, os.path.join(os.path.dirname(p), b"moved-%d" % i))
    else:
        os.unlink(p)


def undo_with_others_changes(
    root: str,
    store: str,
    spec: dict[bytes, Any],
    edits: list[tuple[int, str]],
    foreign: list[tuple[int, str]],
    journal: ChangeJournal | None = None,
) -> Checkpoint:
    """Builds ``spec`` at ``root`` (an empty directory), checkpoints it, makes ``edits``,
    restores the checkpoint with ``foreign`` made just before the refresh, checkpoints
    again, and checks that checkpoint against the layer (exported beside ``store``).
    Returns it."""
    build_tree(root, spec)
    time.sleep(PAST_RACY_S)
    refresh = restore_mod.Restorer._refresh_cache

    def others_first(self: restore_mod.Restorer, written_ns: int) -> None:
        for i, op in foreign:
            change(root, i, op, b"by another process")
        time.sleep(PAST_RACY_S)  # their timestamps too old to be racy
        refresh(self, written_ns)

    with Engine(root, store) as e:
        e.journal = journal
        e.create("c0")
        for i, op in edits:
            change(root, i, op, b"edited")
        time.sleep(PAST_RACY_S)
        with mock.patch.object(restore_mod.Restorer, "_refresh_cache", others_first):
            e.restore("v0")
        again = e.create("again")
        live = snapshot_tree(root)
        out = store + ".export"
        os.mkdir(out)
        e.export(again.id, out)
        assert_trees_equal(live, out)
        return again
