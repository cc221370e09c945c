"""Hard links in the overlay's merged view: one inode per group, as in MERGED itself."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.helpers.daemon import write_file

pytestmark = pytest.mark.integration


def test_a_hard_link_group_has_one_inode_in_the_merged_view(overlay_daemon: Any) -> None:
    d, o = overlay_daemon, overlay_daemon.overlay
    merged = o.merged
    write_file(os.path.join(merged, "app", "data.bin"), b"shared bytes\n")
    os.makedirs(os.path.join(merged, "other"))
    os.link(os.path.join(merged, "app", "data.bin"), os.path.join(merged, "other", "alias"))
    os.link(os.path.join(merged, "app", "data.bin"), os.path.join(merged, "app", "zz"))
    write_file(os.path.join(merged, "app", "lone"), b"shared bytes\n")  # same bytes, no link
    names = ["app/data.bin", "other/alias", "app/zz"]
    live = [os.lstat(os.path.join(merged, n)) for n in names]
    assert len({s.st_ino for s in live}) == 1  # overlayfs: one inode
    d.create("v0")
    view = os.path.join(d.state, "checkpoints", "v0")
    shown = [os.lstat(os.path.join(view, n)) for n in names]
    assert len({s.st_ino for s in shown}) == 1, [s.st_ino for s in shown]
    assert all(s.st_nlink == 3 for s in shown)
    assert os.lstat(os.path.join(view, "app", "lone")).st_ino != shown[0].st_ino
    for n in names:
        with open(os.path.join(view, n), "rb") as f:
            assert f.read() == b"shared bytes\n"
    # a base-image file next to them keeps an inode of its own
    assert os.lstat(os.path.join(view, "etc", "hosts")).st_ino != shown[0].st_ino
