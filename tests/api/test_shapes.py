"""The shapes' JSON Schemas come from their TypedDicts, and they are strict where a shape
is closed: an unknown or missing field, or a wrong type, fails validation."""

from __future__ import annotations

from typing import NotRequired, TypedDict

import jsonschema
import pytest

from sprite_env.api import shapes
from tests.api.fake_backend import checkpoint


class _Stringly(TypedDict):
    """A TypedDict of a module with string annotations (like the MCP server's)."""

    must: int
    may: NotRequired[str | None]


def _valid(value: object, shape: object) -> bool:
    try:
        jsonschema.validate(value, shapes.json_schema(shape))
    except jsonschema.ValidationError:
        return False
    return True


def test_not_required_keys_are_optional_even_under_string_annotations() -> None:
    schema = shapes.json_schema(_Stringly)
    assert schema["required"] == ["must"]
    assert schema["properties"]["may"] == {"type": ["string", "null"]}
    assert _valid({"must": 1}, _Stringly)
    assert not _valid({"may": "x"}, _Stringly)


def test_a_closed_shape_refuses_unknown_missing_and_mistyped_fields() -> None:
    good = checkpoint("v0")
    assert _valid(good, shapes.Checkpoint)
    assert not _valid({**good, "surprise": 1}, shapes.Checkpoint)
    assert not _valid({k: v for k, v in good.items() if k != "files"}, shapes.Checkpoint)
    assert not _valid({**good, "files": "1"}, shapes.Checkpoint)
    assert not _valid({**good, "warnings": [{"path": "/a"}]}, shapes.Checkpoint)


def test_events_are_open_but_typed_by_their_type() -> None:
    base = {"time": "2026-12-01T00:00:00.000000Z", "job": 1}
    assert _valid({**base, "type": "info", "data": "x", "anything": [1]}, shapes.Event)
    assert _valid({**base, "type": "error", "error": "no", "code": "busy"}, shapes.Event)
    assert not _valid({**base, "type": "error", "error": "no"}, shapes.Event)  # no code
    assert not _valid({**base, "type": "finished", "data": "x"}, shapes.Event)
    # A complete event's checkpoint is a Checkpoint.
    assert not _valid({**base, "type": "complete", "data": "x", "checkpoint": {}}, shapes.Event)


def test_the_diff_builder_sums_entries_and_their_inner_counts() -> None:
    changes: list[shapes.DiffEntry] = [
        {"path": "a", "change": "added", "type": "dir", "size": None, "entries": 51},
        {
            "path": "b",
            "change": "modified",
            "type": "file",
            "size": 3,
            "entries": 1,
            "inner": {"removed": 4},
        },
        {"path": "c", "change": "meta", "type": "file", "size": 0, "entries": 1},
    ]
    got = shapes.diff("v0", None, changes)
    assert got["counts"] == {"added": 51, "removed": 4, "modified": 1, "meta": 1}
    assert list(got["counts"]) == ["added", "removed", "modified", "meta"]
    assert (got["from"], got["to"]) == ("v0", "live")
    assert _valid(got, shapes.Diff)


def test_every_named_shape_has_a_valid_schema() -> None:
    for shape in shapes.SHAPES:
        jsonschema.Draft202012Validator.check_schema(shapes.json_schema(shape))


def test_an_annotation_without_a_schema_is_an_error() -> None:
    with pytest.raises(TypeError, match="no JSON Schema"):
        shapes.json_schema(bytes)


def test_request_bodies_give_the_router_their_field_types() -> None:
    assert shapes.field_types(shapes.RestoreRequest) == {"created_by": str, "paths": list}
