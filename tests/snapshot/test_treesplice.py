"""The native merges of a changed directory (native/treesplice.c) against the Python
encoders: the signature diff, the spliced tree, the entry lookup, and their refusals."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sprite_env.snapshot import dircache
from sprite_env.snapshot.tree import Kind, TreeEntry, decode_entry, encode_entry, encode_tree

native = pytest.importorskip("sprite_env._native")

NAMES = st.binary(min_size=1, max_size=12).filter(
    lambda n: b"/" not in n and n not in (b".", b"..")
)
SIG = st.tuples(
    st.integers(1, 2**64 - 1),
    st.sampled_from([-1, 0, 5, 1_700_000_000_000_000_000]),
    st.integers(0, 2**40),
    st.sampled_from([-1, 0, 7, 1_700_000_000_000_000_001]),
)
XATTRS = st.lists(st.tuples(st.binary(min_size=1, max_size=5), st.binary(max_size=9)), max_size=2)


def _entry(name: bytes, n: int, xattrs: list[tuple[bytes, bytes]]) -> TreeEntry:
    if n % 3 == 0:
        return TreeEntry(name, Kind.DIR, 0o755, 0, 0, n, payload=bytes(32), xattrs=tuple(xattrs))
    if n % 3 == 1:
        return TreeEntry(name, Kind.SYMLINK, 0o777, 1, 1, n, size=3, payload=b"abc", link=b"")
    return TreeEntry(
        name, Kind.FILE, 0o644, 1000, 1000, n, size=n, payload=b"x" * (n % 50), xattrs=tuple(xattrs)
    )


@settings(max_examples=200)
@given(old=st.dictionaries(NAMES, SIG, max_size=20), new=st.dictionaries(NAMES, SIG, max_size=20))
def test_sig_diff_is_the_python_comparison(old: dict[bytes, Any], new: dict[bytes, Any]) -> None:
    # some names shared with equal signatures, as in a real directory
    for name in list(old)[: len(old) // 2]:
        new.setdefault(name, old[name])
    changed, removed = native.sig_diff(dircache.encode_sigs(new), dircache.encode_sigs(old))
    want = sorted(n for n, s in new.items() if dircache.is_racy(s) or old.get(n) != s)
    assert changed == want
    assert removed == sorted(set(old) - set(new))


def test_an_equal_poisoned_signature_still_counts_as_changed() -> None:
    racy = {b"f": (7, -1, 0, -1)}
    blob = dircache.encode_sigs(racy)
    assert native.sig_diff(blob, blob) == ([b"f"], [])


@settings(max_examples=200)
@given(
    old=st.dictionaries(NAMES, SIG, max_size=20),
    patch=st.dictionaries(NAMES, SIG, max_size=8),
    gone=st.sets(NAMES, max_size=8),
)
def test_sig_splice_is_the_python_merge(
    old: dict[bytes, Any], patch: dict[bytes, Any], gone: set[bytes]
) -> None:
    gone.update(list(old)[:2])  # some of the gone names were there
    gone -= patch.keys()
    out = native.sig_splice(dircache.encode_sigs(old), dircache.encode_sigs(patch), sorted(gone))
    want = {n: s for n, s in old.items() if n not in gone}
    want.update(patch)
    assert out == dircache.encode_sigs(want)


def test_sig_splice_refuses_what_is_out_of_order() -> None:
    blob = dircache.encode_sigs({b"a": (1, 2, 3, 4), b"b": (5, 6, 7, 8)})
    patch = dircache.encode_sigs({b"b": (9, 9, 9, 9)})
    with pytest.raises(ValueError, match="out of order"):
        native.sig_splice(blob, patch, [b"b"])  # both looked at and gone
    with pytest.raises(ValueError, match="out of order"):
        native.sig_splice(blob, b"", [b"b", b"a"])
    backwards = patch + dircache.encode_sigs({b"a": (1, 1, 1, 1)})
    with pytest.raises(ValueError, match="out of order"):
        native.sig_splice(blob, backwards, [])
    with pytest.raises(ValueError, match="malformed"):
        native.sig_splice(blob[:-1], patch, [])


def test_a_malformed_blob_is_refused() -> None:
    blob = dircache.encode_sigs({b"name": (1, 2, 3, 4)})
    with pytest.raises(ValueError, match="malformed"):
        native.sig_diff(blob[:-1], blob)


@settings(max_examples=200)
@given(
    old=st.dictionaries(NAMES, st.integers(0, 10**6), max_size=15),
    new=st.dictionaries(NAMES, st.integers(0, 10**6), max_size=15),
    xattrs=XATTRS,
    keep=st.lists(st.booleans(), max_size=15),
)
def test_the_splice_is_encode_tree_of_the_expected_entries(
    old: dict[bytes, int], new: dict[bytes, int], xattrs: Any, keep: list[bool]
) -> None:
    """Children kept from the old tree come byte for byte; the rest from ``added``."""
    old_entries = {n: _entry(n, v, xattrs) for n, v in old.items()}
    listing = dict.fromkeys(new)
    # a kept child is one listed and present in the old tree, and not in added
    kept = {n for n, k in zip(sorted(set(old) & set(new)), keep, strict=False) if k}
    added = {n: _entry(n, new[n] + 1, []) for n in listing if n not in kept}
    blob = dircache.encode_sigs({n: (1, 2, 3, 4) for n in listing})
    body = native.tree_splice(
        encode_tree(old_entries.values()), blob, [encode_entry(added[n]) for n in sorted(added)]
    )
    want = [old_entries[n] if n in kept else added[n] for n in listing]
    assert body == encode_tree(want)


def test_the_splice_refuses_what_it_cannot_vouch_for() -> None:
    a, b = _entry(b"a", 2, []), _entry(b"b", 5, [])
    old = encode_tree([a])
    both = dircache.encode_sigs({b"a": (1, 2, 3, 4), b"b": (1, 2, 3, 4)})
    only_a = dircache.encode_sigs({b"a": (1, 2, 3, 4)})
    with pytest.raises(ValueError, match="lacks an unchanged child"):
        native.tree_splice(old, both, [])  # b is listed, unchanged, but not in the old tree
    with pytest.raises(ValueError, match="not in the listing"):
        native.tree_splice(old, only_a, [encode_entry(b)])
    with pytest.raises(ValueError, match="cannot splice"):
        native.tree_splice(encode_tree([]), both, [encode_entry(b), encode_entry(a)])  # order
    with pytest.raises(ValueError, match="malformed"):
        native.tree_splice(old[:-1], only_a, [])
    with pytest.raises(ValueError, match="malformed"):
        native.tree_splice(b"nope" + old[4:], only_a, [])


def test_tree_find_returns_the_encoded_entry() -> None:
    entries = [_entry(b"x%d" % i, i, [(b"user.k", b"v")]) for i in range(7)]
    tree = encode_tree(entries)
    for e in entries:
        raw = native.tree_find(tree, e.name)
        assert raw == encode_entry(e)
        assert decode_entry(raw) == e
    assert native.tree_find(tree, b"x10") is None
    assert native.tree_find(tree, b"a") is None
    with pytest.raises(ValueError, match="malformed"):
        native.tree_find(tree[:20], b"x3")


@settings(max_examples=200, deadline=None)
@given(present=st.sets(NAMES, max_size=40), absent=st.lists(NAMES, max_size=20), data=st.data())
def test_tree_find_many_is_tree_find_of_each(
    present: set[bytes], absent: list[bytes], data: st.DataObject
) -> None:
    tree = encode_tree([_entry(n, i, []) for i, n in enumerate(sorted(present))])
    found = data.draw(st.lists(st.sampled_from(sorted(present)), max_size=20)) if present else []
    names = data.draw(st.permutations(found + absent))  # any order, repeats, absent ones
    assert native.tree_find_many(tree, names) == [native.tree_find(tree, n) for n in names]


def test_tree_find_many_refuses_what_tree_find_refuses() -> None:
    tree = encode_tree([_entry(b"x%d" % i, i, []) for i in range(7)])
    assert native.tree_find_many(tree, []) == []
    with pytest.raises(ValueError, match="malformed"):
        native.tree_find_many(tree[:20], [b"x3"])
    with pytest.raises(ValueError, match="malformed"):
        native.tree_find_many(b"nope" + tree[4:], [])
    with pytest.raises(TypeError, match="bytes"):
        native.tree_find_many(tree, [b"x1", "x2"])  # type: ignore[list-item]
