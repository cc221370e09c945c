"""Failures reach the reader as EIO with one log line; the file system stays up."""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING

import pytest

from sprite_env.errors import StoreError
from sprite_env.fuse import StoreSource, ViewConfig
from sprite_env.snapshot.diff import top_entry
from sprite_env.snapshot.tree import decode_chunks, decode_tree
from tests.fuse.mounting import Mounted, requires_fuse

if TYPE_CHECKING:
    from collections.abc import Callable

    from sprite_env.checkpoints import Engine
    from sprite_env.ids import ObjectId

pytestmark = [pytest.mark.fuse, requires_fuse]


def _write(root: str, name: str, data: bytes) -> None:
    path = os.path.join(root, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _first_object(engine: Engine, name: bytes) -> ObjectId:
    read = engine.store.read
    top = top_entry(read, engine.info("v0").top_tree)
    entry = next(e for e in decode_tree(read(top.subtree)) if e.name == name)
    oid = decode_chunks(entry.payload)[0][0]
    assert oid is not None
    return oid


def test_a_damaged_pack_gives_eio_and_a_log_line(
    root: str, engine: Engine, mount: Callable[..., Mounted], expect_log: Callable[[str], None]
) -> None:
    _write(root, "bad", os.urandom(100_000))
    _write(root, "good", b"still fine")
    engine.create()
    loc = engine.store.catalog.locate(_first_object(engine, b"bad"))
    assert loc is not None
    path = os.path.join(engine.store.packs_dir, f"{loc.pack}.pack")
    with open(path, "r+b") as f:  # flip one byte in the middle of the object's payload
        f.seek(loc.entry.offset + loc.entry.stored_len // 2 + 64)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    expect_log(r"v0/bad: corrupt pack .*hash mismatch")
    with mount() as m:
        with (
            open(m.path("v0", "bad"), "rb") as f,
            pytest.raises(OSError, match="Input/output error") as e,
        ):
            f.read()
        assert e.value.errno == errno.EIO
        with open(m.path("v0", "good"), "rb") as f:
            assert f.read() == b"still fine"


class _BrokenSource(StoreSource):
    """A source whose reads of one tree fail in a chosen way."""

    broken: ObjectId | None = None
    error: Exception = RuntimeError("a bug")

    def read(self, oid: ObjectId) -> bytes:
        if oid == self.broken:
            raise self.error
        return super().read(oid)


@pytest.mark.parametrize(
    ("error", "logged"),
    [
        (StoreError("the disk is on fire"), r"v0/sub: the disk is on fire"),
        # opendir without open reads nothing: then readdir reads the tree
        (RuntimeError("a bug"), r"(opendir|readdir) failed \(a bug\)"),
    ],
)
def test_store_errors_and_bugs_become_eio(
    root: str,
    engine: Engine,
    mountpoint: str,
    expect_log: Callable[[str], None],
    error: Exception,
    logged: str,
) -> None:
    _write(root, "sub/f", b"x")
    _write(root, "other/f", b"y")
    engine.create()
    read = engine.store.read
    top = top_entry(read, engine.info("v0").top_tree)
    sub = next(e for e in decode_tree(read(top.subtree)) if e.name == b"sub")
    source = _BrokenSource(engine.store, engine.registry)
    source.broken, source.error = sub.subtree, error
    expect_log(logged)
    with Mounted(source, mountpoint, ViewConfig()) as m:
        with pytest.raises(OSError, match="Input/output error"):
            os.listdir(m.path("v0", "sub"))
        assert os.listdir(m.path("v0", "other")) == ["f"]  # the rest keeps working
