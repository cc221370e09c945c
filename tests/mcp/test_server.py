"""``sprite-env mcp`` driven by the SDK's own client over stdio, against a real daemon:
the tools each scope offers and refuses, the whole loop (create, list, get, diff, read a
file, preview, restore with its undo, restore paths, delete), tool errors with the API's
code, the session checkpoint and its skip rule, and the actor from ``clientInfo``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as mt
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from sprite_env.client import Client
from tests.helpers.cli import REPO

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

pytestmark = pytest.mark.integration

READ = {
    "checkpoint_list",
    "checkpoint_get",
    "checkpoint_diff",
    "checkpoint_preview_restore",
    "checkpoint_read_file",
}
CREATE = READ | {"checkpoint_create"}
FULL = CREATE | {"checkpoint_restore", "checkpoint_restore_path", "checkpoint_delete"}


@asynccontextmanager
async def session(
    sock: str, *args: str, name: str = "test-agent", version: str = "9.9"
) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "sprite_env", "mcp", *args],
        env={**os.environ, "SPRITE_API_SOCK": sock, "SPRITE_API_WAIT": "5"},
        cwd=REPO,
    )
    # (the server's stderr needs a real file: pytest's captured one has no descriptor)
    with open(os.devnull, "w") as errlog:  # noqa: ASYNC230
        async with stdio_client(params, errlog=errlog) as (read, write):
            info = mt.Implementation(name=name, version=version)
            async with ClientSession(read, write, client_info=info) as s:
                await s.initialize()
                yield s


def run(main: Callable[[], Awaitable[None]]) -> None:
    anyio.run(main)


async def call(s: ClientSession, tool: str, **args: Any) -> dict[str, Any]:
    """A tool's structured answer; fails the test on a tool error."""
    r = await s.call_tool(tool, args)
    assert not r.is_error, r.content
    assert isinstance(r.structured_content, dict)
    # the text says the same as the structured content
    first = r.content[0]
    assert isinstance(first, mt.TextContent)
    assert json.loads(first.text) == r.structured_content
    return r.structured_content


async def error(s: ClientSession, tool: str, **args: Any) -> dict[str, Any]:
    r = await s.call_tool(tool, args)
    assert r.is_error, r.structured_content
    assert isinstance(r.structured_content, dict)
    return r.structured_content


def test_each_scope_offers_its_tools_with_true_annotations(daemon: Any) -> None:
    async def main() -> None:
        for scope, names in (("read", READ), ("create", CREATE), ("full", FULL)):
            async with session(daemon.socket, "--scope", scope, "--no-session-checkpoint") as s:
                tools = {t.name: t for t in (await s.list_tools()).tools}
                # no base image under --root: no environment_reset even in full
                assert set(tools) == names, scope
                for t in tools.values():
                    a = t.annotations
                    assert a is not None
                    assert a.open_world_hint is False
                    assert a.read_only_hint is (t.name in READ), t.name
                    restores = t.name.startswith(("checkpoint_restore", "checkpoint_delete"))
                    assert a.destructive_hint is restores, t.name
                    assert t.input_schema["type"] == "object"
                assert tools["checkpoint_get"].input_schema["required"] == ["id"]
                if scope != "full":
                    refused = await error(s, "checkpoint_restore", id="v1")
                    assert refused["code"] == "out_of_scope"
                    assert "--scope full" in refused["message"]
                if scope == "read":
                    refused = await error(s, "checkpoint_create", comment="x")
                    assert refused["code"] == "out_of_scope"
                    assert "--scope create" in refused["message"]
        # default scope: create
        async with session(daemon.socket, "--no-session-checkpoint") as s:
            assert {t.name for t in (await s.list_tools()).tools} == CREATE

    run(main)
    # the refused calls did nothing: no checkpoint was taken
    assert Client(daemon.socket).list(include_auto=True) == []


def test_the_whole_loop_and_its_errors(daemon_factory: Any, tmp_path: Any) -> None:
    root = tmp_path / "root"
    (root / "app").mkdir(parents=True)
    (root / "app" / "main.py").write_text("print('v1')\n")
    (root / "notes.txt").write_text("keep\n")
    # 450,000 bytes: past the 256 KiB cut, which falls inside a 3-byte character
    (root / "big.txt").write_text("€" * 150_000)
    (root / "blob").write_bytes(b"\xff\x00\xfe")
    d = daemon_factory()

    async def main() -> None:
        async with session(d.socket, "--scope", "full", "--no-session-checkpoint") as s:
            made = await call(s, "checkpoint_create", comment="before the change")
            cid = made["id"]
            listed = (await call(s, "checkpoint_list"))["checkpoints"]
            assert [c["id"] for c in listed] == [cid]
            got = await call(s, "checkpoint_get", id=cid)
            assert got["id"] == cid
            assert got["comment"] == "before the change"

            (root / "app" / "main.py").write_text("print('broken')\n")
            (root / "app" / "new.py").write_text("x = 1\n")
            diff = await call(s, "checkpoint_diff", id=cid)
            paths = {c["path"] for c in diff["changes"]}
            assert {"app/main.py", "app/new.py"} <= paths, diff
            old = await call(s, "checkpoint_read_file", id=cid, path="/app/main.py")
            assert old["text"] == "print('v1')\n"
            assert old["truncated"] is False
            big = await call(s, "checkpoint_read_file", id=cid, path="/big.txt")
            assert big["size"] == 450_000
            assert big["truncated"] is True
            assert big["text"] == "€" * (256 * 1024 // 3)  # the split character dropped
            blob = await call(s, "checkpoint_read_file", id=cid, path="/blob")
            assert blob["base64"] == "/wD+"
            assert "text" not in blob
            listing = await call(s, "checkpoint_read_file", id=cid, path="/app")
            assert "entry" in listing
            preview = await call(s, "checkpoint_preview_restore", id=cid)
            assert {c["path"] for c in preview["changes"]} >= {"app/main.py", "app/new.py"}

            # an unknown id is a tool error with the API's code; the server answers on
            missing = await error(s, "checkpoint_get", id="v99")
            assert missing["code"] == "not_found", missing
            bad = await error(s, "checkpoint_read_file", id=cid)
            assert bad["code"] == "invalid_arguments"
            assert "'path'" in bad["message"]
            assert (await call(s, "checkpoint_get", id=cid))["id"] == cid

            done = await call(s, "checkpoint_restore", id=cid)
            undo = done["undo"]
            assert undo, done
            assert undo != cid
            assert done["ends_sessions"] is False
            assert undo in done["note"]
            assert (root / "app" / "main.py").read_text() == "print('v1')\n"
            assert not (root / "app" / "new.py").exists()

            back = await call(s, "checkpoint_restore", id=undo)
            assert back["undo"]
            assert (root / "app" / "main.py").read_text() == "print('broken')\n"
            assert (root / "app" / "new.py").read_text() == "x = 1\n"

            # only a path: the rest stays as it is
            (root / "notes.txt").write_text("changed\n")
            part = await call(s, "checkpoint_restore_path", id=cid, paths=["/app/main.py"])
            assert part["undo"]
            assert part["restored"] == f"/app/main.py from {cid}"
            assert (root / "app" / "main.py").read_text() == "print('v1')\n"
            assert (root / "notes.txt").read_text() == "changed\n"

            newest = await call(s, "checkpoint_create", comment="the newest")
            active = await error(s, "checkpoint_delete", id=newest["id"])
            assert active["code"] == "active_checkpoint", active
            await call(s, "checkpoint_delete", id=back["undo"])
            gone = await error(s, "checkpoint_delete", id=back["undo"])
            assert gone["code"] == "not_found"

            # a daemon that went away: a tool error, and the server still answers
            assert d.stop() == 0
            away = await error(s, "checkpoint_list")
            assert away["code"] == "no_daemon", away
            assert {t.name for t in (await s.list_tools()).tools} == FULL

    run(main)


def test_wait_remote_on_a_local_store_is_refused_creating_nothing(
    daemon_factory: Any, tmp_path: Any
) -> None:
    # Refused, not ignored: an agent asking for a checkpoint that outlives the machine
    # must not be told "done" about one that dies with it. (The bucket's side is in
    # tests/remote/test_mcp_remote.py.)
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "f").write_text("x\n")
    d = daemon_factory("--no-view")

    async def main() -> None:
        async with session(d.socket, "--no-session-checkpoint") as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            schema = tools["checkpoint_create"].input_schema["properties"]["wait_remote"]
            assert schema["type"] == "boolean"
            assert schema["default"] is False
            refused = await error(s, "checkpoint_create", comment="x", wait_remote=True)
            assert refused["code"] == "no_remote", refused
            assert "nothing was created" in refused["message"]
            assert "without wait_remote" in refused["message"]
            bad = await error(s, "checkpoint_create", wait_remote="yes")
            assert bad["code"] == "invalid_arguments", bad
            made = await call(s, "checkpoint_create", comment="plain")
            assert made["storage"] == "local"
            assert made["checkpoint"]["storage"] == "local"

    run(main)
    assert [c["id"] for c in Client(d.socket).list(include_auto=True)] == ["v0"]


@pytest.mark.parametrize("tool", ["checkpoint_list", "checkpoint_create"])
def test_a_daemon_killed_mid_call_is_a_tool_error(
    daemon_factory: Any, tmp_path: Any, tool: str
) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "f").write_text("x\n")
    d = daemon_factory()
    args = {"comment": "lost"} if tool == "checkpoint_create" else {}

    async def main() -> None:
        async with session(d.socket, "--scope", "create", "--no-session-checkpoint") as s:
            # stopped, the daemon's socket still accepts (the kernel's backlog): the
            # request goes out and no answer comes; then it dies with the call in flight
            os.kill(d.proc.pid, signal.SIGSTOP)
            got: dict[str, Any] = {}

            async def in_flight() -> None:
                got["r"] = await s.call_tool(tool, args)

            async with anyio.create_task_group() as tg:
                tg.start_soon(in_flight)
                await anyio.sleep(1.0)
                assert "r" not in got  # still waiting on the stopped daemon
                d.kill()
            r = got["r"]
            assert r.is_error, r.structured_content
            assert isinstance(r.structured_content, dict)
            assert r.structured_content["code"] == "no_daemon", r.structured_content
            assert "daemon" in r.structured_content["message"]
            # the server itself is fine and answers the next call the same way
            again = await error(s, "checkpoint_list")
            assert again["code"] == "no_daemon", again
            assert {t.name for t in (await s.list_tools()).tools} == CREATE

    run(main)


def test_a_session_takes_a_checkpoint_as_its_client(daemon_factory: Any, tmp_path: Any) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "work.txt").write_text("the user's work\n")
    d = daemon_factory()

    async def main() -> None:
        async with session(d.socket, "--scope", "read", name="claude-code", version="1.2.3") as s:
            auto = (await call(s, "checkpoint_list", include_auto=True))["checkpoints"]
            assert [c["comment"] for c in auto] == ["before claude-code/1.2.3 session"]
            # without include_auto the session checkpoint stays out of the way
            assert (await call(s, "checkpoint_list"))["checkpoints"] == []
        # a second session at once, nothing changed: the daemon's rule skips it
        async with session(d.socket, "--scope", "read", "--as", "reviewer") as s:
            again = (await call(s, "checkpoint_list", include_auto=True))["checkpoints"]
            assert len(again) == 1
        # a change since: the next session takes one
        (root / "work.txt").write_text("more work\n")
        async with session(d.socket, "--scope", "read", name="other", version="2") as s:
            third = (await call(s, "checkpoint_list", include_auto=True))["checkpoints"]
            assert [c["comment"] for c in third] == [
                "before other/2 session",
                "before claude-code/1.2.3 session",
            ]

    run(main)
    c = Client(d.socket)
    creates = [e for e in c.activity() if e["action"] == "create"]
    assert creates, c.activity()
    assert creates[-1]["actor"] == "claude-code/1.2.3", creates
    # --as names the actor of the second session's calls
    assert any(e["actor"] == "reviewer" for e in c.activity()), c.activity()


def test_under_an_overlay_restore_says_sessions_end_and_reset_is_offered(
    overlay_daemon: Any,
) -> None:
    d = overlay_daemon
    merged = Path(d.overlay.merged)
    app = merged / "app.py"

    async def main() -> None:
        async with session(d.socket, "--scope", "full", "--no-session-checkpoint") as s:
            names = {t.name for t in (await s.list_tools()).tools}
            assert names == FULL | {"environment_reset"}
            app.write_text("v1\n")
            cid = (await call(s, "checkpoint_create", comment="v1"))["id"]
            app.write_text("broken\n")
            done = await call(s, "checkpoint_restore", id=cid)
            assert done["ends_sessions"] is True, done
            assert "open a new one" in done["note"]
            assert done["undo"] in done["note"]
            assert app.read_text() == "v1\n"
            reset = await call(s, "environment_reset")
            assert reset["undo"], reset
            assert not app.exists()
            # the base image stays
            assert (merged / "etc" / "hosts").read_text() == "127.0.0.1 localhost\n"
            # the reset's undo brings the layer back
            await call(s, "checkpoint_restore", id=reset["undo"])
            assert app.read_text() == "v1\n"

    run(main)


def test_the_online_cli_loads_no_mcp() -> None:
    probe = (
        "import sys\n"
        "from sprite_env.cli.main import main\n"
        "main(['checkpoints', 'list'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in\n"
        "      ('mcp', 'mcp_types', 'pydantic', 'anyio', 'starlette', 'sprite_env.mcp_server')))\n"
    )
    env = {**os.environ, "SPRITE_API_SOCK": "/nonexistent/api.sock", "SPRITE_API_WAIT": "0"}
    r = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, env=env
    )
    assert r.stdout.strip() == "[]", r.stdout + r.stderr
