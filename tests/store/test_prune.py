"""Prune: dead objects go, live ones stay byte-exact, and a kill at any instant is harmless."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

import blake3
import pytest

from sprite_env.errors import CorruptPack, StoreError
from sprite_env.store import ObjectKind, Store, check, open_store, plan_prune
from sprite_env.store.codec import object_id
from sprite_env.store.pack import ENTRY, FOOTER, HEADER, TABLE_ROW, pack_path, read_payload

if TYPE_CHECKING:
    import sqlite3

    from sprite_env.ids import ObjectId
    from sprite_env.store.catalog import Located

PACK = 64 * 1024  # writer pack size in these tests
TARGET = 64 * 1024  # prune's target pack size
SMALL = 32 * 1024  # prune's small-pack size


def blob(tag: str, i: int) -> bytes:
    """About 4.4 kB: a compressible head and an incompressible tail (zstd is used)."""
    return (b"%s-%d " % (tag.encode(), i)) * 100 + blake3.blake3(
        b"%s/%d" % (tag.encode(), i)
    ).digest(length=3000)


def _fill(
    store: Store, tag: str, n: int, kind: ObjectKind = ObjectKind.DATA
) -> dict[ObjectId, bytes]:
    out = {}
    with store.writer(pack_size=PACK) as w:
        for i in range(n):
            data = blob(tag, i)
            out[w.put(data, kind)] = data
        w.commit()
    return out


def _disk_bytes(store: Store) -> int:
    return sum(
        os.path.getsize(os.path.join(store.packs_dir, f)) for f in os.listdir(store.packs_dir)
    )


def _state(store: Store) -> tuple[object, ...]:
    files = sorted(
        (f, st.st_size, st.st_mtime_ns)
        for f in os.listdir(store.packs_dir)
        for st in [os.stat(os.path.join(store.packs_dir, f))]
    )
    return (
        files,
        os.listdir(store.tmp_dir),
        store.catalog.query("SELECT * FROM packs ORDER BY id"),
        store.catalog.query("SELECT * FROM objects ORDER BY id"),
    )


def _assert_clean(store: Store) -> None:
    report = check(store, read_data=True)
    assert report.ok, report
    assert not report.warnings, report
    on_disk = {f[:-5] for f in os.listdir(store.packs_dir)}
    assert on_disk == {p.name for p in store.catalog.packs()}
    # every pack holds objects of its own class only
    assert not store.catalog.query(
        "SELECT 1 FROM objects o JOIN packs p ON o.pack = p.id WHERE (o.kind = 0) != (p.class = 0)"
    )


def _raw_payload(store: Store, loc: Located) -> bytes:
    fd = os.open(pack_path(store.packs_dir, loc.pack), os.O_RDONLY)
    try:
        return read_payload(fd, loc.pack, loc.entry)
    finally:
        os.close(fd)


def _half(objs: dict[ObjectId, bytes]) -> tuple[set[ObjectId], set[ObjectId]]:
    ids = sorted(objs)
    return set(ids[::2]), set(ids[1::2])


def test_dry_run_changes_nothing(store: Store) -> None:
    objs = _fill(store, "a", 40) | _fill(store, "m", 10, ObjectKind.TREE)
    live, dead = _half(objs)
    before = _state(store)
    plan = plan_prune(store, live, target_pack_size=TARGET, small_pack=SMALL)
    assert plan.objects_dead == len(dead)
    assert set(plan.dead) == dead
    assert plan.rewrite
    assert plan.bytes_to_copy > 0
    assert plan.bytes_freed_estimate > 0
    assert plan.live_missing == 0
    assert _state(store) == before
    assert all(store.has(oid) for oid in dead)


def test_plan_works_on_a_read_only_store_but_execute_refuses(store_dir: str) -> None:
    with open_store(store_dir, create=True) as s:
        objs = _fill(s, "a", 20)
    with open_store(store_dir, writable=False) as s:
        plan = plan_prune(s, set(), target_pack_size=TARGET)
        assert plan.objects_dead == 20
        assert plan.packs_deleted == len(s.catalog.packs())
        with pytest.raises(StoreError, match="writing"):
            plan.execute(s)
        assert all(s.has(oid) for oid in objs)


def test_everything_live_does_nothing(store: Store) -> None:
    objs = _fill(store, "a", 50)  # two full packs (22 objects each) and a small tail
    assert len(store.catalog.packs()) >= 3
    before = _state(store)
    plan = plan_prune(store, objs.keys(), target_pack_size=TARGET, small_pack=SMALL)
    assert plan.nothing_to_do
    assert (plan.delete, plan.rewrite, plan.objects_dead) == ([], [], 0)
    assert len(plan.keep) == len(store.catalog.packs())
    assert plan.bytes_freed_estimate == plan.bytes_to_copy == 0
    report = plan.execute(store)
    assert (report.objects_removed, report.packs_deleted, report.packs_written) == (0, 0, 0)
    assert report.bytes_freed == 0
    assert _state(store) == before


@pytest.mark.parametrize("as_predicate", [False, True])
def test_nothing_live_empties_the_store(store: Store, as_predicate: bool) -> None:
    objs = _fill(store, "a", 30) | _fill(store, "t", 10, ObjectKind.TREE)
    disk = _disk_bytes(store)
    plan = plan_prune(
        store,
        (lambda oid: False) if as_predicate else [],
        target_pack_size=TARGET,
        small_pack=SMALL,
    )
    assert plan.live_missing == (None if as_predicate else 0)
    assert plan.rewrite == []
    assert plan.packs_deleted == len(store.catalog.packs())
    assert plan.bytes_freed_estimate == disk
    report = plan.execute(store)
    assert report.objects_removed == len(objs)
    assert report.packs_written == 0
    assert report.bytes_freed == disk
    assert os.listdir(store.packs_dir) == []
    assert store.catalog.packs() == []
    assert store.catalog.object_count() == 0
    assert not any(store.has(oid) for oid in objs)
    _assert_clean(store)
    # and the store still takes writes
    again = _fill(store, "a", 3)
    assert all(store.read(oid) == data for oid, data in again.items())


def test_half_live_frees_the_dead_and_keeps_the_live(store: Store) -> None:
    objs = _fill(store, "a", 40) | _fill(store, "b", 40) | _fill(store, "t", 20, ObjectKind.TREE)
    live, dead = _half(objs)
    old_packs = store.catalog.packs()
    assert len(old_packs) == 5  # 2 + 2 data packs, 1 metadata pack
    moved = sorted(live)[3]
    loc_before = store.catalog.locate(moved)
    assert loc_before is not None
    assert loc_before.entry.codec == 1  # zstd: the copy must not decompress it
    payload_before = _raw_payload(store, loc_before)
    disk_before = _disk_bytes(store)
    dead_stored = sum(loc.entry.stored_len for oid in dead if (loc := store.catalog.locate(oid)))

    plan = plan_prune(store, live, target_pack_size=TARGET, small_pack=SMALL)
    assert plan.packs_rewritten == len(old_packs)  # every pack is about half dead
    assert plan.bytes_dead == dead_stored + ENTRY.size * len(dead)
    report = plan.execute(store)

    assert report.objects_removed == len(dead)
    assert report.packs_deleted == len(old_packs)
    assert report.packs_written == len(store.catalog.packs()) < len(old_packs)
    assert not any(store.has(oid) for oid in dead)
    for oid in live:
        assert store.read(oid) == objs[oid]
    _assert_clean(store)

    freed = disk_before - _disk_bytes(store)
    assert freed == report.bytes_freed
    overhead = len(dead) * (ENTRY.size + TABLE_ROW.size) + len(old_packs) * (
        HEADER.size + FOOTER.size
    )
    assert dead_stored <= freed <= dead_stored + overhead
    assert abs(plan.bytes_freed_estimate - freed) <= 2 * (HEADER.size + FOOTER.size)
    assert report.bytes_copied == plan.bytes_to_copy

    loc_after = store.catalog.locate(moved)
    assert loc_after is not None
    assert loc_after.pack != loc_before.pack
    assert loc_after.entry.codec == loc_before.entry.codec
    assert _raw_payload(store, loc_after) == payload_before  # copied verbatim

    # a second prune with the same live set has nothing left to do
    assert plan_prune(store, live, target_pack_size=TARGET, small_pack=SMALL).nothing_to_do


def test_mostly_dead_packs_are_rewritten_and_small_packs_merged(store: Store) -> None:
    big = _fill(store, "a", 70)  # three full packs (22 objects each) and a small tail
    full = [p for p in store.catalog.packs() if p.size >= SMALL]
    assert len(full) >= 3
    mostly_dead, nearly_live, healthy = full[:3]
    in_pack = {p.id: {e.id for e in store.catalog.objects_in_pack(p.id)} for p in full}
    small1 = _fill(store, "b", 2)
    small2 = _fill(store, "c", 3)

    dead = set(sorted(in_pack[mostly_dead.id])[1:])  # all but one
    dead_kept = min(in_pack[nearly_live.id])  # one object of 22: under the 10% threshold
    dead.add(dead_kept)
    live = (big.keys() | small1.keys() | small2.keys()) - dead

    plan = plan_prune(store, live, target_pack_size=TARGET, small_pack=SMALL)
    rewritten = {u.pack.id for u in plan.rewrite}
    kept = {u.pack.id for u in plan.keep}
    assert mostly_dead.id in rewritten
    assert {nearly_live.id, healthy.id} <= kept
    small_ids = {p.id for p in store.catalog.packs() if p.size < SMALL}
    assert len(small_ids) == 3  # the tail of the first commit and the two small commits
    assert small_ids <= rewritten  # merged
    usage = next(u for u in plan.keep if u.pack.id == nearly_live.id)
    assert usage.dead_objects == 1
    assert 0 < usage.garbage_ratio < 0.10

    report = plan.execute(store)
    assert report.packs_deleted == 4
    assert report.packs_written == 1  # one live object + 3 small packs fit in one pack
    new = store.catalog.packs()
    assert {p.id for p in new} >= {nearly_live.id, healthy.id}
    merged = {
        loc.pack for oid in small1.keys() | small2.keys() if (loc := store.catalog.locate(oid))
    }
    assert len(merged) == 1
    # the dead object of the kept pack left the catalog, its bytes stay in the pack
    assert not store.has(dead_kept)
    assert os.path.exists(pack_path(store.packs_dir, nearly_live.name))
    assert not any(store.has(oid) for oid in dead)
    for oid in live:
        assert store.read(oid) == (big | small1 | small2)[oid]
    _assert_clean(store)
    # stable: nothing more to do
    assert plan_prune(store, live, target_pack_size=TARGET, small_pack=SMALL).nothing_to_do


def test_a_rewrite_that_reproduces_a_pack_byte_for_byte_keeps_it(store: Store) -> None:
    # Every pack counts as small and the target equals the writer's pack size, so the
    # rewrite writes the very same packs again (same names): they must survive.
    objs = _fill(store, "a", 40)
    names = sorted(p.name for p in store.catalog.packs())
    plan = plan_prune(store, objs.keys(), target_pack_size=PACK, small_pack=10 * PACK)
    assert plan.packs_rewritten == len(names)
    report = plan.execute(store)
    assert sorted(report.new_packs) == names
    assert sorted(p.name for p in store.catalog.packs()) == names
    for oid, data in objs.items():
        assert store.read(oid) == data
    _assert_clean(store)


def test_readers_after_prune(store: Store) -> None:
    objs = _fill(store, "a", 40)
    live, _dead = _half(objs)
    oid = sorted(live)[0]
    old = store.catalog.locate(oid)
    assert old is not None
    assert store.read(oid) == objs[oid]  # the store now caches an fd of the old pack
    raw_fd = os.open(pack_path(store.packs_dir, old.pack), os.O_RDONLY)
    try:
        with store.pack_files.lend(old.pack) as lent_fd:  # a read in progress across the prune
            plan_prune(store, live, target_pack_size=TARGET, small_pack=SMALL).execute(store)
            assert not os.path.exists(pack_path(store.packs_dir, old.pack))
            # open fds of an unlinked pack keep reading it (Linux semantics)
            assert read_payload(lent_fd, old.pack, old.entry) == _raw_payload_fd(raw_fd, old)
        assert read_payload(raw_fd, old.pack, old.entry)
    finally:
        os.close(raw_fd)
    # through the same Store: the catalog points at the new pack
    new = store.catalog.locate(oid)
    assert new is not None
    assert new.pack != old.pack
    assert store.read(oid) == objs[oid]
    # a stale location names a pack that is gone
    with pytest.raises(CorruptPack, match="missing"):
        store.read_entry(old.pack, old.entry)


def _raw_payload_fd(fd: int, loc: Located) -> bytes:
    return read_payload(fd, loc.pack, loc.entry)


def test_hook_commits_with_the_prune(store: Store) -> None:
    objs = _fill(store, "a", 10)
    seen = []

    def hook(db: sqlite3.Connection) -> None:
        seen.append(db.execute("SELECT count(*) FROM objects").fetchone()[0])
        db.execute("INSERT INTO meta(key, value) VALUES ('pruned', 'yes')")

    plan_prune(store, set(list(objs)[:4]), target_pack_size=TARGET).execute(store, hook=hook)
    assert seen == [4]  # sees the pruned catalog, inside the transaction
    assert store.catalog.meta("pruned") == "yes"

    def failing(db: sqlite3.Connection) -> None:
        raise RuntimeError("no")

    before = _state(store)
    with pytest.raises(RuntimeError):
        plan_prune(store, set(), target_pack_size=TARGET).execute(store, hook=failing)
    assert _state(store) == before  # rolled back, and the new packs were removed
    assert {f[:-5] for f in os.listdir(store.packs_dir)} == {p.name for p in store.catalog.packs()}


def test_a_stale_plan_is_refused(store: Store) -> None:
    objs = _fill(store, "a", 20)
    plan = plan_prune(store, set(), target_pack_size=TARGET)
    more = _fill(store, "b", 5)
    with pytest.raises(StoreError, match="changed since"):
        plan.execute(store)
    assert all(store.has(oid) for oid in objs.keys() | more.keys())
    _assert_clean(store)


def test_live_ids_the_catalog_lacks_are_counted(store: Store) -> None:
    objs = _fill(store, "a", 5)
    plan = plan_prune(store, {*objs, object_id(b"not stored")}, target_pack_size=TARGET)
    assert plan.live_missing == 1
    assert plan.objects_dead == 0


def test_bad_parameters(store: Store) -> None:
    with pytest.raises(ValueError, match="repack_threshold"):
        plan_prune(store, set(), repack_threshold=0)
    with pytest.raises(ValueError, match="target_pack_size"):
        plan_prune(store, set(), target_pack_size=0)


def test_a_damaged_object_stops_the_prune_before_any_change(store: Store) -> None:
    objs = _fill(store, "a", 40)
    live, _dead = _half(objs)
    loc = store.catalog.locate(sorted(live)[5])
    assert loc is not None
    with open(pack_path(store.packs_dir, loc.pack), "r+b") as f:  # break its entry header
        f.seek(loc.entry.offset + 10)
        f.write(b"\xff")
    before = store.catalog.query("SELECT * FROM objects ORDER BY id")
    plan = plan_prune(store, live, target_pack_size=TARGET, small_pack=SMALL)
    with pytest.raises(CorruptPack, match="header"):
        plan.execute(store)
    assert store.catalog.query("SELECT * FROM objects ORDER BY id") == before
    assert {f[:-5] for f in os.listdir(store.packs_dir)} == {p.name for p in store.catalog.packs()}
    assert os.listdir(store.tmp_dir) == []


# -- crashes -----------------------------------------------------------------------------

PRUNER = r"""
import sys
from sprite_env.store import open_store, plan_prune
from tests.store.test_prune import TARGET, SMALL, live_ids
store_dir = sys.argv[1]
with open_store(store_dir) as s:
    plan = plan_prune(s, live_ids(), target_pack_size=TARGET, small_pack=SMALL)
    assert plan.rewrite and plan.delete, plan
    plan.execute(s)
print("pruned", flush=True)
"""

CRASH_POINTS = [
    "pack-before-rename:2",
    "pack-after-rename",
    "pack-after-rename:2",
    "prune-after-write",
    "prune-mid-commit",
    "prune-after-commit",
    "prune-mid-unlink",
    "prune-mid-unlink:3",
]
COMMITTED = {"prune-after-commit", "prune-mid-unlink", "prune-mid-unlink:3"}


def _crash_fixture() -> dict[ObjectId, bytes]:
    out = {}
    for tag, n in [("a", 40), ("b", 40), ("c", 20)]:
        for i in range(n):
            data = blob(tag, i)
            out[object_id(data)] = data
    return out


def live_ids() -> set[ObjectId]:
    """Half of "a" and "b" live; all of "c" dead (its packs are deleted outright)."""
    return {object_id(blob(tag, i)) for tag in "ab" for i in range(0, 40, 2)}


def _run_pruner(store_dir: str, crash_at: str | None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("SPRITE_ENV_CRASH_AT", None)
    if crash_at:
        env["SPRITE_ENV_CRASH_AT"] = crash_at
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", PRUNER, store_dir],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_kill_during_prune_leaves_old_or_new_state(store_dir: str, point: str) -> None:
    objs = _crash_fixture()
    with open_store(store_dir, create=True) as s:
        for tag, n in [("a", 40), ("b", 40), ("c", 20)]:
            _fill(s, tag, n)
        assert len(s.catalog.packs()) == 5
    live = live_ids()
    dead = objs.keys() - live

    killed = _run_pruner(store_dir, point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    with open_store(store_dir, writable=False) as s:  # sees the crash's leftovers as they are
        on_disk = {f[:-5] for f in os.listdir(s.packs_dir)}
        listed = {p.name for p in s.catalog.packs()}
        assert listed <= on_disk
        assert on_disk - listed, "the kill should leave orphan packs (new or old)"
        report = check(s, read_data=True)
        assert report.ok, report
        assert len(report.warnings) == len(on_disk - listed)

    with open_store(store_dir) as s:  # the writable open removes orphans
        assert os.listdir(s.tmp_dir) == []
        _assert_clean(s)
        for oid in live:
            assert s.read(oid) == objs[oid]
        present = [s.has(oid) for oid in dead]
        assert present == [point not in COMMITTED] * len(dead)

    # the interrupted prune can simply be run again
    done = _run_pruner(store_dir, None) if point not in COMMITTED else None
    if done is not None:
        assert done.returncode == 0, done.stderr
    with open_store(store_dir) as s:
        assert not any(s.has(oid) for oid in dead)
        for oid in live:
            assert s.read(oid) == objs[oid]
        _assert_clean(s)
