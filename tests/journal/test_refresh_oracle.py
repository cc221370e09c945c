"""The refresh's oracle (``tests/helpers/foreign.py``) with the change journal, as the
daemon runs: the undo checkpoint and the next one are journal-driven, and what another
process changes before the refresh reaches the journal as events."""

from __future__ import annotations

import itertools
import os
from typing import Any

from hypothesis import HealthCheck, given, settings

from sprite_env.journal import Journal
from tests.helpers.foreign import edit_lists, foreign_lists, undo_with_others_changes
from tests.helpers.strategies import trees as tree_specs

_EXAMPLE = itertools.count()


@settings(
    max_examples=20,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(spec=tree_specs(max_entries=25), edits=edit_lists, foreign=foreign_lists)
def test_the_next_journal_checkpoint_after_a_restore_holds_the_layer_as_it_is(
    fs: str, spec: dict[bytes, Any], edits: list[tuple[int, str]], foreign: list[tuple[int, str]]
) -> None:
    n = next(_EXAMPLE)  # each example its own layer and store on the test's tmpfs
    root, store = os.path.join(fs, f"layer-{n}"), os.path.join(fs, f"store-{n}")
    os.mkdir(root)
    with Journal(root) as j:
        undo_with_others_changes(root, store, spec, edits, foreign, j)
