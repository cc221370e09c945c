"""``sprite-env checkpoints ...`` as a subprocess: output, JSON and exit codes."""

from __future__ import annotations

import json
import os

from tests.helpers.cli import run_cli
from tests.helpers.trees import assert_trees_equal, snapshot_tree


def test_full_loop(tmp_path: os.PathLike[str]) -> None:
    root = os.path.join(os.fspath(tmp_path), "layer")
    os.mkdir(root)
    with open(os.path.join(root, "a"), "w") as f:
        f.write("one")

    def cli(*args: str) -> tuple[int, str, str]:
        r = run_cli("--root", root, *args)
        return r.returncode, r.stdout, r.stderr

    assert cli("store", "init")[0] == 0  # offline, only store init creates one (issue 10)
    code, out, _ = cli("checkpoints", "create", "--comment", "first")
    assert code == 0
    assert out.endswith("Checkpoint created: v0\n")  # Sprites' line, last
    with open(os.path.join(root, "b"), "w") as f:
        f.write("two")
    code, out, _ = cli("checkpoints", "create", "--comment", "second", "--json")
    assert json.loads(out)["id"] == "v1"
    code, out, _ = cli("checkpoints", "list", "--json")
    assert [c["id"] for c in json.loads(out)] == ["v1", "v0"]
    code, out, _ = cli("checkpoints", "list")
    assert "second" in out
    assert "v1 *" in out
    code, out, _ = cli("checkpoints", "info", "v0")
    assert "Comment:  first" in out
    code, out, _ = cli("checkpoints", "diff", "v0", "v1")
    assert "+ b" in out.splitlines()
    code, out, _ = cli("restore", "v0", "--preview", "--json")
    assert json.loads(out)["counts"]["remove"] == 1  # the API's preview, as online
    code, out, _ = cli("restore", "v0")  # no terminal: a script, and every restore undoes
    assert code == 0
    assert "undo with: sprite-env restore auto-" in out
    assert not os.path.exists(os.path.join(root, "b"))
    code, out, _ = cli("restore", "v0", "--yes")  # already there: nothing happens
    assert (code, out) == (0, "The layer already is v0: nothing to restore\n")
    code, _, err = cli("checkpoints", "delete", "v0")
    assert code == 2
    assert "cannot delete active checkpoint" in err
    code, out, _ = cli("checkpoints", "delete", "v1", "--json")
    assert code == 0
    assert json.loads(out)["bytes_freed"] > 0
    code, _, err = cli("checkpoints", "info", "v7")
    assert code == 2
    assert "not found" in err
    assert "Traceback" not in err
    code, _, err = cli("checkpoints", "info", "../etc")
    assert code == 2
    assert "invalid checkpoint id" in err
    code, out, _ = cli("store", "check", "--read-data")
    assert code == 0
    assert ": ok" in out
    dest = os.path.join(os.fspath(tmp_path), "export")
    code, _, _ = cli("checkpoints", "export", "v0", dest)
    with open(os.path.join(dest, "a")) as f:
        assert f.read() == "one"


def test_excludes_are_saved_in_the_store(tmp_path: os.PathLike[str]) -> None:
    root = os.path.join(os.fspath(tmp_path), "layer")
    os.makedirs(os.path.join(root, "cache"))
    for name in ("cache/big", "keep"):
        with open(os.path.join(root, name), "w") as f:
            f.write(name)
    assert run_cli("--root", root, "store", "init").returncode == 0
    # --json: the complete event a daemon's create ends with, its checkpoint inside.
    r = run_cli("--root", root, "checkpoints", "create", "--exclude", "cache", "--json")
    assert json.loads(r.stdout)["checkpoint"]["files"] == 1
    r = run_cli("--root", root, "checkpoints", "create", "--json")  # the saved list applies
    assert json.loads(r.stdout)["checkpoint"]["files"] == 1
    os.unlink(os.path.join(root, "keep"))
    r = run_cli("--root", root, "restore", "v0", "--yes")
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(root)) == [".sprite", "cache", "keep"]
    assert os.listdir(os.path.join(root, "cache")) == ["big"]


def test_offline_reset_is_refused_and_touches_nothing(tmp_path: os.PathLike[str]) -> None:
    # Offline there is no base image: a reset would empty the layer (issue 10).
    root = os.path.join(os.fspath(tmp_path), "layer")
    os.mkdir(root)
    with open(os.path.join(root, "a"), "w") as f:
        f.write("one")
    assert run_cli("--root", root, "store", "init").returncode == 0
    assert run_cli("--root", root, "checkpoints", "create").returncode == 0
    before = snapshot_tree(root)
    for args in (["reset"], ["reset", "--yes"], ["reset", "--yes", "--json"]):
        r = run_cli("--root", root, *args)
        assert r.returncode == 2, r
        assert "needs a base image" in r.stderr
        assert "nothing was changed" in r.stderr
        assert "Traceback" not in r.stderr
        assert_trees_equal(before, root)
    r = run_cli("--root", root, "checkpoints", "list", "--include-auto", "--json")
    assert [c["id"] for c in json.loads(r.stdout)] == ["v0"]  # no undo point: nothing ran
