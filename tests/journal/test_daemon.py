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


def test_under_an_overlay_the_journal_sees_writes_through_merged(
    daemon_factory: Any, fs: str, tmp_path: Any
) -> None:
    dirs = {n: os.path.join(fs, n) for n in ("lower", "upper", "work", "merged")}
    for p in dirs.values():
        os.mkdir(p)
    for i in range(3):
        write_file(os.path.join(dirs["lower"], "usr", "lib", f"m{i}.py"), b"# base %d\n" % i)
    spec = ":".join(dirs[n] for n in ("lower", "upper", "work", "merged"))
    d = daemon_factory(
        "--overlay", spec, "--no-view", root=dirs["merged"], state=str(tmp_path / "state")
    )
    merged = dirs["merged"]
    write_file(os.path.join(merged, "home", "app.py"), b"print(1)\n")
    first = _info(d, d.create("first")["id"])
    # Under an overlay a create is two passes: the first (running, here the full walk of
    # a journal just started) stores nearly everything; the second, with the writers
    # frozen, walks only what the journal saw during the first (issue 11, point 7).
    assert (first["walk"], first["walk_reason"]) == ("journal", "")

    time.sleep(0.06)
    with open(os.path.join(merged, "usr", "lib", "m1.py"), "ab") as f:  # copied up, then written
        f.write(b"# patched\n")
    os.unlink(os.path.join(merged, "usr", "lib", "m2.py"))  # a whiteout in UPPER
    second = _info(d, d.create("second")["id"])
    assert (second["walk"], second["walk_reason"]) == ("journal", "")
    status, diff = d.json("GET", f"/v1/checkpoints/{first['id']}/diff?against={second['id']}")
    assert status == 200
    changes = {c["path"]: c["change"] for c in diff["changes"]}
    assert changes["usr/lib/m1.py"] == "modified", diff
    assert changes["usr/lib/m2.py"] == "removed", diff

    status, evs = d.stream("POST", f"/v1/checkpoints/{first['id']}/restore")
    assert status == 202
    assert evs[-1]["type"] == "complete", evs
    time.sleep(0.06)
    third = _info(d, d.create("after the restore")["id"])
    assert third["walk"] == "journal"
    status, diff = d.json("GET", f"/v1/checkpoints/{first['id']}/diff?against={third['id']}")
    assert diff["changes"] == [], diff


def test_a_restarted_daemon_walks_everything_once(daemon_factory: Any, layer: str) -> None:
    _layer(layer)
    d = daemon_factory("--no-view", root=layer)
    d.create("one")
    assert d.stop() == 0
    write_file(os.path.join(layer, "src", "while-down.py"), b"x")  # no journal saw this
    d2 = daemon_factory("--no-view", root=layer)
    info = _info(d2, d2.create("two")["id"])
    assert info["walk"] == "full"
    assert "just started" in info["walk_reason"]
    assert info["files"] == 9
    time.sleep(0.06)
    write_file(os.path.join(layer, "src", "after.py"), b"y")
    info = _info(d2, d2.create("three")["id"])
    assert (info["walk"], info["files"]) == ("journal", 10)
