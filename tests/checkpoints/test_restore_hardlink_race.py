"""A hard link planted while a restore runs never gets the checkpoint's metadata (issue 15,
point 6: 15 of 15 audit rounds changed an outside file's mode and mtime)."""

from __future__ import annotations

import os

import pytest

from sprite_env.checkpoints import Engine
from tests.helpers.daemon import write_file
from tests.helpers.races import when_restore_starts

OLD_NS = 1_000_000_000_123_456_789


@pytest.mark.parametrize("kind", ["file", "fifo"])
def test_a_planted_hard_link_keeps_its_own_metadata(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    base = os.fspath(tmp_path)
    root, outside = os.path.join(base, "layer"), os.path.join(base, "outside")
    secret = os.path.join(outside, "secret")
    write_file(secret, b"root's secret\n")  # same file system as the layer: linkable
    os.chmod(secret, 0o600)
    os.utime(secret, ns=(OLD_NS, OLD_NS))
    name = os.path.join(root, "app", "config")
    if kind == "file":
        write_file(name, b"config\n")
    else:
        os.makedirs(os.path.dirname(name))
        os.mkfifo(name)
    os.chmod(name, 0o644)
    with Engine(root, os.path.join(base, "store")) as engine:
        engine.create("v0")
        os.chmod(name, 0o640)  # only metadata differs: the restore would chmod it back

        def plant() -> None:
            os.unlink(name)
            os.link(secret, name)

        when_restore_starts(monkeypatch, engine, plant)
        engine.restore("v0")

    st = os.stat(secret)
    assert oct(st.st_mode & 0o7777) == oct(0o600)
    assert st.st_mtime_ns == OLD_NS
    with open(secret, "rb") as f:
        assert f.read() == b"root's secret\n"
    # The layer holds the checkpoint's entry, as a new inode of its own.
    live = os.lstat(name)
    assert live.st_ino != st.st_ino
    assert oct(live.st_mode & 0o7777) == oct(0o644)
    if kind == "file":
        with open(name, "rb") as f:
            assert f.read() == b"config\n"
    else:
        import stat

        assert stat.S_ISFIFO(live.st_mode)
