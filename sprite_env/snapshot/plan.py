"""What a restore will do, in its own words: the vocabulary of previews and restore reports.

A restore makes the live tree equal to a target. Per path it does one of four things
(:class:`Action`): ``delete`` what exists only live, ``create`` (bring back) what exists
only in the target, ``change`` an entry's content (file bytes, symlink target, device
number, or its type), or fix its ``metadata`` (owner, mode, mtime, xattrs, hard-link
grouping). Each is counted in entries, recursively: a directory made since the target,
holding 50 files, is 51 deletions.

A preview is the diff from the target to the live tree (``diff.count_changes``), so what
was *added* since the target is what the restore deletes (:data:`ACTION_OF`). The
restore's own counters (``restore.RestoreStats``) count from the same two trees in the
same units, and :func:`stats_counts` names them with these words: for one state, a
preview's counts equal the counts its restore reports.

Under an overlay the trees compared are the merged views (``overlay.merge``), so paths
are those a user sees in MERGED: a whiteout in UPPER that the restore removes is the base
image's file coming back, ``create etc/os-release``.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

from sprite_env.snapshot.diff import Change, Counted

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sprite_env.snapshot.restore import RestoreStats


class Action(Enum):
    """What a restore does to one path."""

    DELETE = "delete"
    CREATE = "create"  # brings back what the target holds and the live tree lacks
    CHANGE = "change"  # content or type
    METADATA = "metadata"


#: Most consequential first: the order of a preview's summary and sample.
ORDER = (Action.DELETE, Action.CHANGE, Action.CREATE, Action.METADATA)

#: A change from the target to the live tree, as the restore's action that undoes it.
ACTION_OF = {
    Change.ADDED: Action.DELETE,
    Change.REMOVED: Action.CREATE,
    Change.MODIFIED: Action.CHANGE,
    Change.META: Action.METADATA,
}


def counts(items: Iterable[Counted]) -> dict[str, int]:
    """A preview's entries per action (every action present, zeros included)."""
    out = {a.value: 0 for a in ORDER}
    for it in items:
        for change, n in it.effects:
            out[ACTION_OF[change].value] += n
    return out


def step_json(it: Counted) -> dict[str, object]:
    """One path of a preview: the diff's fields (``change``: what happened since the
    target) plus the restore's ``action`` and the ``entries`` it touches; a type change
    adds ``inner``, the entries below it deleted or created."""
    out = it.difference.to_json()
    out["action"] = ACTION_OF[it.difference.change].value
    out["entries"] = it.entries
    inner = {ACTION_OF[c].value: n for c, n in it.effects if c is not it.difference.change}
    if inner:
        out["inner"] = inner
    return out


#: The restore's counter (``RestoreStats``) of each action: one vocabulary, two spellings.
STATS_FIELD = {
    Action.DELETE: "removed",
    Action.CHANGE: "modified",
    Action.CREATE: "created",
    Action.METADATA: "meta",
}


def stats_counts(stats: RestoreStats) -> dict[str, int]:
    """A restore's counters in a preview's words (:func:`counts`)."""
    return {a.value: int(getattr(stats, STATS_FIELD[a])) for a in ORDER}


def as_stats(counts: dict[str, int]) -> dict[str, int]:
    """A preview's counts under the restore's counter names (``RestoreStats``)."""
    return {STATS_FIELD[a]: counts[a.value] for a in ORDER}
