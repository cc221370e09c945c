from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sprite_env.daemon.retention import (
    QuotaExceeded,
    RetentionPlan,
    RetentionPolicy,
    make_room,
    plan_retention,
)
from sprite_env.errors import UserError

HOUR = 3600 * 10**9
DAY = 24 * HOUR


def at(stamp: str) -> int:
    """Nanoseconds since the epoch of a UTC ``YYYY-MM-DD HH:MM``."""
    dt = datetime.strptime(stamp, "%Y-%m-%d %H:%M").replace(tzinfo=UTC)
    return int(dt.timestamp()) * 10**9


# --- hand-written examples ----------------------------------------------------------------


def test_empty_input() -> None:
    plan = plan_retention([], RetentionPolicy())
    assert plan == RetentionPlan([], [], {})


def test_keep_last_only() -> None:
    autos = [(f"a{i}", at("2026-01-01 00:00") + i * 10**9) for i in range(6)]
    plan = plan_retention(autos, RetentionPolicy(keep_last=2, hourly=0, daily=0))
    assert plan.keep == ["a5", "a4"]
    assert plan.drop == ["a3", "a2", "a1", "a0"]
    assert plan.reasons == {"a5": ["last"], "a4": ["last"]}


def test_hourly_keeps_newest_of_each_hour() -> None:
    autos = [
        ("h10a", at("2026-01-01 10:05")),
        ("h10b", at("2026-01-01 10:55")),
        ("h11a", at("2026-01-01 11:00")),
        ("h11b", at("2026-01-01 11:59")),
        ("h13", at("2026-01-01 13:30")),
    ]
    plan = plan_retention(autos, RetentionPolicy(keep_last=0, hourly=3, daily=0))
    assert plan.keep == ["h13", "h11b", "h10b"]
    assert plan.drop == ["h11a", "h10a"]


def test_hourly_counts_only_hours_that_have_a_checkpoint() -> None:
    # A quiet night between 20:00 and 08:00 does not use up the hourly budget.
    autos = [
        ("eve", at("2026-01-01 20:10")),
        ("morning", at("2026-01-02 08:10")),
        ("now", at("2026-01-02 09:10")),
    ]
    plan = plan_retention(autos, RetentionPolicy(keep_last=0, hourly=3, daily=0))
    assert plan.keep == ["now", "morning", "eve"]


def test_daily_uses_utc_days() -> None:
    autos = [
        ("d1-early", at("2026-03-01 00:00")),
        ("d1-late", at("2026-03-01 23:59")),
        ("d2", at("2026-03-02 00:00")),
        ("d4", at("2026-03-04 12:00")),
    ]
    plan = plan_retention(autos, RetentionPolicy(keep_last=0, hourly=0, daily=2))
    assert plan.keep == ["d4", "d2"]
    plan = plan_retention(autos, RetentionPolicy(keep_last=0, hourly=0, daily=7))
    assert plan.keep == ["d4", "d2", "d1-late"]
    assert plan.drop == ["d1-early"]


def test_tiers_combine_and_reasons_accumulate() -> None:
    autos = [
        ("a", at("2026-05-01 09:00")),
        ("b", at("2026-05-02 09:00")),
        ("c", at("2026-05-03 09:00")),
        ("d", at("2026-05-03 10:15")),
        ("e", at("2026-05-03 10:45")),
        ("f", at("2026-05-03 11:20")),
    ]
    plan = plan_retention(autos, RetentionPolicy(keep_last=1, hourly=2, daily=3))
    assert plan.keep == ["f", "e", "b", "a"]
    assert plan.drop == ["d", "c"]
    assert plan.reasons == {
        "f": ["last", "hourly", "daily"],
        "e": ["hourly"],
        "b": ["daily"],
        "a": ["daily"],
    }


def test_protected_is_kept_even_when_every_rule_is_off() -> None:
    autos = [("old", at("2026-01-01 00:00")), ("new", at("2026-01-02 00:00"))]
    plan = plan_retention(
        autos, RetentionPolicy(keep_last=0, hourly=0, daily=0), protect={"old", "unknown"}
    )
    assert plan.keep == ["old"]
    assert plan.drop == ["new"]
    assert plan.reasons == {"old": ["protected"]}


def test_protected_also_counts_for_its_rules() -> None:
    autos = [("a", at("2026-01-01 00:00")), ("b", at("2026-01-01 00:01"))]
    plan = plan_retention(autos, RetentionPolicy(keep_last=1, hourly=0, daily=0), protect=["b"])
    assert plan.reasons == {"b": ["last", "protected"]}
    assert plan.drop == ["a"]


def test_equal_times_break_ties_by_id_whatever_the_input_order() -> None:
    t = at("2026-01-01 12:00")
    policy = RetentionPolicy(keep_last=1, hourly=0, daily=0)
    assert plan_retention([("x", t), ("y", t)], policy).keep == ["y"]
    assert plan_retention([("y", t), ("x", t)], policy).keep == ["y"]


def test_times_before_the_epoch_still_bucket_by_utc_hour() -> None:
    autos = [("a", -HOUR - 1), ("b", -HOUR), ("c", -1)]
    plan = plan_retention(autos, RetentionPolicy(keep_last=0, hourly=5, daily=0))
    assert plan.keep == ["c", "a"]


def test_duplicate_ids_are_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        plan_retention([("a", 1), ("a", 2)], RetentionPolicy())


def test_negative_policy_is_rejected() -> None:
    with pytest.raises(ValueError, match="hourly"):
        RetentionPolicy(hourly=-1)


def test_default_policy_over_a_week_of_ten_minute_autos() -> None:
    start = at("2026-06-01 00:00")
    autos = [(f"auto-{i:04d}", start + i * 600 * 10**9) for i in range(7 * 24 * 6)]
    plan = plan_retention(autos, RetentionPolicy())
    # 5 newest + the newest of 24 hours (the newest hour's overlaps) + 7 days (the newest
    # day's overlaps with the newest hour's).
    assert len(plan.keep) == 5 + 23 + 6
    newest_of_day = {f"auto-{(d + 1) * 144 - 1:04d}" for d in range(7)}
    assert newest_of_day <= set(plan.keep)


# --- make_room ----------------------------------------------------------------------------


def test_make_room_with_room_to_spare() -> None:
    cps = [("v0", False, 1), ("auto-a", True, 2)]
    assert make_room(cps, 3) == []
    assert make_room(cps, 4, adding=2) == []


def test_make_room_deletes_oldest_autos_first() -> None:
    cps = [
        ("v0", False, 1),
        ("auto-c", True, 30),
        ("auto-a", True, 10),
        ("v1", False, 5),
        ("auto-b", True, 20),
    ]
    assert make_room(cps, 5) == ["auto-a"]
    assert make_room(cps, 4) == ["auto-a", "auto-b"]
    assert make_room(cps, 4, protect={"auto-a"}) == ["auto-b", "auto-c"]
    assert make_room(cps, 5, adding=3) == ["auto-a", "auto-b", "auto-c"]


def test_make_room_never_chooses_manual_or_protected() -> None:
    cps = [("v0", False, 1), ("v1", False, 2), ("auto-a", True, 3)]
    assert make_room(cps, 3) == ["auto-a"]
    with pytest.raises(QuotaExceeded) as info:
        make_room(cps, 3, protect=["auto-a"])
    assert str(info.value) == (
        "quota of 3 checkpoints reached (2 manual, which are never deleted for you): "
        "delete 1 (the oldest: v0) with: sprite-env checkpoints delete v0"
    )
    assert isinstance(info.value, UserError)
    assert (info.value.limit, info.value.manual) == (3, 2)
    assert info.value.code == "quota_exceeded"
    with pytest.raises(QuotaExceeded, match="quota of 2 checkpoints"):
        make_room(cps, 2)
    with pytest.raises(QuotaExceeded) as again:
        make_room(cps, 2, protect=["auto-a", "v0"], why="the restore's undo checkpoint")
    assert str(again.value) == (
        "quota of 2 checkpoints reached (2 manual, which are never deleted for you); the "
        "restore's undo checkpoint needs 2 slots: delete 2 (the oldest: v1) with: "
        "sprite-env checkpoints delete v1"
    )


# --- properties ---------------------------------------------------------------------------

# Times over about ten days, clustered so that hours and days often hold several.
times = st.one_of(
    st.integers(0, 10 * DAY),
    st.integers(0, 240).map(lambda h: h * HOUR),
    st.integers(0, 10).map(lambda d: d * DAY + 59 * 60 * 10**9),
)
autos_st = st.dictionaries(st.text("abcdef0123", min_size=1, max_size=6), times, max_size=60).map(
    lambda d: list(d.items())
)
policies = st.builds(RetentionPolicy, st.integers(0, 8), st.integers(0, 30), st.integers(0, 10))


def reference_plan(autos: list[tuple[str, int]], policy: RetentionPolicy) -> set[str]:
    """The policy restated as group-by-bucket: the newest of each of the newest N buckets."""
    kept: set[str] = set()
    order = sorted(autos, key=lambda a: (a[1], a[0]), reverse=True)
    kept.update(cid for cid, _ in order[: policy.keep_last])
    for size, count in ((HOUR, policy.hourly), (DAY, policy.daily)):
        buckets: dict[int, tuple[int, str]] = {}
        for cid, t in autos:
            buckets[t // size] = max(buckets.get(t // size, (t, cid)), (t, cid))
        for key in sorted(buckets, reverse=True)[:count]:
            kept.add(buckets[key][1])
    return kept


@given(autos_st, policies, st.data())
def test_plan_properties(
    autos: list[tuple[str, int]], policy: RetentionPolicy, data: st.DataObject
) -> None:
    ids = [cid for cid, _ in autos]
    protect = data.draw(st.sets(st.sampled_from(ids)) if ids else st.just(set[str]()))
    plan = plan_retention(autos, policy, protect=protect)

    assert set(plan.keep) | set(plan.drop) == set(ids)
    assert not set(plan.keep) & set(plan.drop)
    assert len(plan.keep) + len(plan.drop) == len(ids)
    assert set(plan.reasons) == set(plan.keep)
    assert all(plan.reasons.values())
    assert protect <= set(plan.keep)

    newest = sorted(autos, key=lambda a: (a[1], a[0]), reverse=True)
    assert {cid for cid, _ in newest[: policy.keep_last]} <= set(plan.keep)
    assert set(plan.keep) == reference_plan(autos, policy) | protect

    # Both lists newest first.
    rank = {cid: i for i, (cid, _) in enumerate(newest)}
    assert plan.keep == sorted(plan.keep, key=rank.__getitem__)
    assert plan.drop == sorted(plan.drop, key=rank.__getitem__)

    # Idempotent: planning again over what was kept keeps all of it, for the same reasons.
    kept = [(cid, t) for cid, t in autos if cid in plan.reasons]
    again = plan_retention(kept, policy, protect=protect)
    assert again.drop == []
    assert again.reasons == plan.reasons


@given(autos_st, policies)
def test_plan_ignores_input_order(autos: list[tuple[str, int]], policy: RetentionPolicy) -> None:
    assert plan_retention(autos, policy) == plan_retention(autos[::-1], policy)


@given(
    st.dictionaries(
        st.text("abc123", min_size=1, max_size=5), st.tuples(st.booleans(), times), max_size=30
    ),
    st.integers(0, 35),
    st.integers(0, 3),
    st.data(),
)
def test_make_room_properties(
    cps: dict[str, tuple[bool, int]], limit: int, adding: int, data: st.DataObject
) -> None:
    rows = [(cid, auto, t) for cid, (auto, t) in cps.items()]
    protect = data.draw(st.sets(st.sampled_from(sorted(cps))) if cps else st.just(set[str]()))
    try:
        chosen = make_room(rows, limit, adding=adding, protect=protect)
    except QuotaExceeded:
        deletable = [r for r in rows if r[1] and r[0] not in protect]
        assert len(rows) - len(deletable) + adding > limit
        return
    assert len(rows) - len(chosen) + adding <= limit
    assert len(set(chosen)) == len(chosen)
    assert all(cps[cid][0] and cid not in protect for cid in chosen)
    # Only as many as needed, and the oldest of the candidates.
    assert len(chosen) == max(0, len(rows) + adding - limit)
    candidates = sorted((t, cid) for cid, auto, t in rows if auto and cid not in protect)
    assert chosen == [cid for _, cid in candidates[: len(chosen)]]
