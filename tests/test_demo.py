"""The README's demo command runs end to end against a real daemon and checks what it
claims, leaving no daemon and no mount behind."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from sprite_env import demo
from sprite_env.demo import build_sample_tree, mounted_under, run_demo
from sprite_env.snapshot.filedata import ChunkRef, read_chunks, store_file
from sprite_env.store.chunker import Chunker
from tests.helpers.cli import run_cli

if TYPE_CHECKING:
    from sprite_env.store import Store


def _processes_in(base: str) -> list[str]:
    """Command lines of the processes working in ``base`` or naming it in an argument
    (the demo starts its daemon in ``base`` with ``--state state``)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue  # gone meanwhile, or not ours to see
        if cwd == base or cwd.startswith(base + "/") or any(base in arg for arg in argv):
            found.append(" ".join(argv))
    return found


def _assert_nothing_left(base: str) -> None:
    assert mounted_under(base) == []
    with open("/proc/self/mountinfo") as f:
        assert base not in f.read()
    assert _processes_in(base) == []
    with open(os.path.join(base, "daemon.log")) as f:
        log = f.read()
    assert "Traceback" not in log, log


@pytest.mark.integration
def test_demo_runs_the_loop_against_a_daemon(tmp_path: os.PathLike[str]) -> None:
    base = os.path.join(os.fspath(tmp_path), "demo")
    r = run_cli("demo", "--dir", base)
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    assert out.rstrip().splitlines()[-1].startswith("demo OK")
    for step in [
        "$ sprite-env daemon --root layer --state state --auto-interval 0",
        "$ sprite-env checkpoints create --comment 'sample tree'",
        "Checkpoint created: v0",
        "Checkpoint created: v1",
        "$ sprite-env checkpoints diff v0 v1",
        "M src/pkg3/mod7.py",
        "$ sprite-env restore v0 --preview",
        "$ sprite-env restore v0 --yes",
        "Restored v0",
        "undo with: sprite-env restore auto-",
        "the layer equals the sample tree",
        "$ sprite-env checkpoints log",
        "$ sprite-env curl /v1/checkpoints",
        "[1]+ Done (exit status 0)",
        "$ sprite-env --root layer --store state/store store check --read-data",
        "objects read and hashed: ok",
    ]:
        assert step in out, f"{step!r} missing from:\n{out}"
    if os.path.exists("/dev/fuse") and "view did not mount" not in out:
        assert "$ ls state/checkpoints" in out
        assert "> # edited by the demo" in out
        assert "state/checkpoints unmounted" in out
    assert len(out.splitlines()) < 80  # a screenful or so
    _assert_nothing_left(base)


@pytest.mark.integration
def test_demo_without_the_view(tmp_path: os.PathLike[str]) -> None:
    base = os.path.join(os.fspath(tmp_path), "demo")
    r = run_cli("demo", "--dir", base, "--no-view")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "--auto-interval 0 --no-view" in r.stdout
    assert "skipped: browsing state/checkpoints/" in r.stdout
    assert "$ ls state/checkpoints" not in r.stdout
    assert "demo OK" in r.stdout
    _assert_nothing_left(base)


def test_demo_refuses_a_directory_in_use(tmp_path: os.PathLike[str]) -> None:
    os.mkdir(os.path.join(tmp_path, "state"))
    lines: list[str] = []
    assert not run_demo(os.fspath(tmp_path), say=lines.append)
    assert lines[-1].startswith("demo FAILED:")
    assert "choose an empty directory" in lines[-1]


@pytest.mark.integration
def test_demo_failing_says_why_and_cleans_up(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    start = demo.DaemonProcess.start

    def bad_start(self: demo.DaemonProcess) -> int:
        self.args += ["--max-checkpoints", "0"]  # the daemon refuses to start
        return start(self)

    monkeypatch.setattr(demo.DaemonProcess, "start", bad_start)
    base = os.path.join(os.fspath(tmp_path), "demo")
    lines: list[str] = []
    assert not run_demo(base, say=lines.append)
    assert lines[-1] == "demo FAILED: the daemon exited with 2 at start"
    assert any("--max-checkpoints must be at least 1" in line for line in lines)
    _assert_nothing_left(base)


def test_sparse_file_becomes_holes(tmp_path: os.PathLike[str], store: Store) -> None:
    root = os.path.join(tmp_path, "tree")
    build_sample_tree(root)
    path = os.path.join(root, "data", "disk.img")
    with store.writer() as w:
        refs = store_file(path, w, Chunker())
        w.commit()
    holes = [r for r in refs if r.oid is None]
    assert sum(r.length for r in holes) > 10 << 20  # most of the 16 MiB image
    with open(path, "rb") as f:
        assert b"".join(read_chunks(store, refs)) == f.read()
    assert all(isinstance(r, ChunkRef) for r in refs)
