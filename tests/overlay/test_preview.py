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


def test_a_restore_counts_what_changed_after_its_check(overlay_daemon: Any) -> None:
    """The counts a restore reports are counted beside its check; when the layer changed
    after the check (here a session writes as it is ended), they are counted again against
    the undo checkpoint, and are what an offline diff of the two checkpoints counts."""
    import signal
    import subprocess

    from sprite_env.checkpoints import Engine

    d, o = overlay_daemon, overlay_daemon.overlay
    srv = os.path.join(o.merged, "srv")
    os.makedirs(srv)
    d.create("base")
    write_file(os.path.join(o.merged, "app", "main.py"), b"print('v1')\n")
    os.unlink(os.path.join(o.merged, "etc", "hosts"))
    # A session that writes into MERGED when the restore ends it, after the check.
    session = subprocess.Popen(
        ["sh", "-c", "trap 'echo bye > last-words; exit 0' TERM; echo up > ready; "
         "while :; do sleep 0.05; done"],
        cwd=srv,
    )  # fmt: skip
    try:
        while not os.path.exists(os.path.join(srv, "ready")):
            session.poll()
            assert session.returncode is None
        status, evs = d.stream("POST", "/v1/checkpoints/v0/restore")
    finally:
        if session.poll() is None:
            session.send_signal(signal.SIGKILL)
        session.wait()
    assert status == 202
    assert evs[-1]["type"] == "complete", evs
    stats, undo = evs[-1]["stats"], evs[-1]["undo"]
    assert not os.path.exists(os.path.join(srv, "last-words"))  # v0 had none
    assert d.stop() == 0
    with Engine(o.upper, os.path.join(d.state, "store"), create=False) as e:
        # the session's last words are in the undo checkpoint: the check did not see them
        assert b"srv/last-words" in {c.difference.path for c in e.diff("v0", undo)}
        counts = plan.counts(e.diff("v0", undo, base_image=o.lower))
    reported = {k: stats[f] for k, f in ((a.value, f) for a, f in plan.STATS_FIELD.items())}
    assert reported == counts
    assert counts["delete"] >= 4  # app/, app/main.py, srv/ready, srv/last-words
