"""Patching a file in place writes exactly the ranges that differ."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hypothesis import given, settings
from hypothesis import strategies as st

from sprite_env.ids import ObjectId
from sprite_env.snapshot.patch import changed_ranges as _changed_ranges

if TYPE_CHECKING:
    from sprite_env.snapshot.tree import Piece

OBJECTS = {
    ObjectId(bytes([i]) * 32): bytes((i * 7 + k) % 251 for k in range(64)) for i in range(1, 4)
}


@st.composite
def piece_lists(draw: st.DrawFn, total: int) -> list[Piece]:
    out: list[Piece] = []
    left = total
    while left:
        n = draw(st.integers(1, min(left, 20)))
        if draw(st.integers(0, 5)) == 0:
            out.append((None, 0, n))
        else:
            oid = draw(st.sampled_from(sorted(OBJECTS)))
            out.append((oid, draw(st.integers(0, 64 - n)), n))
        left -= n
    return out


def render(pieces: list[Piece]) -> bytes:
    return b"".join(
        bytes(n) if oid is None else OBJECTS[oid][off : off + n] for oid, off, n in pieces
    )


@settings(max_examples=300, deadline=None, database=None)
@given(st.integers(1, 120).flatmap(lambda n: st.tuples(piece_lists(n), piece_lists(n))))
def test_applying_the_plan_gives_the_new_bytes(pair: tuple[list[Piece], list[Piece]]) -> None:
    old, new = pair
    plan = _changed_ranges(old, new)
    if plan is None:  # a hole must replace data: the restore rewrites the file instead
        assert any(o is None for o, _, _ in new)
        return
    data = bytearray(render(old))
    written = 0
    for pos, (oid, off, n) in plan:
        assert oid is not None
        data[pos : pos + n] = OBJECTS[oid][off : off + n]
        written += n
    assert bytes(data) == render(new)
    assert written <= len(data)
    if old == new:
        assert plan == []
