"""Any checkpoint, any time (issue 10, point 5), through the real daemon and the real CLI
(subprocesses without a terminal): ``checkpoints cat`` and ``export`` of automatic
checkpoints and of manual ones older than the mounted view, ``restore --path`` of single
files and subtrees (undoable, the rest untouched), path tricks refused, and offline
commands that never create a store."""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING, Any

import pytest

from tests.helpers.cli import REPO, run_cli
from tests.helpers.daemon import write_file
from tests.helpers.trees import assert_trees_equal, snapshot_tree
from tests.helpers.users import as_nobody, need_nobody

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.helpers.daemon import DaemonProcess

pytestmark = pytest.mark.integration

BIN = bytes(range(256)) * 300 + b"\0\xff\xfe" * 5000  # ~92 KiB, every byte value
ODD = b"r\xe9sum\xe9-\xff.txt"  # a name that is not UTF-8


def _cli(d: DaemonProcess, *args: str | bytes) -> subprocess.CompletedProcess[bytes]:
    """``sprite-env ARGS`` against daemon ``d``: bytes in (argv) and out, no terminal."""
    r = subprocess.run(
        [sys.executable, "-m", "sprite_env", *args],
        capture_output=True,
        cwd=REPO,
        env={**os.environ, **d.env()},
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    assert b"Traceback" not in r.stderr, r.stderr.decode(errors="replace")
    return r


def _layer(root: str) -> None:
    write_file(os.path.join(root, "app/config.txt"), b"good config\n")
    write_file(os.path.join(root, "app/lib/a.py"), b"a = 1\n")
    write_file(os.path.join(root, "app/lib/b.py"), b"b = 2\n")
    write_file(os.path.join(root, "data/blob.bin"), BIN)
    write_file(os.path.join(os.fsencode(root), b"data/" + ODD), b"odd name\n")
    write_file(os.path.join(root, "notes.txt"), b"notes v0\n")


def _manual(d: DaemonProcess, comment: str) -> str:
    return str(d.create(comment)["id"])


def test_cat_any_checkpoint_byte_exact(daemon_factory: Any) -> None:
    d = daemon_factory("--view-count", "1")
    _layer(d.root)
    assert _manual(d, "v0") == "v0"
    write_file(os.path.join(d.root, "data/blob.bin"), BIN[::-1])
    auto = d.create("", auto=True)["id"]
    assert auto.startswith("auto-")
    for n in (1, 2):
        write_file(os.path.join(d.root, "notes.txt"), b"notes v%d\n" % n)
        _manual(d, f"v{n}")
    # v0 is older than the one checkpoint the view mounts; the automatic one is not
    # mounted at all: both are read from the store.
    mounted = os.listdir(os.path.join(d.state, "checkpoints"))
    assert "v0" not in mounted, mounted
    assert auto not in mounted, mounted

    r = _cli(d, "checkpoints", "cat", "v0", "/data/blob.bin")
    assert r.returncode == 0, r.stderr
    assert r.stdout == BIN
    r = _cli(d, "checkpoints", "cat", auto, "data/blob.bin")
    assert (r.returncode, r.stdout) == (0, BIN[::-1])
    r = _cli(d, "checkpoints", "cat", "v0", b"/data/" + ODD)
    assert (r.returncode, r.stdout) == (0, b"odd name\n")

    # The API: the bytes with their Content-Length; a directory as a JSON listing.
    status, headers, body = d.request("GET", "/v1/checkpoints/v0/files/data/blob.bin")
    assert (status, headers["content-length"], body) == (200, str(len(BIN)), BIN)
    assert headers["content-type"] == "application/octet-stream"
    status, headers, body = d.request("GET", "/v1/checkpoints/v0/files/data")
    listing = json.loads(body)
    assert status == 200
    assert listing["type"] == "dir"
    assert listing["path"] == "/data"
    names = [e["name"] for e in listing["entries"]]
    assert names == ["blob.bin", ODD.decode(errors="backslashreplace")]

    # Not a file, not there, not a path: clear errors (exit 2), nothing on stdout.
    r = _cli(d, "checkpoints", "cat", "v0", "/data")
    assert r.returncode == 2
    assert r.stdout == b""
    assert b"/data is a dir in v0, not a file" in r.stderr
    r = _cli(d, "checkpoints", "cat", "--json", "v0", "/data")
    assert r.returncode == 0
    assert json.loads(r.stdout)["entries"][0]["name"] == "blob.bin"
    r = _cli(d, "checkpoints", "cat", "v0", "/nope")
    assert r.returncode == 2
    assert b"no /nope in checkpoint v0" in r.stderr
    r = _cli(d, "checkpoints", "cat", "v9", "/notes.txt")
    assert r.returncode == 2
    assert b"v9" in r.stderr
    r = _cli(d, "checkpoints", "cat", "v0", "app/../../etc/passwd")
    assert r.returncode == 2
    assert b"'..'" in r.stderr
    status, _, body = d.request("GET", "/v1/checkpoints/v0/files/app/%2E%2E/%2E%2E/etc/passwd")
    assert status == 400
    assert json.loads(body)["code"] == "invalid_path"


def test_export_through_the_daemon(daemon_factory: Any, tmp_path: Any) -> None:
    d = daemon_factory("--no-view")
    _layer(d.root)
    at_auto = snapshot_tree(d.root)
    auto = d.create("", auto=True)["id"]
    write_file(os.path.join(d.root, "app/config.txt"), b"changed\n")
    base = os.fspath(tmp_path)

    whole = os.path.join(base, "whole")
    r = _cli(d, "checkpoints", "export", auto, whole)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().startswith(f"Exported {auto} to {whole}: ")
    assert_trees_equal(at_auto, whole)

    part = os.path.join(base, "part")
    os.mkdir(part)  # an empty directory is fine too
    r = _cli(d, "checkpoints", "export", auto, part, "--path", "app/lib", "--path", "/notes.txt")
    assert r.returncode == 0, r.stderr
    got = snapshot_tree(part)
    assert set(got) == {b".", b"app", b"app/lib", b"app/lib/a.py", b"app/lib/b.py", b"notes.txt"}
    for p in (b"app/lib", b"app/lib/a.py", b"app/lib/b.py", b"notes.txt"):
        assert got[p] == at_auto[p], p

    # Refused before anything is written: not empty, the daemon's own state, no such path.
    r = _cli(d, "checkpoints", "export", auto, part)
    assert r.returncode == 2
    assert b"not empty" in r.stderr
    inside = os.path.join(d.state, "copy")
    r = _cli(d, "checkpoints", "export", auto, inside)
    assert r.returncode == 2
    assert b"inside the state directory" in r.stderr
    assert not os.path.exists(inside)
    r = _cli(d, "checkpoints", "export", auto, os.path.join(base, "x"), "--path", "nope")
    assert r.returncode == 2
    assert b"no /nope in checkpoint" in r.stderr
    assert not os.path.exists(os.path.join(base, "x"))


def _undo_of(out: bytes) -> str:
    m = re.search(rb"undo with: sprite-env restore (auto-\S+)", out)
    assert m, out
    return m.group(1).decode()


def test_restore_one_file_and_one_subtree(daemon_factory: Any) -> None:
    d = daemon_factory("--no-view")
    _layer(d.root)
    v0 = snapshot_tree(d.root)
    _manual(d, "v0")
    # After v0: changes everywhere, inside and outside the paths to restore.
    write_file(os.path.join(d.root, "app/config.txt"), b"broken\n")
    write_file(os.path.join(d.root, "app/lib/a.py"), b"a = 'oops'\n")
    os.unlink(os.path.join(d.root, "app/lib/b.py"))
    write_file(os.path.join(d.root, "app/lib/new.py"), b"new\n")
    write_file(os.path.join(d.root, "notes.txt"), b"kept\n")
    write_file(os.path.join(os.fsencode(d.root), b"data/" + ODD), b"changed too\n")
    before = snapshot_tree(d.root)

    r = _cli(d, "restore", "v0", "--path", "/app/config.txt", "--yes")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(b"Restored /app/config.txt from v0: 0 deleted, 1 changed")
    undo = _undo_of(r.stdout)
    after_file = snapshot_tree(d.root)
    assert after_file[b"app/config.txt"] == v0[b"app/config.txt"]
    assert_trees_equal(before, after_file, ignore=["app/config.txt"])

    r = _cli(d, "checkpoints", "restore", "v0", "--path", "app/lib", "--path", b"/data/" + ODD)
    assert r.returncode == 0, r.stderr
    now = snapshot_tree(d.root)
    for p in (b"app/lib", b"app/lib/a.py", b"app/lib/b.py", b"data/" + ODD):
        assert now[p] == v0[p], p
    assert b"app/lib/new.py" not in now
    assert_trees_equal(after_file, now, ignore=["app/lib", b"data/" + ODD])

    # Undoable like any restore: the first undo brings back the state before it, whole.
    r = _cli(d, "restore", undo, "--yes")
    assert r.returncode == 0, r.stderr
    assert_trees_equal(before, d.root)
    # The API shape: the restore's last event names the paths and the undo.
    status, evs = d.stream("POST", "/v1/checkpoints/v0/restore", {"paths": ["/notes.txt"]})
    assert (status, evs[-1]["type"]) == (202, "complete"), evs
    assert evs[-1]["paths"] == ["/notes.txt"]
    assert evs[-1]["undo"].startswith("auto-")
    with open(os.path.join(d.root, "notes.txt"), "rb") as f:
        assert f.read() == b"notes v0\n"


def test_path_tricks_refused(daemon_factory: Any, tmp_path: Any) -> None:
    d = daemon_factory("--no-view")
    _layer(d.root)
    _manual(d, "v0")
    outside = os.path.join(os.fspath(tmp_path), "outside")
    write_file(os.path.join(outside, "lib/a.py"), b"outside\n")
    subprocess.run(["rm", "-rf", os.path.join(d.root, "app")], check=True)
    os.symlink(outside, os.path.join(d.root, "app"))  # live: app leads out of the layer
    before = snapshot_tree(d.root)
    count = len(d.json("GET", "/v1/checkpoints?include_auto=true")[1])

    for path, said in [
        ("../etc/passwd", b"'..'"),
        ("/app/lib/a.py", b"/app is a symlink in the live layer"),
        ("/", b"whole layer"),
        ("/nowhere", b"neither in v0 nor in the live layer"),
    ]:
        r = _cli(d, "restore", "v0", "--path", path, "--yes")
        assert r.returncode == 2, (path, r.stderr)
        assert said in r.stderr, (path, r.stderr)
    status, problem = d.json("POST", "/v1/checkpoints/v0/restore", {"paths": ["a/../../x"]})
    assert (status, problem["code"]) == (400, "invalid_path")
    status, problem = d.json("POST", "/v1/checkpoints/v0/restore", {"paths": [""]})
    assert (status, problem["code"]) == (400, "bad_request")
    with open(os.path.join(outside, "lib/a.py"), "rb") as f:
        assert f.read() == b"outside\n"  # nothing written through the symlink
    assert_trees_equal(before, d.root)
    assert len(d.json("GET", "/v1/checkpoints?include_auto=true")[1]) == count
    # The symlink itself may be restored: it is replaced by v0's directory, not followed.
    r = _cli(d, "restore", "v0", "--path", "/app", "--yes")
    assert r.returncode == 0, r.stderr
    assert not os.path.islink(os.path.join(d.root, "app"))
    with open(os.path.join(outside, "lib/a.py"), "rb") as f:
        assert f.read() == b"outside\n"


def test_offline_commands_never_create_a_store(tmp_path: Any) -> None:
    layer = os.path.join(os.fspath(tmp_path), "layer")
    os.mkdir(layer)
    write_file(os.path.join(layer, "f"), b"x")
    dest = os.path.join(os.fspath(tmp_path), "dest")
    for args in (
        ["--root", layer, "checkpoints", "list"],
        ["--root", layer, "checkpoints", "create"],
        ["--root", layer, "checkpoints", "export", "v0", dest],
        ["--root", layer, "checkpoints", "cat", "v0", "/f"],
        ["--root", layer, "restore", "v0", "--yes"],
        ["--store", os.path.join(layer, "st"), "checkpoints", "info", "v0"],
    ):
        r = run_cli(*args)
        assert r.returncode == 3, (args, r.stderr)
        assert "no sprite-env store at" in r.stderr, r.stderr
        assert "store init" in r.stderr, r.stderr
        assert os.listdir(layer) == ["f"], (args, os.listdir(layer))
        assert not os.path.exists(dest)
    # Without --root, export goes to the daemon (none here): it creates nothing either.
    host_store = os.path.exists("/.sprite/store")
    r = run_cli("checkpoints", "export", "v0", dest, env={"SPRITE_API_SOCK": "/nonexistent/s"})
    assert r.returncode == 5, r.stderr
    assert os.path.exists("/.sprite/store") == host_store
    assert not os.path.exists(dest)
    # store init is the one command that creates it; then the others work.
    assert run_cli("--root", layer, "store", "init").returncode == 0
    r = run_cli("--root", layer, "checkpoints", "create")
    assert r.returncode == 0, r.stderr
    r = run_cli("--root", layer, "checkpoints", "cat", "v0", "/f")
    assert (r.returncode, r.stdout) == (0, "x")
    # LAYER/.sprite (the default store's home) is not part of the layer: no checkpoint or
    # diff shows it.
    r = run_cli("--root", layer, "--json", "checkpoints", "cat", "v0", "/")
    assert [e["name"] for e in json.loads(r.stdout)["entries"]] == ["f"]
    r = run_cli("--root", layer, "checkpoints", "diff", "v0")
    assert ".sprite" not in r.stdout, r.stdout


@pytest.mark.fuse
def test_overlay_cat_export_and_restore_paths_as_the_environment_sees_them(
    daemon_factory: Any, tmp_path: Any
) -> None:
    base = os.fspath(tmp_path)
    lower, upper, work, merged = (os.path.join(base, n) for n in ("lo", "up", "wk", "mg"))
    for p in (upper, work, merged):
        os.makedirs(p)
    write_file(os.path.join(lower, "etc/hosts"), b"127.0.0.1 localhost\n")
    write_file(os.path.join(lower, "usr/lib/m0.py"), b"# base module\n")
    spec = f"{lower}:{upper}:{work}:{merged}"
    d = daemon_factory("--overlay", spec, root=merged, state=os.path.join(base, "state"))
    try:
        write_file(os.path.join(merged, "etc/hosts"), b"10.0.0.1 db\n")  # a copy-up
        write_file(os.path.join(merged, "app/main.py"), b"v0\n")
        assert _manual(d, "v0") == "v0"
        # cat and the API read the merged view: the base image's files too.
        r = _cli(d, "checkpoints", "cat", "v0", "/usr/lib/m0.py")
        assert (r.returncode, r.stdout) == (0, b"# base module\n")
        r = _cli(d, "checkpoints", "cat", "v0", "/etc/hosts")
        assert (r.returncode, r.stdout) == (0, b"10.0.0.1 db\n")

        os.unlink(os.path.join(merged, "etc/hosts"))  # a whiteout in UPPER
        write_file(os.path.join(merged, "app/main.py"), b"v1, kept\n")
        status, evs = d.stream("POST", "/v1/checkpoints/v0/restore", {"paths": ["/etc/hosts"]})
        assert (status, evs[-1]["type"]) == (202, "complete"), evs
        with open(os.path.join(merged, "etc/hosts"), "rb") as f:
            assert f.read() == b"10.0.0.1 db\n"
        with open(os.path.join(merged, "app/main.py"), "rb") as f:
            assert f.read() == b"v1, kept\n"
        # A path only the base image holds is as in v0 already: nothing to do, no error.
        status, evs = d.stream("POST", "/v1/checkpoints/v0/restore", {"paths": ["/usr/lib"]})
        assert evs[-1].get("noop") is True, evs

        dest = os.path.join(base, "copy")
        r = _cli(d, "checkpoints", "export", "v0", dest)
        assert r.returncode == 0, r.stderr
        got = snapshot_tree(dest)
        assert {b"etc/hosts", b"usr/lib/m0.py", b"app/main.py"} <= set(got)
        assert all(f.kind != "chardev" for f in got.values())  # no whiteouts
        with open(os.path.join(dest, "app/main.py"), "rb") as f:
            assert f.read() == b"v0\n"
        r = _cli(d, "checkpoints", "export", "v0", os.path.join(upper, "x"))
        assert r.returncode == 2
        assert b"inside the layer (UPPER)" in r.stderr
    finally:  # the daemon first (it must stop cleanly), then MERGED, which it leaves mounted
        if d.proc is not None and d.proc.returncode is None:
            assert d.stop() == 0, d.log()
        subprocess.run(["umount", "-l", merged], capture_output=True, check=False)


def test_restore_path_on_a_terminal_previews_only_that_path(daemon_factory: Any) -> None:
    from tests.cli.test_preview import _under_a_terminal

    d = daemon_factory("--no-view")
    _layer(d.root)
    _manual(d, "v0")
    write_file(os.path.join(d.root, "app/lib/new.py"), b"new\n")
    write_file(os.path.join(d.root, "notes.txt"), b"changed, outside the path\n")
    env = {**os.environ, **d.env()}
    shown = _under_a_terminal(env, "restore", "v0", "--path", "/app/lib", answer=b"y\n")
    sample = [line for line in shown.splitlines() if line.startswith("  ")]
    assert any("new.py" in line for line in sample), shown
    assert not any("notes.txt" in line for line in sample), shown
    assert "Restore /app/lib from v0? [y/N]" in shown, shown
    assert "Restored /app/lib from v0" in shown, shown
    assert not os.path.exists(os.path.join(d.root, "app/lib/new.py"))
    with open(os.path.join(d.root, "notes.txt"), "rb") as f:
        assert f.read() == b"changed, outside the path\n"
    r = _cli(d, "restore", "v0", "--path", "/app/lib", "--preview")
    assert r.returncode == 0, r.stderr
    assert b"notes.txt" not in r.stdout


def _flip_a_byte(d: DaemonProcess, data: bytes) -> None:
    """Damages the stored object holding ``data`` (a chunk), behind the daemon's back."""
    from sprite_env.store.catalog import Catalog
    from sprite_env.store.codec import object_id
    from sprite_env.store.pack import ENTRY, pack_path

    store = os.path.join(d.state, "store")
    catalog = Catalog(os.path.join(store, "catalog.db"), readonly=True)
    try:
        loc = catalog.locate(object_id(data))
    finally:
        catalog.close()
    assert loc is not None
    with open(pack_path(os.path.join(store, "packs"), loc.pack), "r+b") as f:
        f.seek(loc.entry.offset + ENTRY.size + 5)
        b = f.read(1)
        f.seek(loc.entry.offset + ENTRY.size + 5)
        f.write(bytes([b[0] ^ 0x40]))


def test_a_damaged_piece_is_an_error_never_a_shorter_file(daemon_factory: Any) -> None:
    import random

    from sprite_env.store.chunker import Chunker

    d = daemon_factory("--no-view")
    big = random.Random(5).randbytes(3 << 20)
    small = random.Random(6).randbytes(10_000)  # one chunk
    write_file(os.path.join(d.root, "big.bin"), big)
    write_file(os.path.join(d.root, "small.bin"), small)
    _manual(d, "v0")
    at, late = 0, b""
    for chunk in Chunker().chunks_of_bytes(big):
        if at >= 2 << 20:  # past the first block the daemon reads before it answers
            late = bytes(chunk)
            break
        at += len(chunk)
    _flip_a_byte(d, late)
    _flip_a_byte(d, small)

    r = _cli(d, "checkpoints", "cat", "v0", "/big.bin")
    assert r.returncode == 5, r.stderr
    assert b"answer was cut after" in r.stderr
    assert len(r.stdout) < len(big)  # what came is a prefix, and the exit says it is cut
    assert big.startswith(r.stdout)
    r = _cli(d, "checkpoints", "cat", "v0", "/small.bin")  # damage in the first block
    assert r.returncode == 3, r.stderr
    assert b"checkpoint v0 is damaged at /small.bin" in r.stderr
    assert b"store check --read-data" in r.stderr
    assert r.stdout == b""


@pytest.fixture
def reachable() -> Iterator[str]:
    """A 0755 directory under /tmp, which ``nobody`` may enter (``tmp_path`` is under a
    0700 one); removed after the daemons in it stopped (request it before them)."""
    top = tempfile.mkdtemp(prefix="sprite-export-", dir="/tmp")
    os.chmod(top, 0o755)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def test_another_user_exports_only_into_its_own_directories(
    reachable: str, daemon_factory: Any
) -> None:
    need_nobody()
    gid = grp.getgrnam("daemon").gr_gid
    top = reachable
    root, state = os.path.join(top, "root"), os.path.join(top, "state")
    os.mkdir(root)
    d = daemon_factory("--socket-group", "daemon", root=root, state=state)
    _layer(d.root)
    _manual(d, "v0")
    mine = os.path.join(top, "mine")
    os.mkdir(mine)
    os.chown(mine, pwd.getpwnam("nobody").pw_uid, -1)
    cli = [sys.executable, "-m", "sprite_env", "--socket", d.socket]
    # root's directory: the daemon (root) would write there for nobody: refused.
    p = as_nobody([*cli, "checkpoints", "export", "v0", os.path.join(top, "x")], groups=[gid])
    assert p.returncode == 2, p.stderr
    assert "does not own" in p.stderr
    assert not os.path.exists(os.path.join(top, "x"))
    # its own: fine.
    dest = os.path.join(mine, "copy")
    p = as_nobody([*cli, "checkpoints", "export", "v0", dest, "--path", "/notes.txt"], groups=[gid])
    assert p.returncode == 0, p.stderr
    with open(os.path.join(dest, "notes.txt"), "rb") as f:
        assert f.read() == b"notes v0\n"
