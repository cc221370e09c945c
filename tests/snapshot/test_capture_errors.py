"""What an I/O error does during a capture (issue 15, point 9), pinned with a failing-reader
test double (borg's ``failing.py`` idea): the double makes reads or opens of one named
file fail with a chosen errno, at the system-call level the capture really uses."""

from __future__ import annotations

import errno
import os
import socket
from typing import TYPE_CHECKING, Any

import pytest

from sprite_env.checkpoints import Engine
from sprite_env.snapshot import capture
from sprite_env.snapshot.capture import CaptureFailed
from sprite_env.store import check
from tests.helpers.daemon import write_file

if TYPE_CHECKING:
    from collections.abc import Callable


def _failing(real: Callable[..., Any], name: str, err: int) -> Callable[..., Any]:
    """``real`` (os.readv, os.pread, ...), failing with ``err`` on descriptors of ``name``."""

    def call(fd: int, *args: Any, **kw: Any) -> Any:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target.endswith("/" + name):
            raise OSError(err, os.strerror(err))
        return real(fd, *args, **kw)

    return call


@pytest.fixture
def layer(tmp_path: Any) -> tuple[str, str]:
    root, store = str(tmp_path / "layer"), str(tmp_path / "store")
    write_file(os.path.join(root, "good.txt"), b"fine\n")
    write_file(os.path.join(root, "bad.bin"), os.urandom(100_000))
    return root, store


@pytest.mark.parametrize("err", [errno.EIO, errno.ENXIO, errno.EOVERFLOW])
def test_a_read_error_fails_the_checkpoint_naming_the_file(
    layer: tuple[str, str], monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    root, store = layer
    # The double fails Python's reads: the native batch read of small files (which hands
    # any file it cannot read back to this path, tests/snapshot/test_bulk_read.py) is off.
    monkeypatch.setattr(capture, "_read_start", None)
    with Engine(root, store, create=True) as e:
        monkeypatch.setattr(os, "readv", _failing(os.readv, "bad.bin", err))
        monkeypatch.setattr(os, "pread", _failing(os.pread, "bad.bin", err))
        with pytest.raises(CaptureFailed) as info:
            e.create("v0")
        monkeypatch.undo()
        assert "bad.bin" in str(info.value)
        assert "no checkpoint was taken" in str(info.value)
        assert info.value.code == "io_error"
        assert e.checkpoints(include_auto=True) == []  # nothing committed
        assert check(e.store, read_data=True).ok
        e.create("v0")  # the disk is back: the same checkpoint goes through
        assert [c.id for c in e.checkpoints()] == ["v0"]


def test_permission_errors_and_sockets_are_warnings_with_codes(
    layer: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, store = layer
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(os.path.join(root, "app.sock"))
    real_open = os.open

    def opening(path: Any, flags: int, *args: Any, dir_fd: int | None = None, **kw: Any) -> int:
        if os.fsencode(path) == b"bad.bin":
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_open(path, flags, *args, dir_fd=dir_fd, **kw)

    try:
        with Engine(root, store, create=True) as e:
            monkeypatch.setattr(capture, "_read_start", None)  # as above: Python's opens
            monkeypatch.setattr(os, "open", opening)
            cp = e.create("v0")
            monkeypatch.undo()
    finally:
        sock.close()
    codes = {w["path"]: w["code"] for w in cp.warnings}
    assert codes == {"bad.bin": "unreadable", "app.sock": "socket_skipped"}
    assert all(w["message"] for w in cp.warnings)
