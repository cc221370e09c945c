from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import pytest

from sprite_env.actor import MAX_ACTOR, clean_actor
from sprite_env.daemon.activity import ActivityLog, _lines_backwards
from sprite_env.errors import UserError

if TYPE_CHECKING:
    from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIME_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


@pytest.fixture
def log(tmp_path: Path) -> ActivityLog:
    return ActivityLog(tmp_path / "activity.jsonl")


def test_round_trip(log: ActivityLog) -> None:
    entry = log.record("restore", "v3", "user", True, "Restore from v3 complete", job=7)
    assert list(entry) == ["time", "action", "id", "actor", "ok", "detail", "job"]
    assert TIME_RE.match(entry["time"])
    assert entry["id"] == "v3"
    assert log.entries() == [entry]
    with open(log.path, "rb") as f:
        assert f.read() == json.dumps(entry).encode() + b"\n"
    assert os.stat(log.path).st_mode & 0o777 == 0o600


def test_values_with_newlines_and_unicode_stay_on_one_line(log: ActivityLog) -> None:
    entry = log.record("create", None, "zoë", False, "line one\nline two \u2028 \udcff")
    with open(log.path, "rb") as f:
        data = f.read()
    assert data.count(b"\n") == 1
    assert data.isascii()
    assert log.entries() == [entry]


def test_empty_or_missing_log(log: ActivityLog) -> None:
    assert log.entries() == []
    assert log.entries(limit=None, action="create") == []


def test_newest_first_limit_and_filter(log: ActivityLog) -> None:
    for i in range(10):
        log.record("create" if i % 2 else "delete", f"v{i}", "user", True)
    assert [e["id"] for e in log.entries()] == [f"v{i}" for i in range(9, -1, -1)]
    assert [e["id"] for e in log.entries(limit=3)] == ["v9", "v8", "v7"]
    assert [e["id"] for e in log.entries(limit=2, action="delete")] == ["v8", "v6"]
    assert [e["id"] for e in log.entries(limit=None, action="create")] == [
        "v9",
        "v7",
        "v5",
        "v3",
        "v1",
    ]
    assert log.entries(limit=0) == []
    assert log.entries(action="reset") == []
    with pytest.raises(ValueError, match="limit"):
        log.entries(limit=-1)


def test_reserved_extra_fields_are_rejected(log: ActivityLog) -> None:
    with pytest.raises(ValueError, match="reserved"):
        log.record("create", "v1", "user", True, time="yesterday")
    assert log.entries() == []


def test_torn_last_line_is_skipped_and_does_not_swallow_the_next(log: ActivityLog) -> None:
    first = log.record("create", "v0", "user", True)
    with open(log.path, "ab") as f:
        f.write(b'{"time": "2026-01-01T00:00:00.000000Z", "action": "cre')
    assert log.entries() == [first]
    second = log.record("create", "v1", "user", True)
    assert log.entries() == [second, first]
    with open(log.path, "ab") as f:
        f.write(b"\xff\xfe garbage\n[1, 2]\n\n")
    assert log.entries() == [second, first]


@pytest.mark.parametrize("block", [1, 2, 3, 7, 16, 1000])
def test_lines_backwards_at_any_block_size(tmp_path: Path, block: int) -> None:
    lines = [b"a", b"", b"bb" * 20, b"ccc", b"", b"d"]
    path = tmp_path / "f"
    path.write_bytes(b"\n".join(lines) + b"\nunterminated")
    expected = [b"unterminated"] + [x for x in reversed(lines) if x]
    assert list(_lines_backwards(str(path), block)) == expected
    path.write_bytes(b"\n".join(lines) + b"\n")
    assert list(_lines_backwards(str(path), block)) == expected[1:]


def test_entries_reads_only_the_end_of_a_big_log(
    log: ActivityLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open(log.path, "wb") as f:
        line = json.dumps({"action": "old", "detail": "x" * 200}).encode() + b"\n"
        f.write(line * 20_000)  # about 4 MiB
    log.record("create", "v1", "user", True)
    read = 0
    real_pread = os.pread

    def counting_pread(fd: int, n: int, offset: int) -> bytes:
        nonlocal read
        read += n
        return real_pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", counting_pread)
    assert [e["id"] for e in log.entries(limit=1)] == ["v1"]
    assert read <= 64 << 10


def test_rotation_keeps_one_older_generation(tmp_path: Path) -> None:
    log = ActivityLog(tmp_path / "activity.jsonl", max_bytes=1000)
    ids = [f"v{i}" for i in range(40)]
    for cid in ids:
        log.record("create", cid, "user", True)
        assert os.path.getsize(log.path) <= 1000
    assert os.path.exists(log.old_path)
    assert os.path.getsize(log.old_path) <= 1000

    got = [e["id"] for e in log.entries(limit=None)]
    # Newest first across both files, with no gap and no repeat; the oldest are gone.
    assert got == ids[::-1][: len(got)]
    assert 1000 // 120 < len(got) < 40
    assert [e["id"] for e in log.entries(limit=3)] == ["v39", "v38", "v37"]

    # Entries that span both generations.
    current = sum(1 for _ in _lines_backwards(log.path))
    assert [e["id"] for e in log.entries(limit=current + 2)][-2:] == [
        ids[-current - 1],
        ids[-current - 2],
    ]


def test_concurrent_writers_do_not_interleave(log: ActivityLog) -> None:
    threads, per_thread = 8, 40

    def write(t: int) -> None:
        for i in range(per_thread):
            log.record("create", f"v{i}", f"thread-{t}", True, "x" * (i * 37 % 500), seq=i)

    workers = [threading.Thread(target=write, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()

    with open(log.path, "rb") as f:
        lines = f.read().splitlines()
    assert len(lines) == threads * per_thread
    parsed = [json.loads(line) for line in lines]  # every line whole
    for t in range(threads):
        seqs = [e["seq"] for e in parsed if e["actor"] == f"thread-{t}"]
        assert seqs == list(range(per_thread))
    assert len(log.entries(limit=None)) == threads * per_thread


_WRITER = """
import sys
from sprite_env.daemon.activity import ActivityLog
log = ActivityLog(sys.argv[1], max_bytes=int(sys.argv[2]))
i = 0
while True:
    log.record("create", f"v{i}", "writer", True, "y" * (i % 300), seq=i)
    i += 1
"""


@pytest.mark.parametrize("max_bytes", [4 << 20, 4000])
def test_kill_9_mid_stream_leaves_a_readable_log(tmp_path: Path, max_bytes: int) -> None:
    path = tmp_path / "activity.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path), str(max_bytes)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    try:
        deadline = time.monotonic() + 30
        rotating = max_bytes < 1 << 20
        old = tmp_path / "activity.jsonl.1"
        while not (path.exists() and path.stat().st_size > 2000) or (rotating and not old.exists()):
            assert time.monotonic() < deadline, "writer did not start"
            assert proc.poll() is None, "writer died"
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL

    log = ActivityLog(path, max_bytes=max_bytes)
    seqs = [e["seq"] for e in log.entries(limit=None)]
    assert seqs
    assert seqs == list(range(seqs[0], seqs[0] - len(seqs), -1))
    current, older = _whole_lines(path), _whole_lines(old)
    after = log.record("create", "after", "test", True)
    assert log.entries(limit=1) == [after]
    rest = [e["seq"] for e in log.entries(limit=None)[1:]]
    if _whole_lines(old) == older:
        assert rest == seqs
    else:
        # the record rotated (killed near the bound): the current file became the old
        # one, and the old one's records went, as rotation means
        assert _whole_lines(old) == current
        assert rest == seqs[: len(current)]


def _whole_lines(path: Path) -> list[dict[str, object]]:
    """The records of one file of the log, a torn line skipped; none if it is missing
    (killed between the rotation's rename and the new file's creation)."""
    whole: list[dict[str, object]] = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_bytes().splitlines():
            with contextlib.suppress(ValueError):
                whole.append(json.loads(line))
    return whole


def test_clean_actor() -> None:
    assert clean_actor(None, "api") == "api"
    assert clean_actor("", "api") == "api"
    assert clean_actor("   ", "api") == "api"
    assert clean_actor("  alice \t", "api") == "alice"
    assert clean_actor("ci bot (zoë)", "api") == "ci bot (zoë)"
    assert clean_actor("x" * 100, "api") == "x" * MAX_ACTOR
    assert clean_actor("y" * 63 + " z", "api") == "y" * 63


@pytest.mark.parametrize("name", ["a\nb", "evil\x1b[31m", "nul\x00", "del\x7f", "ls\u2028x"])
def test_clean_actor_rejects_control_characters(name: str) -> None:
    with pytest.raises(UserError, match="invalid actor"):
        clean_actor(name, "api")
