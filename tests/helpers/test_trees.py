"""Tests of the tree helpers: the builder sets what it is told, the snapshot sees it, an
independent copy (``cp -a``) compares equal and every kind of damage is reported precisely."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, given, settings

from tests.helpers.strategies import trees
from tests.helpers.trees import (
    CAP_NET_BIND_SERVICE,
    DEEP_LEVELS,
    T0,
    CharDev,
    Dir,
    EntryFacts,
    Fifo,
    File,
    HardLink,
    Socket,
    Sparse,
    Symlink,
    assert_trees_equal,
    build_tree,
    diff_trees,
    sample_spec,
    show_path,
    snapshot_tree,
    spec_differences,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.helpers.trees import Node, PathArg

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds device nodes and owners")


def cp_a(src: PathArg, dst: PathArg, *extra: str) -> None:
    """``cp -a`` (GNU): preserves owners, modes, ns mtimes, xattrs of every namespace (symlinks
    too), hard links, devices, fifos, sockets and (with the default --sparse=auto) holes."""
    subprocess.run(["cp", "-a", *extra, os.fsencode(src), os.fsencode(dst)], check=True)


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, dict[bytes, Node]]:
    """The sample tree (with a socket), built once; tests copy it, never change it."""
    root = os.fsencode(tmp_path_factory.mktemp("sample") / "tree")
    return root, build_tree(root, sample_spec(socket=True))


@pytest.fixture
def copy(sample: tuple[bytes, dict[bytes, Node]], tmp_path: Path) -> bytes:
    dst = os.fsencode(tmp_path / "copy")
    cp_a(sample[0], dst)
    return dst


# --------------------------------------------------------------------------------------------
# The builder and the snapshot


def test_every_declared_fact_of_the_sample_is_observed(
    sample: tuple[bytes, dict[bytes, Node]],
) -> None:
    root, spec = sample
    snap = snapshot_tree(root)
    assert spec_differences(spec, snap) == []
    # Spot checks that spec_differences itself looks at the right things.
    assert {f.kind for f in snap.values()} == {
        "file",
        "dir",
        "symlink",
        "chardev",
        "blockdev",
        "fifo",
        "socket",
    }
    assert snap[b"."].mtime_ns == T0
    ping = snap[b"usr/bin/ping"]
    assert ping.xattrs == {b"security.capability": CAP_NET_BIND_SERVICE}
    both = snap[b"usr/bin/suid-cap"]
    assert stat.S_IMODE(both.mode) == 0o4711
    assert (both.uid, both.gid) == (1000, 1000)
    assert both.xattrs[b"security.capability"] == CAP_NET_BIND_SERVICE
    assert stat.S_IMODE(snap[b"tmp"].mode) == 0o1777
    assert stat.S_IMODE(snap[b"srv/shared"].mode) == 0o2775
    assert snap[b"upper/opaque"].xattrs[b"trusted.overlay.opaque"] == b"y"
    assert snap[b"upper/deleted"].rdev == (0, 0)
    assert snap[b"upper/deleted"].mode == stat.S_IFCHR
    assert snap[b"dev/loop0"].rdev == (7, 0)
    assert snap[b"links/owned"].xattrs == {b"trusted.sym": b"1"}
    assert snap[b"links/outside"].target == b"../../etc/passwd"
    assert snap[b"home/big-ids"].uid == 4_000_000_000
    assert snap[b"times/pre-1970"].mtime_ns == -1_000_000_001
    groups = {f.link_group for f in snap.values() if f.link_group is not None}
    sizes = sorted(sum(f.link_group == g for f in snap.values()) for g in groups)
    assert sizes == [2, 2, 3]
    assert snap[b"hard/sub/b2"].nlink == 3
    assert snap[b"sparse/big"].data_extents == ((0, 8192), (5 << 20, (5 << 20) + 4096))
    assert snap[b"sparse/big"].size == 8 << 20
    assert snap[b"sparse/all-hole"].data_extents == ()
    assert snap[b"sizes/zeros"].data_extents == ((0, 12288),)  # written zeros are data
    assert snap[b"empty/file"].size == 0
    assert snap[b"empty/file"].data_extents == ()
    assert b"names/" + b"n" * 255 in snap
    assert b"names/\xff\xfe-not-utf8" in snap
    deepest = max(snap, key=lambda p: p.count(b"/"))
    assert deepest.count(b"/") == DEEP_LEVELS + 1
    assert deepest.endswith(b"/leaf")
    assert {snap[p].size for p in snap if p.startswith(b"sizes/64k")} == {65535, 65536, 65537}


def test_snapshot_keys_root_ignore_and_path_types(tmp_path: Path) -> None:
    build_tree(
        tmp_path,
        {
            "a/b.txt": File(b"x"),
            "store/objects/1": File(b"y"),
            "storekeeper": File(b"z"),
            "l": Symlink("a"),
        },
    )
    snap = snapshot_tree(tmp_path, ignore=["store"])
    assert list(snap) == [b".", b"a", b"a/b.txt", b"l", b"storekeeper"]
    assert snap[b"l"].kind == "symlink"  # not followed
    assert snapshot_tree(str(tmp_path), ignore=[b"store/"]) == snap
    assert snapshot_tree(os.fsencode(tmp_path), ignore=["./store"]) == snap
    assert b"store/objects/1" in snapshot_tree(tmp_path)
    with pytest.raises(NotADirectoryError):
        snapshot_tree(tmp_path / "l")


def test_snapshot_stays_on_one_file_system(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    build_tree(tmp_path, {"mnt": Dir(), "here": File(b"h")})
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "none", mnt]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        (mnt / "elsewhere").write_bytes(b"e")
        snap = snapshot_tree(tmp_path)
    finally:
        subprocess.run(["umount", mnt], check=True)
    assert b"mnt" in snap
    assert b"here" in snap
    assert b"mnt/elsewhere" not in snap


def test_list_spec_and_bytes_paths(tmp_path: Path) -> None:
    spec: list[Node] = [
        File(b"1", path=b"\xff/one", mode=0o600),
        HardLink(b"\xff/one", path="two"),
        Dir(path=".", mode=0o700, mtime_ns=5),
    ]
    build_tree(tmp_path, spec)
    snap = snapshot_tree(tmp_path)
    assert spec_differences(spec, snap) == []
    assert snap[b"two"].link_group == snap[b"\xff/one"].link_group == 0
    assert snap[b"."].mode == stat.S_IFDIR | 0o700
    assert snap[b"."].mtime_ns == 5


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"a": File(b""), "a/b": File(b"")}, "not a directory"),
        ({"d": Dir(), "h": HardLink("d")}, "non-directory"),
        ({"h": HardLink("nowhere")}, "non-directory"),
        ({"../x": File(b"")}, r"'\.\.'"),
        ({"a": File(b""), "./a": File(b"")}, "duplicate"),
        ({"l": Symlink("x", mode=0o700)}, "no mode"),
        ({"f": File(b"", mode=0o100644)}, "permission bits"),
        ({".": File(b"")}, "only be a Dir"),
        ([File(b"")], "needs a path"),
    ],
)
def test_build_tree_rejects_bad_specs(tmp_path: Path, spec: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_tree(tmp_path, spec)  # type: ignore[arg-type]


def test_metadata_survives_in_the_right_order(tmp_path: Path) -> None:
    """chown clears setuid/setgid and security.capability; writing a file clears
    security.capability; creating entries changes the parent's mtime: none of it may leak."""
    spec: dict[str, Node] = {
        "d": Dir(mode=0o2750, uid=7, gid=8, mtime_ns=T0, xattrs={b"user.d": b"1"}),
        "d/f": File(
            b"data",
            mode=0o6755,
            uid=1000,
            gid=1000,
            mtime_ns=T0 + 1,
            xattrs={b"security.capability": CAP_NET_BIND_SERVICE},
        ),
        "d/sub": Dir(mtime_ns=T0 + 2),
        "d/sub/s": Socket(mode=0o700, mtime_ns=T0 + 3),
        "d/sub/p": Fifo(mtime_ns=T0 + 4),
        "d/sub/h": HardLink("d/f"),
    }
    build_tree(tmp_path, spec)
    assert spec_differences(spec, snapshot_tree(tmp_path)) == []


# --------------------------------------------------------------------------------------------
# Comparing: an independent copy is equal, every change is reported precisely


def test_a_cp_a_copy_of_the_sample_has_no_differences(
    sample: tuple[bytes, dict[bytes, Node]], copy: bytes
) -> None:
    assert diff_trees(sample[0], copy) == []
    assert_trees_equal(sample[0], copy)
    assert snapshot_tree(sample[0]) == snapshot_tree(copy)


def test_sparse_always_punches_zeros_which_only_kept_mode_accepts(
    sample: tuple[bytes, dict[bytes, Node]], tmp_path: Path
) -> None:
    """``cp --sparse=always`` (like a capture that stores zero chunks as holes) turns written
    zeros into holes: not the same hole map, but every original hole is still a hole."""
    dst = tmp_path / "punched"
    cp_a(sample[0], dst, "--sparse=always")
    diffs = diff_trees(sample[0], dst)
    assert {(d.path, d.field) for d in diffs} == {(b"sizes/zeros", "data_extents")}
    assert diffs[0].b == ()
    assert_trees_equal(sample[0], dst, check_holes="kept")
    assert_trees_equal(sample[0], dst, check_holes=False)
    with pytest.raises(AssertionError, match="sizes/zeros: data_extents"):
        assert_trees_equal(sample[0], dst)
    # The other way round a hole would have been filled: "kept" reports it.
    with pytest.raises(AssertionError, match="sizes/zeros: data_extents"):
        assert_trees_equal(dst, sample[0], check_holes="kept")


@contextlib.contextmanager
def parent_mtime_kept(path: bytes) -> Iterator[None]:
    """Restores the parent directory's mtime after adding/removing/renaming ``path``."""
    parent = os.path.dirname(path)
    before = os.lstat(parent).st_mtime_ns
    yield
    os.utime(parent, ns=(before, before))


def _keep_mtime(path: bytes, change: Callable[[], None]) -> None:
    before = os.lstat(path).st_mtime_ns
    change()
    os.utime(path, ns=(before, before), follow_symlinks=False)


def _mtime(p: bytes) -> None:
    os.utime(p, ns=(0, os.lstat(p).st_mtime_ns + 1), follow_symlinks=False)


def _mode(p: bytes) -> None:
    os.chmod(p, 0o755)  # was 04755


def _owner(p: bytes) -> None:
    _keep_mtime(p, lambda: os.chown(p, 1000, -1))


def _xattr_value(p: bytes) -> None:
    os.setxattr(p, b"user.k", b"w")


def _xattr_removed(p: bytes) -> None:
    os.removexattr(p, b"security.capability")


def _xattr_added_on_symlink(p: bytes) -> None:
    os.setxattr(p, b"trusted.new", b"", follow_symlinks=False)


def _content(p: bytes) -> None:
    def change() -> None:
        with open(p, "r+b") as f:
            f.write(b"J")

    _keep_mtime(p, change)


def _symlink_target(p: bytes) -> None:
    st = os.lstat(p)
    with parent_mtime_kept(p):
        os.unlink(p)
        os.symlink(b"../../etc/shadow", p)
    os.utime(p, ns=(st.st_mtime_ns, st.st_mtime_ns), follow_symlinks=False)


def _link_broken(p: bytes) -> None:
    """Replaces the name by an identical but separate file."""
    tmp = p + b".tmp"
    with parent_mtime_kept(p):
        shutil.copy2(p, tmp)  # content, mode, mtime, xattrs; not the owner
        st = os.lstat(p)
        os.chown(tmp, st.st_uid, st.st_gid)
        os.chmod(tmp, stat.S_IMODE(st.st_mode))
        os.utime(tmp, ns=(st.st_mtime_ns, st.st_mtime_ns))
        os.rename(tmp, p)


def _hole_filled(p: bytes) -> None:
    def change() -> None:
        fd = os.open(p, os.O_WRONLY)
        try:
            os.pwrite(fd, bytes(4096), 1 << 20)
        finally:
            os.close(fd)

    _keep_mtime(p, change)


def _removed(p: bytes) -> None:
    with parent_mtime_kept(p):
        os.unlink(p)


def _added(p: bytes) -> None:
    with parent_mtime_kept(p), open(p, "wb"):
        pass


def _kind(p: bytes) -> None:
    st = os.lstat(p)
    with parent_mtime_kept(p):
        os.unlink(p)
        os.mknod(p, stat.S_IFREG | 0o644)
    os.utime(p, ns=(st.st_mtime_ns, st.st_mtime_ns))


def _rdev(p: bytes) -> None:
    st = os.lstat(p)
    with parent_mtime_kept(p):
        os.unlink(p)
        os.mknod(p, st.st_mode, os.makedev(1, 5))
        os.chmod(p, stat.S_IMODE(st.st_mode))  # not masked by the umask
    os.utime(p, ns=(st.st_mtime_ns, st.st_mtime_ns))


@pytest.mark.parametrize(
    ("path", "change", "expected"),
    [
        (b"etc/passwd", _mtime, {(b"etc/passwd", "changed", "mtime_ns")}),
        (b"home/user", _mtime, {(b"home/user", "changed", "mtime_ns")}),
        (b"links/rel", _mtime, {(b"links/rel", "changed", "mtime_ns")}),
        (b"usr/bin/su", _mode, {(b"usr/bin/su", "changed", "mode")}),
        (b"etc/shadow", _owner, {(b"etc/shadow", "changed", "uid")}),
        (
            b"home/user/notes.txt",
            _xattr_value,
            {(b"home/user/notes.txt", "changed", "xattr user.k")},
        ),
        (
            b"usr/bin/ping",
            _xattr_removed,
            {(b"usr/bin/ping", "changed", "xattr security.capability")},
        ),
        (b"links/abs", _xattr_added_on_symlink, {(b"links/abs", "changed", "xattr trusted.new")}),
        (b"sizes/64k", _content, {(b"sizes/64k", "changed", "digest")}),
        (b"links/outside", _symlink_target, {(b"links/outside", "changed", "target")}),
        (
            b"hard/a2",
            _link_broken,
            {
                (b"hard/a1", "changed", "nlink"),
                (b"hard/a1", "changed", "hard links"),
                (b"hard/a2", "changed", "nlink"),
                (b"hard/a2", "changed", "hard links"),
            },
        ),
        (
            b"hard/b3",
            _link_broken,
            {
                (p, "changed", f)
                for p in (b"hard/b1", b"hard/b3", b"hard/sub/b2")
                for f in ("nlink", "hard links")
            },
        ),
        (b"sparse/big", _hole_filled, {(b"sparse/big", "changed", "data_extents")}),
        (b"empty/file", _removed, {(b"empty/file", "missing", None)}),
        (b"empty/dir/new", _added, {(b"empty/dir/new", "extra", None)}),
        (b"run/fifo", _kind, {(b"run/fifo", "changed", "kind")}),
        (b"dev/null", _rdev, {(b"dev/null", "changed", "rdev")}),
        (
            b"names/\xff\xfe-not-utf8",
            _mtime,
            {(b"names/\xff\xfe-not-utf8", "changed", "mtime_ns")},
        ),
    ],
    ids=lambda v: v.__name__ if callable(v) else None,
)
def test_one_change_is_reported_with_path_and_field(
    sample: tuple[bytes, dict[bytes, Node]],
    copy: bytes,
    path: bytes,
    change: Callable[[bytes], None],
    expected: set[tuple[bytes, str, str | None]],
) -> None:
    change(os.path.join(copy, path))
    diffs = diff_trees(sample[0], copy)
    assert {(d.path, d.what, d.field) for d in diffs} == expected
    with pytest.raises(AssertionError) as info:
        assert_trees_equal(sample[0], copy)
    report = str(info.value)
    for p, what, field in expected:
        assert any(
            show_path(p) in ln and what in ln and (field is None or field in ln)
            for ln in report.splitlines()
        )


def test_report_wording(sample: tuple[bytes, dict[bytes, Node]], copy: bytes) -> None:
    _mode(os.path.join(copy, b"usr/bin/su"))
    _removed(os.path.join(copy, b"names/\xff\xfe-not-utf8"))
    _added(os.path.join(copy, b"empty/dir/new"))
    _content(os.path.join(copy, b"sizes/64k"))
    with pytest.raises(AssertionError) as info:
        assert_trees_equal(sample[0], copy)
    lines = str(info.value).splitlines()
    assert lines[0] == "trees differ in 4 way(s) (a = expected, b = actual):"
    assert lines[1] == "  extra in b:   empty/dir/new (file)"
    assert lines[2] == "  missing in b: names/\\xff\\xfe-not-utf8 (file)"
    assert lines[3].startswith("  changed:      sizes/64k: digest: ")
    assert lines[4] == "  changed:      usr/bin/su: mode: 0o104755 -> 0o100755"


def test_long_reports_are_cut_after_max_shown(
    sample: tuple[bytes, dict[bytes, Node]], copy: bytes
) -> None:
    deep = [p for p in snapshot_tree(copy) if p.startswith(b"deep/")]
    for p in deep:
        _mtime(os.path.join(copy, p))
    with pytest.raises(AssertionError) as info:
        assert_trees_equal(sample[0], copy)
    lines = str(info.value).splitlines()
    assert lines[0] == f"trees differ in {len(deep)} way(s) (a = expected, b = actual):"
    assert len(lines) == 1 + 50 + 1
    assert lines[-1] == f"  … and {len(deep) - 50} more difference(s)"


def test_root_meta_and_ignore_options(sample: tuple[bytes, dict[bytes, Node]], copy: bytes) -> None:
    _added(os.path.join(copy, b"store"))  # a store kept inside the tree...
    _mtime(copy)  # ...and a root touched by whoever restored into it
    assert {(d.path, d.field) for d in diff_trees(sample[0], copy)} == {
        (b".", "mtime_ns"),
        (b"store", None),
    }
    assert_trees_equal(sample[0], copy, check_root_meta=False, ignore=["store"])
    # Snapshots and roots mix; ignore applies to given snapshots too.
    assert_trees_equal(snapshot_tree(sample[0]), copy, check_root_meta=False, ignore=[b"store"])


def test_kept_holes_mode_compares_containment() -> None:
    def facts(*extents: tuple[int, int]) -> EntryFacts:
        return EntryFacts("file", stat.S_IFREG | 0o644, 0, 0, 0, size=1 << 20, data_extents=extents)

    a = {b"f": facts((0, 8192), (65536, 131072))}
    fewer = {b"f": facts((4096, 8192), (65536, 69632), (126976, 131072))}
    more = {b"f": facts((0, 12288), (65536, 131072))}
    assert diff_trees(a, fewer, check_holes="kept") == []
    assert diff_trees(a, fewer, check_holes=False) == []
    assert [d.field for d in diff_trees(a, fewer)] == ["data_extents"]
    assert [d.field for d in diff_trees(a, fewer, check_holes="exact")] == ["data_extents"]
    assert [d.field for d in diff_trees(a, more, check_holes="kept")] == ["data_extents"]


# --------------------------------------------------------------------------------------------
# Generated trees


def _restore_holes(src: bytes, dst: bytes) -> None:
    """cp's --sparse=auto looks for holes only if st_blocks < st_size // 512, so it fills
    holes it does not expect: a hole-only file under 512 bytes, or a hole in the last, partial
    block (size 4516 with only the first block allocated). Rewrite such copies extent by
    extent, on the same inode (keeping hard links), restoring the mode and mtime."""
    dst_snap = snapshot_tree(dst)
    for path, facts in snapshot_tree(src).items():
        if facts.kind != "file" or facts.data_extents == dst_snap[path].data_extents:
            continue
        assert facts.data_extents is not None
        assert facts.size is not None
        p = os.path.join(dst, path)
        st = os.lstat(p)
        sfd = os.open(os.path.join(src, path), os.O_RDONLY)
        dfd = os.open(p, os.O_WRONLY)
        try:
            os.ftruncate(dfd, 0)
            for start, end in facts.data_extents:
                os.pwrite(dfd, os.pread(sfd, end - start, start), start)
            os.ftruncate(dfd, facts.size)
        finally:
            os.close(sfd)
            os.close(dfd)
        os.chmod(p, stat.S_IMODE(st.st_mode))
        os.utime(p, ns=(st.st_mtime_ns, st.st_mtime_ns))


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(spec=trees())
def test_generated_trees_build_as_declared_and_copy_equal(spec: dict[bytes, Node]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(os.fsencode(tmp), b"src")
        dst = os.path.join(os.fsencode(tmp), b"dst")
        build_tree(src, spec)
        snap = snapshot_tree(src)
        assert spec_differences(spec, snap) == []
        cp_a(src, dst)
        _restore_holes(src, dst)
        assert_trees_equal(snap, dst)
        assert snapshot_tree(dst) == snap


def test_the_strategy_covers_every_kind() -> None:
    seen: set[type] = set()
    modes: set[int] = set()

    @settings(max_examples=40, derandomize=True, database=None, deadline=None)
    @given(spec=trees())
    def collect(spec: dict[bytes, Node]) -> None:
        for node in spec.values():
            seen.add(type(node))
            if isinstance(node, CharDev) and (node.major, node.minor) == (0, 0):
                seen.add(type(None))  # a whiteout
            mode = getattr(node, "mode", None)
            if mode:
                modes.add(mode & 0o7000)

    collect()
    assert seen >= {File, Sparse, Dir, Symlink, HardLink, Fifo, CharDev, type(None)}
    assert modes >= {0o4000, 0o2000, 0o1000}


def test_sockets_need_no_short_path(tmp_path: Path) -> None:
    """sun_path holds 108 bytes; the builder binds via /proc/self/fd and renames."""
    deep = "/".join(["x" * 50] * 4) + "/" + "s" * 200
    build_tree(tmp_path, {deep: Socket()})
    assert stat.S_ISSOCK(os.lstat(tmp_path / deep).st_mode)
    assert os.listdir(os.path.dirname(tmp_path / deep)) == ["s" * 200]  # no temporary name left
