"""Human output (``cli/render.py``) and the event display (``cli/progress.py``)."""

from __future__ import annotations

import json

import pytest

from sprite_env.cli import render
from sprite_env.cli.progress import EventDisplay, describe_progress
from sprite_env.errors import UserError


def _cp(cid: str, **kw: object) -> dict[str, object]:
    return {
        "id": cid,
        "create_time": "2025-03-04T05:06:07.123456Z",
        "comment": "",
        "is_auto": False,
        "is_active": False,
        "files": 3,
        "dirs": 1,
        "bytes": 2048,
        "bytes_added": 100,
        "created_by": "user",
        "history": [],
        "warnings": [],
        **kw,
    }


def test_sizes() -> None:
    assert render.size(0) == "0 B"
    assert render.size(1023) == "1023 B"
    assert render.size(1536) == "1.5 KiB"
    assert render.size(5 * 2**40) == "5.0 TiB"


def test_checkpoint_table_aligns_and_marks_the_active_one() -> None:
    rows = [
        _cp("v10", comment="tab\there", is_active=True, files=12345),
        _cp("auto-20250304T050607Z", is_auto=True),
    ]
    assert render.checkpoint_table(rows).splitlines() == [
        "ID                            CREATED              FILES     SIZE  ADDED  COMMENT",
        "v10 *                         2025-03-04 05:06:07  12345  2.0 KiB  100 B  tab here",
        "auto-20250304T050607Z (auto)  2025-03-04 05:06:07      3  2.0 KiB  100 B",
    ]


def test_checkpoint_info() -> None:
    c = _cp("v2", history=["v1", "v0"], warnings=[{"path": "db", "message": "kept changing"}])
    lines = list(render.checkpoint_info(c))
    assert lines[0] == "ID:       v2"
    assert "History:  v1 <- v0" in lines
    assert lines[-1] == "Warning:  db: kept changing"


def test_change_lines_take_words_or_marks_and_odd_names() -> None:
    changes = [
        {"path": "a", "change": "added"},
        {"path": "b", "change": "-"},
        {"path": "c\\xff", "change": "modified"},  # the API escapes non-UTF-8 bytes
        {"path": "d\udcff", "change": "meta"},  # a surrogate-escaped byte
    ]
    assert list(render.change_lines(changes)) == ["+ a", "- b", "M c\\xff", "m d\\xff"]


def test_preview_lines_group_by_directory_deletions_first() -> None:
    changes = [
        {"path": f"a/f{i:02d}", "change": "meta", "action": "metadata", "entries": 1}
        for i in range(25)
    ] + [{"path": "z/new", "change": "added", "type": "dir", "action": "delete", "entries": 51}]
    counts = {"delete": 51, "change": 0, "create": 0, "metadata": 25}
    lines = list(render.preview_lines("v1", counts, changes, limit=20))
    assert lines == [
        "Restoring v1 would delete 51, change 0, create 0 and fix the metadata of 25 entries:",
        "  delete        51  z/new/ and everything in it",
        "  metadata      25  in a/: f00, f01, f02, f03, f04, f05, f06, f07, f08, f09, f10, f11, "
        "... (13 more)",
        "Every path: sprite-env restore v1 --preview",
    ]
    full = list(render.preview_lines("v1", counts, changes, limit=None))
    assert full[1] == "  delete    z/new/ (51 entries)"
    assert full[2:] == [f"  metadata  a/f{i:02d}" for i in range(25)]
    assert list(render.preview_lines("v1", counts, [], limit=20)) == [
        "Nothing to restore: the layer already equals v1."
    ]


def test_preview_sample_coarsens_until_it_fits() -> None:
    changes = [
        {"path": f"d{i:02d}/x/f", "change": "added", "action": "delete", "entries": 1}
        for i in range(30)
    ]
    counts = {"delete": 30}
    lines = list(render.preview_lines("v1", counts, changes, limit=20))
    assert (
        lines[1]
        == "  delete        30  in ./: d00/x/f, d01/x/f, d02/x/f, d03/x/f, d04/x/f, d05/x/f, "
        "... (24 more)"
    )
    assert len(lines) == 3


def test_a_type_change_counts_its_contents_as_deletions() -> None:
    changes = [
        {
            "path": "p",
            "change": "modified",
            "type": "file",
            "action": "change",
            "entries": 1,
            "inner": {"delete": 12},
        },
    ]
    lines = list(render.preview_lines("v1", {"delete": 12, "change": 1}, changes, limit=20))
    assert lines[1] == "  delete        12  p/ (the entries inside)"
    assert lines[2] == "  change         1  p (and delete the 12 entries inside)"


def test_restored_line() -> None:
    stats = {"created": 1, "modified": 2, "removed": 3, "meta": 4}
    assert render.restored_line("v1", stats, "auto-x") == (
        "Restored v1: 3 deleted, 2 changed, 1 created, 4 metadata fixed; "
        "undo with: sprite-env restore auto-x"
    )
    assert render.restored_line(None, {}, None).startswith("Reset the layer to its base: 0")


def test_diff_lines_say_when_nothing_changed() -> None:
    assert list(render.diff_lines("v0", None, [])) == ["no changes between v0 and the live layer"]
    assert list(render.diff_lines("v0", "v1", [])) == ["no changes between v0 and v1"]
    dir_added = {"path": "new", "change": "added", "type": "dir", "entries": 51}
    assert list(render.diff_lines("v0", "v1", [dir_added])) == ["+ new (51 entries)"]
    retyped = {"path": "p", "change": "modified", "type": "file", "entries": 1}
    retyped["inner"] = {"removed": 12}
    assert list(render.change_lines([retyped])) == ["M p (12 removed inside)"]


def test_activity_table() -> None:
    entries = [
        {"time": "2025-03-04T05:06:07Z", "action": "delete", "id": "v0", "actor": "me",
         "ok": False, "detail": "cannot delete active checkpoint v0"},
        {"time": "2025-03-04T05:06:00Z", "action": "reset", "id": None, "actor": "user",
         "ok": True, "detail": {"removed": 2}},
    ]  # fmt: skip
    assert render.activity_table(entries).splitlines() == [
        "TIME                 ACTOR  ACTION  ID  OK      DETAIL",
        "2025-03-04 05:06:07  me     delete  v0  FAILED  cannot delete active checkpoint v0",
        '2025-03-04 05:06:00  user   reset   -   ok      {"removed":2}',
    ]


def test_confirm_refuses_without_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    with pytest.raises(UserError, match="confirm with --yes") as info:
        render.confirm("Restore v1?", [], what="restore", flag="--yes")
    assert info.value.exit_code == 2


def test_describe_progress() -> None:
    capture = {"type": "progress", "phase": "capture", "files": 10, "bytes_read": 2048,
               "dirs": 4, "dirs_reused": 3, "job": 1, "time": "t"}  # fmt: skip
    assert describe_progress(capture) == "capturing: 10 files, 2.0 KiB read, 3/4 dirs unchanged"
    restore = {"type": "progress", "phase": "restore", "created": 1, "bytes_written": 5}
    assert describe_progress(restore) == "restoring: 1 created, 0 changed, 0 removed, 5 B written"
    other = {"type": "progress", "phase": "prune", "packs": 2, "bytes_copied": 0, "done": 1}
    assert describe_progress(other) == "prune: 2 packs"


def test_event_display_without_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    events = [
        {"type": "info", "job": 4, "data": "Creating checkpoint..."},
        {"type": "progress", "job": 4, "phase": "capture", "files": 1},
        {"type": "complete", "job": 4, "id": "v0", "data": "done"},
    ]
    with EventDisplay(as_json=False) as show:
        for e in events:
            show(e)
    out, err = capsys.readouterr()
    assert (out, err) == ("", "Creating checkpoint...\n")
    assert show.job == 4
    with EventDisplay(as_json=True) as show:
        for e in events:
            show(e)
    out, err = capsys.readouterr()
    assert [json.loads(line) for line in out.splitlines()] == events
    assert err == ""
