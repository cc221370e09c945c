"""Nothing can wipe what it does not own (issue 10, point 1): the daemon has no default
layer (it once defaulted to ``/`` and its ``reset`` emptied it), and ``reset`` exists only
where there is a base image below the layer, an overlay's LOWER."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.daemon import write_file
from tests.helpers.trees import assert_trees_equal, snapshot_tree

pytestmark = pytest.mark.integration


def test_a_daemon_needs_to_be_told_its_layer(tmp_path: Any) -> None:
    state = tmp_path / "state"
    existed = os.path.exists("/.sprite")
    t0 = time.monotonic()
    r = run_cli("daemon", "--state", str(state), "--no-view")
    assert r.returncode == 2, r
    assert time.monotonic() - t0 < 30  # refused up front, not after serving anything
    assert "--overlay LOWER:UPPER:WORK:MERGED" in r.stderr
    assert "--root DIR" in r.stderr
    assert "Traceback" not in r.stderr
    assert not state.exists()  # nothing was created
    assert os.path.exists("/.sprite") == existed
    # Without --state either: no state directory appears under a default root.
    r = run_cli("daemon")
    assert r.returncode == 2, r
    assert os.path.exists("/.sprite") == existed


def test_reset_through_the_cli_on_a_plain_root_touches_nothing(daemon_factory: Any) -> None:
    d = daemon_factory("--no-view")
    write_file(os.path.join(d.root, "etc", "hosts"), b"127.0.0.1 localhost\n")
    write_file(os.path.join(d.root, "home", "me", "notes"), b"keep me\n")
    before = snapshot_tree(d.root)
    for args in (["reset"], ["reset", "--yes"], ["reset", "--yes", "--detach"]):
        r = run_cli("--socket", d.socket, *args)
        assert r.returncode == 2, r
        assert "needs a base image" in r.stderr, r.stderr
        assert "nothing was changed" in r.stderr
        assert_trees_equal(before, d.root)
    status, cps = d.json("GET", "/v1/checkpoints?include_auto=true")
    assert cps == []  # not even the undo checkpoint a reset takes first
