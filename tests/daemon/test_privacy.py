"""The daemon's state directory and its store are private to root (issue 15, point 1), with
a real daemon: whatever its umask, after an older version's modes, and with
``--socket-group``, which grants the API and never the store's files. "Others" is the real
user ``nobody``."""

from __future__ import annotations

import glob
import grp
import os
import stat
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest

from tests.helpers.daemon import write_file
from tests.helpers.users import (
    as_nobody,
    assert_private,
    need_nobody,
    reachable_dir,
    read_as_nobody,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.integration

SECRET = b"root's secret, mode 0600 in the layer\n"
#: In STATE but not private on purpose: the view (its files keep their captured modes), the
#: socket (api/server.py: 0600, or 0660 for the socket group) and the agents' guide.
NOT_PRIVATE = ("checkpoints", "api.sock", "llm.txt")
#: Connects to the socket given and prints the status of GET /v1/status.
_STATUS = """
import sys
from sprite_env.client import UnixHTTPConnection
c = UnixHTTPConnection(sys.argv[1], 30)
c.request("GET", "/v1/status", headers={"Host": "sprite"})
print(c.getresponse().status)
"""


@pytest.fixture
def base() -> Iterator[str]:
    with reachable_dir() as d:
        yield d


def make_layer(base: str) -> str:
    """A layer with a 0600 secret and a service that prints a line and keeps running."""
    root = os.path.join(base, "root")
    write_file(os.path.join(root, "secret"), SECRET)
    os.chmod(os.path.join(root, "secret"), 0o600)
    write_file(
        os.path.join(root, "etc", "sprite", "services", "talker.toml"),
        b'command = "echo talker-started; exec sleep 600"\nrestart = "never"\n',
    )
    return root


def wait_for_service_log(state: str) -> str:
    path = os.path.join(state, "services", "talker.log")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path, "rb") as f:
                if b"talker-started" in f.read():
                    return path
        time.sleep(0.05)
    raise AssertionError(f"no {path}")


def private_paths(state: str) -> list[str]:
    """What others must not read: the store's packs and catalog, the logs, the locks."""
    store = os.path.join(state, "store")
    paths = [
        state,
        store,
        *glob.glob(os.path.join(store, "packs", "*.pack")),
        os.path.join(store, "catalog.db"),
        os.path.join(state, "activity.jsonl"),
        os.path.join(state, "daemon.lock"),
        os.path.join(state, "services"),
        os.path.join(state, "services", "talker.log"),
    ]
    for p in paths:
        assert os.path.exists(p), p
    return paths


@pytest.mark.parametrize("mask", [0o000, 0o022], ids=["umask000", "umask022"])
def test_state_and_store_are_private_whatever_the_umask(
    base: str, daemon_factory: Any, mask: int
) -> None:
    need_nobody()
    root = make_layer(base)
    state = os.path.join(base, "state")
    old = os.umask(mask)  # the daemon inherits it
    try:
        d = daemon_factory(root=root, state=state)
    finally:
        os.umask(old)
    d.create("with a secret")
    wait_for_service_log(state)
    seen = assert_private(state, skip=NOT_PRIVATE)
    assert {"store/catalog.db", "activity.jsonl", "daemon.lock", "services/talker.pid"} <= set(seen)
    assert stat.S_IMODE(os.stat(d.socket).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.join(state, "llm.txt")).st_mode) == 0o644
    targets = [*private_paths(state), d.socket, os.path.join(state, "llm.txt")]
    assert read_as_nobody(targets) == dict.fromkeys(targets, "EACCES")
    p = as_nobody([sys.executable, "-c", _STATUS, d.socket])
    assert p.returncode != 0
    assert "PermissionError" in p.stderr


def test_an_old_state_is_made_private_at_start(base: str, daemon_factory: Any) -> None:
    """A state an older version left open (0755 directories, 0644 files): the daemon makes
    it private when it starts, and says so in its log."""
    need_nobody()
    root = make_layer(base)
    state = os.path.join(base, "state")
    d = daemon_factory(root=root, state=state)
    d.create("before the upgrade")
    wait_for_service_log(state)
    d.stop()
    for dirpath, dirs, files in os.walk(state):
        dirs[:] = [x for x in dirs if x != "checkpoints"]
        os.chmod(dirpath, 0o755)
        for f in files:
            if f != "api.sock":
                os.chmod(os.path.join(dirpath, f), 0o644)
    targets = private_paths(state)
    assert set(read_as_nobody(targets).values()) == {"ok"}  # what an older version allowed

    d.start()
    assert_private(state, skip=NOT_PRIVATE)
    assert read_as_nobody(targets) == dict.fromkeys(targets, "EACCES")
    log = d.log()
    assert f"state directory {state} was mode 0755, open to other users: made 0700" in log
    assert f"store {state}/store was open to other users" in log


def test_the_socket_group_gets_the_api_and_never_the_store(base: str, daemon_factory: Any) -> None:
    need_nobody()
    root = make_layer(base)
    state = os.path.join(base, "state")
    gid = grp.getgrnam("daemon").gr_gid
    d = daemon_factory("--socket-group", "daemon", root=root, state=state)
    d.create("with a secret")
    wait_for_service_log(state)

    st = os.stat(state)
    assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o710, gid)  # search only, for the group
    assert_private(state, skip=NOT_PRIVATE, dir_mode=0o710)
    assert stat.S_IMODE(os.stat(os.path.join(state, "store")).st_mode) == 0o700

    # A member of the group: the API and the agents' guide, nothing of the store or logs.
    p = as_nobody([sys.executable, "-c", _STATUS, d.socket], groups=[gid])
    assert (p.returncode, p.stdout.strip()) == (0, "200"), p.stderr
    guide = os.path.join(state, "llm.txt")
    private = private_paths(state)
    assert read_as_nobody([guide, *private], groups=[gid]) == {
        guide: "ok",
        **dict.fromkeys(private, "EACCES"),
    }
    # Not a member: not even the socket.
    p = as_nobody([sys.executable, "-c", _STATUS, d.socket])
    assert p.returncode != 0
    assert "PermissionError" in p.stderr


def test_an_unknown_socket_group_is_refused_before_anything_is_made(
    base: str, daemon_factory: Any
) -> None:
    state = os.path.join(base, "state")
    d = daemon_factory(
        "--socket-group", "no-such-group-here", root=make_layer(base), state=state, wait=False
    )
    assert d.proc.wait(60) == 2
    assert "--socket-group: unknown group 'no-such-group-here'" in d.log()
    assert not os.path.exists(state)


def test_another_user_cannot_run_a_daemon_on_roots_state(base: str, daemon_factory: Any) -> None:
    need_nobody()
    root = make_layer(base)
    state = os.path.join(base, "state")
    daemon_factory(root=root, state=state).stop()
    for st in (state, os.path.join(base, "new-state")):  # root's, and one it cannot create
        p = as_nobody(
            [sys.executable, "-m", "sprite_env", "daemon", "--root", root, "--state", st]
            + ["--auto-interval", "0"]
        )
        assert p.returncode == 2, p.stderr
        assert "Traceback" not in p.stderr
        assert f"the state directory {st}: permission denied" in p.stderr
        assert p.stderr.rstrip().endswith("run this command as root"), p.stderr
    assert not os.path.exists(os.path.join(base, "new-state"))
