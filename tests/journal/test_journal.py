"""The journal's epochs and hints, on a real tmpfs and through a real overlayfs."""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import subprocess
from typing import TYPE_CHECKING

import pytest

from sprite_env.journal import Journal, JournalUnavailable, kernel_reason
from sprite_env.snapshot.capture import WalkMemo
from tests.helpers.daemon import write_file

if TYPE_CHECKING:
    from sprite_env.journal import WalkPlan

MEMO = WalkMemo({}, frozenset(), frozenset(), 0)


def started(layer: str, *, bounded_queue: bool = False) -> Journal:
    """A journal past its first (full) capture, so the next plan carries a hint."""
    j = Journal(layer, bounded_queue=bounded_queue)
    plan = j.begin()
    assert plan.hint is None
    assert "just started" in plan.reason
    j.commit(plan, MEMO)
    return j


def dirty_after(j: Journal) -> tuple[set[bytes], set[bytes]]:
    plan = j.begin()
    assert plan.hint is not None, plan.reason
    j.commit(plan, MEMO)
    return set(plan.hint.dirty), set(plan.hint.void)


def test_a_hint_names_the_changed_directories_relative_to_the_root(layer: str) -> None:
    for d in ("a/b/c", "a/d", "e"):
        os.makedirs(f"{layer}/{d}")
    write_file(f"{layer}/a/b/c/f", b"1")
    write_file(f"{layer}/e/g", b"1")
    with started(layer) as j:
        assert dirty_after(j) == (set(), set())
        with open(f"{layer}/a/b/c/f", "ab") as f:
            f.write(b"2")
        os.chmod(f"{layer}/e/g", 0o600)
        assert dirty_after(j) == ({b"a/b/c", b"e"}, set())

        os.rename(f"{layer}/a/b", f"{layer}/e/b")  # a whole directory moves
        dirty, void = dirty_after(j)
        assert {b"a", b"e"} <= dirty
        assert void == {b"a/b", b"e/b"}

        os.chmod(f"{layer}/a/d", 0o700)  # a directory's own metadata: its parent's entry
        assert b"a" in dirty_after(j)[0]

        shutil.rmtree(f"{layer}/e/b")  # handles of removed directories are gone: dropped
        dirty, void = dirty_after(j)
        assert dirty == {b"e"}
        assert void == {b"e/b"}


def test_events_outside_the_layer_are_dropped(fs: str, layer: str) -> None:
    os.mkdir(f"{fs}/elsewhere")
    with started(layer) as j:
        for i in range(50):
            write_file(f"{fs}/elsewhere/{i}", b"x")
        write_file(f"{layer}/in", b"x")
        assert dirty_after(j) == ({b""}, set())
        assert j.events >= 100


def test_events_during_a_capture_belong_to_the_next(layer: str) -> None:
    os.mkdir(f"{layer}/d")
    with started(layer) as j:
        plan = j.begin()
        write_file(f"{layer}/d/late", b"x")  # behind the walk of this capture
        j.commit(plan, MEMO)
        assert dirty_after(j)[0] == {b"d"}


def test_a_failed_capture_makes_the_next_walk_full(layer: str) -> None:
    with started(layer) as j:
        plan: WalkPlan = j.begin()
        j.abort(plan)
        nxt = j.begin()
        assert nxt.hint is None
        assert "did not finish" in nxt.reason


def test_overflow_makes_the_next_walk_full(layer: str) -> None:
    os.mkdir(f"{layer}/many")
    with started(layer, bounded_queue=True) as j:
        for i in range(17000):  # more than the kernel's 16384-event queue, unread
            os.close(os.open(f"{layer}/many/{i}", os.O_CREAT | os.O_WRONLY, 0o644))
        plan = j.begin()
        assert plan.hint is None
        assert "overflowed" in plan.reason
        j.commit(plan, MEMO)
        assert dirty_after(j) == (set(), set())  # and the one after builds on that walk


def test_the_default_queue_holds_a_burst_nobody_read(layer: str) -> None:
    """The daemon's journal asks for an unlimited queue: 17000 events left unread (more
    than the kernel's default 16384) do not overflow, and the plan still has a hint."""
    os.mkdir(f"{layer}/many")
    with started(layer) as j:
        for i in range(17000):
            os.close(os.open(f"{layer}/many/{i}", os.O_CREAT | os.O_WRONLY, 0o644))
        assert dirty_after(j)[0] == {b"many"}
        assert j.overflows == 0


def _record_calls(monkeypatch: pytest.MonkeyPatch, j: Journal, method: str) -> list[bytes]:
    """The handles ``j.<method>`` is called with from now on (first argument)."""
    seen: list[bytes] = []
    real = getattr(j, method)

    def recorded(h: bytes, *rest: object) -> object:
        seen.append(h)
        return real(h, *rest)

    monkeypatch.setattr(j, method, recorded)
    return seen


def test_a_poll_resolves_only_what_came_since_the_poll_before(
    layer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """poll() resolves what it read between captures, so begin() opens no handle a poll
    already resolved (20k directories elsewhere cost 0.35 s at a begin); and each poll
    takes only the handles that came since the poll before it (the batch's ``fresh_*``
    sets; rebuilding the whole epoch's set every poll cost 4.5 ms each with 17k
    directories in it): nothing is looked at twice, and what came after the first poll is
    resolved by the second."""
    for i in range(60):
        os.makedirs(f"{layer}/d{i}")
    with started(layer) as j:
        for i in range(30):
            write_file(f"{layer}/d{i}/f", b"1")
        j.poll()
        looked = _record_calls(monkeypatch, j, "_dir_path")
        for i in range(30, 60):
            write_file(f"{layer}/d{i}/f", b"1")
        j.poll()
        assert len(looked) == 30  # the 30 new directories, not the 30 of the first poll
        assert j.poll() == 0
        assert len(looked) == 30  # nothing new: nothing looked at
        opened = _record_calls(monkeypatch, j, "_open")
        dirty, _ = dirty_after(j)
        assert dirty == {f"d{i}".encode() for i in range(60)}
        assert opened == []  # every one resolved ahead, by one poll or the other


def test_a_quiet_journal_reads_and_resolves_after(
    layer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the daemon's own restore writes (``Journal.quiet``), a poll leaves the events
    in the kernel's queue; the first poll after reads and resolves all of them, so begin()
    opens no handle and its plan names every directory written meanwhile."""
    for i in range(20):
        os.makedirs(f"{layer}/d{i}")
    with started(layer) as j:
        looked = _record_calls(monkeypatch, j, "_dir_path")
        with j.quiet():
            for i in range(20):
                write_file(f"{layer}/d{i}/f", b"1")
            assert j.poll() == 0  # left queued
            assert looked == []  # nor resolved beside the restore
        assert j.poll() > 0
        assert len(looked) == 20
        opened = _record_calls(monkeypatch, j, "_open")
        dirty, _ = dirty_after(j)
        assert dirty == {f"d{i}".encode() for i in range(20)}
        assert opened == []


def _plan_after(j: Journal) -> WalkPlan:
    plan = j.begin()
    assert plan.hint is not None, plan.reason
    j.commit(plan, MEMO)
    return plan


def test_names_of_writes_in_place_are_looked_up_by_a_poll(
    layer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write in place names its file with no entry event: begin() must check that the
    name still names the written file (one ``name_to_handle_at`` each, ~1.1k in the medium
    step). A poll between captures looks them up ahead, so begin() looks up none, and its
    plan names the same files."""
    for i in range(12):
        write_file(f"{layer}/d{i % 3}/f{i}", b"0")
    with started(layer) as j:
        for i in range(12):
            with open(f"{layer}/d{i % 3}/f{i}", "ab") as f:
                f.write(b"1")
        j.poll()
        from sprite_env.journal import fanotify

        looked: list[bytes] = []
        real = fanotify.handle_at

        def handle_at(path: bytes) -> bytes:
            looked.append(path)
            return real(path)

        monkeypatch.setattr(fanotify, "handle_at", handle_at)
        plan = _plan_after(j)
        assert looked == []
        assert plan.hint is not None
        assert {d: set(n) for d, n in plan.hint.named.items()} == {
            f"d{k}".encode(): {f"f{i}".encode() for i in range(k, 12, 3)} for k in range(3)
        }


def test_a_write_under_a_lost_name_found_ahead_names_the_file_where_it_is(
    layer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write through a descriptor opened by a name the file lost in an earlier epoch is
    reported under that name: a poll finds where the file is now (its other link), and
    begin() names it there without looking again."""
    write_file(f"{layer}/x/f", b"0")
    os.link(f"{layer}/x/f", f"{layer}/x/h")
    fd = os.open(f"{layer}/x/f", os.O_WRONLY)
    try:
        with started(layer) as j:
            os.unlink(f"{layer}/x/f")
            full = j.begin()  # that epoch's capture: a full walk (a link count changed)
            j.commit(full, MEMO)
            os.write(fd, b"written through the lost name")
            j.poll()
            lost = _record_calls(monkeypatch, j, "_lost_name_path")
            plan = _plan_after(j)
            assert lost == []
            assert plan.hint is not None
            assert plan.hint.named[b"x"] >= {b"h"}
    finally:
        os.close(fd)


def test_a_directory_resolved_ahead_then_moved_is_walked_at_its_new_place(layer: str) -> None:
    """A handle poll() resolved names the old path after a move; the move itself makes
    the new place void (walked whole), so what is written there after it is not missed."""
    os.makedirs(f"{layer}/x/sub")
    with started(layer) as j:
        write_file(f"{layer}/x/sub/f", b"1")
        j.poll()  # x/sub resolved now
        os.rename(f"{layer}/x", f"{layer}/y")
        write_file(f"{layer}/y/sub/g", b"2")  # the same directory handle as x/sub
        dirty, void = dirty_after(j)
        assert b"y" in void
        assert b"" in dirty


def test_polling_keeps_the_queue_from_overflowing(layer: str) -> None:
    os.mkdir(f"{layer}/many")
    with started(layer, bounded_queue=True) as j:
        for i in range(17000):
            os.close(os.open(f"{layer}/many/{i}", os.O_CREAT | os.O_WRONLY, 0o644))
            if i % 4000 == 0:
                j.poll()
        assert dirty_after(j)[0] == {b"many"}


def test_a_file_mapped_writable_keeps_its_directory_dirty(layer: str) -> None:
    write_file(f"{layer}/d/m", b"0" * 4096)
    with started(layer) as j:
        fd = os.open(f"{layer}/d/m", os.O_RDWR)
        try:
            with mmap.mmap(fd, 4096) as m:
                assert dirty_after(j)[0] == {b"d"}
                m[0:1] = b"1"  # no event at all: only the scan of mappings sees it
                plan = j.begin()
                assert plan.hint is not None
                assert plan.hint.dirty == {b"d"}
                assert plan.reread == {b"d/m"}  # read again even if its mtime stayed
                j.commit(plan, MEMO)
        finally:
            os.close(fd)
        assert dirty_after(j)[0] == {b"d"}  # the close after writing
        assert dirty_after(j)[0] == set()


def test_a_mount_inside_the_layer_makes_the_walk_full(layer: str) -> None:
    os.mkdir(f"{layer}/mnt")
    with started(layer) as j:
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", f"{layer}/mnt"], check=True)
        try:
            plan = j.begin()
            assert plan.hint is None
            assert "mounted" in plan.reason
            j.commit(plan, MEMO)
        finally:
            subprocess.run(["umount", f"{layer}/mnt"], check=True)
        plan = j.begin()
        assert plan.hint is None
        assert "mounted" in plan.reason


def test_kernels_without_support_get_a_reason() -> None:
    assert kernel_reason(release="6.18.44") is None
    assert kernel_reason(overlay=True, release="6.5.0") is None
    why = kernel_reason(overlay=True, release="6.1.0-32-amd64")  # Debian 12's stock kernel
    assert why == "kernel 6.1: overlayfs writes reach fanotify only from 6.5 on"
    assert kernel_reason(release="5.4.0") == "kernel 5.4: fanotify reports names only from 5.9 on"


def test_a_missing_root_is_a_clear_error(tmp_path: os.PathLike[str]) -> None:
    with pytest.raises(JournalUnavailable, match="cannot watch"):
        Journal(os.path.join(os.fspath(tmp_path), "nowhere"))


def test_writes_through_overlayfs_merged_reach_the_upper_layer(
    overlay: tuple[str, str],
) -> None:
    upper, merged = overlay
    with Journal(upper, views=[merged], overlay=True) as j:
        plan = j.begin()
        j.commit(plan, MEMO)
        with open(f"{merged}/etc/conf1", "a") as f:  # a lower file: copied up, then written
            f.write("changed\n")
        dirty, _void = dirty_after(j)
        assert b"etc" in dirty  # the work directory's events are outside the layer: dropped
        assert all(not p.startswith(b"..") for p in dirty)

        os.unlink(f"{merged}/etc/deep/x")  # a whiteout in upper
        assert b"etc/deep" in dirty_after(j)[0]

        os.makedirs(f"{merged}/new/sub")
        write_file(f"{merged}/new/sub/f", b"1")
        dirty, void = dirty_after(j)
        assert {b"", b"new", b"new/sub"} <= dirty
        assert {b"new", b"new/sub"} <= void

        fd = os.open(f"{merged}/new/sub/f", os.O_RDWR)
        try:
            with mmap.mmap(fd, 1) as m:  # mapped through MERGED: found through the view
                m[0:1] = b"2"
                assert b"new/sub" in dirty_after(j)[0]
        finally:
            os.close(fd)


def test_writes_to_a_removed_file_through_its_descriptor_are_no_doubt(layer: str) -> None:
    """A log still written after its name was removed: the events name "log", which names
    nothing (then another file); the file they are about is in no directory, so no entry
    can have changed, and the next walk stays journal-driven (see Journal._linked)."""
    write_file(f"{layer}/log", b"1\n")
    fd = os.open(f"{layer}/log", os.O_WRONLY | os.O_APPEND)
    try:
        with started(layer) as j:
            os.unlink(f"{layer}/log")
            assert b"" in dirty_after(j)[0]
            os.write(fd, b"2\n")
            assert dirty_after(j)[0] == {b""}
            write_file(f"{layer}/log", b"a new log\n")
            assert dirty_after(j)[0] == {b""}
            os.write(fd, b"3\n")
            assert dirty_after(j)[0] == {b""}
            os.close(fd)
            fd = -1
            assert dirty_after(j)[0] == {b""}
    finally:
        if fd >= 0:
            os.close(fd)


def test_a_lost_name_without_its_files_handle_is_a_doubt(layer: str) -> None:
    """The kernel gives every data event its file's handle; a batch that names a name no
    file has and carries none (decoded from a record without one) cannot say where the
    file went: a full walk, as before the handles were kept."""
    from sprite_env.journal import fanotify as fan
    from sprite_env.journal.journal import _Doubt, _Resolved

    os.mkdir(f"{layer}/d")
    with started(layer) as j:
        fd = os.open(f"{layer}/d", os.O_RDONLY | os.O_DIRECTORY)
        try:
            d = fan.handle_of(fd)
        finally:
            os.close(fd)
        batch = fan.new_batch()
        batch.dirs.add(d)
        batch.names.add((d, b"gone"))
        with pytest.raises(_Doubt, match="a name it does not have"):
            j._resolve(batch, _Resolved())
        write_file(f"{layer}/d/here", b"1")
        batch.names = {(d, b"here")}
        assert j._resolve(batch, _Resolved()).named == {b"d": {b"here"}}


def test_force_full_makes_the_next_walk_full_once(layer: str) -> None:
    with started(layer) as j:
        j.force_full("the daemon rewrote the layer itself")
        plan = j.begin()
        assert plan.hint is None
        assert plan.reason == "the daemon rewrote the layer itself"
        j.commit(plan, MEMO)
        assert dirty_after(j) == (set(), set())


def test_a_file_system_without_file_handles_gets_no_journal_and_a_reason() -> None:
    from sprite_env.journal import NoJournal, open_journal

    j = open_journal("/proc")  # procfs cannot encode file handles
    assert isinstance(j, NoJournal)
    assert j.reason == (
        "no change journal: cannot watch the file system of /proc (Operation not supported)"
    )
    plan = j.begin()
    assert plan.hint is None
    assert plan.reason == j.reason
    assert isinstance(open_journal("/proc", enabled=False), NoJournal)


def test_an_undecodable_record_makes_the_next_walk_full(layer: str) -> None:
    """A record of a metadata version this code does not know (fed through a pipe in the
    group's place: the kernel writes only version 3) fails neither poll nor begin."""
    import struct

    with started(layer) as j:
        real = j._fd
        r, w = os.pipe()
        os.set_blocking(r, False)
        try:
            os.write(w, struct.pack("<IBBHQii", 24, 99, 0, 24, 0x2, -1, 0))
            j._fd = r
            assert j.poll() == 0
            j._fd = real
            plan = j.begin()
            assert plan.hint is None
            assert "not understood" in plan.reason
        finally:
            j._fd = real
            os.close(r)
            os.close(w)


def test_a_handle_that_fails_with_enomem_is_tried_again_then_is_a_doubt(
    layer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """open_by_handle_at's ENOMEM (exportfs failing to reconnect a directory) once: the
    plan keeps its hint; every time: the walk is full, and says why."""
    from sprite_env.journal import fanotify as fan

    real = fan.open_by_handle
    failures = {"left": 1}

    def flaky(mount_fd: int, handle: bytes, flags: int) -> int:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))
        return real(mount_fd, handle, flags)

    os.makedirs(f"{layer}/d")
    monkeypatch.setattr(fan, "open_by_handle", flaky)
    with started(layer) as j:
        write_file(f"{layer}/d/f", b"1")
        assert dirty_after(j)[0] == {b"d"}
        failures["left"] = 10**6
        write_file(f"{layer}/d/g", b"2")
        plan = j.begin()
        assert plan.hint is None
        assert "Cannot allocate memory" in plan.reason
