"""``sprite-env checkpoints mount``: the standalone server, as a real subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from sprite_env.fuse import mounts, unmount
from tests.fuse.mounting import requires_fuse, wait_until
from tests.helpers.cli import REPO, run_cli

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.fuse, pytest.mark.integration, requires_fuse]


def _mounted(path: str) -> bool:
    return any(m.mountpoint == path for m in mounts())


@pytest.fixture
def layer(tmp_path: os.PathLike[str]) -> Iterator[tuple[str, str]]:
    """A layer with checkpoint v0, and a mount point that is unmounted after the test."""
    root = os.path.join(os.fspath(tmp_path), "layer")
    os.makedirs(os.path.join(root, "etc"))
    with open(os.path.join(root, "etc", "hosts"), "w") as f:
        f.write("127.0.0.1 localhost\n")
    assert run_cli("--root", root, "store", "init").returncode == 0
    assert run_cli("--root", root, "checkpoints", "create").returncode == 0
    mnt = os.path.join(root, ".sprite", "checkpoints")
    try:
        yield root, mnt
    finally:
        if _mounted(mnt):
            with contextlib.suppress(Exception):
                unmount(mnt, lazy=True)


def _foreground(root: str) -> subprocess.Popen[bytes]:
    """``checkpoints mount --foreground``; its log lines go to ROOT/../mount.log."""
    with open(os.path.join(os.path.dirname(root), "mount.log"), "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "sprite_env", "--root", root, "checkpoints", "mount", "-f"],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )


def test_background_mount_holds_the_store_until_unmounted(layer: tuple[str, str]) -> None:
    root, mnt = layer
    r = run_cli("--root", root, "--json", "checkpoints", "mount")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["mountpoint"] == mnt
    assert info["shown"] == ["v0"]
    with open(os.path.join(mnt, "v0", "etc", "hosts")) as f:
        assert f.read() == "127.0.0.1 localhost\n"
    # the server holds the store (shared lock): writers are refused, readers are not
    r = run_cli("--root", root, "checkpoints", "create")
    assert r.returncode == 4
    assert "locked" in r.stderr
    assert run_cli("--root", root, "store", "check").returncode == 0
    # a second mount on the same point is refused with a clear message
    r = run_cli("--root", root, "checkpoints", "mount")
    assert r.returncode == 2
    assert "already a mount point" in r.stderr
    assert run_cli("--root", root, "checkpoints", "unmount").returncode == 0
    wait_until(lambda: not _pid_alive(info["pid"]), what="the server to exit")
    assert run_cli("--root", root, "checkpoints", "create").returncode == 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone too
        return f.read().split(") ", 1)[1][0] != "Z"


def test_sigterm_unmounts_and_a_killed_servers_mount_is_cleaned(
    layer: tuple[str, str],
) -> None:
    root, mnt = layer
    proc = _foreground(root)
    try:
        wait_until(lambda: _mounted(mnt), what="the mount")
        assert os.listdir(mnt) == [".checkpoints.json", "v0"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert not _mounted(mnt)
        with open(os.path.join(os.path.dirname(root), "mount.log")) as f:
            assert "SIGTERM: unmounting" in f.read()

        proc = _foreground(root)
        wait_until(lambda: _mounted(mnt), what="the second mount")
        os.listdir(mnt)
        proc.kill()  # a crash: the mount stays, dead
        proc.wait(20)
        with pytest.raises(OSError, match="Transport endpoint is not connected"):
            os.statvfs(mnt)  # (a listing may come from the kernel's cache for a while)

        r = run_cli("--root", root, "checkpoints", "mount")  # cleans it and mounts
        assert r.returncode == 0, r.stderr
        assert os.listdir(mnt) == [".checkpoints.json", "v0"]
        assert run_cli("--root", root, "checkpoints", "unmount").returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
