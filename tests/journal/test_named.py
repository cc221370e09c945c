"""A journal-driven capture stats only the children the events named (``_dir_named``), not
the whole listing of a dirty directory, and still yields the truth and its counts."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from typing import TYPE_CHECKING, Any

from sprite_env.journal import Journal
from sprite_env.snapshot import capture as capture_mod
from sprite_env.snapshot.paths import lookup

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sprite_env.snapshot.capture import CaptureResult
    from tests.journal.conftest import Harness


@contextlib.contextmanager
def _listed() -> Iterator[list[int]]:
    """Counts the directories listed whole by the native scan (``scan_dir``)."""
    real = capture_mod._scan_dir
    assert real is not None
    calls = [0]

    def counted(*args: Any) -> Any:
        calls[0] += 1
        return real(*args)

    capture_mod._scan_dir = counted
    try:
        yield calls
    finally:
        capture_mod._scan_dir = real


def _counts(r: CaptureResult) -> tuple[int, int, int, int, int]:
    s = r.stats
    return s.files, s.dirs, s.symlinks, s.specials, s.bytes


def _check(h: Harness, r: CaptureResult) -> None:
    truth = h.truth_result()
    assert r.walk == "journal", r.walk_reason
    assert r.top_tree == truth.top_tree
    assert _counts(r) == _counts(truth)


def _check_full(h: Harness, r: CaptureResult, why: str) -> None:
    """``r`` walked everything, for a reason naming ``why``, and holds the truth."""
    assert r.walk == "full"
    assert why in r.walk_reason
    assert r.top_tree == h.truth()


def _wide(layer: str, harness_for: Any) -> tuple[Harness, str]:
    wide = os.path.join(layer, "deep", "er", "wide")
    os.makedirs(os.path.join(wide, "sub", "subsub"))
    os.makedirs(os.path.join(layer, "other"))
    for i in range(300):
        with open(os.path.join(wide, f"f{i:03}"), "wb") as f:
            f.write(b"%d\n" % i * 20)
    os.symlink("f001", os.path.join(wide, "link"))
    os.mkfifo(os.path.join(wide, "fifo"))
    with open(os.path.join(layer, "other", "x"), "wb") as f:
        f.write(b"x\n")
    time.sleep(0.06)  # past the racy window
    h = harness_for(layer, Journal(layer))
    h.capture()  # full: the journal's first
    h.capture()  # journal-driven, nothing changed: the memo every later one builds on
    return h, wide


def test_a_changed_file_deep_down_lists_no_directory(layer: str, harness_for: Any) -> None:
    h, wide = _wide(layer, harness_for)
    try:
        with open(os.path.join(wide, "f007"), "ab") as f:
            f.write(b"edit\n")
        time.sleep(0.06)
        with _listed() as listed:
            r = h.capture()
        _check(h, r)
        # the root, deep/, deep/er/ and wide/ were walked, each stat'ing one child
        assert listed[0] == 0
        assert r.stats.files_read == 1
    finally:
        assert h.journal is not None
        h.journal.close()


def test_names_created_removed_retyped_and_chmodded(layer: str, harness_for: Any) -> None:
    h, wide = _wide(layer, harness_for)
    try:
        with open(os.path.join(wide, "new"), "wb") as f:
            f.write(b"new\n")
        os.unlink(os.path.join(wide, "f100"))
        os.chmod(os.path.join(wide, "f200"), 0o600)
        os.unlink(os.path.join(wide, "f201"))
        os.mkdir(os.path.join(wide, "f201"))  # a file become a directory
        with open(os.path.join(wide, "f201", "in"), "wb") as f:
            f.write(b"in\n")
        os.unlink(os.path.join(wide, "link"))
        os.symlink("f002", os.path.join(wide, "link"))
        os.unlink(os.path.join(wide, "fifo"))
        with open(os.path.join(wide, "sub", "subsub", "deep"), "wb") as f:
            f.write(b"deep\n")
        time.sleep(0.06)
        with _listed() as listed:
            r = h.capture()
        _check(h, r)
        # wide/f201 is new (a void path: listed whole, as every directory under it);
        # nothing else is listed
        assert listed[0] <= 1
        h.capture()  # and the next one builds on what this one counted
        os.rename(os.path.join(wide, "sub"), os.path.join(layer, "other", "sub"))
        time.sleep(0.06)
        _check(h, h.capture())
    finally:
        assert h.journal is not None
        h.journal.close()


def test_a_removed_subtree_is_subtracted_from_the_counts(layer: str, harness_for: Any) -> None:
    h, wide = _wide(layer, harness_for)
    try:
        for name in ("subsub",):
            os.rmdir(os.path.join(wide, "sub", name))
        for i in range(0, 300, 3):
            os.unlink(os.path.join(wide, f"f{i:03}"))
        time.sleep(0.06)
        r = h.capture()
        _check(h, r)
        assert r.stats.files == 200 + 1  # other/x
    finally:
        assert h.journal is not None
        h.journal.close()


def test_the_changed_files_reads_start_before_the_walk(layer: str, harness_for: Any) -> None:
    """The plan starts the reads of every narrowed directory's changed small files before
    the walk; the walk takes each of them (the same stat object), reading none again."""
    h, wide = _wide(layer, harness_for)
    taken: list[bytes] = []
    real = capture_mod._Batches.add

    def add(self: Any, rel: bytes, name: bytes, st: Any) -> Any:
        slot = self.ready.get(name)
        if slot is not None and slot.group.items[slot.index][2] is st:
            taken.append(rel)
        return real(self, rel, name, st)

    try:
        for p in ("f010", "f011", "sub/subsub/x"):
            with open(os.path.join(wide, p), "ab") as f:
                f.write(b"more\n")
        with open(os.path.join(layer, "other", "x"), "ab") as f:
            f.write(b"more\n")
        time.sleep(0.06)
        capture_mod._Batches.add = add  # type: ignore[method-assign]
        try:
            r = h.capture()
        finally:
            capture_mod._Batches.add = real  # type: ignore[method-assign]
        _check(h, r)
        assert sorted(taken) == [
            b"deep/er/wide/f010",
            b"deep/er/wide/f011",
            b"deep/er/wide/sub/subsub/x",
            b"other/x",
        ]
        assert r.stats.files_read == 4
    finally:
        assert h.journal is not None
        h.journal.close()


def test_a_directorys_own_change_is_its_parents_name(layer: str, harness_for: Any) -> None:
    """chmod, utimes and an xattr on a directory change its entry in its parent, not its
    listing: nothing is listed whole (a restore sets back the mtime of every directory it
    wrote in)."""
    h, wide = _wide(layer, harness_for)
    try:
        os.chmod(wide, 0o700)
        os.utime(os.path.join(wide, "sub"), ns=(1, 1_000_000_000))
        os.setxattr(os.path.join(layer, "other"), "user.note", b"x")
        time.sleep(0.06)
        with _listed() as listed:
            r = h.capture()
        _check(h, r)
        assert listed[0] == 0
        assert r.stats.files_read == 0
    finally:
        assert h.journal is not None
        h.journal.close()


def test_a_hard_link_made_and_removed_within_an_epoch(layer: str, harness_for: Any) -> None:
    """``ln``, a change through the new name, ``rm`` of it, all between two checkpoints:
    the event named the link only, so the file's own name must not be trusted (the oracle
    found a/b/a's new mtime missed). Its link count changed: the journal names the file
    where it is now (it has one name again), and the walk stays narrow. With or without
    the reader resolving in between."""
    h, wide = _wide(layer, harness_for)
    assert h.journal is not None
    try:
        for poll in (False, True):
            os.link(os.path.join(wide, "f050"), os.path.join(layer, "other", "ln"))
            if poll:
                h.journal.poll()  # resolved while the group lives
            os.utime(os.path.join(layer, "other", "ln"), ns=(10**18, 10**18))
            os.unlink(os.path.join(layer, "other", "ln"))
            time.sleep(0.06)
            with _listed() as listed:
                r = h.capture()
            _check(h, r)
            assert listed[0] <= 2, "the 300-entry directory was listed whole"
            assert _entry(h, r, b"deep/er/wide/f050")[0] == 10**18
    finally:
        h.journal.close()


def _entry(h: Harness, r: CaptureResult, rel: bytes) -> tuple[int, int]:
    """The (mtime_ns, nlink) of ``rel``'s entry in ``r``'s tree."""
    entry = lookup(h.store.read, r.top_tree, tuple(rel.split(b"/")), "the capture")
    assert entry is not None, rel
    return entry.mtime_ns, entry.nlink


def _link_and_write_through(
    h: Harness, first: str, second: str, rel: bytes, *, poll: bool = False
) -> None:
    """Links ``first`` (``rel`` in the layer) as ``second``; a journal walk captures the
    group exactly; then a write through ``second`` only, captured exactly too."""
    assert h.journal is not None
    os.link(first, second)
    if poll:
        h.journal.poll()
    time.sleep(0.06)
    r = h.capture()
    _check(h, r)
    assert _entry(h, r, rel)[1] == 2
    with open(second, "ab") as f:
        f.write(b"through the second name\n")
    time.sleep(0.06)
    _check(h, h.capture())


def test_a_link_made_outside_the_layer_keeps_the_journal(layer: str, harness_for: Any) -> None:
    """A link made to a layer file from outside the layer (a package manager's store, a
    cache elsewhere on the disk), and writes through that name only: no event names the
    layer's name, so the journal gives the file's inode, the walk names what the files
    cache has for it, and from then on its directory is walked each time (a group). Before,
    each such link made the next walk full."""
    h, wide = _wide(layer, harness_for)
    assert h.journal is not None
    outside = os.path.join(os.path.dirname(layer), "outside")
    os.mkdir(outside)
    try:
        second = os.path.join(outside, "store-copy")
        _link_and_write_through(h, os.path.join(wide, "f070"), second, b"deep/er/wide/f070")
        os.unlink(os.path.join(outside, "store-copy"))
        time.sleep(0.06)
        r = h.capture()
        _check(h, r)
        assert _entry(h, r, b"deep/er/wide/f070")[1] == 1
    finally:
        h.journal.close()


def test_a_new_group_no_event_gave_restarts_the_walk_with_its_names(
    layer: str, harness_for: Any
) -> None:
    """The walk itself meets a group neither the memo nor the hint knows (here the
    journal's word on the link count is taken out of the hint): it walks again with the
    names the files cache has for that inode, not everything."""
    h, wide = _wide(layer, harness_for)
    j = h.journal
    assert j is not None
    try:
        os.link(os.path.join(wide, "f090"), os.path.join(layer, "other", "n2"))
        time.sleep(0.06)
        real = j.begin

        def without_inodes() -> Any:
            plan = real()
            assert plan.hint is not None
            assert plan.hint.inodes, "the journal gave the inode"
            return dataclasses.replace(
                plan, hint=dataclasses.replace(plan.hint, inodes=frozenset())
            )

        j.begin = without_inodes  # type: ignore[method-assign]
        calls = []
        real_run = capture_mod.Capturer.run

        def counted(self: Any) -> Any:
            calls.append(self.hint)
            return real_run(self)

        capture_mod.Capturer.run = counted  # type: ignore[method-assign]
        try:
            r = h.capture()
        finally:
            capture_mod.Capturer.run = real_run  # type: ignore[method-assign]
            del j.begin
        _check(h, r)
        assert len(calls) == 2
        assert calls[1] is not None
        assert calls[1].named[b"deep/er/wide"] >= {b"f090"}
        assert _entry(h, r, b"deep/er/wide/f090")[1] == 2
    finally:
        j.close()


def test_a_link_made_then_its_first_name_removed_keeps_the_journal(
    layer: str, harness_for: Any
) -> None:
    """``git`` writes each object as ``link(tmp, name)``, then ``unlink(tmp)``: both names
    are events, and by the capture the file has one link again. The reader resolving the
    handle while both names lived must not make the capture walk everything (it did, for
    the benchmark's step); a group that still lives at the capture's start does."""
    h, wide = _wide(layer, harness_for)
    assert h.journal is not None
    objects = os.path.join(layer, "other", "objects")
    os.mkdir(objects)
    time.sleep(0.06)
    h.capture()
    try:
        for i in range(3):
            tmp, final = os.path.join(objects, f"tmp_obj_{i}"), os.path.join(objects, f"o{i}")
            with open(tmp, "wb") as f:
                f.write(b"object %d\n" % i)
            os.link(tmp, final)
            h.journal.poll()  # resolved while the file has two links
            os.unlink(tmp)
        time.sleep(0.06)
        r = h.capture()
        _check(h, r)
        # the same with the second name still there at the capture: a new group, whose
        # first name the files cache has (the journal gives the inode), then a write
        # through the second name only
        first, second = os.path.join(objects, "o0"), os.path.join(wide, "again")
        _link_and_write_through(h, first, second, b"other/objects/o0", poll=True)
    finally:
        h.journal.close()
