"""A diff of two merged checkpoints that reads both sides of a directory together
(``MergedTrees.read_pair``: LOWER's entries neither UPPER names are left out) equals the
diff that merges each side whole, difference by difference and count by count, over
generated base images and layers with whiteouts, opaque directories, files replacing
directories and back. Real captures into a real store; LOWER on disk."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sprite_env.checkpoints import Engine
from sprite_env.overlay.merge import MergedTrees
from sprite_env.snapshot.diff import count_changes
from sprite_env.snapshot.tree import decode_tree, encode_entry

if os.geteuid() != 0:
    pytest.skip("whiteouts (0:0 devices) and trusted.* xattrs need root", allow_module_level=True)

NAMES = ["a", "b", "c"]
# What a name is in a tree: absent, a file (its bytes), a dir (its children), and in UPPER
# also a whiteout or an opaque dir.
Node = Any


def _trees(upper: bool, depth: int = 2) -> st.SearchStrategy[dict[str, Node]]:
    leaf = st.one_of(
        st.tuples(st.just("file"), st.sampled_from([b"", b"one", b"two"])),
        *([st.just(("whiteout",))] if upper else []),
    )
    node: st.SearchStrategy[Node] = leaf
    for _ in range(depth):
        sub = st.dictionaries(st.sampled_from(NAMES), node, max_size=3)
        kinds = [st.tuples(st.just("dir"), sub)]
        if upper:
            kinds.append(st.tuples(st.just("opaque"), sub))
        node = st.one_of(leaf, *kinds)
    return st.dictionaries(st.sampled_from(NAMES), node, max_size=3)


def _build(path: str, tree: dict[str, Node]) -> None:
    os.makedirs(path, exist_ok=True)
    for name, node in tree.items():
        p = os.path.join(path, name)
        if node[0] == "file":
            with open(p, "wb") as f:
                f.write(node[1])
            os.utime(p, ns=(10**18, 10**18))
        elif node[0] == "whiteout":
            os.mknod(p, 0o600 | 0o020000, os.makedev(0, 0))
        else:
            _build(p, node[1])
            if node[0] == "opaque":
                os.setxattr(p, b"trusted.overlay.opaque", b"y")
    os.utime(path, ns=(10**18, 10**18))


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(lower=_trees(upper=False), old=_trees(upper=True), new=_trees(upper=True))
def test_read_pair_gives_the_whole_merge_diff(
    tmp_path: Any, lower: dict[str, Node], old: dict[str, Node], new: dict[str, Node]
) -> None:
    base = tmp_path / "case"
    shutil.rmtree(base, ignore_errors=True)
    lower_dir, upper_dir, store = str(base / "lower"), str(base / "upper"), str(base / "store")
    _build(lower_dir, lower)
    with Engine(upper_dir if os.path.isdir(upper_dir) else _mk(upper_dir), store) as e:
        _build(upper_dir, old)
        a = e.create("old").top_tree
        shutil.rmtree(upper_dir)
        _build(upper_dir, new)
        b = e.create("new").top_tree

        whole = MergedTrees(e.store.read, lower_dir)
        expect = list(count_changes(whole.read, whole.top(a), whole.top(b)))
        paired = MergedTrees(e.store.read, lower_dir)
        got = list(count_changes(paired.read, paired.top(a), paired.top(b), pair=paired.read_pair))
    assert [(c.difference, c.effects) for c in got] == [(c.difference, c.effects) for c in expect]


def _mk(path: str) -> str:
    os.makedirs(path)
    return path


def test_the_merged_view_hides_overlayfs_xattrs_and_keeps_the_rest(tmp_path: Any) -> None:
    """overlayfs's own ``trusted.overlay.*`` xattrs (an origin, a metacopy) are not part of
    what MERGED shows: left out of the merged entry, where the file's other xattrs stay; an
    entry with none of them is the UPPER entry as it was, and so is its encoding."""
    lower_dir, upper_dir = str(tmp_path / "lower"), str(tmp_path / "upper")
    os.makedirs(lower_dir)
    _build(upper_dir, {"a": ("dir", {"b": ("file", b"one"), "c": ("file", b"two")})})
    b, c = os.path.join(upper_dir, "a", "b"), os.path.join(upper_dir, "a", "c")
    os.setxattr(b, b"trusted.overlay.origin", b"\x00\xfb")
    os.setxattr(b, b"user.kept", b"1")
    os.setxattr(c, b"user.plain", b"2")
    with Engine(upper_dir, str(tmp_path / "store")) as e:
        top = e.create("x").top_tree
        merged = MergedTrees(e.store.read, lower_dir)
        root = _entries(merged.read, _entries(merged.read, merged.top(top))[b"."].subtree)
        shown = _entries(merged.read, root[b"a"].subtree)
        upper = _entries(e.store.read, _entries(e.store.read, top)[b"."].subtree)
        plain = _entries(e.store.read, upper[b"a"].subtree)
    assert shown[b"b"].xattrs == ((b"user.kept", b"1"),)
    assert dict(plain[b"b"].xattrs)[b"trusted.overlay.origin"] == b"\x00\xfb"
    assert shown[b"c"] == plain[b"c"]
    assert encode_entry(shown[b"c"]) == encode_entry(plain[b"c"])


def _entries(read: Any, tree: Any) -> dict[bytes, Any]:
    return {x.name: x for x in decode_tree(read(tree))}
