"""``.checkpoints.json`` at the view's root: what each checkpoint shown is, read through a
real mount, fresh after each commit (the kernel told to drop what it cached), and nothing
of it inside a checkpoint's own tree."""

from __future__ import annotations

import glob
import json
import os
from typing import TYPE_CHECKING, Any

import pytest

from tests.fuse.mounting import requires_fuse

if TYPE_CHECKING:
    from collections.abc import Callable

    from sprite_env.checkpoints import Engine
    from tests.fuse.mounting import Mounted

pytestmark = [pytest.mark.fuse, requires_fuse]

NAME = ".checkpoints.json"


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _status(m: Mounted) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(_read(m.path(NAME)))
    return rows


def _write(root: str, name: str, text: str) -> None:
    with open(os.path.join(root, name), "w") as f:
        f.write(text)


@pytest.mark.parametrize("no_open", [True, False], ids=["no-open", "open"])
def test_the_file_lists_each_checkpoint_shown_and_is_fresh_after_a_commit(
    root: str, engine: Engine, mount: Callable[..., Mounted], no_open: bool
) -> None:
    _write(root, "f", "zero")
    v0 = engine.create("first one")
    engine.create("a timer", auto=True)  # not shown (no include_auto): not listed either
    # a TTL of an hour: only the refresh after the commit (what the daemon calls), and
    # the kernel being told to drop the file's pages and attributes, make it fresh
    with mount(list_ttl=3600.0, no_open=no_open) as m:
        assert _status(m) == [
            {
                "id": "v0",
                "created": v0.create_time,
                "comment": "first one",
                "auto": False,
                "storage": "local",  # a local store: nothing is ever remote
            }
        ]
        st = os.stat(m.path(NAME))
        assert st.st_mode & 0o777 == 0o444
        assert st.st_size == len(_read(m.path(NAME)))
        _write(root, "f", "one")
        engine.create("second")
        m.ops.refresh()
        rows = _status(m)  # newest first, as the root shows them
        assert [(r["id"], r["comment"]) for r in rows] == [("v1", "second"), ("v0", "first one")]
        assert os.stat(m.path(NAME)).st_size == len(_read(m.path(NAME)))
        assert os.stat(m.path(NAME)).st_mtime_ns > st.st_mtime_ns
        engine.delete("v0")
        m.ops.refresh()
        assert [r["id"] for r in _status(m)] == ["v1"]


def test_the_file_is_hidden_read_only_and_nothing_is_added_inside_a_checkpoint(
    root: str, engine: Engine, mount: Callable[..., Mounted]
) -> None:
    _write(root, "f", "x")
    engine.create()
    with mount() as m:
        # hidden by its dot: a glob (what `ls` and `for d in */` see) has only checkpoints
        assert [os.path.basename(p.rstrip("/")) for p in glob.glob(m.path("*/"))] == ["v0"]
        assert [os.path.basename(p) for p in glob.glob(m.path("*"))] == ["v0"]
        assert os.listdir(m.mountpoint) == [NAME, "v0"]  # `ls -a` shows it
        # a checkpoint's root is exactly the captured root: no synthetic xattr, no file
        assert os.listxattr(m.path("v0")) == os.listxattr(root)
        assert sorted(os.listdir(m.path("v0"))) == ["f"]
        assert os.listxattr(m.path(NAME)) == []
        with pytest.raises(OSError, match="No data available"):
            os.getxattr(m.path(NAME), "user.storage")
        for flags in (os.O_WRONLY, os.O_RDWR | os.O_TRUNC):
            with pytest.raises(OSError, match="Read-only file system"):
                os.open(m.path(NAME), flags)
        with pytest.raises(OSError, match="Read-only file system"):
            os.unlink(m.path(NAME))
        assert _status(m)[0]["id"] == "v0"  # unharmed
