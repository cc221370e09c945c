"""Remote deletes with a grace period (issue 14, point 6), against the real Swift: a reader
of the old generation reads through the grace, then the space is freed; nothing a kept
generation names is deleted; each writer keeps its newest generations."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

import pytest

from sprite_env.checkpoints import Engine
from sprite_env.store import check, open_store
from sprite_env.store.lease import open_lease
from sprite_env.store.remote import (
    RemoteStoreError,
    generations,
    heads,
    pull,
    push,
    writer_id,
)
from sprite_env.store.remote_gc import GcPlan, GcPolicy, collect, plan
from tests.helpers import trees
from tests.helpers.daemon import write_file

if TYPE_CHECKING:
    from sprite_env.store.remote import Generation
    from sprite_env.store.s3 import S3Storage

#: Ages come from the server's Date header, in whole seconds, against the objects'
#: LastModified: :func:`_past_grace` asks the server rather than sleeping a margin.
GRACE = 1.5


def _past_grace(storage: S3Storage, policy: GcPolicy, timeout: float = 30.0) -> GcPlan:
    """Waits until a dry run of ``policy`` spares nothing for the grace alone (its
    ``due_in`` is None: every superseded generation and unnamed pack is past it, by the
    server's clock), and returns that plan. Polled: a fixed sleep of the grace plus a
    2.5 s margin for whole-second clocks and load (4 s) was most of these tests' time."""
    deadline = time.monotonic() + timeout
    while True:
        p = plan(storage, policy)
        if p.due_in is None:
            return p
        assert time.monotonic() < deadline, p
        time.sleep(min(max(p.due_in, 0.1), 1.0))


def _named(storage: S3Storage, gen: Generation, tmp_path, tag: str) -> set[str]:
    """The packs ``gen`` names, checked byte for byte through a pull of it."""
    pulled = str(tmp_path / f"check-{tag}")
    pull(storage, pulled, generation=gen)
    with open_store(pulled, writable=False) as s:
        assert check(s, read_data=True).ok
        return {f"packs/{p.name}.pack" for p in s.catalog.packs()}


def test_a_delete_frees_remote_space_after_the_grace(storage: S3Storage, tmp_path) -> None:
    """v0 holds a big file; it is deleted and the next generation no longer names its
    pack. Within the grace nothing goes and a reader of the old generation reads it
    whole; after it, the old generation, its pack and an orphan are gone, and the newest
    generation's packs all stay."""
    policy = GcPolicy(keep=1, grace=GRACE)
    root, store_dir = str(tmp_path / "layer"), str(tmp_path / "store")
    trees.build_tree(root, trees.sample_spec())
    write_file(os.path.join(root, "big"), os.urandom(400_000))
    with Engine(root, store_dir) as e:
        e.create("v0")
        old = push(e.store, storage).generation
        os.unlink(os.path.join(root, "big"))
        e.create("v1")
        e.delete("v0")
        pushed = time.monotonic()  # before the generation that supersedes ``old``
        new = push(e.store, storage).generation
        wid = writer_id(e.store)
    orphan = f"packs/{'ab' * 32}.pack"  # a pack of a push still on its way elsewhere
    storage.put_bytes(orphan, b"in flight")
    old_packs = _named(storage, old, tmp_path, "old")
    new_packs = _named(storage, new, tmp_path, "new")
    dropped = old_packs - new_packs
    assert dropped  # the big file's pack at least
    before = storage.list("packs/")

    # Within the grace nothing goes: asked with a grace of a minute, which no loaded
    # machine spends between the push and here (the pulls above took more than GRACE once).
    within = GcPolicy(keep=1, grace=60.0)
    early = collect(storage, wid, within)
    assert (early.generations, early.packs) == (0, 0)
    assert early.due_in is not None  # what it spared, it says when to come back for
    assert 0 <= early.due_in <= 60.0 + 1  # +1: whole-second clocks
    assert early.due_in >= 60.0 - (time.monotonic() - pushed) - 1
    assert storage.list("packs/") == before
    reader = str(tmp_path / "reader")  # a reader that took the old generation
    pull(storage, reader, generation=old)
    with open_store(reader, writable=False) as s:
        assert check(s, read_data=True).ok

    dry = _past_grace(storage, policy)
    assert [g.name for g in dry.generations] == [old.name]
    assert set(dry.packs) == dropped | {orphan}
    report = collect(storage, wid, policy)
    assert (report.generations, report.packs) == (1, len(dropped) + 1)
    assert report.bytes == sum(before[p] for p in dropped) + len(b"in flight")
    after = storage.list("packs/")
    assert set(after) == new_packs  # freed, and every pack of the newest is there
    assert [g.name for g in generations(storage)] == [new.name]
    with pytest.raises(RemoteStoreError, match="no generation of"):
        pull(storage, str(tmp_path / "too-late"), generation=old)
    assert _named(storage, new, tmp_path, "after") == new_packs
    again = collect(storage, wid, policy)
    assert (again.generations, again.packs) == (0, 0)
    assert again.due_in is None  # nothing waits for the grace any more


def test_each_writer_keeps_its_newest_generations(storage: S3Storage, tmp_path) -> None:
    """Two writers (A and its fork B) push three generations each; with keep=1 each keeps
    its own newest, whichever pushed last, and both stay whole."""
    policy = GcPolicy(keep=1, grace=GRACE)
    root_a, store_a = str(tmp_path / "a/layer"), str(tmp_path / "a/store")
    trees.build_tree(root_a, trees.sample_spec())
    with Engine(root_a, store_a) as a:
        a.create("v0")
        push(a.store, storage)
    store_b = str(tmp_path / "b/store")
    pull(storage, store_b)
    os.makedirs(tmp_path / "b/layer")
    with (
        Engine(root_a, store_a, create=False) as a,
        Engine(str(tmp_path / "b/layer"), store_b, create=False) as b,
    ):
        b.restore("v0")
        for i in range(2):
            write_file(os.path.join(root_a, f"a{i}"), os.urandom(30_000))
            a.create(f"a{i}")
            push(a.store, storage)
            write_file(os.path.join(str(tmp_path / "b/layer"), f"b{i}"), os.urandom(30_000))
            b.create(f"b{i}")
            push(b.store, storage)
        push(b.store, storage)  # B's newest, no change: A's head is now two numbers back
        wa = writer_id(a.store)
    assert len(generations(storage)) == 6
    h = heads(storage)
    _past_grace(storage, policy)
    report = collect(storage, wa, policy)
    assert report.generations == 4
    assert sorted(generations(storage)) == sorted(h.values())
    for writer, head in h.items():
        _named(storage, head, tmp_path, writer)  # complete and sound


def test_a_damaged_or_incomplete_newest_keeps_the_complete_one(
    storage: S3Storage, tmp_path, expect_log
) -> None:
    """keep=1 counts complete generations only: above the writer's good generation sit
    one whose packs were never uploaded and one whose bytes are damaged. After the grace
    the damaged one goes, the incomplete one (its writer's newest) stays, and the good one
    with every pack it names stays too: it is what readers take."""
    expect_log("generation passed over")
    from sprite_env.store.remote import Generation, _backup, _file_b3

    policy = GcPolicy(keep=1, grace=GRACE)
    root, store_dir = str(tmp_path / "layer"), str(tmp_path / "store")
    trees.build_tree(root, trees.sample_spec())
    with Engine(root, store_dir) as e:
        e.create("v0")
        good = push(e.store, storage).generation
        write_file(os.path.join(root, "x"), os.urandom(200_000))
        e.create("v1")  # its packs are never uploaded
        early = str(tmp_path / "early.db")
        _backup(e.store, early)
        wid = writer_id(e.store)
    damaged = str(tmp_path / "junk")
    with open(damaged, "wb") as f:
        f.write(b"not a catalog")
    junk = Generation(good.number + 1, wid, "ab" * 32)
    storage.put_file(junk.name, damaged)
    incomplete = Generation(good.number + 2, wid, _file_b3(early))
    storage.put_file(incomplete.name, early)
    packs = storage.list("packs/")
    _past_grace(storage, policy)
    report = collect(storage, wid, policy)
    assert report.generations == 1  # the damaged one
    assert sorted(g.name for g in generations(storage)) == sorted([good.name, incomplete.name])
    assert storage.list("packs/") == packs
    assert pull(storage, str(tmp_path / "reader")).generation == good


def test_remote_deletes_wait_for_the_lease(storage: S3Storage) -> None:
    from sprite_env.store.lease import LeaseHeld

    with open_lease(storage, "a" * 12), pytest.raises(LeaseHeld, match="writer aaaaaaaaaaaa"):
        collect(storage, "b" * 12, GcPolicy(keep=1, grace=0))


def test_remote_delete_settings_from_the_environment() -> None:
    from sprite_env.store.s3 import BadRemoteSetting

    got = GcPolicy.from_env({"SPRITE_ENV_REMOTE_KEEP": "3", "SPRITE_ENV_REMOTE_GRACE": "60"})
    assert got == GcPolicy(keep=3, grace=60)
    assert GcPolicy.from_env({}) == GcPolicy()
    with pytest.raises(BadRemoteSetting, match="SPRITE_ENV_REMOTE_KEEP"):
        GcPolicy.from_env({"SPRITE_ENV_REMOTE_KEEP": "0"})
