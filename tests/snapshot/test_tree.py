"""Tree object encoding: canonical, round-trips, refuses garbage; a golden id pins it."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sprite_env.errors import CorruptObject, SnapshotError
from sprite_env.ids import ObjectId
from sprite_env.snapshot.tree import (
    Kind,
    TreeEntry,
    decode_chunks,
    decode_entry,
    decode_tree,
    encode_chunks,
    encode_entry,
    encode_tree,
    entry_meta,
    entry_spans,
    with_payload,
)
from sprite_env.store.codec import object_id

names = st.binary(min_size=1, max_size=40).filter(
    lambda b: b"/" not in b and b"\0" not in b and b not in (b".", b"..")
)
entries = st.builds(
    TreeEntry,
    name=names,
    kind=st.sampled_from(list(Kind)),
    mode=st.integers(0, 0o7777),
    uid=st.integers(0, 2**32 - 1),
    gid=st.integers(0, 2**32 - 1),
    mtime_ns=st.integers(-(2**63), 2**63 - 1),
    size=st.integers(0, 2**64 - 1),
    rdev=st.integers(0, 2**64 - 1),
    nlink=st.integers(1, 2**32 - 1),
    xattrs=st.lists(
        st.tuples(st.binary(min_size=1, max_size=30), st.binary(max_size=100)),
        max_size=3,
        unique_by=lambda kv: kv[0],
    ).map(lambda xs: tuple(sorted(xs))),
    link=st.binary(max_size=50),
    payload=st.binary(max_size=200),
    indirect=st.booleans(),
)


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(entries, max_size=20, unique_by=lambda e: e.name))
def test_round_trip_and_canonical_order(es: list[TreeEntry]) -> None:
    data = encode_tree(es)
    back = decode_tree(data)
    assert back == sorted(es, key=lambda e: e.name)
    assert encode_tree(reversed(es)) == data  # order of input does not matter
    assert encode_tree(back) == data  # re-encoding decoded entries is exact


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(entries, max_size=20, unique_by=lambda e: e.name))
def test_entry_meta_reads_what_decoding_gives(es: list[TreeEntry]) -> None:
    raws = entry_spans(encode_tree(es))
    for e in es:
        assert entry_meta(raws[e.name]) == (e.kind, e.mode, e.uid, e.gid, e.mtime_ns, e.size)


@settings(max_examples=200, deadline=None, database=None)
@given(entries, st.binary(max_size=200))
def test_with_payload_is_the_entry_encoded_with_that_payload(e: TreeEntry, payload: bytes) -> None:
    raw = encode_entry(e)
    assert with_payload(raw, payload) == encode_entry(dataclasses.replace(e, payload=payload))
    assert decode_entry(with_payload(raw, payload)).payload == payload


def test_with_payload_refuses_what_is_not_an_entry() -> None:
    raw = encode_entry(TreeEntry(b"d", Kind.DIR, 0o755, 0, 0, 1, payload=bytes(32)))
    with pytest.raises(CorruptObject):
        with_payload(raw[:10], b"x")
    with pytest.raises(CorruptObject):
        with_payload(raw[:-33], b"x")  # shorter than its header's payload says


def test_entry_meta_refuses_a_short_entry() -> None:
    with pytest.raises(CorruptObject):
        entry_meta(b"\x01\x00\x01")


def test_golden_tree_id() -> None:
    # Pinned forever: a change to the encoding changes every tree id, so every directory
    # of every existing store would be stored again.
    es = [
        TreeEntry(
            b"a.txt",
            Kind.FILE,
            0o644,
            1000,
            1000,
            1_700_000_000_123_456_789,
            size=5,
            xattrs=((b"user.k", b"v"),),
            payload=encode_chunks([(ObjectId(b"\1" * 32), 0, 5)]),
        ),
        TreeEntry(b"d", Kind.DIR, 0o755, 0, 0, 42, payload=b"\2" * 32),
        TreeEntry(b"l", Kind.SYMLINK, 0o777, 0, 0, 7, size=3, payload=b"../"),
        TreeEntry(b"wh", Kind.CHR, 0, 0, 0, 9),
    ]
    assert object_id(encode_tree(es)).hex() == (
        "28a73098c8bfaecd459c23b79679636746b6b7c3f283c579066bb774e3f0f668"
    )


def test_replace_drops_cached_encoding() -> None:
    e = TreeEntry(b"f", Kind.FILE, 0o600, 0, 0, 1)
    (d,) = decode_tree(encode_tree([e]))
    changed = dataclasses.replace(d, mode=0o644)
    assert decode_tree(encode_tree([changed]))[0].mode == 0o644


@settings(max_examples=200, deadline=None, database=None)
@given(entries)
def test_one_entry_decodes_alone_as_in_its_tree(e: TreeEntry) -> None:
    """``decode_entry`` parses an entry in place: what its tree's decoding gives, the very
    bytes kept for a re-encoding, and any trailing, missing or unknown byte refused."""
    raw = entry_spans(encode_tree([e]))[e.name]
    got = decode_entry(raw)
    assert got == e == decode_tree(encode_tree([e]))[0]
    assert encode_entry(got) == raw
    assert encode_tree([got]) == encode_tree([e])
    assert decode_entry(memoryview(raw)) == e
    for bad in (raw + b"x", raw[:-1]):
        with pytest.raises(CorruptObject):
            decode_entry(bad)


@pytest.mark.parametrize("kind", [0, 7, 255])
def test_an_unknown_kind_is_refused(kind: int) -> None:
    raw = bytearray(encode_entry(TreeEntry(b"f", Kind.FILE, 0, 0, 0, 0)))
    raw[2] = kind  # after the name's length (u16)
    with pytest.raises(CorruptObject):
        decode_entry(bytes(raw))
    with pytest.raises(CorruptObject):
        decode_tree(b"SPT2" + (1).to_bytes(4, "little") + bytes(raw))


def test_format_1_is_refused_by_name() -> None:
    with pytest.raises(CorruptObject, match="tree format 1"):
        decode_tree(b"SPT1" + bytes(4))


def test_garbage_and_duplicates_are_refused() -> None:
    with pytest.raises(CorruptObject, match="corrupt tree"):
        decode_tree(b"nope")
    data = encode_tree([TreeEntry(b"f", Kind.FILE, 0, 0, 0, 0)])
    with pytest.raises(CorruptObject, match="corrupt tree"):
        decode_tree(data[:-3])
    with pytest.raises(CorruptObject, match="corrupt tree"):
        decode_tree(data + b"x")
    e = TreeEntry(b"x", Kind.FILE, 0, 0, 0, 0)
    with pytest.raises(SnapshotError, match="duplicate"):
        encode_tree([e, e])


def test_chunk_lists_with_holes() -> None:
    cl = [(ObjectId(b"\7" * 32), 0, 10), (None, 0, 4096), (ObjectId(b"\x08" * 32), 4096, 1)]
    assert decode_chunks(encode_chunks(cl)) == cl
    with pytest.raises(CorruptObject):
        decode_chunks(b"\0" * 39)
