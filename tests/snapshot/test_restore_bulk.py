"""The bulk restore into an empty directory (``snapshot/bulkrestore.py``, an export) is
exact: every fact the tree oracle sees, as the diff restore writes it (its oracle here);
and it writes its files in batches through the native writer."""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, given, settings

from sprite_env._native import write_files
from sprite_env.checkpoints import Engine
from sprite_env.snapshot import bulkrestore
from sprite_env.snapshot.restore import restore
from sprite_env.snapshot.tree import encode_chunks
from sprite_env.store.codec import object_id
from tests.helpers import trees
from tests.helpers.acl import DEFAULT_ACL, inherits_acls
from tests.helpers.strategies import trees as tree_specs

if TYPE_CHECKING:
    from sprite_env.ids import ObjectId
    from tests.helpers.trees import Node


def _both(engine: Engine, cid: str, where: str) -> tuple[str, str, object, object]:
    """Exports ``cid`` with the bulk path and with the diff restore; their counters."""
    bulk, slow = os.path.join(where, "bulk"), os.path.join(where, "slow")
    os.mkdir(bulk)
    os.mkdir(slow)
    stats = engine.export(cid, bulk)
    top = engine.info(cid).top_tree
    res = restore(
        slow, engine.store.read, engine.store.read, None, top, refresh_cache=False, bulk=False
    )
    return bulk, slow, stats, res.stats


def test_the_sample_tree_is_exported_exactly(
    engine_layer: tuple[str, Engine], tmp_path: object
) -> None:
    """Every feature: hard links across directories, devices, FIFOs, whiteouts, sparse
    files (holes kept), xattrs of every namespace, special mode bits, owners, ns mtimes,
    non-UTF-8 names, directory mtimes (set after their contents)."""
    root, engine = engine_layer
    trees.build_tree(root, trees.sample_spec())
    engine.create()
    where = os.path.join(os.fspath(tmp_path), "out")  # type: ignore[call-overload]
    os.mkdir(where)
    bulk, slow, fast_stats, slow_stats = _both(engine, "v0", where)
    trees.assert_trees_equal(root, bulk, check_holes="exact")
    trees.assert_trees_equal(slow, bulk, check_holes="exact")
    assert fast_stats == slow_stats


def test_an_export_writes_files_in_native_batches(
    engine_layer: tuple[str, Engine], tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """500 small files in 3 directories: a handful of native calls, not one per file."""
    root, engine = engine_layer
    for d in range(3):
        os.mkdir(os.path.join(root, f"d{d}"))
        for i in range(500 // 3):
            with open(os.path.join(root, f"d{d}", f"f{i}"), "wb") as f:
                f.write(os.urandom(100 + i))
    engine.create()
    calls: list[int] = []
    real = bulkrestore._write_files
    assert real is not None

    def counted(
        files: list[tuple[int, bytes, int, int, int, int, bytes]],
        objects: dict[bytes, bytes],
        **skips: object,
    ) -> list[int]:
        calls.append(len(files))
        return real(files, objects, **skips)

    monkeypatch.setattr(bulkrestore, "_write_files", counted)
    dest = os.path.join(os.fspath(tmp_path), "out")  # type: ignore[call-overload]
    os.mkdir(dest)
    engine.export("v0", dest)
    trees.assert_trees_equal(root, dest)
    assert sum(calls) == 3 * (500 // 3)
    assert len(calls) <= 6


def test_inherited_xattrs_are_removed(engine_layer: tuple[str, Engine], tmp_path: object) -> None:
    """A default ACL on the destination gives new files and directories ACLs of their own;
    the export leaves exactly the captured xattrs (none here)."""
    root, engine = engine_layer
    trees.build_tree(root, {"a": trees.File(b"x", mode=0o640), "d/b": trees.File(b"y")})
    engine.create()
    dest = os.path.join(os.fspath(tmp_path), "out")  # type: ignore[call-overload]
    os.mkdir(dest)
    os.setxattr(dest, b"system.posix_acl_default", DEFAULT_ACL)
    if not inherits_acls(dest):
        pytest.skip("no ACL inheritance on this file system")
    engine.export("v0", dest)
    for p in ("a", "d", "d/b"):
        assert os.listxattr(os.path.join(dest, p), follow_symlinks=False) == [], p
    trees.assert_trees_equal(root, dest)


@settings(
    max_examples=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(spec=tree_specs(max_entries=30))
def test_bulk_equals_the_diff_restore(spec: dict[bytes, Node]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "layer")
        os.mkdir(root)
        trees.build_tree(root, spec)
        with Engine(root, os.path.join(tmp, "store")) as engine:
            engine.create()
            bulk, slow, fast_stats, slow_stats = _both(engine, "v0", tmp)
        trees.assert_trees_equal(root, bulk, check_holes="exact")
        trees.assert_trees_equal(slow, bulk, check_holes="exact")
        assert fast_stats == slow_stats


# -- the native writer alone ----------------------------------------------------------------


def _objects(*data: bytes) -> tuple[dict[bytes, bytes], list[ObjectId]]:
    ids = [object_id(d) for d in data]
    return dict(zip(ids, data, strict=True)), ids


def test_write_files_writes_pieces_holes_and_metadata(tmp_path: object) -> None:
    d = os.fspath(tmp_path)  # type: ignore[call-overload]
    objects, (a, b) = _objects(b"A" * 5000, b"0123456789")
    big = 3 << 20
    chunks = encode_chunks([(a, 100, 4000), (None, 0, big), (b, 2, 5), (None, 0, 4096)])
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fix = write_files(
            [
                (fd, b"sparse", 0o4751, 0, 0, -1_500_000_001, chunks),
                (fd, b"empty", 0o600, 1234, 56, 7, b""),
            ],
            objects,
        )
    finally:
        os.close(fd)
    assert fix == []
    p = os.path.join(d, "sparse")
    st = os.stat(p)
    assert st.st_size == 4000 + big + 5 + 4096
    assert (oct(st.st_mode & 0o7777), st.st_mtime_ns, st.st_atime_ns) == (
        "0o4751",
        -1_500_000_001,
        -1_500_000_001,
    )
    with open(p, "rb") as f:
        data = f.read()
    assert data == b"A" * 4000 + bytes(big) + b"23456" + bytes(4096)
    assert st.st_blocks * 512 < 1 << 20  # the holes were not written
    st = os.stat(os.path.join(d, "empty"))
    assert (st.st_size, st.st_uid, st.st_gid, st.st_mtime_ns) == (0, 1234, 56, 7)


def test_write_files_refuses_and_names_what_it_cannot_write(tmp_path: object) -> None:
    d = os.fspath(tmp_path)  # type: ignore[call-overload]
    objects, (a,) = _objects(b"abc")
    one = encode_chunks([(a, 0, 3)])
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.symlink("/etc/passwd", os.path.join(d, "planted"))
        with pytest.raises(FileExistsError) as exc:  # O_EXCL: never through a symlink
            write_files(
                [
                    (fd, b"ok", 0o644, 0, 0, 0, one),
                    (fd, b"planted", 0o644, 0, 0, 0, one),
                    (fd, b"after", 0o644, 0, 0, 0, one),
                ],
                objects,
            )
        assert exc.value.filename == b"planted"
        assert os.path.exists(os.path.join(d, "ok"))
        assert not os.path.exists(os.path.join(d, "after"))  # nothing after the failure
        with pytest.raises(ValueError, match="not given"):
            write_files(
                [(fd, b"x", 0o644, 0, 0, 0, encode_chunks([(object_id(b"?"), 0, 1)]))], objects
            )
        with pytest.raises(ValueError, match="shorter"):
            write_files([(fd, b"x", 0o644, 0, 0, 0, encode_chunks([(a, 1, 3)]))], objects)
        with pytest.raises(ValueError, match="one component"):
            write_files([(fd, b"a/b", 0o644, 0, 0, 0, one)], objects)
        with pytest.raises(ValueError, match="chunk list"):
            write_files([(fd, b"x", 0o644, 0, 0, 0, one[:-1])], objects)
        assert not os.path.exists(os.path.join(d, "x"))
    finally:
        os.close(fd)


# -- steps skipped where they change nothing (filewrite.h) ------------------------------------

_SKIP_MODES = [0o644, 0o755, 0o640, 0o600, 0o444, 0o000, 0o666, 0o4755, 0o2750, 0o1777]


def _write_probe(d: str, owner: tuple[int, int] | None, umask: int, xattrs: bool) -> list[int]:
    """One file per mode of ``_SKIP_MODES`` (owner 0:0) and one of owner 1234:56, written
    by ``write_files`` with these skips; their stats checked exactly."""
    objects, (a,) = _objects(b"payload")
    one = encode_chunks([(a, 0, 7)])
    specs = [(0, f"m{m:o}".encode(), m, 0, 0, 1_000 + m, one) for m in _SKIP_MODES]
    specs.append((0, b"other", 0o644, 1234, 56, 5, one))
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        specs = [(fd, *s[1:]) for s in specs]
        fix = write_files(specs, objects, owner=owner, umask=umask, xattrs=xattrs)
    finally:
        os.close(fd)
    for _fd, name, mode, uid, gid, mtime, _c in specs:
        st = os.stat(os.path.join(d, os.fsdecode(name)))
        assert (st.st_mode & 0o7777, st.st_uid, st.st_gid, st.st_mtime_ns) == (
            mode,
            uid,
            gid,
            mtime,
        ), name
        with open(os.path.join(d, os.fsdecode(name)), "rb") as f:
            assert f.read() == b"payload"
    return fix


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to other owners needs root")
@pytest.mark.parametrize("umask", [0o022, 0o077, 0o000])
def test_write_files_skips_only_steps_that_change_nothing(tmp_path: object, umask: int) -> None:
    """With the owner, umask and no inheritance given, every file still gets exactly its
    mode (special bits, bits the umask would clear), owner and time."""
    d = os.fspath(tmp_path)  # type: ignore[call-overload]
    old = os.umask(umask)
    try:
        assert _write_probe(d, (0, 0), umask, False) == []
    finally:
        os.umask(old)


_PROBE = """
import os, sys
sys.path[:0] = [{repo!r}]
from tests.snapshot.test_restore_bulk import _write_probe
os.umask(0o022)
_write_probe({d!r}, {owner!r}, {umask!r}, {xattrs!r})
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to other owners needs root")
@pytest.mark.skipif(
    not any(os.access(os.path.join(p, "strace"), os.X_OK) for p in os.defpath.split(":")),
    reason="needs strace",
)
def test_write_files_makes_fewer_system_calls_when_told_what_is_a_no_op(tmp_path: str) -> None:
    """Counted by strace: without skips every file is chowned, chmodded and listed (11
    files: 33 calls); with the process's owner, its umask 022 and no inheritance, only the
    one file of another owner is chowned and only the modes the umask or special bits
    change (0666, 4755, 2750, 1777) are chmodded."""
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def calls(d: str, owner: tuple[int, int] | None, umask: int, xattrs: bool) -> list[str]:
        os.mkdir(d)
        log = d + ".strace"
        code = _PROBE.format(repo=repo, d=d, owner=owner, umask=umask, xattrs=xattrs)
        subprocess.run(
            [
                "strace",
                "-f",
                "-qq",
                "-e",
                "trace=fchown,fchmod,flistxattr",
                "-o",
                log,
                sys.executable,
                "-c",
                code,
            ],
            check=True,
        )
        with open(log) as f:
            return [ln.split("(")[0].split()[-1] for ln in f if "(" in ln]

    base = os.fspath(tmp_path)
    every = calls(os.path.join(base, "all"), None, -1, True)
    assert sorted(every) == sorted(["fchown", "fchmod", "flistxattr"] * 11)
    few = calls(os.path.join(base, "few"), (0, 0), 0o022, False)
    assert sorted(few) == sorted(["fchown"] + ["fchmod"] * 4)


@pytest.mark.skipif(os.geteuid() != 0, reason="a directory of another group needs root")
def test_no_ops_follow_the_destination(tmp_path: object) -> None:
    """A destination of the process's group: its owner, its umask, nothing inherited; one
    of another group may hand that down (setgid, or ``grpid``): always chown; one with
    xattrs may hand them down: always look."""
    d = os.fspath(tmp_path)  # type: ignore[call-overload]
    plain, sgid = os.path.join(d, "plain"), os.path.join(d, "sgid")
    os.mkdir(plain)
    os.chown(plain, os.geteuid(), os.getegid())
    os.mkdir(sgid)
    os.chown(sgid, 0, 1234)
    os.chmod(sgid, 0o2755)
    old = os.umask(0o027)
    try:
        for path, owner in [(plain, (os.geteuid(), os.getegid())), (sgid, None)]:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                assert bulkrestore._no_ops(fd) == {"owner": owner, "umask": 0o027, "xattrs": False}
            finally:
                os.close(fd)
    finally:
        os.umask(old)
    os.setxattr(plain, b"user.note", b"x")
    fd = os.open(plain, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert bulkrestore._no_ops(fd)["xattrs"] is True
    finally:
        os.close(fd)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to other owners needs root")
def test_an_export_into_a_setgid_directory_keeps_the_groups(
    engine_layer: tuple[str, Engine], tmp_path: object
) -> None:
    """A setgid destination of group 1234 would give every new file that group: files of
    group 0 are still exported with it, under a umask that clears some of their bits."""
    root, engine = engine_layer
    trees.build_tree(
        root,
        {
            "a": trees.File(b"x", mode=0o644),
            "d/b": trees.File(b"y", mode=0o664, uid=5, gid=0),
            "d/c": trees.File(b"z", mode=0o2755),
        },
    )
    engine.create()
    dest = os.path.join(os.fspath(tmp_path), "out")  # type: ignore[call-overload]
    os.mkdir(dest)
    os.chown(dest, 0, 1234)
    os.chmod(dest, 0o2775)
    old = os.umask(0o077)
    try:
        engine.export("v0", dest)
    finally:
        os.umask(old)
    trees.assert_trees_equal(root, dest, check_root_meta=False)
