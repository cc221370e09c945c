"""Big files changed in place are read from the start of a journal-driven capture
(``Capturer._start_early``), and the walk takes such a read only for the file it listed.

The journal tells the capture which directories changed; the page digests' table tells
which big files were captured before. Their reads then overlap the walk instead of holding
it up in walk order. The checkpoint must be exactly the one a walk that trusts nothing
makes, and a read of a file that changed after it must not stand for the file.
"""

from __future__ import annotations

import os
import random
import time
from concurrent.futures import Future
from typing import Any

import pytest

from sprite_env.checkpoints import Engine
from sprite_env.checkpoints.hashonly import HashOnlySink
from sprite_env.journal import Journal
from sprite_env.snapshot import capture as capture_mod
from sprite_env.snapshot import dircache, pagesums
from sprite_env.snapshot.capture import Capturer, _EarlyRead, capture
from sprite_env.snapshot.fsmeta import O_DIR
from sprite_env.store import open_store

pytestmark = pytest.mark.skipif(not pagesums.NATIVE, reason="the C extension is not built")

SIZE = 2 << 20  # above IN_PLACE_MIN
PAGE = 4096


def _write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _write_pages(path: str, pages: list[int], rng: random.Random) -> None:
    with open(path, "r+b") as f:  # in place: the same inode
        for p in pages:
            f.seek(p * PAGE)
            f.write(rng.randbytes(PAGE))


def _truth(engine: Engine) -> bytes:
    """The top tree of a full walk with the committed files cache and no page digests: a
    file changed in place is compared with its old objects from the store, which gives
    the very pieces the digests give (``tests/snapshot/test_in_place_sums.py``); a walk
    with no files cache at all would chunk it afresh into other pieces of the same bytes."""
    sink = HashOnlySink(engine.store)
    cache = dircache.load(engine.store.catalog)
    return capture(engine.root, sink, sink.read, cache, excludes=engine.excludes).top_tree


@pytest.fixture
def capturers(monkeypatch: pytest.MonkeyPatch) -> list[Capturer]:
    """The capturers the engine runs (the real class, recorded)."""
    made: list[Capturer] = []

    class Recorded(Capturer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(capture_mod, "Capturer", Recorded)
    return made


def test_a_big_file_changed_in_place_is_read_before_the_walk(
    layer: str, tmp_path: os.PathLike[str], capturers: list[Capturer]
) -> None:
    rng = random.Random(3)
    db = os.path.join(layer, "data", "db.bin")
    _write(db, rng.randbytes(SIZE))
    for d in ("a", "data", "z"):
        for i in range(3):
            _write(os.path.join(layer, d, f"f{i}"), b"%d" % i * 50)
    time.sleep(0.06)  # past the racy window: rows that vouch for every file
    with Engine(layer, os.path.join(os.fspath(tmp_path), "store")) as e, Journal(layer) as j:
        e.journal = j
        e.create()  # full (the journal just started): the database gets its digests
        e.create()  # the journal's base
        time.sleep(0.06)
        _write_pages(db, [1, 2, 200, 511], rng)
        _write(os.path.join(layer, "z", "f1"), b"changed")
        _write(os.path.join(layer, "a", "new"), b"new")
        time.sleep(0.06)  # past the racy window
        truth = _truth(e)
        capturers.clear()
        cp = e.create()
        assert (cp.walk, cp.walk_reason) == ("journal", "")
        assert cp.top_tree == truth
        (c,) = capturers
        assert (c.early_started, c.early_taken) == (1, 1)
        assert c.stats.files_read == 3  # the database once, z/f1, a/new
        # and a file left as it was is not read early
        _write(os.path.join(layer, "z", "f2"), b"changed too")
        time.sleep(0.06)
        truth = _truth(e)
        capturers.clear()
        cp = e.create()
        assert cp.top_tree == truth
        assert capturers[0].early_started == 0


def test_an_early_read_of_a_file_changed_since_is_not_taken(tmp_path: os.PathLike[str]) -> None:
    root = os.path.join(os.fspath(tmp_path), "layer")
    path = os.path.join(root, "db.bin")
    _write(path, random.Random(4).randbytes(SIZE))
    time.sleep(0.06)  # past the racy window: a racy stat is never taken
    with open_store(os.path.join(os.fspath(tmp_path), "store"), create=True) as store:
        sink = HashOnlySink(store)
        dfd = os.open(root, O_DIR)
        try:
            cap = Capturer(os.fsencode(root), sink, sink.read, {})
            early = cap._file(dfd, b"db.bin", b"db.bin", os.stat(path), b"")
            assert early is not None
            done: Future[Any] = Future()
            done.set_result(early)
            listed = os.stat(path)  # the walk lists the file as the read left it: taken
            same = _EarlyRead(cap, (done, None), dfd, b"db.bin", b"db.bin", listed, b"", None)
            assert same.result() == early
            assert cap.early_taken == 1
            with open(path, "r+b") as f:  # changed after the read, before the listing
                f.write(b"x" * PAGE)
            time.sleep(0.06)
            cap = Capturer(os.fsencode(root), sink, sink.read, {})
            listed = os.stat(path)
            later = _EarlyRead(cap, (done, None), dfd, b"db.bin", b"db.bin", listed, b"", None)
            entry, after = later.result()
            assert cap.early_taken == 0  # read again instead
            assert entry.payload != early[0].payload
            assert (after.st_ctime_ns, after.st_size) == (listed.st_ctime_ns, listed.st_size)
            fresh = cap._file(dfd, b"db.bin", b"db.bin", listed, b"")
            assert fresh is not None
            assert entry == fresh[0]
        finally:
            os.close(dfd)


def test_the_big_files_directory_is_finished_after_its_siblings(
    layer: str,
    tmp_path: os.PathLike[str],
    capturers: list[Capturer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read still running when the walk reaches its directory: that directory's tree is
    made after the walk of its siblings (``_Later``), and the checkpoint, its counts and the
    counts the next checkpoint takes from the memo are a full walk's."""
    rng = random.Random(5)
    db = os.path.join(layer, "home", "data", "db.bin")
    _write(db, rng.randbytes(SIZE))
    for d in ("home/a", "home/data", "home/data/sub", "home/z", "home/z/deep", "top"):
        for i in range(3):
            _write(os.path.join(layer, d, f"f{i}"), b"%d" % i * 70)
    time.sleep(0.06)
    real = Capturer._file

    def slow(self: Capturer, dirfd: int, rel: bytes, *args: Any) -> Any:
        if rel == b"home/data/db.bin":
            time.sleep(0.5)  # still reading when the walk gets to home/data
        return real(self, dirfd, rel, *args)

    with Engine(layer, os.path.join(os.fspath(tmp_path), "store")) as e, Journal(layer) as j:
        e.journal = j
        e.create()
        e.create()
        time.sleep(0.06)
        _write_pages(db, [0, 100, 300], rng)
        for d in ("home/a", "home/data/sub", "home/z/deep", "top"):
            _write(os.path.join(layer, d, "f1"), b"changed")
        time.sleep(0.06)
        truth = _truth(e)
        monkeypatch.setattr(capture_mod.Capturer, "_file", slow)
        capturers.clear()
        cp = e.create()
        (c,) = capturers
        assert (c.early_started, c.early_taken) == (1, 1)
        assert [x.rel for x in c._later] == [b"home/data"]  # finished late
        assert cp.top_tree == truth
        sink = HashOnlySink(e.store)
        full = capture(e.root, sink, sink.read, {}, excludes=e.excludes).stats
        assert (cp.files, cp.dirs, cp.bytes) == (full.files, full.dirs, full.bytes)
        monkeypatch.setattr(capture_mod.Capturer, "_file", real)
        _write(os.path.join(layer, "home", "z", "f2"), b"again")  # home/data kept: memo's
        time.sleep(0.06)
        truth = _truth(e)
        cp = e.create()
        assert cp.walk == "journal"
        assert cp.top_tree == truth
        full = capture(e.root, sink, sink.read, {}, excludes=e.excludes).stats
        assert (cp.files, cp.dirs, cp.bytes) == (full.files, full.dirs, full.bytes)
