"""The store is private to its owner (issue 15, point 1): 0700 directories and 0600 files
whatever the umask, tightened when an older store is opened for writing, reported by
``store check``, and unreadable to a real other user (``nobody``), who gets a clear error
from the command line instead of a traceback."""

from __future__ import annotations

import glob
import json
import os
import stat
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from sprite_env.privacy import AccessDenied
from sprite_env.store import ObjectKind, check, open_store
from sprite_env.store.pack import PackWriter
from tests.helpers.cli import REPO, run_cli
from tests.helpers.users import (
    assert_private,
    cli_as_nobody,
    modes,
    need_nobody,
    reachable_dir,
    read_as_nobody,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

SECRET = b"root's secret, mode 0600 in the layer\n"


@pytest.fixture
def base() -> Iterator[str]:
    with reachable_dir() as d:
        yield d


@pytest.fixture
def umask() -> Iterator[Callable[[int], None]]:
    """Sets this process's umask for the test (restored after)."""
    old = os.umask(0o022)
    os.umask(old)
    yield lambda m: os.umask(m) and None
    os.umask(old)


def make_old(store_dir: str) -> None:
    """What an older version left: directories 0755, files 0644."""
    for dirpath, _dirs, files in os.walk(store_dir):
        os.chmod(dirpath, 0o755)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o644)


def offline_checkpoint(base: str, umask: int) -> tuple[str, str]:
    """A layer with a 0600 secret, and a store holding one checkpoint of it, written by the
    offline engine (the real command) under ``umask``."""
    root, store = os.path.join(base, "root"), os.path.join(base, "store")
    os.makedirs(root)
    with open(os.path.join(root, "secret"), "wb") as f:
        f.write(SECRET)
    os.chmod(os.path.join(root, "secret"), 0o600)
    for args in (["store", "init"], ["checkpoints", "create", "--root", root]):
        p = subprocess.run(
            [sys.executable, "-m", "sprite_env", *args, "--store", store],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=300,
            umask=umask,
        )
        assert p.returncode == 0, p.stderr
    return root, store


@pytest.mark.parametrize("mask", [0o000, 0o022], ids=["umask000", "umask022"])
def test_a_store_is_created_private_whatever_the_umask(
    store_dir: str, umask: Callable[[int], None], mask: int
) -> None:
    umask(mask)
    with open_store(store_dir, create=True) as s:
        with s.writer() as w:
            w.put(b"x" * 100_000)
            w.commit()
        tmp_pack = PackWriter(s.tmp_dir, ObjectKind.DATA.pack_class)  # a pack being written
        try:
            # While open, the catalog's -wal and -shm exist: SQLite gives them the db's mode.
            seen = assert_private(store_dir)
        finally:
            tmp_pack.abort()
    assert {"catalog.db", "catalog.db-wal", "catalog.db-shm", "lock", "sprite-store.json"} <= set(
        seen
    )
    assert any(r.startswith("packs/") for r in seen)
    assert any(r.startswith("tmp/") for r in seen)


def test_an_empty_directory_given_for_a_new_store_becomes_private(
    store_dir: str, umask: Callable[[int], None]
) -> None:
    umask(0)
    os.makedirs(store_dir, mode=0o777)
    open_store(store_dir, create=True).close()
    assert stat.S_IMODE(os.stat(store_dir).st_mode) == 0o700


@pytest.mark.parametrize("mask", [0o000, 0o022], ids=["umask000", "umask022"])
def test_another_user_cannot_read_a_store_the_offline_engine_wrote(base: str, mask: int) -> None:
    need_nobody()
    _root, store = offline_checkpoint(base, mask)
    assert_private(store)
    targets = [
        *glob.glob(os.path.join(store, "packs", "*.pack")),
        os.path.join(store, "packs"),
        os.path.join(store, "catalog.db"),
        os.path.join(store, "lock"),
        store,
    ]
    assert len(targets) > 4
    assert read_as_nobody(targets) == dict.fromkeys(targets, "EACCES")


def test_an_old_store_is_tightened_when_opened_for_writing(
    store_dir: str, expect_log: Callable[[str], None]
) -> None:
    with open_store(store_dir, create=True) as s, s.writer() as w:
        oid = w.put(b"data")
        w.commit()
    make_old(store_dir)
    before = modes(store_dir)
    assert before["."] == 0o755
    assert before["catalog.db"] == 0o644

    # A read-only open changes nothing, and check reports it with the fix.
    with open_store(store_dir, writable=False) as s:
        report = check(s)
        assert s.read(oid) == b"data"
    assert not report.ok
    [error] = report.errors
    assert f"store {store_dir} is not private" in error
    assert "3 directories and " in error
    assert f"chmod -R go= {store_dir}" in error
    after_ro = modes(store_dir)
    assert {k: v for k, v in after_ro.items() if k in before} == before

    expect_log(rf"store {store_dir} was open to other users \(3 directories, .* made private")
    with open_store(store_dir) as s:
        assert s.read(oid) == b"data"
        assert check(s).ok
    assert_private(store_dir)


def test_store_check_reports_an_open_store_and_how_to_fix_it(base: str) -> None:
    _root, store = offline_checkpoint(base, 0o022)
    assert run_cli("store", "check", "--store", store).returncode == 0
    make_old(store)
    p = run_cli("store", "check", "--store", store)
    assert p.returncode == 3, p.stderr
    assert f"error: store {store} is not private" in p.stderr
    assert f"Fix: chmod -R go= {store}" in p.stderr
    assert "1 problem(s)" in p.stdout
    p = run_cli("store", "check", "--json", "--store", store)
    assert p.returncode == 3
    out = json.loads(p.stdout)
    assert out["ok"] is False
    assert any("is not private" in e for e in out["errors"])
    # The fix it names works.
    subprocess.run(["chmod", "-R", "go=", store], check=True)
    p = run_cli("store", "check", "--store", store)
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("old", [False, True], ids=["private", "old-modes"])
def test_non_root_check_and_export_fail_with_a_clear_message(base: str, old: bool) -> None:
    need_nobody()
    root, store = offline_checkpoint(base, 0o022)
    if old:  # readable files, but the lock cannot be opened for writing: still no traceback
        make_old(store)
    dest = os.path.join(base, "out")
    for args in (
        ["store", "check", "--store", store],
        ["store", "check", "--read-data", "--json", "--store", store],
        ["checkpoints", "export", "v0", dest, "--store", store, "--root", root],
        ["checkpoints", "list", "--store", store, "--root", root],
    ):
        p = cli_as_nobody(*args)
        assert p.returncode == AccessDenied.exit_code == 2, (args, p.stderr)
        assert "Traceback" not in p.stderr
        assert f"cannot open the store {store}: permission denied" in p.stderr, p.stderr
        assert "it is private to its owner: run this command as root" in p.stderr
    assert not os.path.exists(os.path.join(dest, "secret"))


def test_a_store_reached_through_a_symlink_is_checked_and_tightened_at_its_target(
    tmp_path: os.PathLike[str], expect_log: Callable[[str], None]
) -> None:
    real = os.path.join(os.fspath(tmp_path), "data", "store")
    link = os.path.join(os.fspath(tmp_path), "store-link")
    open_store(real, create=True).close()
    os.symlink(real, link)
    with open_store(link, writable=False) as s:
        assert check(s).ok  # the link's own 0777 is no permission of the store's
    make_old(real)
    expect_log(r"store .*store-link was open to other users")
    open_store(link).close()
    assert_private(real)
