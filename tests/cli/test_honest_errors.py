"""Fast, honest errors (issue 10, point 4): --json errors are JSON with the API's code,
unknown ids are not found everywhere, a declined prompt is not "a bug", flags that mean
nothing to a command are refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.daemon import write_file

pytestmark = pytest.mark.integration


def test_json_errors_keep_the_code_and_unknown_ids_are_not_found(daemon_factory: Any) -> None:
    d = daemon_factory("--no-view")
    write_file(f"{d.root}/a", b"a")
    d.create("v0")
    for args in (
        ["checkpoints", "info", "v99"],
        ["checkpoints", "list", "--history", "v99"],
        ["checkpoints", "delete", "v99"],
        ["checkpoints", "diff", "v99"],
        ["restore", "v99", "--yes"],
    ):
        r = run_cli("--socket", d.socket, *args, "--json")
        assert r.returncode == 2, (args, r)
        err = json.loads(r.stdout)
        assert err["code"] == "not_found", (args, err)
        assert "v99" in err["message"]
        assert "Traceback" not in r.stderr


def test_the_daemon_refuses_flags_that_mean_nothing_to_it(tmp_path: Any) -> None:
    for flag in (["--socket", "/tmp/x.sock"], ["--as", "me"], ["--json"]):
        r = run_cli("daemon", "--root", str(tmp_path), "--no-view", *flag)
        assert r.returncode == 2, r
        assert f"{flag[0]} means nothing to the daemon" in r.stderr
    assert not (tmp_path / ".sprite").exists()
