"""``store check`` as an oracle (issue 15, point 5): every flipped byte of the catalog is
either harmless (the rows read back unchanged) or an exit 3 with a message, never a
traceback and never an "ok" over changed rows; a files-cache row whose checksum fails is
dropped and its directory read afresh; a damaged chunk or a missing pack names each
checkpoint and the paths that need it; a damaged catalog recommends ``rebuild-catalog``,
which repairs it."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from typing import TYPE_CHECKING, Any

import pytest

from sprite_env.checkpoints import Engine
from sprite_env.checkpoints.verify import verify_store
from sprite_env.errors import StoreError
from sprite_env.store import open_store
from sprite_env.store.codec import object_id
from sprite_env.store.pack import ENTRY, pack_path
from tests.helpers import trees
from tests.helpers.cli import run_cli

if TYPE_CHECKING:
    from collections.abc import Callable

#: File contents (each one chunk: far below the chunker's minimum), unique per path.
FILES = {
    b"etc/conf": os.urandom(3000),
    b"etc/other": os.urandom(2000),
    b"data/caf\xe9": os.urandom(4000),  # not UTF-8: named escaped
    b"data/deep/x": os.urandom(2500),
}


def _make(tmp: str) -> tuple[str, str]:
    root, store = os.path.join(tmp, "layer"), os.path.join(tmp, "store")
    trees.build_tree(root, {p: trees.File(d) for p, d in FILES.items()})
    with Engine(root, store) as e:
        e.create("first")
        with open(os.path.join(root, "etc/new"), "wb") as f:
            f.write(os.urandom(1500))
        e.create("second")
    return root, store


def _dump(db_path: str) -> dict[str, Any] | None:
    """Every row of the catalog, read straight from SQLite (None if it cannot be read)."""
    c = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    c.text_factory = bytes
    try:
        return {
            t: sorted(c.execute(f"SELECT * FROM {t}").fetchall())
            for t in ("meta", "packs", "objects", "checkpoints", "dircache")
        }
    except Exception:
        return None
    finally:
        c.close()


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def test_catalog_byte_flips_are_detected_or_harmless(tmp_path: os.PathLike[str]) -> None:
    tmp = os.fspath(tmp_path)
    _, store = _make(tmp)
    db = os.path.join(store, "catalog.db")
    pristine = _dump(db)
    size = os.path.getsize(db)
    work = os.path.join(tmp, "work")
    outcomes = {"harmless": 0, "detected": 0, "refused": 0}
    # Through the real CLI too (exit 0, or 3 with a message, never a traceback): the first
    # 4 flips of each outcome, not every 8th (38 processes, about half the test's 70 s).
    through_cli = dict.fromkeys(outcomes, 0)
    for offset in range(0, size, 211):
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(store, work)
        _flip(os.path.join(work, "catalog.db"), offset)
        try:
            with open_store(work, writable=False) as s:
                v = verify_store(s, read_data=True)
        except StoreError as e:  # what the CLI prints, exit 3
            message = str(e)
            assert message, offset
            outcome, ok = "refused", False
        else:
            if v.ok:
                assert _dump(os.path.join(work, "catalog.db")) == pristine, f"silent at {offset}"
                outcome, ok = "harmless", True
            else:
                assert v.errors, offset
                outcome, ok = "detected", False
        outcomes[outcome] += 1
        if through_cli[outcome] < 4:
            through_cli[outcome] += 1
            p = run_cli("store", "check", "--read-data", "--store", work)
            assert "Traceback" not in p.stderr, (offset, p.stderr)
            assert p.returncode == (0 if ok else 3), (offset, p.stderr)
    # the flips did reach live rows
    assert outcomes["detected"] + outcomes["refused"] >= 10, outcomes


def test_files_cache_row_that_fails_its_checksum_is_dropped_and_reread(
    tmp_path: os.PathLike[str], expect_log: Callable[[str], None]
) -> None:
    expect_log("files cache of .*: 1 rows failed their checksum and were dropped")
    tmp = os.fspath(tmp_path)
    root, store = _make(tmp)
    db = sqlite3.connect(os.path.join(store, "catalog.db"))
    trees_of = dict(db.execute("SELECT path, tree FROM dircache").fetchall())
    # A flipped row: "etc" now names the tree of "data" (what a flip in the tree column
    # that lands on another valid id would do; any flip fails the checksum the same way).
    db.execute("UPDATE dircache SET tree=? WHERE path=?", (trees_of[b"data"], b"etc"))
    db.commit()
    db.close()
    p = run_cli("store", "check", "--store", store)
    assert p.returncode == 3, p.stderr
    assert "files cache: 1 rows fail their checksum (first: etc)" in p.stderr
    assert "Traceback" not in p.stderr
    want = trees.snapshot_tree(root)
    with Engine(root, store) as e:
        cp = e.create("after the flip")  # the row is dropped, etc read afresh
        out = os.path.join(tmp, "out")
        os.mkdir(out)
        e.export(cp.id, out)
    trees.assert_trees_equal(want, out)
    p = run_cli("store", "check", "--read-data", "--store", store)
    assert p.returncode == 0, p.stderr


def _locate(store: str, data: bytes) -> tuple[str, int, int]:
    oid = object_id(data)
    c = sqlite3.connect(os.path.join(store, "catalog.db"))
    name, off, slen = c.execute(
        "SELECT p.name, o.offset, o.stored_len FROM objects o JOIN packs p ON p.id = o.pack "
        "WHERE o.id=?",
        (oid,),
    ).fetchone()
    c.close()
    return name, off, slen


def _check_json(store: str) -> dict[str, Any]:
    p = run_cli("store", "check", "--read-data", "--json", "--store", store)
    assert p.returncode == 3, p.stderr
    assert "Traceback" not in p.stderr
    out: dict[str, Any] = json.loads(p.stdout)
    return out


def test_damaged_chunk_names_each_checkpoint_and_path(tmp_path: os.PathLike[str]) -> None:
    _, store = _make(os.fspath(tmp_path))
    name, off, slen = _locate(store, FILES[b"data/caf\xe9"])
    _flip(pack_path(os.path.join(store, "packs"), name), off + ENTRY.size + slen // 2)
    got = _check_json(store)
    assert not got["ok"]
    assert got["damaged_objects"] == [object_id(FILES[b"data/caf\xe9"]).hex()]
    by_cp = {a["checkpoint"]: a["paths"] for a in got["affected"]}
    assert by_cp == {"v0": ["data/caf\\xe9"], "v1": ["data/caf\\xe9"]}
    assert got["rebuild_catalog"] is False  # the bytes are gone: rebuild cannot help
    p = run_cli("store", "check", "--read-data", "--store", store)
    assert "checkpoint v0: 1 paths need damaged or missing objects: data/caf\\xe9" in p.stderr
    assert "rebuild-catalog cannot bring them back" in p.stderr


def test_missing_pack_names_every_path_that_needs_it(tmp_path: os.PathLike[str]) -> None:
    _, store = _make(os.fspath(tmp_path))
    name, _, _ = _locate(store, FILES[b"etc/conf"])
    in_pack = {p for p, d in FILES.items() if _locate(store, d)[0] == name}
    os.unlink(pack_path(os.path.join(store, "packs"), name))
    got = _check_json(store)
    expected = sorted(p.decode(errors="backslashreplace") for p in in_pack)
    for a in got["affected"]:
        # v1 also has etc/new, which may share the pack; every path named is one whose
        # chunk lived there, and every such path of v0 is named
        assert set(expected) <= set(a["paths"]) or a["checkpoint"] == "v1", a
    v0 = next(a for a in got["affected"] if a["checkpoint"] == "v0")
    assert sorted(v0["paths"]) == expected
    assert any(f"pack {name}: missing" in e for e in got["errors"])


def test_damaged_catalog_recommends_rebuild_which_repairs_it(tmp_path: os.PathLike[str]) -> None:
    tmp = os.fspath(tmp_path)
    root, store = _make(tmp)
    db = os.path.join(store, "catalog.db")
    # the objects table's pages: flip bytes until SQLite itself reports the damage
    work = os.path.join(tmp, "work")
    size = os.path.getsize(db)
    for offset in range(4096, size, 509):
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(store, work)
        _flip(os.path.join(work, "catalog.db"), offset)
        p = run_cli("store", "check", "--store", work)
        if p.returncode == 3 and "rebuild-catalog --store" in p.stderr:
            break
    else:
        pytest.fail("no flip damaged the catalog")
    assert "Traceback" not in p.stderr
    p = run_cli("store", "rebuild-catalog", "--store", work)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    p = run_cli("store", "check", "--read-data", "--store", work)
    assert p.returncode == 0, p.stderr
    with Engine(root, work) as e:
        assert sorted(c.id for c in e.checkpoints()) == ["v0", "v1"]
