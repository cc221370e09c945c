"""Every endpoint through ``curl --unix-socket``, the way scripts and people call it."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

pytestmark = pytest.mark.integration


def _curl(d: Any, *args: str) -> tuple[int, str]:
    """Runs curl; returns the HTTP status and the body."""
    p = d.curl("-w", "\n%{http_code}", *args)
    assert p.returncode == 0, p.stderr
    body, _, code = p.stdout.rpartition("\n")
    return int(code), body


def _lines(body: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in body.splitlines() if line.strip()]


def test_every_endpoint_with_curl(daemon: Any) -> None:
    root = daemon.root
    os.makedirs(os.path.join(root, "etc", "sprite", "services"))
    with open(os.path.join(root, "etc", "hosts"), "w") as f:
        f.write("127.0.0.1 localhost\n")
    with open(os.path.join(root, "etc", "sprite", "services", "tick.toml"), "w") as f:
        f.write('command = "while true; do echo tick; sleep 0.2; done"\n')
    u = "http://sprite"
    h = ["-H", "X-Sprite-Actor: curl-test"]

    code, body = _curl(daemon, *h, "-X", "POST", f"{u}/v1/checkpoint", "-d", '{"comment": "c0"}')
    assert code == 200
    assert _lines(body)[-1]["id"] == "v0"
    with open(os.path.join(root, "etc", "hosts"), "a") as f:
        f.write("10.0.0.2 db\n")
    code, body = _curl(daemon, "-X", "POST", f"{u}/v1/checkpoint", "-d", '{"comment": "c1"}')
    assert _lines(body)[-1]["id"] == "v1"
    code, body = _curl(daemon, "-X", "POST", f"{u}/v1/checkpoint", "-d", '{"auto": true}')
    auto = _lines(body)[-1]["id"]
    assert auto.startswith("auto-")

    code, body = _curl(daemon, f"{u}/v1/checkpoints")
    assert (code, [c["id"] for c in json.loads(body)]) == (200, ["v1", "v0"])
    code, body = _curl(daemon, f"{u}/v1/checkpoints?include_auto=true")
    assert [c["id"] for c in json.loads(body)] == [auto, "v1", "v0"]
    code, body = _curl(daemon, f"{u}/v1/checkpoints?history=v0")
    assert {c["id"] for c in json.loads(body)} == {"v0", "v1"}
    code, body = _curl(daemon, f"{u}/v1/checkpoints/v0")
    assert (code, json.loads(body)["created_by"]) == (200, "curl-test")
    code, body = _curl(daemon, f"{u}/v1/checkpoints/v0/diff?against=v1")
    assert (code, json.loads(body)["counts"]) == (200, {"modified": 1})
    code, body = _curl(daemon, f"{u}/v1/checkpoints/v0/diff")
    assert json.loads(body)["to"] == "live"
    code, body = _curl(daemon, f"{u}/v1/checkpoints/v0/preview")
    assert (code, json.loads(body)["counts"]["change"]) == (200, 1)

    code, body = _curl(daemon, "-X", "POST", f"{u}/v1/checkpoints/v0/restore")
    assert code == 202
    done = _lines(body)[-1]
    assert done["type"] == "complete"
    with open(os.path.join(root, "etc", "hosts")) as f:
        assert f.read() == "127.0.0.1 localhost\n"
    code, body = _curl(daemon, f"{u}/v1/jobs/{done['job']}")
    assert (code, json.loads(body)["state"]) == (200, "done")
    code, body = _curl(daemon, f"{u}/v1/jobs/{done['job']}/events")
    assert _lines(body)[-1] == done

    code, body = _curl(daemon, "-X", "DELETE", f"{u}/v1/checkpoints/v1")
    assert (code, json.loads(body)["id"]) == (200, "v1")
    code, body = _curl(daemon, "-X", "DELETE", f"{u}/v1/checkpoints/v0")
    assert (code, json.loads(body)["code"]) == (409, "active_checkpoint")

    code, body = _curl(daemon, f"{u}/v1/services")
    assert [s["name"] for s in json.loads(body)["services"]] == ["tick"]
    code, body = _curl(daemon, "-X", "POST", f"{u}/v1/services/tick/start")
    assert (code, json.loads(body)["state"]) == (200, "running")
    code, body = _curl(daemon, f"{u}/v1/services/tick/logs?lines=5")
    assert code == 200
    code, body = _curl(daemon, "-X", "POST", f"{u}/v1/services/tick/stop")
    assert (code, json.loads(body)["state"]) == (200, "stopped")

    code, body = _curl(daemon, "-X", "POST", f"{u}/v1/reset")
    assert (code, json.loads(body)["code"]) == (409, "no_base_image")  # no --overlay
    assert os.listdir(root) != []

    code, body = _curl(daemon, f"{u}/v1/activity?limit=50")
    log = json.loads(body)
    assert code == 200
    assert [(e["action"], e["id"]) for e in log if e["actor"] == "curl-test"] == [("create", "v0")]
    assert {e["action"] for e in log} >= {"create", "restore", "delete"}
    code, body = _curl(daemon, f"{u}/v1/status")
    assert (code, json.loads(body)["pid"]) == (200, daemon.proc.pid)
