"""Single paths restored, exported and read from any checkpoint (issue 10, point 5), in
process: the real engine, store and layer, compared with ``snapshot_tree``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sprite_env.checkpoints import Engine
from sprite_env.snapshot.paths import InvalidPath, PathNotFound
from tests.helpers.trees import assert_trees_equal, snapshot_tree

BIN = bytes(range(256)) * 64 + b"\0\xff" * 100
ODD = b"caf\xe9-\xff.bin"  # not UTF-8


def _write(root: str, rel: str | bytes, data: bytes) -> None:
    path = os.path.join(os.fsencode(root), os.fsencode(rel))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _read(root: str, rel: str | bytes) -> bytes:
    with open(os.path.join(os.fsencode(root), os.fsencode(rel)), "rb") as f:
        return f.read()


@pytest.fixture
def layer(root: str) -> str:
    _write(root, "app/config.txt", b"good config\n")
    _write(root, "app/lib/a.py", b"a = 1\n")
    _write(root, "app/lib/b.py", b"b = 2\n")
    _write(root, "data/blob.bin", BIN)
    _write(root, b"data/" + ODD, b"odd name\n")
    _write(root, "notes.txt", b"notes v0\n")
    return root


def _damage(root: str) -> None:
    """Changes made after v0: every kind of change, inside and outside the paths."""
    _write(root, "app/config.txt", b"broken config\n")
    _write(root, "app/lib/a.py", b"a = 'oops'\n")
    os.unlink(os.path.join(root, "app/lib/b.py"))
    _write(root, "app/lib/new.py", b"new\n")
    _write(root, "notes.txt", b"notes v1, kept\n")
    _write(root, "later/file.txt", b"written after v0\n")


def test_one_file_restored_the_rest_untouched(engine: Engine, layer: str) -> None:
    engine.create("v0")
    _damage(layer)
    before = snapshot_tree(layer)
    rep = engine.restore_paths("v0", ["/app/config.txt"])
    assert rep.undo is not None
    assert rep.paths == ["/app/config.txt"]
    assert _read(layer, "app/config.txt") == b"good config\n"
    # Everything else, the parent directories' metadata included, is as it was.
    assert_trees_equal(before, layer, ignore=["app/config.txt"], check_root_meta=True)
    after = snapshot_tree(layer)
    assert after[b"app"].mtime_ns == before[b"app"].mtime_ns
    # Undoable: the undo checkpoint holds the state before, whole.
    engine.restore(rep.undo)
    assert_trees_equal(before, layer)


def test_subtree_restored_deletions_and_creations(engine: Engine, layer: str) -> None:
    v0 = snapshot_tree(layer)
    engine.create("v0")
    _damage(layer)
    before = snapshot_tree(layer)
    engine.restore_paths("v0", ["app/lib"])
    # The subtree is as in v0: new.py deleted, b.py back, a.py's content back.
    now = snapshot_tree(layer)
    lib = {p: f for p, f in v0.items() if p.startswith(b"app/lib")}
    assert {p: f for p, f in now.items() if p.startswith(b"app/lib")} == lib
    assert_trees_equal(before, layer, ignore=["app/lib"])


def test_path_absent_in_the_checkpoint_is_deleted(engine: Engine, layer: str) -> None:
    engine.create("v0")
    _damage(layer)
    engine.restore_paths("v0", ["/later"])
    assert not os.path.lexists(os.path.join(layer, "later"))
    assert _read(layer, "notes.txt") == b"notes v1, kept\n"


def test_missing_parents_are_created_as_in_the_checkpoint(engine: Engine, layer: str) -> None:
    os.chmod(os.path.join(layer, "app/lib"), 0o750)
    v0 = snapshot_tree(layer)
    engine.create("v0")
    subprocess.run(["rm", "-rf", os.path.join(layer, "app")], check=True)
    engine.restore_paths("v0", ["app/lib/a.py"])
    assert _read(layer, "app/lib/a.py") == b"a = 1\n"
    assert not os.path.exists(os.path.join(layer, "app/lib/b.py"))
    assert not os.path.exists(os.path.join(layer, "app/config.txt"))
    now = snapshot_tree(layer)
    assert now[b"app/lib"].mode == v0[b"app/lib"].mode


def test_binary_file_and_non_utf8_name(engine: Engine, layer: str) -> None:
    engine.create("v0")
    _write(layer, b"data/" + ODD, b"changed\n")
    os.unlink(os.path.join(layer, "data/blob.bin"))
    rep = engine.restore_paths("v0", [os.fsdecode(b"/data/" + ODD), "/data/blob.bin"])
    assert _read(layer, b"data/" + ODD) == b"odd name\n"
    assert _read(layer, "data/blob.bin") == BIN
    assert rep.paths == sorted(["/data/blob.bin", os.fsdecode(b"/data/" + ODD)])


def test_read_any_checkpoint_byte_exact(engine: Engine, layer: str) -> None:
    engine.create("v0")
    _write(layer, "data/blob.bin", b"newer")
    auto = engine.create("", auto=True)
    assert b"".join(engine.read_file(*engine.find("v0", "/data/blob.bin"))) == BIN
    assert b"".join(engine.read_file(*engine.find(auto.id, "data/blob.bin"))) == b"newer"
    odd = engine.find("v0", b"/data/" + ODD)
    assert b"".join(engine.read_file(*odd)) == b"odd name\n"
    names = [e.name for e in engine.entries(*engine.find("v0", "/data"))]
    assert names == sorted([b"blob.bin", ODD])
    with pytest.raises(PathNotFound, match="no /nope in checkpoint v0"):
        engine.find("v0", "/nope")
    with pytest.raises(InvalidPath, match="not a file"):
        list(engine.read_file(*engine.find("v0", "/data")))


def test_sparse_file_read_with_its_holes(engine: Engine, root: str) -> None:
    path = os.path.join(root, "sparse")
    with open(path, "wb") as f:
        f.truncate(3 << 20)
        f.seek(1 << 20)
        f.write(b"middle")
    engine.create("v0")
    with open(path, "rb") as f:
        assert b"".join(engine.read_file(*engine.find("v0", "sparse"))) == f.read()


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("../etc/passwd", "'..'"),
        ("app/../../x", "'..'"),
        ("/", "whole layer"),
        ("nowhere/at/all", "neither in v0 nor in the live layer"),
    ],
)
def test_bad_paths_refused_nothing_changed(
    engine: Engine, layer: str, path: str, message: str
) -> None:
    engine.create("v0")
    _damage(layer)
    before = snapshot_tree(layer)
    count = len(engine.checkpoints(include_auto=True))
    with pytest.raises((InvalidPath, PathNotFound), match=message):
        engine.restore_paths("v0", [path])
    assert_trees_equal(before, layer)
    assert len(engine.checkpoints(include_auto=True)) == count


def test_symlink_on_the_way_is_never_followed(engine: Engine, layer: str, tmp_path: str) -> None:
    outside = os.path.join(os.fspath(tmp_path), "outside")
    os.mkdir(outside)
    _write(outside, "lib/a.py", b"outside, must stay\n")
    engine.create("v0")
    # Live: app is now a symlink out of the layer; restoring app/lib/a.py must not write
    # through it.
    subprocess.run(["rm", "-rf", os.path.join(layer, "app")], check=True)
    os.symlink(outside, os.path.join(layer, "app"))
    with pytest.raises(InvalidPath, match="/app is a symlink in the live layer"):
        engine.restore_paths("v0", ["app/lib/a.py"])
    assert _read(outside, "lib/a.py") == b"outside, must stay\n"
    # The symlink itself can be restored (replaced by v0's directory).
    engine.restore_paths("v0", ["app"])
    assert not os.path.islink(os.path.join(layer, "app"))
    assert _read(layer, "app/lib/a.py") == b"a = 1\n"
    assert _read(outside, "lib/a.py") == b"outside, must stay\n"
    # In the checkpoint: a symlink on the way is refused there too.
    engine.create("v1 with app restored")
    subprocess.run(["rm", "-rf", os.path.join(layer, "app")], check=True)
    os.symlink("/etc", os.path.join(layer, "app"))
    v2 = engine.create("v2")
    with pytest.raises(InvalidPath, match=f"/app is a symlink .* in {v2.id}"):
        engine.find(v2.id, "app/passwd")
    with pytest.raises(InvalidPath, match="symlink"):
        engine.restore_paths(v2.id, ["app/passwd"])


def test_hard_link_to_a_path_outside_is_cut(engine: Engine, root: str) -> None:
    _write(root, "keep/first", b"shared\n")
    os.mkdir(os.path.join(root, "sel"))
    os.link(os.path.join(root, "keep/first"), os.path.join(root, "sel/second"))
    engine.create("v0")
    os.unlink(os.path.join(root, "sel/second"))
    _write(root, "keep/first.tmp", b"other content now\n")
    os.replace(os.path.join(root, "keep/first.tmp"), os.path.join(root, "keep/first"))
    engine.restore_paths("v0", ["sel/second"])
    # Not linked to the live keep/first (which holds something else now).
    assert _read(root, "sel/second") == b"shared\n"
    assert _read(root, "keep/first") == b"other content now\n"


def test_noop_when_the_paths_already_match(engine: Engine, layer: str) -> None:
    engine.create("v0")
    _write(layer, "notes.txt", b"other\n")
    rep = engine.restore_paths("v0", ["app"])
    assert rep.noop
    assert rep.undo is None


def test_export_paths(engine: Engine, layer: str, tmp_path: str) -> None:
    v0 = snapshot_tree(layer)
    engine.create("v0")
    dest = os.path.join(os.fspath(tmp_path), "out")
    os.mkdir(dest)
    engine.export("v0", dest, paths=["app/lib", "/notes.txt"])
    got = snapshot_tree(dest)
    assert set(got) == {b".", b"app", b"app/lib", b"app/lib/a.py", b"app/lib/b.py", b"notes.txt"}
    for p in (b"app/lib", b"app/lib/a.py", b"notes.txt"):
        assert got[p] == v0[p]
    with pytest.raises(PathNotFound, match="no /nope in checkpoint v0"):
        engine.export("v0", os.path.join(os.fspath(tmp_path), "empty"), paths=["nope"])


def test_preview_paths_names_only_those(engine: Engine, layer: str) -> None:
    engine.create("v0")
    _damage(layer)
    changed = {d.path for d in engine.preview_paths("v0", ["app/lib"]).differences}
    # app/lib's mtime, a.py changed, b.py deleted, new.py added; config.txt and notes.txt
    # changed too, but are outside the path.
    assert changed == {b"app/lib", b"app/lib/a.py", b"app/lib/b.py", b"app/lib/new.py"}


_CRASH = """
import sys
from sprite_env.checkpoints import Engine
with Engine(sys.argv[1], sys.argv[2]) as e:
    e.restore_paths("v0", ["app/lib"])
"""


def test_killed_path_restore_resumes_only_those_paths(tmp_path: str, layer: str) -> None:
    store = os.path.join(os.fspath(tmp_path), "store")
    with Engine(layer, store) as e:
        e.create("v0")
    _damage(layer)
    env = {**os.environ, "SPRITE_ENV_CRASH_AT": "restore-entry-written:1"}
    r = subprocess.run([sys.executable, "-c", _CRASH, layer, store], env=env, check=False)
    assert r.returncode == -9
    with Engine(layer, store) as e:  # the open finishes it: those paths only
        assert e.pending_restore() is None
    assert _read(layer, "app/lib/a.py") == b"a = 1\n"
    assert not os.path.exists(os.path.join(layer, "app/lib/new.py"))
    assert _read(layer, "app/config.txt") == b"broken config\n"
    assert _read(layer, "notes.txt") == b"notes v1, kept\n"
