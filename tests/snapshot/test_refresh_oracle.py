"""The files cache a restore leaves behind, against a walk that trusts nothing.

After a restore, its refresh (``Restorer._refresh_cache``) signs rows for what it wrote so
that the next checkpoint reads none of it again. A row vouches that its file still holds
the bytes it names: it must never vouch for a file that another process changed while the
restore ran (only the services are stopped). Generated trees, an agent's edits undone by a
restore, and changes by "another process" made just before the refresh (appends, chmods,
xattrs, same-size writes with the mtime set back, touches, removals), past the racy
window: the next checkpoint's tree must be the tree of a capture with no files cache.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import time
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sprite_env.checkpoints import Engine
from sprite_env.checkpoints.hashonly import HashOnlySink
from sprite_env.snapshot import dircache
from sprite_env.snapshot import restore as restore_mod
from sprite_env.snapshot.capture import capture
from tests.helpers.strategies import trees as tree_specs
from tests.helpers.trees import build_tree

#: Past the racy window (``dircache.RACY_NS``): rows signed after it vouch.
PAST_RACY_S = dircache.RACY_NS / 1e9 * 1.2
EDITS = ("append", "rewrite", "chmod", "remove", "add")
FOREIGN = ("append", "chmod", "xattr", "same size, mtime set back", "touch", "remove")


def _entries(root: str) -> list[tuple[str, os.stat_result]]:
    """Every entry under ``root`` (sorted, the root left out), lstat'ed."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            p = os.path.join(d, name)
            out.append((p, os.lstat(p)))
    return out


def _pick(root: str, i: int, want: Any) -> tuple[str, os.stat_result] | None:
    found = [(p, st) for p, st in _entries(root) if want(st)]
    return found[i % len(found)] if found else None


def _is_file(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode)


def _edit(root: str, i: int, op: str) -> None:
    """One of the agent's changes (what the restore then undoes)."""
    if op == "add":
        with open(os.path.join(root, f"added-{i}"), "wb") as f:
            f.write(b"new %d" % i)
        return
    hit = _pick(root, i, _is_file)
    if hit is None:
        return
    p, st = hit
    if op == "append":
        with open(p, "ab") as f:
            f.write(b" edited")
    elif op == "rewrite":
        with open(p, "r+b") as f:
            f.write(b"E" * min(3, st.st_size))
    elif op == "chmod":
        os.chmod(p, stat.S_IMODE(st.st_mode) ^ 0o040)
    else:
        os.unlink(p)


def _foreign(root: str, i: int, op: str) -> None:
    """A change by another process, just before the refresh."""

    def xattr_ok(st: os.stat_result) -> bool:
        return stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)

    hit = _pick(root, i, xattr_ok if op in ("xattr", "touch") else _is_file)
    if hit is None:
        return
    p, st = hit
    if op == "append":
        with open(p, "ab") as f:
            f.write(b" by another process")
    elif op == "chmod":
        os.chmod(p, stat.S_IMODE(st.st_mode) ^ 0o004)
    elif op == "xattr":
        with contextlib.suppress(OSError):  # a file system or a name that takes none
            os.setxattr(p, "user.by-another", b"%d" % i, follow_symlinks=False)
    elif op == "same size, mtime set back":
        with open(p, "r+b") as f:
            f.write(b"F" * min(2, st.st_size))
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
    elif op == "touch":
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000), follow_symlinks=False)
    else:
        os.unlink(p)


@settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    spec=tree_specs(max_entries=25, special_files=True),
    edits=st.lists(
        st.tuples(st.integers(0, 10**6), st.sampled_from(EDITS)), min_size=1, max_size=6
    ),
    foreign=st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(FOREIGN)), max_size=4),
)
def test_the_next_checkpoint_after_a_restore_is_a_walk_that_trusts_nothing(
    spec: dict[bytes, Any], edits: list[tuple[int, str]], foreign: list[tuple[int, str]]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "layer")
        os.mkdir(root)
        build_tree(root, spec)
        time.sleep(PAST_RACY_S)
        refresh = restore_mod.Restorer._refresh_cache

        def others_first(self: restore_mod.Restorer, written_ns: int) -> None:
            for i, op in foreign:
                _foreign(root, i, op)
            time.sleep(PAST_RACY_S)  # their timestamps too old to be racy
            refresh(self, written_ns)

        with Engine(root, os.path.join(tmp, "store")) as e:
            e.create("c0")
            for i, op in edits:
                _edit(root, i, op)
            time.sleep(PAST_RACY_S)
            with mock.patch.object(restore_mod.Restorer, "_refresh_cache", others_first):
                e.restore("v0")
            again = e.create("again")
            sink = HashOnlySink(e.store)
            truth = capture(root, sink, sink.read, {})
            assert again.top_tree == truth.top_tree, (edits, foreign)
