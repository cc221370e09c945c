"""The remote store against a real Swift (s3api): push, pull, a fork on another machine,
and each ordering invariant of docs/remote.md with a fault at each step."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from sprite_env.checkpoints import Engine
from sprite_env.snapshot.dircache import RACY_NS
from sprite_env.store import check, open_store
from sprite_env.store.remote import (
    Generation,
    RemoteStoreError,
    _backup,
    generations,
    pull,
    push,
)
from sprite_env.store.s3 import BadStoreUrl, RemoteError, S3Storage, StoreUrl
from tests.helpers import trees
from tests.helpers.daemon import write_file

PUSH = """
import sys
from sprite_env.store import open_store
from sprite_env.store.remote import push
from sprite_env.store.s3 import S3Storage, StoreUrl
with open_store(sys.argv[1]) as store:
    push(store, S3Storage(StoreUrl(sys.argv[2], sys.argv[3])))
"""


def _age() -> None:
    time.sleep(RACY_NS / 1e9 * 1.5)  # past the racy window, so the files cache can vouch


def _push_in_child(store_dir: str, storage: S3Storage, crash_at: str) -> int:
    env = dict(os.environ, SPRITE_ENV_CRASH_AT=crash_at)
    args = [sys.executable, "-c", PUSH, store_dir, storage.url.bucket, storage.url.prefix]
    return subprocess.run(args, env=env, capture_output=True, check=False).returncode


def _packs_of(store_dir: str) -> set[str]:
    with open_store(store_dir, writable=False) as s:
        return {f"packs/{p.name}.pack" for p in s.catalog.packs()}


def _stamps(storage: S3Storage) -> dict[str, object]:
    """Each object's ETag and modification time: an overwrite would change them. Lease
    locks are left out: they come and go (a killed pusher's is removed by the next)."""
    pages = storage.client.get_paginator("list_objects_v2").paginate(Bucket=storage.url.bucket)
    return {
        o["Key"]: (o["ETag"], o["LastModified"])
        for p in pages
        for o in p.get("Contents", [])
        if "/locks/" not in o["Key"]
    }


def _ids(store_dir: str, root: str) -> list[str]:
    with Engine(root, store_dir, create=False) as e:
        return sorted(c.id for c in e.checkpoints(include_auto=True))


def test_the_server_refuses_conditional_puts(storage: S3Storage) -> None:
    """The premise of the commit protocol: Swift 2.30 cannot fence a write."""
    with pytest.raises(Exception, match="Conditional object PUTs are not supported"):
        storage.client.put_object(
            Bucket=storage.url.bucket, Key="store/x", Body=b"x", IfNoneMatch="*"
        )


def test_push_uploads_each_pack_once_then_the_generation(storage: S3Storage, tmp_path) -> None:
    root, store_dir = str(tmp_path / "layer"), str(tmp_path / "store")
    trees.build_tree(root, trees.sample_spec())
    with Engine(root, store_dir) as e:
        e.create("first")
        first = push(e.store, storage)
        assert first.generation.number == 0
        assert first.packs_uploaded == len(e.store.catalog.packs()) >= 2  # data + metadata
        assert set(storage.list("packs/")) == _packs_of_open(e)
        again = push(e.store, storage)  # nothing new: no pack is sent again
        assert (again.generation.number, again.packs_uploaded) == (1, 0)
        assert again.packs_present == first.packs_uploaded
        assert again.generation.writer == first.generation.writer
        write_file(os.path.join(root, "new/file"), b"fresh bytes" * 1000)
        e.create("second")
        third = push(e.store, storage)
    assert third.generation.number == 2
    assert 1 <= third.packs_uploaded < len(_packs_of(store_dir))
    assert [g.number for g in generations(storage)] == [2, 1, 0]


def _packs_of_open(e: Engine) -> set[str]:
    return {f"packs/{p.name}.pack" for p in e.store.catalog.packs()}


def test_a_checkpoint_restored_on_another_machine(storage: S3Storage, tmp_path) -> None:
    """A second root and store with nothing local lists the checkpoints and restores one
    exactly (content, modes, times, xattrs, links, holes)."""
    root_a, store_a = str(tmp_path / "a/layer"), str(tmp_path / "a/store")
    trees.build_tree(root_a, trees.sample_spec())
    v0_tree = trees.snapshot_tree(root_a)
    with Engine(root_a, store_a) as e:
        e.create("v0")
        write_file(os.path.join(root_a, "etc/later"), b"after v0")
        os.chmod(os.path.join(root_a, "etc/later"), 0o640)
        e.create("v1")
        push(e.store, storage)
        ids_a = sorted(c.id for c in e.checkpoints(include_auto=True))
    v1_tree = trees.snapshot_tree(root_a)
    root_b, store_b = str(tmp_path / "b/layer"), str(tmp_path / "b/store")
    os.makedirs(root_b)
    report = pull(storage, store_b)
    assert report.skipped == []
    assert report.packs == len(_packs_of(store_a))
    assert _ids(store_b, root_b) == ids_a == ["v0", "v1"]
    with Engine(root_b, store_b, create=False) as e:
        e.restore("v1")
        trees.assert_trees_equal(v1_tree, trees.snapshot_tree(root_b))
        _age()
        e.restore("v0")
        trees.assert_trees_equal(v0_tree, trees.snapshot_tree(root_b))
        assert check(e.store, read_data=True).ok
        # A fork: its own writer id, its own next generation, the parent's packs shared.
        fork = push(e.store, storage)
    assert fork.generation.writer != report.generation.writer
    assert fork.generation.number == report.generation.number + 1


@pytest.mark.parametrize(
    ("crash_at", "committed"),
    [
        ("remote-before-pack-put", False),  # nothing sent
        ("remote-after-pack-put", False),  # one pack durable, no generation names it
        ("remote-before-pack-put:2:EIO", False),  # an error, not a kill, mid-way
        ("remote-before-catalog-put", False),  # every pack durable, the generation not sent
        ("remote-before-catalog-put:1:EIO", False),
        ("remote-after-catalog-put", True),  # killed after the commit point: committed
    ],
)
def test_a_fault_at_each_step_of_a_push(
    storage: S3Storage, tmp_path, crash_at: str, committed: bool
) -> None:
    """Invariants: the bucket's newest complete generation is the old one or the new one,
    never a mix; every pack it names is there and sound; the next push completes, sending
    only what is missing and overwriting nothing."""
    root, store_dir = str(tmp_path / "layer"), str(tmp_path / "store")
    trees.build_tree(root, trees.sample_spec())
    with Engine(root, store_dir) as e:
        e.create("v0")
        push(e.store, storage)
        write_file(os.path.join(root, "big/one"), os.urandom(300_000))
        write_file(os.path.join(root, "big/two"), os.urandom(300_000))
        e.create("v1")
    before = _stamps(storage)
    assert _push_in_child(store_dir, storage, crash_at) != 0
    after_fault = _stamps(storage)
    assert {k: after_fault[k] for k in before} == before  # nothing rewritten
    newest = generations(storage)[0]
    assert newest.number == (1 if committed else 0)
    pulled = str(tmp_path / "pulled")
    pull(storage, pulled)
    assert _ids(pulled, root) == (["v0", "v1"] if committed else ["v0"])
    with open_store(pulled, writable=False) as s:
        assert check(s, read_data=True).ok
    with open_store(store_dir) as s:
        resumed = push(s, storage)
        total = len(s.catalog.packs())
    sent_before = len(set(after_fault) - set(before) - {newest.name}) if not committed else 0
    assert resumed.packs_uploaded == (0 if committed else total - resumed.packs_present)
    assert resumed.packs_present + resumed.packs_uploaded == total
    assert resumed.packs_present >= len(_packs_of(pulled)) + sent_before
    final = _stamps(storage)
    assert {k: final[k] for k in after_fault} == after_fault
    again = str(tmp_path / "pulled-again")
    pull(storage, again)
    assert _ids(again, root) == ["v0", "v1"]


def test_pull_passes_over_incomplete_generations(storage: S3Storage, tmp_path, expect_log) -> None:
    """A newer generation whose bytes do not match its name (a damaged upload), or one
    that names packs the bucket lacks (a writer that broke the order), is not used."""
    expect_log("generation passed over")
    root, store_dir = str(tmp_path / "layer"), str(tmp_path / "store")
    trees.build_tree(root, trees.sample_spec())
    with Engine(root, store_dir) as e:
        e.create("v0")
        good = push(e.store, storage).generation
        write_file(os.path.join(root, "x"), os.urandom(200_000))
        e.create("v1")  # its packs are never uploaded
        early = str(tmp_path / "early.db")
        _backup(e.store, early)
    from sprite_env.store.remote import _file_b3

    storage.put_file(Generation(1, "0" * 12, _file_b3(early)).name, early)
    junk = str(tmp_path / "junk")
    with open(junk, "wb") as f:
        f.write(b"not a catalog")
    storage.put_file(Generation(2, "1" * 12, "ab" * 32).name, junk)
    report = pull(storage, str(tmp_path / "pulled"))
    assert report.generation == good
    assert len(report.skipped) == 2
    assert "do not match" in report.skipped[0]
    assert "packs are missing" in report.skipped[1]
    assert _ids(str(tmp_path / "pulled"), root) == ["v0"]


def test_pull_of_an_empty_prefix_is_a_clear_error(storage: S3Storage, tmp_path) -> None:
    with pytest.raises(RemoteStoreError, match="no catalog generation"):
        pull(storage, str(tmp_path / "s"))
    assert not os.path.exists(tmp_path / "s")  # nothing made


def test_wrong_credentials_are_a_clear_error(s3_env, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    s = S3Storage(StoreUrl("any-bucket", ""))
    with pytest.raises(RemoteError, match=r"listing of .*(SignatureDoesNotMatch|AccessDenied)"):
        s.list("catalog/")


def test_store_urls() -> None:
    assert StoreUrl.parse("s3://b/p/q/") == StoreUrl("b", "p/q/")
    assert StoreUrl.parse("s3://b") == StoreUrl("b", "")
    for bad in ("/local/dir", "s3://", "http://b/p", "s3://b/p?x=1"):
        with pytest.raises(BadStoreUrl):
            StoreUrl.parse(bad)


PULL = """
import sys
from sprite_env.store.remote import pull
from sprite_env.store.s3 import S3Storage, StoreUrl
pull(S3Storage(StoreUrl(sys.argv[2], sys.argv[3])), sys.argv[1])
"""


@pytest.mark.parametrize("crash_at", ["remote-pull-before-pack:2", "remote-pull-before-catalog"])
def test_a_pull_killed_midway_leaves_no_checkpoint_and_can_be_run_again(
    storage: S3Storage, tmp_path, crash_at: str
) -> None:
    root, store_dir = str(tmp_path / "layer"), str(tmp_path / "store")
    trees.build_tree(root, trees.sample_spec())
    with Engine(root, store_dir) as e:
        e.create("v0")
        push(e.store, storage)
    pulled = str(tmp_path / "pulled")
    env = dict(os.environ, SPRITE_ENV_CRASH_AT=crash_at)
    args = [sys.executable, "-c", PULL, pulled, storage.url.bucket, storage.url.prefix]
    assert subprocess.run(args, env=env, capture_output=True, check=False).returncode != 0
    assert os.listdir(os.path.join(pulled, "packs"))  # some packs came, no catalog names them
    assert _ids(pulled, root) == []
    pull(storage, pulled)  # the writable open deleted them as orphans; all come again
    assert _ids(pulled, root) == ["v0"]
    with open_store(pulled, writable=False) as s:
        assert check(s, read_data=True).ok
