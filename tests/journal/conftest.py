"""Fixtures for the journal: a private tmpfs (a file system of its own, so the journal's
file-system-wide mark sees only this test's writes), and a capture harness."""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING

import pytest

from sprite_env.checkpoints.hashonly import HashOnlySink
from sprite_env.journal import Journal, probe
from sprite_env.snapshot.capture import CaptureResult, capture
from sprite_env.store import open_store

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from sprite_env.ids import ObjectId
    from sprite_env.snapshot.dircache import CachedDir
    from sprite_env.store import Store


def _mount(kind: str, target: str, *opts: str) -> None:
    subprocess.run(["mount", "-t", kind, *opts, kind, target], check=True)


def _umount(target: str) -> None:
    subprocess.run(["umount", "-l", target], check=False)


@pytest.fixture
def fs(tmp_path: os.PathLike[str]) -> Iterator[str]:
    """A fresh tmpfs; the layer is its subdirectory ``layer`` (events elsewhere on it are
    outside the layer)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs and fanotify need root")
    mnt = os.path.join(os.fspath(tmp_path), "fs")
    os.mkdir(mnt)
    _mount("tmpfs", mnt, "-o", "size=256m")
    try:
        os.mkdir(os.path.join(mnt, "layer"))
        why = probe(os.path.join(mnt, "layer"))
        if why is not None:
            pytest.skip(why)
        yield mnt
    finally:
        _umount(mnt)


@pytest.fixture
def layer(fs: str) -> str:
    return os.path.join(fs, "layer")


@pytest.fixture
def overlay(tmp_path: os.PathLike[str]) -> Iterator[tuple[str, str]]:
    """A real overlayfs: (upper, merged), upper and work on a fresh tmpfs, a small lower."""
    if os.geteuid() != 0:
        pytest.skip("overlayfs needs root")
    base = os.path.join(os.fspath(tmp_path), "ov")
    os.mkdir(base)
    _mount("tmpfs", base, "-o", "size=256m")
    try:
        dirs = {n: os.path.join(base, n) for n in ("lower", "upper", "work", "merged")}
        for d in dirs.values():
            os.mkdir(d)
        os.makedirs(os.path.join(dirs["lower"], "etc", "deep"))
        for i in range(5):
            with open(os.path.join(dirs["lower"], "etc", f"conf{i}"), "w") as f:
                f.write(f"base {i}\n")
        with open(os.path.join(dirs["lower"], "etc", "deep", "x"), "w") as f:
            f.write("deep\n")
        why = probe(dirs["upper"], overlay=True)
        if why is not None:
            pytest.skip(why)
        opts = f"lowerdir={dirs['lower']},upperdir={dirs['upper']},workdir={dirs['work']}"
        subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o", opts, dirs["merged"]], check=True
        )
        try:
            yield dirs["upper"], dirs["merged"]
        finally:
            _umount(dirs["merged"])
    finally:
        _umount(base)


class Harness:
    """Captures one layer like the engine does: a files cache kept between captures (in
    memory here, as ``dircache.save`` would keep it), the journal's begin/commit around
    each capture, and the truth to compare with: a capture with no cache at all."""

    def __init__(self, root: str, store: Store, journal: Journal | None) -> None:
        self.root = root
        self.store = store
        self.journal = journal
        self.cache: dict[bytes, CachedDir] = {}
        self.last: CaptureResult | None = None

    def capture(self) -> CaptureResult:
        plan = self.journal.begin() if self.journal is not None else None
        try:
            with self.store.writer() as w:
                r = capture(
                    self.root,
                    w,
                    self.store.read,
                    dict(self.cache),
                    hint=plan and plan.hint,
                    reread=plan.reread if plan else frozenset(),
                )
                w.flush()
                w.commit()
        except BaseException:
            if self.journal is not None and plan is not None:
                self.journal.abort(plan)
            raise
        self._save(r)
        if self.journal is not None and plan is not None:
            assert r.memo is not None
            self.journal.commit(plan, r.memo)
            if plan.hint is None:
                r.walk_reason = r.walk_reason or plan.reason
        self.last = r
        return r

    def _save(self, r: CaptureResult) -> None:
        for p in r.cache_removed:
            self.cache.pop(p, None)
        for top in r.cache_removed_trees:
            for p in [p for p in self.cache if p == top or p.startswith(top + b"/")]:
                del self.cache[p]
        self.cache.update(r.cache_changed)

    def truth(self) -> ObjectId:
        """The top tree id of a walk that trusts nothing (no files cache)."""
        return self.truth_result().top_tree

    def truth_result(self) -> CaptureResult:
        """The capture of a walk that trusts nothing (its tree and its counts)."""
        return self.truth_and_reader()[0]

    def truth_and_reader(self) -> tuple[CaptureResult, Callable[[ObjectId], bytes]]:
        """:meth:`truth_result`, and what reads its trees (they are not stored)."""
        sink = HashOnlySink(self.store)
        return capture(self.root, sink, sink.read, {}), sink.read


@pytest.fixture
def harness_for(tmp_path: os.PathLike[str]) -> Iterator[object]:
    stores: list[Store] = []

    def make(root: str, journal: Journal | None) -> Harness:
        s = open_store(os.path.join(os.fspath(tmp_path), f"store{len(stores)}"), create=True)
        stores.append(s)
        return Harness(root, s, journal)

    yield make
    for s in stores:
        s.close()
