"""One schema online and offline: the CLI's ``--json`` prints the API's shapes whether it
asks a daemon or runs the engine itself (``--root``), and both validate against
``api/shapes.py`` (issue 13, point 5: the offline CLI printed a second schema: a diff one
change per line, a preview's counts at the top, a create's bare checkpoint)."""

from __future__ import annotations

import json
import os
from typing import Any

import jsonschema
import pytest

from sprite_env.api import shapes
from tests.helpers.cli import run_cli
from tests.helpers.daemon import write_file

pytestmark = pytest.mark.integration

#: A command, and the shape its --json (the last line, for a job) has.
COMMANDS: list[tuple[tuple[str, ...], Any]] = [
    (("checkpoints", "list", "--include-auto"), list[shapes.Checkpoint]),
    (("checkpoints", "info", "v0"), shapes.Checkpoint),
    (("checkpoints", "diff", "v0", "v1"), shapes.Diff),
    (("checkpoints", "diff", "v0"), shapes.Diff),
    (("checkpoints", "cat", "v1", "/app"), shapes.Entry),
    (("checkpoints", "delete", "v0", "--dry-run"), shapes.DeleteReport),
    (("restore", "v0", "--preview"), shapes.Preview),
    (("restore", "v0", "--preview", "--path", "/app"), shapes.Preview),
    (("restore", "v0", "--yes"), shapes.CompleteEvent),
    (("restore", "v1", "--yes", "--path", "/app/new.py"), shapes.CompleteEvent),
]


def _layer(root: str) -> None:
    write_file(os.path.join(root, "app/main.py"), b"print(1)\n")


def _last(stdout: str) -> Any:
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert lines, "no output"
    return json.loads(lines[-1])


def _shape_of(value: Any) -> Any:
    """What a comparison of the two schemas looks at: keys, recursively (not values)."""
    if isinstance(value, dict):
        return {k: _shape_of(v) for k, v in value.items() if k not in ("job", "time")}
    if isinstance(value, list):
        return [_shape_of(v) for v in value[:1]]
    return type(value).__name__ if value is not None else None


def _run_all(cli: Any, root: str, dest: str) -> dict[str, Any]:
    _layer(root)
    out: dict[str, Any] = {}
    r = cli("checkpoints", "create", "--comment", "first", "--json")
    out["create"] = _last(r.stdout)
    write_file(os.path.join(root, "app/new.py"), b"x = 2\n")
    cli("checkpoints", "create", "--comment", "second")
    for args, shape in COMMANDS:
        r = cli(*args, "--json")
        assert r.returncode == 0, (args, r.stderr)
        value = _last(r.stdout)
        jsonschema.validate(value, shapes.json_schema(shape))
        out[" ".join(args)] = value
    r = cli("checkpoints", "export", "v0", dest, "--json")
    assert r.returncode == 0, r.stderr
    out["export"] = _last(r.stdout)
    for key in ("create", "export"):
        jsonschema.validate(out[key], shapes.json_schema(shapes.CompleteEvent))
    return out


def test_json_is_one_schema_online_and_offline(
    daemon_factory: Any, tmp_path: os.PathLike[str]
) -> None:
    base = os.fspath(tmp_path)
    offline_root = os.path.join(base, "offline")
    os.makedirs(offline_root)
    assert run_cli("--root", offline_root, "store", "init").returncode == 0
    offline = _run_all(
        lambda *a: run_cli("--root", offline_root, *a), offline_root, os.path.join(base, "o1")
    )

    d = daemon_factory("--no-view")
    online = _run_all(
        lambda *a: run_cli("--socket", d.socket, *a, env=d.env()),
        d.root,
        os.path.join(base, "o2"),
    )

    assert online.keys() == offline.keys()
    for key in online:
        assert _shape_of(offline[key]) == _shape_of(online[key]), key
    # The same answers, where nothing depends on where it ran.
    both = "checkpoints diff v0 v1"
    assert offline[both]["counts"] == online[both]["counts"] == {"added": 1, "meta": 1}
    assert offline["create"]["data"] == online["create"]["data"]
    assert "job" in online["create"]
    assert "job" not in offline["create"]  # no job offline
