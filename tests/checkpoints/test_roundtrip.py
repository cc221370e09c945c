"""Capture -> restore round trips are exact: content and every attribute."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

import pytest
from hypothesis import HealthCheck, given, settings

from sprite_env.checkpoints import Engine
from sprite_env.snapshot.dircache import RACY_NS
from sprite_env.store import check
from tests.helpers import trees
from tests.helpers.strategies import trees as tree_specs


def _age() -> None:
    time.sleep(RACY_NS / 1e9 * 1.5)  # past the racy window, so the files cache can vouch


def test_sample_tree_round_trips_in_place(engine: Engine, root: str) -> None:
    trees.build_tree(root, trees.sample_spec(socket=True))
    before = trees.snapshot_tree(root, ignore=["run/app.sock"])
    v0 = engine.create("all features")
    assert [w["path"] for w in v0.warnings] == ["run/app.sock"]
    assert "socket" in v0.warnings[0]["message"]
    # wreck it: remove, change, add, retype
    shutil.rmtree(os.path.join(root, "hard"))
    shutil.rmtree(os.path.join(root, "deep"))
    os.chmod(os.path.join(root, "usr/bin/su"), 0o755)
    os.setxattr(os.path.join(root, "etc/passwd"), b"user.mime", b"changed")
    with open(os.path.join(root, "etc/passwd"), "ab") as f:
        f.write(b"evil:x:0:0::/:/bin/sh\n")
    os.unlink(os.path.join(root, "links/rel"))
    os.mkdir(os.path.join(root, "links/rel"))
    os.symlink("/", os.path.join(root, "etc/new-link"))
    engine.create("wrecked")
    report = engine.restore("v0")
    assert report.undo is not None
    assert report.undo.startswith("auto-")
    trees.assert_trees_equal(before, trees.snapshot_tree(root, ignore=["run/app.sock"]))
    assert os.path.exists(os.path.join(root, "run/app.sock"))  # never captured, left alone
    assert engine.active() == "v0"
    assert check(engine.store, read_data=True).ok


def test_export_into_an_empty_directory(
    engine: Engine, root: str, tmp_path: os.PathLike[str]
) -> None:
    trees.build_tree(root, trees.sample_spec())
    engine.create()
    dest = os.path.join(os.fspath(tmp_path), "out")
    os.mkdir(dest)
    engine.export("v0", dest)
    trees.assert_trees_equal(root, dest)


def test_restore_can_be_undone(engine: Engine, root: str) -> None:
    trees.build_tree(root, {"a": trees.File(b"1"), "b/c": trees.File(b"2")})
    engine.create()
    with open(os.path.join(root, "a"), "w") as f:
        f.write("precious work not checkpointed")
    work = trees.snapshot_tree(root)
    report = engine.restore("v0")
    with open(os.path.join(root, "a")) as f:
        assert f.read() == "1"
    assert report.undo is not None
    engine.restore(report.undo)
    trees.assert_trees_equal(work, root)


def test_sequence_of_checkpoints_each_restores_exactly(engine: Engine, root: str) -> None:
    trees.build_tree(root, trees.sample_spec())
    snaps = {}
    for i in range(4):
        snaps[engine.create(f"step {i}").id] = trees.snapshot_tree(root)
        p = os.path.join(root, f"new{i}")
        with open(p, "wb") as f:
            f.write(os.urandom(100_000) * (i + 1))
        os.rename(os.path.join(root, "etc"), os.path.join(root, f"etc{i}"))
        os.makedirs(os.path.join(root, "etc"))
        with open(os.path.join(root, "sparse/big"), "r+b") as f:
            f.seek(i * 1_000_000)
            f.write(b"changed" * 1000)
    for cid in ["v2", "v0", "v3", "v1", "v3"]:
        engine.restore(cid)
        trees.assert_trees_equal(snaps[cid], root)
    assert check(engine.store, read_data=True).ok


def test_unchanged_capture_reads_nothing_and_keeps_tree_ids(engine: Engine, root: str) -> None:
    trees.build_tree(root, trees.sample_spec())
    _age()
    v0 = engine.create()
    stats: list[object] = []
    v1 = engine.create(progress=lambda phase, s: stats.append(s))
    assert v1.top_tree == v0.top_tree
    last = stats[-1]
    # Re-read on purpose: the 5 hard-linked files (groups are re-derived each time) and
    # times/2100, whose mtime lies in the future and so is always "racy". Nothing else.
    assert last.files_read <= 6  # type: ignore[attr-defined]
    assert last.dirs_reused >= last.dirs - 8  # type: ignore[attr-defined]


def test_capture_after_restore_reads_nothing_new(engine: Engine, root: str) -> None:
    trees.build_tree(
        root, {f"d{i}/f{j}": trees.File(os.urandom(5000)) for i in range(5) for j in range(20)}
    )
    _age()
    engine.create()
    for i in range(5):
        with open(os.path.join(root, f"d{i}/f0"), "wb") as f:
            f.write(b"modified")
    os.mkdir(os.path.join(root, "extra"))
    engine.restore("v0")
    stats: list[object] = []
    v = engine.create(progress=lambda phase, s: stats.append(s))
    assert stats[-1].files_read == 0  # type: ignore[attr-defined]
    assert v.top_tree == engine.info("v0").top_tree


def test_real_tree_round_trips(engine: Engine, root: str, tmp_path: os.PathLike[str]) -> None:
    """The Python standard library and this venv's packages: files nobody here wrote.

    Without the interpreter's own site-packages and its test suite (on this machine 685 MB
    and 123 MB of the stdlib directory's 941 MB: 73 s of this test at load 8), its static
    library (one 46 MB archive), the venv's byte code (the stdlib's has that kind) and its
    five files over 4 MB (81 MB of .so): 180 MB and 12k entries left, of every kind the rest
    has. Here each file created costs 0.3-0.6 ms of the kernel's time (ext4), so the
    copies, not the engine, were most of this test's 20-36 s."""
    stdlib = sysconfig.get_paths()["stdlib"]
    site = sysconfig.get_paths()["purelib"]
    subprocess.run(
        ["rsync", "-aHAX", "--exclude=/site-packages", "--exclude=/test", "--exclude=/config-*"]
        + [f"{stdlib}/", os.path.join(root, "stdlib")],
        check=True,
    )
    subprocess.run(
        ["rsync", "-aHAX", "--max-size=4m", "--exclude=__pycache__"]
        + [f"{site}/", os.path.join(root, "site-packages")],
        check=True,
    )
    before = trees.snapshot_tree(root)
    v0 = engine.create("real")
    assert v0.files > 1000
    assert v0.warnings == []
    dest = os.path.join(os.fspath(tmp_path), "out")
    os.mkdir(dest)
    engine.export("v0", dest)
    trees.assert_trees_equal(before, dest)
    # and in place, after a typical change
    shutil.rmtree(os.path.join(root, "stdlib", "json"))
    with open(os.path.join(root, "stdlib", "os.py"), "ab") as f:
        f.write(b"\n# edited\n")
    engine.create("changed")
    engine.restore("v0")
    trees.assert_trees_equal(before, root)


@settings(
    max_examples=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(spec_a=tree_specs(), spec_b=tree_specs())
def test_generated_trees_round_trip(spec_a: dict, spec_b: dict) -> None:  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "layer")
        os.mkdir(root)
        trees.build_tree(root, spec_a)
        a = trees.snapshot_tree(root)
        with Engine(root, os.path.join(tmp, "store")) as e:
            e.create()
            # replace the whole tree with another generated one, capture, restore the first
            for name in os.listdir(root):
                p = os.path.join(root, name)
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p)
                else:
                    os.unlink(p)
            trees.build_tree(root, spec_b)
            b = trees.snapshot_tree(root)
            e.create()
            e.restore("v0")
            trees.assert_trees_equal(a, root)
            e.restore("v1")
            trees.assert_trees_equal(b, root)
            assert check(e.store, read_data=True).ok


@pytest.mark.skipif(sys.platform != "linux", reason="Linux only")
def test_names_that_are_not_utf8_and_255_bytes(engine: Engine, root: str) -> None:
    names = [b"\xff\xfe", b"x" * 255, "üñí".encode(), b"a\nb", b"-rf", b" space "]
    for n in names:
        with open(os.path.join(os.fsencode(root), n), "wb") as f:
            f.write(n)
    before = trees.snapshot_tree(root)
    engine.create()
    for n in names:
        os.unlink(os.path.join(os.fsencode(root), n))
    engine.restore("v0")
    trees.assert_trees_equal(before, root)


def test_hard_link_into_a_subdirectory_of_a_big_file(
    engine: Engine, root: str, tmp_path: os.PathLike[str]
) -> None:
    # The group's first member is written on a writer thread while the walk goes on into
    # a subdirectory holding the second name (a race hypothesis found once).
    trees.build_tree(
        root,
        {
            "d/a-big": trees.File(os.urandom(8 << 20)),
            "d/z/link": trees.HardLink("d/a-big"),
            "d/z/other": trees.File(b"x"),
        },
    )
    before = trees.snapshot_tree(root)
    engine.create()
    for i in range(3):
        dest = os.path.join(os.fspath(tmp_path), f"out{i}")
        os.mkdir(dest)
        engine.export("v0", dest)
        trees.assert_trees_equal(before, dest)


def test_a_file_that_keeps_changing_is_named_in_the_warnings(engine: Engine, root: str) -> None:
    import threading

    path = os.path.join(root, "busy.log")
    with open(path, "wb") as f:
        f.write(os.urandom(20 << 20))
    with open(os.path.join(root, "quiet"), "w") as f:
        f.write("still")
    stop = threading.Event()

    def writer() -> None:
        with open(path, "ab", buffering=0) as f:
            while not stop.is_set():
                f.write(b"x")
                time.sleep(0.0005)

    t = threading.Thread(target=writer)
    t.start()
    try:
        cp = engine.create()
    finally:
        stop.set()
        t.join()
    warned = {w["path"]: w["message"] for w in cp.warnings}
    assert "busy.log" in warned
    assert "changed while being read" in warned["busy.log"]
    assert "quiet" not in warned
    dest = os.path.join(root, "..", "out")
    os.mkdir(dest)
    engine.export(cp.id, dest)
    with open(os.path.join(dest, "quiet")) as f:
        assert f.read() == "still"
    assert os.path.getsize(os.path.join(dest, "busy.log")) >= 20 << 20


def test_hard_link_to_a_small_file_still_queued_in_a_parent_batch(
    engine: Engine, root: str, tmp_path: os.PathLike[str]
) -> None:
    # Small files go to the writers in batches per directory; the second name of a group
    # in a subdirectory must not be linked before its parent's batch was sent (found by
    # hypothesis).
    trees.build_tree(root, {"a": trees.File(b"x" * 100), "z/link": trees.HardLink("a")})
    before = trees.snapshot_tree(root)
    engine.create()
    dest = os.path.join(os.fspath(tmp_path), "out")
    os.mkdir(dest)
    engine.export("v0", dest)
    trees.assert_trees_equal(before, dest)
