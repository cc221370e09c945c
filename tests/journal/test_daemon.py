"""The real daemon runs the journal: its checkpoints say which walk they took and why."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from tests.helpers.daemon import write_file

pytestmark = pytest.mark.integration


def _info(d: Any, cid: str) -> dict[str, Any]:
    status, info = d.json("GET", f"/v1/checkpoints/{cid}")
    assert status == 200, info
    return info  # type: ignore[no-any-return]


def _layer(root: str) -> None:
    for i in range(4):
        write_file(os.path.join(root, "src", f"m{i}.py"), b"# module %d\n" % i)
        write_file(os.path.join(root, "docs", "deep", f"d{i}.md"), b"doc %d\n" % i)


def test_the_daemon_journal_narrows_checkpoints_and_sees_its_restores(
    daemon_factory: Any, layer: str
) -> None:
    _layer(layer)
    d = daemon_factory("--no-view", root=layer)  # the layer on a tmpfs of its own
    first = _info(d, d.create("first")["id"])
    assert first["walk"] == "full"
    assert "just started" in first["walk_reason"]

    time.sleep(0.06)  # past the racy window: what is read is what the journal named
    write_file(os.path.join(layer, "src", "m1.py"), b"# changed\n")
    os.unlink(os.path.join(layer, "docs", "deep", "d0.md"))
    second = _info(d, d.create("second")["id"])
    assert (second["walk"], second["walk_reason"]) == ("journal", "")
    assert second["files"] == 7

    status, evs = d.stream("POST", f"/v1/checkpoints/{first['id']}/restore")
    assert status == 202
    assert evs[-1]["type"] == "complete", evs
    time.sleep(0.06)
    third = _info(d, d.create("after the restore")["id"])
    assert third["walk"] == "journal"  # the restore's writes were events like any other
    status, diff = d.json("GET", f"/v1/checkpoints/{first['id']}/diff?against={third['id']}")
    assert status == 200
    assert diff["changes"] == [], diff
    assert third["files"] == first["files"] == 8


def test_no_journal_walks_everything_and_says_why(daemon_factory: Any, layer: str) -> None:
    _layer(layer)
    d = daemon_factory("--no-view", "--no-journal", root=layer)
    d.create("one")
    write_file(os.path.join(layer, "src", "new.py"), b"x")
    info = _info(d, d.create("two")["id"])
    assert info["walk"] == "full"
    assert info["walk_reason"] == "the change journal is off (--no-journal)"
