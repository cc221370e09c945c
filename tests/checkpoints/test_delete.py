"""Delete frees space at once, in any order, and leaves a clean store with no garbage."""

from __future__ import annotations

import itertools
import os

import pytest

from sprite_env.checkpoints import Engine
from sprite_env.checkpoints.gc import mark
from sprite_env.store import check, stats


def _history(engine: Engine, root: str) -> None:
    """Four checkpoints: shared data, data unique to each, a file that moves around."""
    with open(os.path.join(root, "shared.bin"), "wb") as f:
        f.write(os.urandom(300_000))
    for i in range(4):
        with open(os.path.join(root, f"only{i}.bin"), "wb") as f:
            f.write(os.urandom(200_000 + i))
        if i:
            os.unlink(os.path.join(root, f"only{i - 1}.bin"))
        os.makedirs(os.path.join(root, f"dir{i}/sub"), exist_ok=True)
        engine.create(f"c{i}")


def _assert_no_garbage(engine: Engine) -> None:
    remaining = engine.checkpoints(include_auto=True)
    live = mark(engine.store.read, [c.top_tree for c in remaining])
    live |= {c.record for c in remaining if c.record is not None}
    in_store = {bytes(r[0]) for r in engine.store.catalog.query("SELECT id FROM objects")}
    assert in_store == live
    report = check(engine.store, read_data=True)
    assert report.ok, report.errors
    assert not report.warnings


@pytest.mark.parametrize("order", list(itertools.permutations(["v0", "v1", "v2"])))
def test_delete_in_every_order(engine: Engine, root: str, order: tuple[str, ...]) -> None:
    _history(engine, root)
    before = stats(engine.store).pack_bytes
    for cid in order:
        rep = engine.delete(cid)
        assert rep.bytes_freed >= 0
        _assert_no_garbage(engine)
    assert [c.id for c in engine.checkpoints()] == ["v3"]
    after = stats(engine.store)
    assert after.pack_bytes < before - 3 * 200_000  # the unique files are gone
    engine.restore("v3")  # what is left still restores
    _assert_no_garbage(engine)


def test_store_shrinks_to_what_remains(
    engine: Engine, root: str, tmp_path: os.PathLike[str]
) -> None:
    _history(engine, root)
    for cid in ("v0", "v1", "v2"):
        engine.delete(cid)
    # a fresh store holding just the same tree needs the same objects
    with Engine(root, os.path.join(os.fspath(tmp_path), "fresh")) as fresh:
        fresh.create("c3")
        want = stats(fresh.store)
    got = stats(engine.store)
    assert got.objects_by_kind == want.objects_by_kind
    # the same chunks and trees; only the checkpoint records differ (history, comment)
    assert abs(got.raw_bytes - want.raw_bytes) < 100


def test_delete_reports_what_it_freed(engine: Engine, root: str) -> None:
    with open(os.path.join(root, "big"), "wb") as f:
        f.write(os.urandom(2_000_000))
    engine.create()
    os.unlink(os.path.join(root, "big"))
    engine.create()
    rep = engine.delete("v0")
    assert 2_000_000 <= rep.bytes_freed < 2_200_000
    assert rep.objects_removed >= 8  # ~64 KiB chunks of 2 MB, plus trees and the record


def test_files_cache_never_points_at_pruned_trees(engine: Engine, root: str) -> None:
    os.makedirs(os.path.join(root, "d"))
    with open(os.path.join(root, "d/f"), "w") as f:
        f.write("one")
    engine.create()
    engine.create(auto=True)  # the files cache now names this one's trees
    engine.restore("v0")
    for c in engine.checkpoints(include_auto=True):
        if c.is_auto:
            engine.delete(c.id)
    v = engine.create()  # must not reuse a tree id the store dropped
    dest = os.path.join(root, "..", "out")
    os.mkdir(dest)
    engine.export(v.id, dest)
    with open(os.path.join(dest, "d/f")) as f:
        assert f.read() == "one"
    _assert_no_garbage(engine)
