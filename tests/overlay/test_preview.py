"""Under an overlay, previews and diffs speak of the merged view a user sees, never of
UPPER's internals (issue 10): a whiteout the restore removes is the base image's file
coming back."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import pytest

from sprite_env.snapshot import plan
from tests.helpers.cli import run_cli
from tests.helpers.daemon import write_file

pytestmark = pytest.mark.integration


def test_preview_and_diff_show_merged_paths(overlay_daemon: Any) -> None:
    d, o = overlay_daemon, overlay_daemon.overlay
    d.create("base")  # UPPER empty: the environment is the base image
    merged = o.merged
    os.unlink(os.path.join(merged, "etc", "hosts"))  # a whiteout in UPPER
    shutil.rmtree(os.path.join(merged, "usr", "lib", "pkg"))
    os.makedirs(os.path.join(merged, "usr", "lib", "pkg"))  # an opaque directory
    write_file(os.path.join(merged, "usr", "lib", "pkg", "new.py"), b"# new\n")
    write_file(os.path.join(merged, "app", "main.py"), b"print('v0')\n")
    assert os.path.exists(os.path.join(o.upper, "etc", "hosts"))  # UPPER has the whiteout

    r = run_cli("restore", "v0", "--preview", env=d.env())
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == (
        "Restoring v0 would delete 3, change 0, create 4 and fix the metadata of 3 entries:"
    )
    assert lines[1:] == [
        "  delete    app/ (2 entries)",
        "  delete    usr/lib/pkg/new.py",
        "  create    etc/hosts",  # the whiteout goes: the base image's file is back
        "  create    usr/lib/pkg/m0.py",  # the opaque directory goes: the base's files
        "  create    usr/lib/pkg/m1.py",
        "  create    usr/lib/pkg/m2.py",
        "  metadata  etc/",  # MERGED's directories have other mtimes now
        "  metadata  usr/lib/",
        "  metadata  usr/lib/pkg/",
    ]

    r = run_cli("checkpoints", "diff", "v0", env=d.env())
    assert r.returncode == 0, r.stderr
    diff = r.stdout.splitlines()
    assert "- etc/hosts" in diff
    assert "+ etc" not in diff  # UPPER's new directory holding the whiteout is no news
    assert "- usr/lib/pkg/m0.py" in diff
    assert "+ usr/lib/pkg/new.py" in diff

    status, pv = d.json("GET", "/v1/checkpoints/v0/preview")
    assert status == 200
    assert {(c["path"], c["action"]) for c in pv["changes"]} >= {
        ("etc/hosts", "create"),
        ("usr/lib/pkg/new.py", "delete"),
    }
    assert pv["counts"]["create"] == 4
    status, between = d.json("GET", "/v1/checkpoints/v0/diff?against=v0")
    assert (status, between["changes"]) == (200, [])

    status, evs = d.stream("POST", "/v1/checkpoints/v0/restore")
    assert status == 202
    assert evs[-1]["type"] == "complete", evs
    # the restore reports what it did in the preview's units: MERGED's entries
    stats = evs[-1]["stats"]
    reported = {k: stats[f] for k, f in ((a.value, f) for a, f in plan.STATS_FIELD.items())}
    assert reported == {k: v for k, v in pv["counts"].items() if k != "remove"}
    with open(os.path.join(merged, "etc", "hosts")) as f:
        assert f.read() == "127.0.0.1 localhost\n"
    r = run_cli("checkpoints", "diff", "v0", "--json", env=d.env())
    assert json.loads(r.stdout)["changes"] == []


def test_a_copy_up_with_the_base_bytes_is_metadata_not_content(overlay_daemon: Any) -> None:
    d, o = overlay_daemon, overlay_daemon.overlay
    d.create("base")
    os.chmod(os.path.join(o.merged, "etc", "hosts"), 0o600)  # copied up, bytes unchanged
    write_file(os.path.join(o.merged, "usr", "lib", "pkg", "m0.py"), b"# edited\n")
    assert os.path.exists(os.path.join(o.upper, "etc", "hosts"))

    r = run_cli("restore", "v0", "--preview", env=d.env())
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "  metadata  etc/hosts" in lines
    assert "  change    usr/lib/pkg/m0.py" in lines
    assert not any(line.startswith("  change    etc/hosts") for line in lines)

    d.create("chmod")  # between two checkpoints: the copy's bytes are read from the store
    r = run_cli("checkpoints", "diff", "v0", "v1", env=d.env())
    assert "m etc/hosts" in r.stdout.splitlines()
    assert "M usr/lib/pkg/m0.py" in r.stdout.splitlines()
