"""The diff restore writes a directory's whole small files in one native call
(``Restorer._place_many``, ``bulkrestore.write_into``) into a live layer whose directories
it did not make: a setgid directory of another group, a default ACL, files with
set-id bits and xattrs all end exact, as the checkpoint has them; a native call that fails
leaves no temporary name and the files are written the Python way."""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING

import pytest

from sprite_env.checkpoints.engine import RestoreFailed
from sprite_env.checkpoints.verify import verify_store
from sprite_env.snapshot import bulkrestore
from sprite_env.snapshot import restore as restore_mod
from tests.helpers import trees
from tests.helpers.acl import DEFAULT_ACL, inherits_acls

if TYPE_CHECKING:
    from sprite_env.checkpoints import Engine

pytestmark = pytest.mark.skipif(not bulkrestore.available(), reason="built without write_files")


def _spec() -> trees.Spec:
    return {
        # setgid, of a group that is not the process's: a new file gets group 4321 there
        "shared": trees.Dir(mode=0o2775, gid=4321),
        "shared/a": trees.File(b"a" * 3000, mode=0o644, uid=0, gid=0),
        "shared/b": trees.File(b"b" * 10, mode=0o640, uid=1000, gid=4321),
        "acl": trees.Dir(mode=0o755, xattrs={b"system.posix_acl_default": DEFAULT_ACL}),
        "acl/plain": trees.File(b"p" * 5000, mode=0o600),
        "acl/tagged": trees.File(b"t", mode=0o644, xattrs={b"user.k": b"v"}),
        "bits/setuid": trees.File(b"#!/bin/sh\n", mode=0o4755, mtime_ns=1_600_000_000_000_000_001),
        "bits/sticky": trees.File(b"", mode=0o1777),
        "bits/many": trees.File(os.urandom(70_000), mode=0o444),
        "bits/sparse": trees.Sparse(size=300_000, data={0: b"x" * 5000, 250_000: b"y" * 100}),
    }


def _step(root: str) -> None:
    """Every file rewritten (new inodes, other modes and owners), one removed, one added."""
    for rel in ("shared/a", "shared/b", "acl/plain", "acl/tagged", "bits/setuid", "bits/many"):
        p = os.path.join(root, rel)
        os.unlink(p)
        with open(p, "wb") as f:
            f.write(b"changed " + rel.encode())
        os.chmod(p, 0o600)
    os.unlink(os.path.join(root, "bits/sparse"))
    os.truncate(os.path.join(root, "bits/sticky"), 5)
    with open(os.path.join(root, "shared/new"), "wb") as f:
        f.write(b"new")


def test_new_files_in_live_directories_end_exact(
    engine_layer: tuple[str, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, engine = engine_layer
    trees.build_tree(root, _spec())
    if not inherits_acls(os.path.join(root, "acl")):
        pytest.skip("no ACL inheritance on this file system")
    before = trees.snapshot_tree(root)
    engine.create()
    _step(root)
    calls: list[int] = []
    real = bulkrestore.write_into

    def counted(
        dirfd: int, specs: list[bulkrestore._Spec], objects: dict[bytes, bytes], *, umask: int
    ) -> list[int]:
        calls.append(len(specs))
        assert umask == 0o027  # the process's, read when the restore began
        return real(dirfd, specs, objects, umask=umask)

    monkeypatch.setattr(bulkrestore, "write_into", counted)
    os.umask(0o027)  # the umask keeps no mode of these files whole: chmod after all
    try:
        engine.restore("v0")
    finally:
        os.umask(0o022)
    trees.assert_trees_equal(before, root, check_holes="exact")
    # one call per directory: shared (a, b), acl (plain, tagged), bits (4 files)
    assert sorted(calls) == [2, 2, 4]
    assert not _temporary(root)
    assert verify_store(engine.store, read_data=True).ok


@pytest.mark.parametrize("at", [0, 1])
def test_a_native_call_that_fails_leaves_nothing_and_the_python_way_writes(
    engine_layer: tuple[str, Engine], monkeypatch: pytest.MonkeyPatch, at: int
) -> None:
    """``write_files`` stops at the first file that fails, those before it written: the
    restore removes them and writes the batch file by file (which names the file that
    fails when it is the file system's fault; here it was the native call's)."""
    root, engine = engine_layer
    trees.build_tree(root, {f"d/f{i}": trees.File(b"%d" % i * 100, mode=0o640) for i in range(5)})
    before = trees.snapshot_tree(root)
    engine.create()
    for i in range(5):
        with open(os.path.join(root, f"d/f{i}"), "wb") as f:
            f.write(b"other")
    real = bulkrestore.write_into
    failed: list[int] = []

    def failing(
        dirfd: int, specs: list[bulkrestore._Spec], objects: dict[bytes, bytes], *, umask: int
    ) -> list[int]:
        real(dirfd, specs[:at], objects, umask=umask)  # the files before the one that fails exist
        failed.append(len(specs))
        raise OSError(errno.ENOSPC, "No space left on device", specs[at][1])

    monkeypatch.setattr(bulkrestore, "write_into", failing)
    written: list[bytes] = []
    real_place = restore_mod.Restorer._place

    def place(self: restore_mod.Restorer, fd: int, name: bytes, path: bytes, e: object) -> None:
        written.append(name)
        real_place(self, fd, name, path, e)  # type: ignore[arg-type]

    monkeypatch.setattr(restore_mod.Restorer, "_place", place)
    engine.restore("v0")
    assert failed == [5]
    assert sorted(written) == [b"f%d" % i for i in range(5)]
    trees.assert_trees_equal(before, root, check_holes="exact")
    assert sorted(os.listdir(os.path.join(root, "d"))) == [f"f{i}" for i in range(5)]


def test_a_restore_failing_after_its_native_batch_leaves_no_temporary_name(
    engine_layer: tuple[str, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault after the first file of a batch is renamed into place: the batch's other
    files, written under temporary names, are removed; the restore asked again finishes
    (a second restore in the same process never meets a name of the first)."""
    root, engine = engine_layer
    trees.build_tree(root, {f"d/f{i}": trees.File(b"%d" % i * 100) for i in range(6)})
    before = trees.snapshot_tree(root)
    engine.create()
    for i in range(6):
        with open(os.path.join(root, f"d/f{i}"), "wb") as f:
            f.write(b"other")
    calls = 0

    def crashpoint(name: str) -> None:
        nonlocal calls
        calls += name == "restore-entry-written"
        if calls == 2 and name == "restore-entry-written":
            raise OSError(errno.ENOSPC, "No space left on device (injected)")

    monkeypatch.setattr(restore_mod, "crashpoint", crashpoint)
    with pytest.raises(RestoreFailed, match="injected"):
        engine.restore("v0")
    assert not _temporary(root)
    engine.restore("v0")
    trees.assert_trees_equal(before, root, check_holes="exact")
    assert not _temporary(root)


def _temporary(root: str) -> list[str]:
    prefix = restore_mod._TMP_PREFIX.decode()
    return [n for _d, _s, names in os.walk(root) for n in names if n.startswith(prefix)]
