"""The five newest agent-session checkpoints are always kept by retention (issue 13)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.helpers.daemon import write_file

pytestmark = pytest.mark.integration


def test_the_newest_session_checkpoints_outlive_other_automatic_ones(daemon_factory: Any) -> None:
    d = daemon_factory("--no-view")
    write_file(os.path.join(d.root, "f"), b"base")
    d.create("v0")
    sessions = []
    for i in range(7):  # each session starts from a changed layer: none is skipped
        write_file(os.path.join(d.root, "f"), b"session %d" % i)
        done = d.create(auto=True, reason=f"before agent-{i} session")
        assert done.get("skipped") is not True
        sessions.append(done["id"])
    for i in range(6):  # restores: each takes an automatic undo checkpoint, newer still
        write_file(os.path.join(d.root, "f"), b"edit %d" % i)
        status, evs = d.stream("POST", "/v1/checkpoints/v0/restore")
        assert evs[-1]["type"] == "complete", evs
    status, cps = d.json("GET", "/v1/checkpoints?include_auto=true")
    ids = {c["id"] for c in cps}
    # The policy keeps the last 5 automatic ones (the undos here) and one an hour; the
    # five newest session points are kept on top of that, the older ones go.
    assert set(sessions[-5:]) <= ids
    assert not set(sessions[:2]) & ids
