"""A preview speaks the restore's language: its counts are the counts the restore reports.

In-process (the engine on a temporary layer); the real daemon and CLI are in
tests/cli/test_preview.py and tests/overlay/test_preview.py.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sprite_env.checkpoints import Engine
from sprite_env.snapshot import plan
from tests.helpers import trees
from tests.helpers.strategies import trees as tree_specs

if TYPE_CHECKING:
    from tests.helpers.trees import Node


def _wipe(root: str) -> None:
    for name in os.listdir(root):
        p = os.path.join(root, name)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.unlink(p)


def _without_counts_alias(counts: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in counts.items() if k != "remove"}


def _preview_then_restore(root: str, store: str, a: Any, b: Any) -> tuple[Any, Any, Any]:
    """Builds ``a``, checkpoints it, replaces it by ``b``; returns (preview counts, the
    restore's counts, the preview)."""
    trees.build_tree(root, a)
    want = trees.snapshot_tree(root)
    with Engine(root, store) as e:
        e.create()
        _wipe(root)
        trees.build_tree(root, b)
        pv = e.preview("v0")
        rep = e.restore("v0")
        trees.assert_trees_equal(want, root)
        return _without_counts_alias(pv.counts()), plan.stats_counts(rep.stats), pv


def test_a_new_directory_of_50_files_is_51_deletions(tmp_path: Any) -> None:
    root = os.path.join(tmp_path, "layer")
    os.mkdir(root)
    a = {"keep": trees.File(b"k", mode=0o644), "conf": trees.File(b"1")}
    b: dict[str, Node] = {"keep": trees.File(b"k", mode=0o755), "conf": trees.File(b"22")}
    b.update({f"new/f{i:02d}": trees.File(b"x") for i in range(50)})
    counts, restored, pv = _preview_then_restore(root, os.path.join(tmp_path, "s"), a, b)
    assert counts == {"delete": 51, "change": 1, "create": 0, "metadata": 1}
    assert restored == counts
    new = next(it for it in pv.items if it.path == b"new")
    assert plan.step_json(new) == {
        "path": "new",
        "change": "added",  # since v0: what the restore undoes
        "type": "dir",
        "size": None,
        "action": "delete",
        "entries": 51,
    }
    assert all(it.path != b"." for it in pv.items)  # the root's mtime is not news


def test_type_changes_count_the_contents_that_go_and_come(tmp_path: Any) -> None:
    root = os.path.join(tmp_path, "layer")
    os.mkdir(root)
    # in v0 ``d`` is a directory of 3 and ``f`` a file; live, the other way round
    a = {"d/1": trees.File(b"1"), "d/2": trees.File(b"2"), "d/3": trees.File(b"3")}
    a["f"] = trees.File(b"f")
    b = {"d": trees.File(b"now a file"), "f/x": trees.File(b"x"), "f/y/z": trees.File(b"z")}
    counts, restored, pv = _preview_then_restore(root, os.path.join(tmp_path, "s"), a, b)
    # d: changed back to a directory, its 3 entries created; f: a file again, the 3
    # entries below it (x, y, y/z) deleted
    assert counts == {"delete": 3, "change": 2, "create": 3, "metadata": 0}
    assert restored == counts
    by_path = {it.path: plan.step_json(it) for it in pv.items}
    assert by_path[b"d"]["inner"] == {"create": 3}
    assert by_path[b"f"]["inner"] == {"delete": 3}


def test_hard_link_regrouping_is_metadata_for_both(tmp_path: Any) -> None:
    root = os.path.join(tmp_path, "layer")
    os.mkdir(root)
    a = {"a": trees.File(b"same", mtime_ns=10**18), "b": trees.HardLink("a")}
    b = {"a": trees.File(b"same", mtime_ns=10**18), "b": trees.File(b"same", mtime_ns=10**18)}
    counts, restored, _ = _preview_then_restore(root, os.path.join(tmp_path, "s"), a, b)
    assert counts == restored
    assert counts["change"] == 0


_OPS = ["keep", "keep", "keep", "drop", "owner", "content", "retype"]


@st.composite
def _mutations(draw: st.DrawFn) -> tuple[dict[bytes, Node], dict[bytes, Node]]:
    """A generated tree and a changed copy of it: entries kept, dropped (with what is
    below), given another owner, other content or another type, plus a generated subtree
    added."""
    a = draw(tree_specs(max_entries=25))
    b: dict[bytes, Node] = {}
    gone: list[bytes] = []
    for path, node in a.items():
        if any(path.startswith(g + b"/") for g in gone):
            continue
        op = "keep" if path == b"." else draw(st.sampled_from(_OPS))
        if op == "drop":
            gone.append(path)
            continue
        if isinstance(node, trees.HardLink):
            b[path] = node
            continue
        if op == "owner":
            node = dataclasses.replace(node, uid=(node.uid + 1) % 60000)
        elif op == "content" and isinstance(node, trees.File):
            node = dataclasses.replace(node, content=node.content + b"!")
        elif op == "content" and isinstance(node, trees.Symlink):
            node = dataclasses.replace(node, target=os.fsencode(node.target) + b"x")
        elif op == "retype":
            if isinstance(node, trees.Dir):
                gone.append(path)
                node = trees.File(b"was a directory")
            else:
                node = trees.Dir()
        b[path] = node
    for path, node in draw(tree_specs(max_entries=10)).items():
        if path != b".":
            if isinstance(node, trees.HardLink):
                node = trees.HardLink(b"added/" + os.fsencode(node.target))
            b[b"added/" + path] = node
    # a hard link whose first member is gone or no longer a file becomes a plain file
    for path, node in list(b.items()):
        if isinstance(node, trees.HardLink):
            first = b.get(os.fsencode(node.target))
            if not isinstance(first, trees.File | trees.Sparse):
                b[path] = trees.File(b"was a link")
    return a, b


@settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(states=_mutations())
def test_preview_counts_equal_the_restores_counts(
    states: tuple[dict[bytes, Node], dict[bytes, Node]],
) -> None:
    a, b = states
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "layer")
        os.mkdir(root)
        counts, restored, pv = _preview_then_restore(root, os.path.join(tmp, "store"), a, b)
        assert counts == restored, [plan.step_json(it) for it in pv.items]
