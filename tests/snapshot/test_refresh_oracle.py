"""The files cache a restore leaves behind, against the layer itself (see
``tests/helpers/foreign.py``); without the change journal, so every capture walks all."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from hypothesis import HealthCheck, given, settings

from tests.helpers.foreign import edit_lists, foreign_lists, undo_with_others_changes
from tests.helpers.strategies import trees as tree_specs


@settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(spec=tree_specs(max_entries=25), edits=edit_lists, foreign=foreign_lists)
def test_the_next_checkpoint_after_a_restore_holds_the_layer_as_it_is(
    spec: dict[bytes, Any], edits: list[tuple[int, str]], foreign: list[tuple[int, str]]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "layer")
        os.mkdir(root)
        undo_with_others_changes(root, os.path.join(tmp, "store"), spec, edits, foreign)
