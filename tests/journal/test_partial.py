"""A changed directory captured in proportion to its changed children (``_dir_partial``)
yields exactly what a walk that trusts nothing yields, and what the entry-by-entry path
yields with the same files cache, with the same counts.

Random sequences of changes (the oracle's ``World``) on a real tmpfs; full walks with a
files cache (no journal), so every directory goes through the native listing and, when it
differs from its row, through the splice.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from typing import TYPE_CHECKING, Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sprite_env.checkpoints.hashonly import HashOnlySink
from sprite_env.snapshot import capture as capture_mod
from sprite_env.snapshot.capture import capture
from tests.journal.test_oracle import World, _seed

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.journal.conftest import Harness


@contextlib.contextmanager
def _counting() -> Iterator[list[int]]:
    """Counts the directories the splice captured (not those it handed to the slow path)."""
    real = capture_mod.Capturer._dir_partial
    spliced = [0]

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = real(self, *args, **kwargs)
        spliced[0] += out is not None
        return out

    capture_mod.Capturer._dir_partial = counted  # type: ignore[method-assign]
    try:
        yield spliced
    finally:
        capture_mod.Capturer._dir_partial = real  # type: ignore[method-assign]


@contextlib.contextmanager
def _entry_by_entry() -> Iterator[None]:
    saved = capture_mod._sig_diff
    capture_mod._sig_diff = None
    try:
        yield
    finally:
        capture_mod._sig_diff = saved


def _slow_path(h: Harness) -> tuple[bytes, tuple[int, ...]]:
    sink = HashOnlySink(h.store)
    with _entry_by_entry():
        r = capture(h.root, sink, sink.read, dict(h.cache))
    s = r.stats
    return r.top_tree, (s.files, s.dirs, s.symlinks, s.specials, s.bytes)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_the_splice_equals_the_truth_and_the_slow_path(
    data: Any, layer: str, harness_for: Any
) -> None:
    for name in os.listdir(layer):
        p = os.path.join(layer, name)
        shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)
    _seed(layer)
    h = harness_for(layer, None)
    world = World(layer)
    try:
        h.capture()
        mapped = False
        for _round in range(data.draw(st.integers(2, 5))):
            for _ in range(data.draw(st.integers(1, 6))):
                world.step(data)
            if data.draw(st.booleans()):
                time.sleep(0.06)  # past the racy window: signatures decide, not the clock
            slow_top, slow_counts = _slow_path(h)
            r = h.capture()
            s = r.stats
            # Without a journal nothing says which files are mapped writable, and a write
            # through a mapping kept open moves no signature (the journal's ``reread``
            # covers it): once one was kept, the truth is out of any cached walk's reach.
            mapped = mapped or bool(world.maps)
            if not mapped:
                assert r.top_tree == h.truth()
            assert r.top_tree == slow_top
            assert (s.files, s.dirs, s.symlinks, s.specials, s.bytes) == slow_counts
    finally:
        world.close()


def test_a_few_changes_in_a_wide_directory_are_spliced(layer: str, harness_for: Any) -> None:
    """Edits, a new file, a deletion and a chmod among 300 children: the directory (and
    its parent, whose subtree changed) are spliced, and the result is the truth."""
    wide = os.path.join(layer, "wide")
    os.makedirs(os.path.join(wide, "sub"))
    for i in range(300):
        with open(os.path.join(wide, f"f{i:03}"), "wb") as f:
            f.write(b"%d\n" % i * 20)
    time.sleep(0.06)
    h = harness_for(layer, None)
    h.capture()
    with open(os.path.join(wide, "f007"), "ab") as f:
        f.write(b"edit\n")
    with open(os.path.join(wide, "new"), "wb") as f:
        f.write(b"new\n")
    os.unlink(os.path.join(wide, "f100"))
    os.chmod(os.path.join(wide, "f200"), 0o600)
    with open(os.path.join(wide, "sub", "deep"), "wb") as f:
        f.write(b"deep\n")
    time.sleep(0.06)
    with _counting() as spliced:
        r = h.capture()
    assert r.top_tree == h.truth()
    assert r.stats.files == 300 + 1  # 300 - 1 deleted + new + deep
    assert spliced[0] >= 3  # the root, wide/ and wide/sub/
