"""SIGKILL a writer at injected points; the reopened store is clean and loses nothing."""

import os
import signal
import subprocess
import sys

import blake3
import pytest

from sprite_env.checkpoints.verify import verify_store
from sprite_env.store import open_store
from sprite_env.store.codec import object_id

WRITER = r"""
import os, sys
from sprite_env.store import open_store
store_dir, phase = sys.argv[1], sys.argv[2]
import blake3
def blob(tag, i):
    return blake3.blake3(b"%s-%d" % (tag.encode(), i)).digest(length=8000)
with open_store(store_dir, create=True) as s, s.writer(pack_size=50_000) as w:
    for i in range(40):
        w.put(blob(phase, i))
    w.commit()
print("committed", flush=True)
"""

POINTS = [
    "pack-before-fsync",
    "pack-before-rename",
    "pack-after-rename",
    "catalog-before-commit",
    "catalog-mid-commit",
    "catalog-after-commit",
]


def blob(tag: str, i: int) -> bytes:
    # incompressible, so 40 objects fill several 50 kB packs
    return blake3.blake3(b"%s-%d" % (tag.encode(), i)).digest(length=8000)


def _run(store_dir: str, phase: str, crash_at: str | None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("SPRITE_ENV_CRASH_AT", None)
    if crash_at:
        env["SPRITE_ENV_CRASH_AT"] = crash_at
    return subprocess.run(
        [sys.executable, "-c", WRITER, store_dir, phase],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("point", [*POINTS, "pack-before-rename:3", "pack-after-rename:4"])
def test_kill_during_a_write_loses_nothing(store_dir: str, point: str) -> None:
    assert _run(store_dir, "first", None).returncode == 0
    killed = _run(store_dir, "second", point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    with open_store(store_dir) as s:  # the writable open removes orphans
        on_disk = {f[:-5] for f in os.listdir(s.packs_dir)}
        assert on_disk == {p.name for p in s.catalog.packs()}, "orphan packs left"
        assert os.listdir(s.tmp_dir) == []
        report = verify_store(s, read_data=True)
        assert report.ok, report
        assert not report.warnings, report
        for i in range(40):  # the first commit is intact
            assert s.read(object_id(blob("first", i))) == blob("first", i)
        second = [s.has(object_id(blob("second", i))) for i in range(40)]
        # all or nothing: only a kill after the commit keeps the second batch
        assert second == [point == "catalog-after-commit"] * 40

    # and the store keeps working: the interrupted write can simply be redone
    assert _run(store_dir, "second", None).returncode == 0
    with open_store(store_dir) as s:
        assert all(s.has(object_id(blob("second", i))) for i in range(40))
        assert verify_store(s, read_data=True).ok
