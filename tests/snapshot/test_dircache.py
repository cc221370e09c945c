"""dircache.save: rows removed with their subtree, by a range of the primary key."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sprite_env.ids import ObjectId
from sprite_env.snapshot import dircache
from sprite_env.store import Store, open_store

if TYPE_CHECKING:
    from collections.abc import Iterator

_SCHEMA = (
    "CREATE TABLE dircache (path BLOB PRIMARY KEY, tree BLOB NOT NULL, stat BLOB NOT NULL,"
    " sum INTEGER)"
)


def _db(paths: set[bytes]) -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    db.execute(_SCHEMA)
    db.executemany("INSERT INTO dircache VALUES (?, x'00', x'', 0)", ((p,) for p in paths))
    return db


def _left(db: sqlite3.Connection) -> set[bytes]:
    return {bytes(r[0]) for r in db.execute("SELECT path FROM dircache")}


def test_a_removed_tree_takes_its_rows_and_no_neighbour() -> None:
    # neighbours that sort between "a/" and "a0" as bytes or share the prefix "a"
    paths = {b"", b"a", b"a/b", b"a/b/c", b"a/\xff", b"a.b", b"a-x", b"a0", b"ab", b"b/a"}
    db = _db(paths)
    dircache.save(db, {}, removed_trees=[b"a"])
    assert _left(db) == {b"", b"a.b", b"a-x", b"a0", b"ab", b"b/a"}


_name = st.sampled_from([b"a", b"a.", b"a0", b"a/", b"/", b"0", b"\xff", b"-", b"b"])
_path = (
    st.lists(_name, min_size=1, max_size=4)
    .map(b"".join)
    .filter(lambda p: not p.startswith(b"/") and not p.endswith(b"/") and b"//" not in p)
)


@settings(max_examples=200, deadline=None)
@given(st.sets(_path, max_size=30), st.lists(_path, max_size=3))
def test_the_range_delete_removes_what_the_prefix_rule_names(
    paths: set[bytes], trees: list[bytes]
) -> None:
    db = _db(paths)
    dircache.save(db, {}, removed_trees=trees)
    expected = {p for p in paths if not any(p == t or p.startswith(t + b"/") for t in trees)}
    assert _left(db) == expected


_sigs = st.dictionaries(
    st.binary(min_size=1, max_size=30).filter(lambda n: b"/" not in n and b"\0" not in n),
    st.tuples(
        st.integers(0, 2**63 - 1),
        st.sampled_from([-1, 0, 1, 2**62]),  # -1: a poisoned (racy) row
        st.integers(0, 2**63 - 1),
        st.integers(-(2**62), 2**62),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None, database=None)
@given(_sigs)
def test_a_rows_names_are_those_it_has_signatures_for(sigs: dict[bytes, dircache.Sig]) -> None:
    """CachedDir.names (native where built) names exactly the row's signatures, racy ones
    too; what pagesums.save asks to keep a big file's page digests."""
    row = dircache.CachedDir(ObjectId(bytes(32)), dircache.encode_sigs(sigs))
    assert row.names() == frozenset(sigs) == frozenset(row.sigs())
    with mock.patch.object(dircache, "_sig_diff", None):  # no extension built
        assert row.names() == frozenset(sigs)


_ROWS = st.dictionaries(
    st.binary(min_size=1, max_size=6),
    st.dictionaries(
        st.binary(min_size=1, max_size=6),
        st.tuples(
            st.integers(0, 40),  # few inodes: many rows share one
            st.integers(-1, 2**40),
            st.integers(0, 2**40),
            st.integers(-1, 2**40),
        ),
        max_size=8,
    ),
    max_size=12,
)


@pytest.fixture(scope="module")
def catalog_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with open_store(str(tmp_path_factory.mktemp("names-of") / "store"), create=True) as s:
        yield s


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=_ROWS, wanted=st.sets(st.integers(0, 45), max_size=40))
def test_names_of_finds_every_name_of_the_inodes_and_no_other(
    rows: dict[bytes, dict[bytes, dircache.Sig]], wanted: set[int], catalog_store: Store
) -> None:
    """Both ways (SQLite's search of the catalog's rows for up to 4 inodes, a decode of
    every row for more; on a plain mapping and on the store's files cache read row by
    row) give each name whose signature has one of the inodes, whatever bytes their
    neighbours hold (an inode's 8 bytes may also occur inside a time or a size)."""
    cache = {
        path: dircache.CachedDir(ObjectId(b"\0" * 32), dircache.encode_sigs(sigs))
        for path, sigs in rows.items()
    }
    want: dict[bytes, set[bytes]] = {}
    for path, sigs in rows.items():
        for name, sig in sigs.items():
            if sig[0] in wanted:
                want.setdefault(path, set()).add(name)
    assert dircache.names_of(cache, wanted) == want
    with catalog_store.catalog.transaction() as db:
        dircache.clear(db)
        dircache.save(db, cache)
    assert dircache.names_of(dircache.CacheView(catalog_store.catalog), wanted) == want
