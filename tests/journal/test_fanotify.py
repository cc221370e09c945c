"""The fanotify binding on a real tmpfs: what each kind of change reports, decoded."""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING

import pytest

from sprite_env.journal import fanotify as fan
from tests.helpers.daemon import write_file

if TYPE_CHECKING:
    from collections.abc import Iterator

FLAGS = fan.FAN_CLASS_NOTIF | fan.FAN_CLOEXEC | fan.FAN_NONBLOCK
REPORT = fan.FAN_REPORT_DFID_NAME | fan.FAN_REPORT_FID
MASK = fan.CHANGE_EVENTS | fan.FAN_ONDIR | fan.FAN_EVENT_ON_CHILD


class Group:
    def __init__(self, path: str) -> None:
        self.fd = fan.fanotify_init(FLAGS | REPORT, os.O_RDONLY | os.O_CLOEXEC)
        fan.fanotify_mark(self.fd, fan.FAN_MARK_ADD | fan.FAN_MARK_FILESYSTEM, MASK, path.encode())
        self.mount_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        self.fsid = fan.fsid_of(self.mount_fd)

    def read(self) -> fan.Batch:
        b = fan.new_batch()
        fan.read_events(self.fd, self.fsid, b)
        return b

    def path(self, handle: bytes) -> str | None:
        try:
            fd = fan.open_by_handle(self.mount_fd, handle, os.O_PATH)
        except OSError as e:
            if e.errno != errno.ESTALE:  # ESTALE: the object is gone
                raise
            return None
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)

    def paths(self, handles: Iterator[bytes] | set[bytes]) -> set[str | None]:
        return {self.path(h) for h in handles}

    def close(self) -> None:
        os.close(self.fd)
        os.close(self.mount_fd)


def test_each_change_names_its_directory(layer: str) -> None:
    os.makedirs(f"{layer}/a/b")
    write_file(f"{layer}/a/b/f", b"1")
    g = Group(layer)
    try:
        assert g.read().events == 0

        with open(f"{layer}/a/b/f", "ab") as f:
            f.write(b"2")
        b = g.read()
        assert g.paths(b.dirs) == {f"{layer}/a/b"}  # modify, close-write
        assert not b.children
        assert not b.selves
        assert not b.objects

        os.chmod(f"{layer}/a/b/f", 0o600)
        os.setxattr(f"{layer}/a/b/f", "user.k", b"v")
        os.utime(f"{layer}/a/b/f", ns=(1, 1))
        os.truncate(f"{layer}/a/b/f", 0)
        assert g.paths(g.read().dirs) == {f"{layer}/a/b"}

        os.chmod(f"{layer}/a/b", 0o700)  # a directory's own change: the directory itself
        b = g.read()
        assert g.paths(b.selves) == {f"{layer}/a/b"}
        assert not b.dirs

        os.mkdir(f"{layer}/a/c")
        b = g.read()
        assert g.paths(b.dirs) == {f"{layer}/a"}
        assert {(g.path(h), n) for h, n in b.children} == {(f"{layer}/a", b"c")}

        os.rename(f"{layer}/a/b", f"{layer}/a/c/b")
        b = g.read()
        assert g.paths(b.dirs) == {f"{layer}/a", f"{layer}/a/c"}
        assert {(g.path(h), n) for h, n in b.children} == {
            (f"{layer}/a", b"b"),
            (f"{layer}/a/c", b"b"),
        }

        os.link(f"{layer}/a/c/b/f", f"{layer}/a/g")  # the link count: the file alone
        b = g.read()
        assert g.paths(b.dirs) == {f"{layer}/a"}
        assert len(b.objects) == 1

        os.unlink(f"{layer}/a/g")
        os.unlink(f"{layer}/a/c/b/f")
        os.rmdir(f"{layer}/a/c/b")
        b = g.read()
        assert g.paths(b.selves | b.dirs) >= {None}  # the removed directory: ESTALE
        assert f"{layer}/a/c" in g.paths(b.dirs)
    finally:
        g.close()


def test_writes_through_a_mapping_are_reported_at_close(layer: str) -> None:
    import mmap

    write_file(f"{layer}/m", b"0" * 4096)
    g = Group(layer)
    try:
        fd = os.open(f"{layer}/m", os.O_RDWR)
        with mmap.mmap(fd, 4096) as m:
            m[0:1] = b"1"
            assert g.read().events == 0  # nothing while mapped: journal.py scans /proc
        os.close(fd)
        assert g.paths(g.read().dirs) == {layer}
    finally:
        g.close()


def test_records_of_another_file_system_are_dropped(layer: str) -> None:
    g = Group(layer)
    try:
        write_file(f"{layer}/x", b"1")
        buf = os.read(g.fd, fan.READ_SIZE)
        b = fan.new_batch()
        fan.decode(buf, (g.fsid[0] ^ 1, g.fsid[1]), b)
        assert b.events >= 1
        assert b.foreign == b.events
        assert not b.dirs
        b = fan.new_batch()
        fan.decode(buf, g.fsid, b)
        assert b.foreign == 0
        assert b.dirs
    finally:
        g.close()


def test_a_full_queue_reports_overflow(layer: str) -> None:
    g = Group(layer)
    try:
        os.mkdir(f"{layer}/many")
        # 16384 events is the kernel's default queue; each create is one event (names
        # differ, so none merge)
        for i in range(17000):
            os.close(os.open(f"{layer}/many/{i}", os.O_CREAT | os.O_WRONLY, 0o644))
        b = g.read()
        assert b.overflow
    finally:
        g.close()


def test_handle_at_is_the_handle_a_data_event_reports_for_its_file(layer: str) -> None:
    """``handle_at`` (the extension's, and the ctypes one beside it) gives what a write's
    event carries as its file's handle, for the name it names; a symlink's own handle, not
    its target's; and the errors ``lstat`` would."""
    os.mkdir(f"{layer}/d")
    write_file(f"{layer}/d/f", b"1")
    os.symlink("f", f"{layer}/d/s")
    g = Group(layer)
    try:
        with open(f"{layer}/d/f", "ab") as f:
            f.write(b"2")
        batch = g.read()
        ((d, name, obj),) = {t for t in batch.named_objects if t[1] == b"f"}
        path = f"{layer}/d/f".encode()
        assert fan.handle_at(path) == obj
        assert fan._name_to_handle(fan.AT_FDCWD, path, 0) == obj
        assert fan.handle_at(f"{layer}/d/s".encode()) not in (obj, d)
        with pytest.raises(FileNotFoundError):
            fan.handle_at(f"{layer}/d/nothing".encode())
        with pytest.raises(NotADirectoryError):
            fan.handle_at(f"{layer}/d/f/under".encode())
    finally:
        g.close()


def test_handle_of_is_what_events_report(layer: str) -> None:
    os.mkdir(f"{layer}/d")
    g = Group(layer)
    try:
        write_file(f"{layer}/d/f", b"1")
        (reported,) = g.read().dirs
        fd = os.open(f"{layer}/d", os.O_RDONLY | os.O_DIRECTORY)
        try:
            assert fan.handle_of(fd) == reported
        finally:
            os.close(fd)
    finally:
        g.close()
