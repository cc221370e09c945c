"""The mounted view shows a checkpoint exactly as captured (real mounts)."""

from __future__ import annotations

import errno
import os
import re
import stat
import subprocess
from typing import TYPE_CHECKING

import pytest

from tests.fuse.mounting import PAGE_CACHE, requires_fuse
from tests.helpers import trees

if TYPE_CHECKING:
    from collections.abc import Callable

    from sprite_env.checkpoints import Engine
    from tests.fuse.mounting import Mounted

pytestmark = [pytest.mark.fuse, requires_fuse, PAGE_CACHE]

#: diff(1) reports every pair of special files, even identical ones.
_SPECIAL = re.compile(
    r"^File (.+) is a (fifo|character special file|block special file) "
    r"while file (.+) is a \2$"
)


def _diff_r(a: str, b: str) -> list[str]:
    """``diff -r`` of two trees; the lines it prints, but the special-file notices."""
    r = subprocess.run(["diff", "-r", "--no-dereference", a, b], capture_output=True, check=False)
    assert r.returncode in (0, 1), r.stderr
    lines = r.stdout.decode(errors="backslashreplace").splitlines()
    return [ln for ln in lines if not _SPECIAL.match(ln)]


@pytest.fixture
def sample(root: str, engine: Engine) -> trees.Snapshot:
    trees.build_tree(root, trees.sample_spec())
    before = trees.snapshot_tree(root)
    engine.create("sample")
    return before


def test_a_checkpoint_is_shown_exactly_as_captured(
    root: str, sample: trees.Snapshot, mount: Callable[..., Mounted]
) -> None:
    with mount() as m:
        assert os.listdir(m.mountpoint) == [".checkpoints.json", "v0"]
        # every fact: type, mode, owner, size, ns mtime, content, symlink target, rdev,
        # xattrs of every namespace, hard-link groups and st_nlink, the root's own entry
        # (holes are not compared: pyfuse3 has no lseek, so SEEK_HOLE finds none; their
        # zeros are compared by content)
        trees.assert_trees_equal(sample, m.path("v0"), check_holes=False)
        assert _diff_r(root, m.path("v0")) == []


def test_files_report_the_block_size_of_a_disk(
    root: str, sample: trees.Snapshot, mount: Callable[..., Mounted]
) -> None:
    """Tools size their buffers by ``st_blksize``: GNU diff allocates one of it for each
    file it compares, so a view saying 1 MiB made a warm ``diff -r`` of the benchmark
    layer 1.3-1.5x the disk's; saying what ext4 and xfs say makes it ~1.05x."""
    with mount() as m:
        for dirpath, _dirs, files in os.walk(m.path("v0")):
            for name in files:
                st = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISREG(st.st_mode):
                    assert st.st_blksize == 4096, name
        assert os.stat(m.mountpoint).st_blksize == 4096


def test_hard_links_share_an_inode_and_count_their_names(
    sample: trees.Snapshot, mount: Callable[..., Mounted]
) -> None:
    with mount() as m:
        b1, b2, b3 = (os.lstat(m.path("v0", p)) for p in ("hard/b1", "hard/sub/b2", "hard/b3"))
        assert b1.st_ino == b2.st_ino == b3.st_ino
        assert b1.st_nlink == 3
        a1, a2 = os.lstat(m.path("v0", "hard/a1")), os.lstat(m.path("v0", "hard/a2"))
        assert a1.st_ino == a2.st_ino != b1.st_ino
        assert a1.st_nlink == 2
        assert os.lstat(m.path("v0", "etc/passwd")).st_nlink == 1


def test_special_files_metadata_and_no_device_access(
    sample: trees.Snapshot, mount: Callable[..., Mounted]
) -> None:
    with mount() as m:
        st = os.lstat(m.path("v0", "dev/max"))
        assert stat.S_ISCHR(st.st_mode)
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (4095, 0xFFFFF)
        assert stat.S_ISBLK(os.lstat(m.path("v0", "dev/loop0")).st_mode)
        assert stat.S_ISFIFO(os.lstat(m.path("v0", "run/fifo")).st_mode)
        # nodev: a captured /dev/null is shown, never opened as the real device
        with pytest.raises(PermissionError):
            os.open(m.path("v0", "dev/null"), os.O_RDONLY)
        assert os.readlink(m.path("v0", "links/non-utf8")) == b"\xff\xfe/\x80".decode(
            errors="surrogateescape"
        )
        assert os.getxattr(m.path("v0", "usr/bin/ping"), "security.capability") == (
            trees.CAP_NET_BIND_SERVICE
        )
        assert sorted(os.listxattr(m.path("v0", "home/user/notes.txt"))) == [
            "trusted.bin",
            "user.empty",
            "user.k",
        ]
        with pytest.raises(OSError, match="No data available") as e:
            os.getxattr(m.path("v0", "etc/shadow"), "user.nothing")
        assert e.value.errno == errno.ENODATA


def test_sparse_files_read_as_zeros(
    root: str, sample: trees.Snapshot, mount: Callable[..., Mounted]
) -> None:
    with mount() as m:
        for p in ("sparse/big", "sparse/all-hole", "sparse/tail", "sparse/head-hole"):
            subprocess.run(["cmp", os.path.join(root, p), m.path("v0", p)], check=True)
        st = os.lstat(m.path("v0", "sparse/big"))
        assert st.st_size == 8 << 20
        assert st.st_blocks * 512 < 64 << 10  # the holes are not counted as data


def test_writes_are_refused_with_erofs(
    sample: trees.Snapshot, mount: Callable[..., Mounted]
) -> None:
    with mount() as m:
        target = m.path("v0", "etc/passwd")
        attempts: list[Callable[[], object]] = [
            lambda: os.open(target, os.O_WRONLY),
            lambda: os.open(target, os.O_RDONLY | os.O_TRUNC),
            lambda: os.open(m.path("v0", "etc/new"), os.O_WRONLY | os.O_CREAT, 0o644),
            lambda: os.mkdir(m.path("v0", "newdir")),
            lambda: os.mkdir(m.path("v9")),
            lambda: os.unlink(target),
            lambda: os.rename(target, m.path("v0", "etc/moved")),
            lambda: os.symlink("x", m.path("v0", "etc/link")),
            lambda: os.link(target, m.path("v0", "etc/hard")),
            lambda: os.chmod(target, 0o777),
            lambda: os.chown(target, 1, 1),
            lambda: os.utime(target, ns=(0, 0)),
            lambda: os.truncate(target, 0),
            lambda: os.setxattr(target, "user.x", b"1"),
            lambda: os.removexattr(target, "user.mime"),
        ]
        for attempt in attempts:
            with pytest.raises(OSError, match="Read-only file system") as e:
                attempt()
            assert e.value.errno == errno.EROFS, attempt
        assert os.statvfs(m.mountpoint).f_flag & os.ST_RDONLY


def test_statfs_reports_the_shown_checkpoints(
    sample: trees.Snapshot, engine: Engine, mount: Callable[..., Mounted]
) -> None:
    with mount() as m:
        s = os.statvfs(m.mountpoint)
        assert s.f_blocks * s.f_frsize >= engine.info("v0").bytes
        assert (s.f_bfree, s.f_bavail, s.f_ffree) == (0, 0, 0)
        assert s.f_files > engine.info("v0").files
        assert s.f_namemax == 255


def test_lookups_load_only_the_trees_on_their_path(
    sample: trees.Snapshot, mount: Callable[..., Mounted]
) -> None:
    deep = "/".join(["deep"] + ["d"] * trees.DEEP_LEVELS + ["leaf"])
    with mount() as m:
        before = m.call(lambda: m.ops.trees.misses)
        os.lstat(m.path("v0", deep))
        loaded = m.call(lambda: m.ops.trees.misses) - before
        # the top tree, the root directory, deep/ and its 60 levels: one tree each
        assert loaded == 2 + 1 + trees.DEEP_LEVELS


def test_inode_numbers_are_stable_after_the_kernel_forgets(
    sample: trees.Snapshot, mount: Callable[..., Mounted]
) -> None:
    paths = ["v0", "v0/etc/passwd", "v0/hard/b1", "v0/hard/sub/b2", "v0/deep"]
    with mount() as m:
        first = [os.lstat(m.path(p)).st_ino for p in paths]
        live_before = m.call(lambda: len(m.ops.inodes))
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("2\n")  # dentries and inodes: the kernel sends FORGET
        trees_forgotten = m.call(lambda: len(m.ops.inodes)) < live_before
        again = [os.lstat(m.path(p)).st_ino for p in paths]
        assert again == first
        assert trees_forgotten, "the kernel did not forget: the test proved nothing"
