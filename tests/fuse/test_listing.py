"""The root follows the checkpoints as they are created and deleted, without a remount."""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING

import pytest

from tests.fuse.mounting import requires_fuse, wait_until

if TYPE_CHECKING:
    from collections.abc import Callable

    from sprite_env.checkpoints import Engine
    from tests.fuse.mounting import Mounted

pytestmark = [pytest.mark.fuse, requires_fuse]


def _write(root: str, name: str, text: str) -> None:
    with open(os.path.join(root, name), "w") as f:
        f.write(text)


def test_checkpoints_appear_and_disappear_while_mounted(
    root: str, engine: Engine, mount: Callable[..., Mounted]
) -> None:
    _write(root, "f", "zero")
    engine.create()
    with mount(list_ttl=0.2) as m:
        assert os.listdir(m.mountpoint) == [".checkpoints.json", "v0"]
        _write(root, "f", "one")
        engine.create()  # through the engine the mount reads from: the daemon's shape
        wait_until(
            lambda: sorted(os.listdir(m.mountpoint)) == [".checkpoints.json", "v0", "v1"], what="v1"
        )
        with open(m.path("v1", "f")) as f:
            assert f.read() == "one"
        with open(m.path("v0", "f")) as f:
            assert f.read() == "zero"
        engine.delete("v0")
        wait_until(lambda: os.listdir(m.mountpoint) == [".checkpoints.json", "v1"], what="v0 to go")
        # the kernel was told to forget the name: no stale lookup succeeds
        wait_until(lambda: not os.path.exists(m.path("v0")), what="v0's dentry to go")
        with pytest.raises(FileNotFoundError):
            os.stat(m.path("v0", "f"))


def test_refresh_shows_a_new_checkpoint_at_once(
    root: str, engine: Engine, mount: Callable[..., Mounted]
) -> None:
    engine.create()
    with mount(list_ttl=3600.0) as m:
        assert os.listdir(m.mountpoint) == [".checkpoints.json", "v0"]
        engine.create()
        assert os.listdir(m.mountpoint) == [
            ".checkpoints.json",
            "v0",
        ]  # within its TTL the listing stands
        m.ops.refresh()  # what a host calls after a job (thread-safe)
        assert sorted(os.listdir(m.mountpoint)) == [".checkpoints.json", "v0", "v1"]
        assert os.path.isdir(m.path("v1"))


def test_only_the_newest_count_are_shown_and_auto_ones_on_request(
    root: str, engine: Engine, mount: Callable[..., Mounted]
) -> None:
    for i in range(4):
        _write(root, "f", str(i))
        engine.create()
    auto = engine.create(auto=True)
    with mount(count=2) as m:
        assert sorted(os.listdir(m.mountpoint)) == [".checkpoints.json", "v2", "v3"]
        with pytest.raises(FileNotFoundError):
            os.stat(m.path("v1"))
        with pytest.raises(FileNotFoundError):
            os.stat(m.path(auto.id))
        # the root is dated by the newest checkpoint shown
        assert os.stat(m.mountpoint).st_mtime_ns == engine.info("v3").create_time_ns
    with mount(count=2, include_auto=True) as m:
        assert sorted(os.listdir(m.mountpoint)) == sorted([".checkpoints.json", auto.id, "v3"])
        with open(m.path(auto.id, "f")) as f:
            assert f.read() == "3"


def test_a_directory_of_a_deleted_checkpoint_is_stale_not_an_error(
    root: str, engine: Engine, mount: Callable[..., Mounted]
) -> None:
    os.makedirs(os.path.join(root, "a/b"))
    _write(root, "a/b/f", "x")
    engine.create()
    os.rename(os.path.join(root, "a"), os.path.join(root, "moved"))
    _write(root, "moved/b/f", "changed")  # so that a/b's tree exists in v0 only
    engine.create()
    with mount(list_ttl=0.1) as m:
        os.lstat(m.path("v0", "a", "b"))  # known to the kernel, its tree never read
        fd = os.open(m.path("v0", "a"), os.O_RDONLY | os.O_DIRECTORY)
        try:
            engine.delete("v0")  # a/ and a/b/ existed only in v0: their trees are gone
            m.ops.refresh()
            with pytest.raises(OSError, match="Stale file handle") as e:
                os.listdir(f"/proc/self/fd/{fd}/b")
            assert e.value.errno == errno.ESTALE
        finally:
            os.close(fd)
