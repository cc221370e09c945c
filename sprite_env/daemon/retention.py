"""Which automatic checkpoints to keep: a tiered policy, and room under the quota.

Pure functions over ``(id, create_time_ns)`` pairs: no I/O, no clock. The daemon plans,
then deletes what the plan drops (so a plan is a free dry run), the way restic's
``forget`` plans before ``prune`` executes.

Policy semantics (restic's and borg's ``--keep-last/--keep-hourly/--keep-daily``):

- **last**: the ``keep_last`` newest checkpoints.
- **hourly**: walking newest first, the first (so newest) checkpoint of each UTC clock hour,
  until ``hourly`` hours have been counted. Only hours that hold a checkpoint count, so
  ``hourly=24`` reaches back past a quiet night rather than stopping at it.
- **daily**: the same with UTC days.
- **protected**: ids the caller names (the active checkpoint) are never dropped.

Each rule runs on its own over every checkpoint; one checkpoint kept by several rules
counts for each of them. Ties in time are broken by id, so a plan depends only on the set
of checkpoints, never on the order they were passed in; and a plan is idempotent: planning
again over what it keeps drops nothing.

Manual checkpoints are never the subject of either function's choice: ``plan_retention``
is only given autos, and ``make_room`` picks only autos.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sprite_env.errors import UserError

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Sequence

_HOUR_NS = 3600 * 10**9
# Unix time has no leap seconds and its epoch is a UTC midnight, so whole days of
# nanoseconds since the epoch are exactly the UTC calendar days.
_DAY_NS = 24 * _HOUR_NS


class QuotaExceeded(UserError):
    """No room for a new checkpoint: the rest are manual (or protected).

    ``code`` is what the API answers with (409, see ``api/problems.py``).
    """

    code = "quota_exceeded"

    def __init__(
        self, limit: int, manual: int, oldest: Sequence[str] = (), needed: int = 1, why: str = ""
    ) -> None:
        which = (
            f"delete {needed} (the oldest: {', '.join(oldest)}) with: sprite-env checkpoints "
            f"delete {oldest[0]}"
            if oldest
            else "delete one with: sprite-env checkpoints delete ID"
        )
        slots = "one slot" if needed == 1 else f"{needed} slots"
        need = f"; {why} needs {slots}" if why else ""
        super().__init__(
            f"quota of {limit} checkpoints reached ({manual} manual, which are never deleted "
            f"for you){need}: {which}"
        )
        self.limit = limit
        self.manual = manual


@dataclass(frozen=True)
class RetentionPolicy:
    """How many automatic checkpoints each rule keeps (0 turns a rule off)."""

    keep_last: int = 5
    hourly: int = 24
    daily: int = 7

    def __post_init__(self) -> None:
        for name in ("keep_last", "hourly", "daily"):
            if getattr(self, name) < 0:
                raise ValueError(f"retention {name} must be >= 0, not {getattr(self, name)}")


@dataclass
class RetentionPlan:
    """What :func:`plan_retention` decided.

    Attributes:
        keep: ids to keep, newest first.
        drop: ids to delete, newest first.
        reasons: for each kept id, the rules that keep it, in the order
            ``last``, ``hourly``, ``daily``, ``protected``.
    """

    keep: list[str] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)
    reasons: dict[str, list[str]] = field(default_factory=dict)


def plan_retention(
    autos: Sequence[tuple[str, int]],
    policy: RetentionPolicy,
    *,
    protect: Collection[str] = (),
) -> RetentionPlan:
    """Sorts automatic checkpoints into those to keep and those to drop.

    Args:
        autos: ``(id, create_time_ns)`` of every automatic checkpoint, in any order.
        policy: how many to keep under each rule.
        protect: ids never to drop (ids not in ``autos`` are ignored).

    Returns:
        The plan; ``keep`` and ``drop`` partition the input ids.

    Raises:
        ValueError: an id appears twice in ``autos``.
    """
    newest_first = sorted(autos, key=lambda a: (a[1], a[0]), reverse=True)
    if len({cid for cid, _ in newest_first}) != len(newest_first):
        raise ValueError("duplicate checkpoint ids in retention input")

    rules: list[tuple[str, int, Callable[[int, int], int]]] = [
        ("last", policy.keep_last, lambda i, _t: i),  # every checkpoint its own bucket
        ("hourly", policy.hourly, lambda _i, t: t // _HOUR_NS),
        ("daily", policy.daily, lambda _i, t: t // _DAY_NS),
    ]
    reasons: dict[str, list[str]] = {}
    for name, count, bucket_of in rules:
        last_bucket: int | None = None
        left = count
        for i, (cid, t) in enumerate(newest_first):
            if left == 0:
                break
            bucket = bucket_of(i, t)
            # Newest first, so the first checkpoint met in a bucket is its newest.
            if bucket != last_bucket:
                reasons.setdefault(cid, []).append(name)
                last_bucket = bucket
                left -= 1
    protected = set(protect)
    for cid, _ in newest_first:
        if cid in protected:
            reasons.setdefault(cid, []).append("protected")

    plan = RetentionPlan()
    for cid, _ in newest_first:
        (plan.keep if cid in reasons else plan.drop).append(cid)
    plan.reasons = {cid: reasons[cid] for cid in plan.keep}
    return plan


def make_room(
    checkpoints: Sequence[tuple[str, bool, int]],
    limit: int,
    *,
    adding: int = 1,
    protect: Collection[str] = (),
    why: str = "",
) -> list[str]:
    """Chooses the automatic checkpoints to delete so that ``adding`` more fit the quota.

    Args:
        checkpoints: ``(id, is_auto, create_time_ns)`` of every checkpoint.
        limit: the most checkpoints the store may hold.
        adding: how many are about to be created.
        protect: ids never to choose (the active checkpoint).
        why: what needs the room, for the message ("the restore's undo checkpoint").

    Returns:
        Ids of auto checkpoints to delete, oldest first; empty if there is room already.

    Raises:
        QuotaExceeded: deleting every unprotected auto checkpoint would not make room.
            Manual checkpoints are never chosen: only the user deletes those.
    """
    excess = len(checkpoints) + adding - limit
    if excess <= 0:
        return []
    protected = set(protect)
    candidates = sorted(
        ((t, cid) for cid, is_auto, t in checkpoints if is_auto and cid not in protected),
    )
    if len(candidates) < excess:
        manuals = sorted((t, cid) for cid, is_auto, t in checkpoints if not is_auto)
        needed = excess - len(candidates)
        oldest = [cid for _, cid in manuals if cid not in protected][:needed]
        raise QuotaExceeded(limit, len(manuals), oldest, needed, why)
    return [cid for _, cid in candidates[:excess]]
