"""A restore and the frozen pass of a create cost in proportion to the change (issue 11,
points 6 and 7): counted in the directories and files they open (fanotify, from outside
the code), on a tree a hundred times bigger than the change; and a journal that missed
something still restores exactly."""

from __future__ import annotations

import contextlib
import os
import time
from typing import TYPE_CHECKING, Any

from sprite_env.checkpoints import Engine
from sprite_env.checkpoints import engine as engine_mod
from sprite_env.checkpoints.hashonly import HashOnlySink
from sprite_env.journal import Journal, WalkPlan
from sprite_env.snapshot.capture import capture
from tests.helpers.daemon import write_file
from tests.helpers.opens import OpenRecorder, ancestors

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pytest

    from sprite_env.ids import ObjectId

TOPS, SUBS, FILES = 20, 15, 4  # 321 directories, 1,200 files


def _big_tree(layer: str) -> None:
    for t in range(TOPS):
        for s in range(SUBS):
            for f in range(FILES):
                write_file(f"{layer}/d{t}/s{s}/f{f}", b"%d.%d.%d\n" % (t, s, f) * 20)
    time.sleep(0.06)  # past the racy window: the first walk's rows vouch for the files


def _step(layer: str) -> set[bytes]:
    """An agent step: two files rewritten, one created, one deleted, a chmod. Returns the
    directories it changed."""
    write_file(f"{layer}/d3/s7/f1", b"rewritten\n")
    write_file(f"{layer}/d3/s7/f2", b"rewritten too\n")
    write_file(f"{layer}/d5/s1/new", b"a new file\n")
    os.unlink(f"{layer}/d9/s2/f0")
    os.chmod(f"{layer}/d11/s4/f3", 0o600)
    time.sleep(0.06)
    return {b"d3/s7", b"d5/s1", b"d9/s2", b"d11/s4"}


def _truth(engine: Engine) -> ObjectId:
    sink = HashOnlySink(engine.store)
    return capture(engine.root, sink, sink.read, {}, excludes=engine.excludes).top_tree


def _spy_plans(journal: Journal) -> list[WalkPlan]:
    """The plans the journal hands out, in order (its epoch API, unchanged)."""
    plans: list[WalkPlan] = []
    begin = journal.begin

    def recorded() -> WalkPlan:
        plans.append(begin())
        return plans[-1]

    journal.begin = recorded  # type: ignore[method-assign]
    return plans


def test_a_restore_opens_only_what_differs(layer: str, tmp_path: os.PathLike[str]) -> None:
    _big_tree(layer)
    store = os.path.join(os.fspath(tmp_path), "store")  # on another file system
    with Engine(layer, store) as e, Journal(layer) as j:
        e.journal = j
        v0 = e.create()
        changed = _step(layer)
        before = _truth(e)
        plans = _spy_plans(j)
        with OpenRecorder(layer) as rec:
            rec.clear()
            assert e.check_restore("v0")  # what the daemon runs while everything runs
            checked = rec.by(os.getpid())
            rec.clear()
            rep = e.restore("v0")
            restored = rec.by(os.getpid())
        assert rep.undo is not None
        # Both captures (the check's prewarm, the undo checkpoint) were journal-driven...
        assert [p.hint is not None for p in plans] == [True, True]
        assert e.info(rep.undo).walk == "journal"
        assert e.info(rep.undo).top_tree == before  # ...and the undo holds the whole step
        # ...so they opened only the changed directories and those above them, and read
        # only the files the step touched (the chmod'ed one too: its ctime moved): 9 of
        # 321 directories, 4 of 1,200 files.
        near = ancestors(changed)
        assert checked.dirs <= near, sorted(checked.dirs - near)
        assert checked.files == {b"d3/s7/f1", b"d3/s7/f2", b"d5/s1/new", b"d11/s4/f3"}
        # The restore (its undo capture, its diff, its writes, its files-cache refresh)
        # visits only the subtrees that differ, and writes only the files they hold.
        assert restored.dirs <= near, sorted(restored.dirs - near)
        assert {os.path.dirname(f) for f in restored.files} <= changed, restored.files
        assert len(restored.files) <= 6  # two rewritten, one recreated (temporary names)
        assert _truth(e) == v0.top_tree
        # What it wrote is in the files cache: the next checkpoint reads nothing.
        stats: list[Any] = []
        v1 = e.create(progress=lambda phase, s: stats.append(s))
        assert v1.walk == "journal"
        assert v1.top_tree == v0.top_tree
        assert stats[-1].files_read == 0


def test_a_restore_after_lost_events_is_still_exact(
    fs: str, layer: str, tmp_path: os.PathLike[str]
) -> None:
    """The kernel dropped the events of the step (queue overflow): the check walks
    everything, and the undo checkpoint and the restore are exact all the same."""
    _big_tree(layer)
    store = os.path.join(os.fspath(tmp_path), "store")
    with Engine(layer, store) as e, Journal(layer, bounded_queue=True) as j:
        e.journal = j
        v0 = e.create()
        _step(layer)
        os.mkdir(f"{fs}/noise")
        for i in range(17000):  # elsewhere on the same file system: the queue overflows
            os.close(os.open(f"{fs}/noise/{i}", os.O_CREAT | os.O_WRONLY, 0o644))
        before = _truth(e)
        plans = _spy_plans(j)
        assert e.check_restore("v0")
        rep = e.restore("v0")
        assert plans[0].hint is None
        assert "overflowed" in plans[0].reason
        assert rep.undo is not None
        assert e.info(rep.undo).top_tree == before  # nothing of the step lost
        assert _truth(e) == v0.top_tree
        assert e.restore(rep.undo).undo is not None  # and undoing the restore works too
        assert _truth(e) == before


def test_the_frozen_pass_walks_only_what_changed_during_the_first(
    layer: str, tmp_path: os.PathLike[str]
) -> None:
    """A create with a pause: the first pass (prewarm) stores the step; the second,
    inside the pause, is journal-driven and opens only the directories changed after the
    first pass began, up to the moment the writers stopped, all of which it captures."""
    _big_tree(layer)
    with Engine(layer, os.path.join(os.fspath(tmp_path), "store")) as e, Journal(layer) as j:
        e.journal = j
        e.create()
        _step(layer)  # before the create: the first pass's work
        plans = _spy_plans(j)
        rec = OpenRecorder(layer)
        frozen: list[Any] = []

        def during_first_pass(phase: str, s: Any) -> None:
            if phase == "prewarm" and not os.path.exists(f"{layer}/d2/s2/late"):
                write_file(f"{layer}/d2/s2/late", b"written while the first pass ran\n")

        @contextlib.contextmanager
        def pause() -> Iterator[None]:
            # The last write before the writers stop; then the pause holds the layer still.
            write_file(f"{layer}/d4/s4/last", b"written as the freeze began\n")
            rec.clear()
            yield
            frozen.append(rec.by(os.getpid()))

        try:
            cp = e.create(progress=during_first_pass, pause=pause)
        finally:
            rec.close()
        assert len(plans) == 2  # the prewarm's epoch, then the frozen pass's
        assert plans[1].hint is not None
        assert cp.walk == "journal"
        assert plans[1].hint.dirty == {b"d2/s2", b"d4/s4"}
        (inside,) = frozen
        assert inside.dirs <= ancestors({b"d2/s2", b"d4/s4"}), sorted(inside.dirs)
        assert inside.files == {b"d2/s2/late", b"d4/s4/last"}
        assert cp.top_tree == _truth(e)  # the layer as it was when the writers stopped


def test_the_refreshed_files_cache_is_what_a_stat_of_each_entry_gives(
    layer: str, tmp_path: os.PathLike[str]
) -> None:
    """The restore's files-cache rows (one native scan per directory, or the stat loop
    where the directory holds more than the target: here an excluded file left in place)
    are the signatures of the target's entries, so the next checkpoint reads nothing."""
    from sprite_env.snapshot import dircache
    from sprite_env.snapshot.diff import read_entries

    _big_tree(layer)
    write_file(f"{layer}/d3/s7/keep.log", b"excluded: never captured, never removed\n")
    store = os.path.join(os.fspath(tmp_path), "store")
    with Engine(layer, store, excludes=["*.log"]) as e, Journal(layer) as j:
        e.journal = j
        v0 = e.create()
        changed = _step(layer)
        e.restore("v0")
        time.sleep(0.06)
        now = time.time_ns()
        rows = dircache.load(e.store.catalog)
        for rel in changed:
            row = rows[rel]
            sigs = {
                name: dircache.sig_of(os.lstat(os.path.join(os.fsencode(layer), rel, name)), now)
                for name in read_entries(e.store.read, row.tree)
            }
            assert row.stat == dircache.encode_sigs(sigs), rel
        assert os.path.exists(f"{layer}/d3/s7/keep.log")
        stats: list[Any] = []
        v1 = e.create(progress=lambda phase, s: stats.append(s))
        assert v1.top_tree == v0.top_tree == _truth(e)
        assert stats[-1].files_read == 0


def test_the_journal_is_quiet_while_a_restore_writes_and_its_events_are_seen_after(
    layer: str, tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine's restore runs with its journal quiet (``Journal.quiet``: polls resolve
    none of the restore's own events beside it) until it has committed; the next
    checkpoint, journal-driven, still finds the layer exactly as restored."""
    _big_tree(layer)
    store = os.path.join(os.fspath(tmp_path), "store")
    with Engine(layer, store) as e, Journal(layer) as j:
        e.journal = j
        v0 = e.create()
        _step(layer)
        quiet_during: list[int] = []
        real_restore = engine_mod.restore

        def restore(*a: Any, **k: Any) -> Any:
            out = real_restore(*a, **k)
            j.poll()  # the daemon's reader, as the restore ends: reads, resolves nothing
            quiet_during.append(j._quiet)
            return out

        monkeypatch.setattr(engine_mod, "restore", restore)
        e.restore("v0")
        assert quiet_during == [1]
        assert j._quiet == 0
        plans = _spy_plans(j)
        after = e.create()
        assert plans[-1].hint is not None  # journal-driven
        assert after.top_tree == v0.top_tree == _truth(e)
