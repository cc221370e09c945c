"""A big file changed in place: the byte ranges where two versions of it differ.

A restore rewrites only those ranges of a big file (``restore.PATCH_MIN`` or more) in
place, from the target's pieces; its check (``preflight.plan_needs``) reads and verifies
the objects of exactly those pieces, and keeps their bytes for the restore
(:class:`Prefetched`), so that the restore, while the environment is down, reads nothing.
Measured on the medium layer's typical step: the 215 MB database differs from the
checkpoint in 3,507 ranges, 13.7 MB, slices of 2,360 objects holding 129 MB (the chunks of
the first checkpoint): the restore read and decompressed all 129 MB while down (1.3 s of
one writer thread at load 6-9), after the check had read them once already.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sprite_env.ids import ObjectId
    from sprite_env.snapshot.tree import Piece

#: Bytes a check keeps for its restore at most (the typical step: about 20 MB).
KEEP_BYTES = 64 << 20


def changed_ranges(old: list[Piece], new: list[Piece]) -> list[tuple[int, Piece]] | None:
    """The byte ranges where ``new`` differs from ``old``, as (file offset, piece).

    Both lists are walked together; a range is unchanged when both name the same bytes of
    the same object (pieces may be slices, so boundaries need not line up). None when a
    hole would have to replace data.
    """
    out: list[tuple[int, Piece]] = []
    i = 0
    opos = 0  # file offset where old[i] starts
    npos = 0  # file offset where the current new piece starts
    for noid, noff, nlen in new:
        pos = npos
        end = npos + nlen
        while pos < end:
            while i < len(old) and opos + old[i][2] <= pos:
                opos += old[i][2]
                i += 1
            if i < len(old):
                ooid, ooff, olen = old[i]
                seg_end = min(end, opos + olen)
                same = noid == ooid and (noid is None or noff + (pos - npos) == ooff + (pos - opos))
            else:
                seg_end, same = end, False
            if not same:
                if noid is None:
                    return None
                piece = (noid, noff + (pos - npos), seg_end - pos)
                if (
                    out
                    and out[-1][1][0] == noid
                    and (
                        out[-1][0] + out[-1][1][2] == pos
                        and out[-1][1][1] + out[-1][1][2] == piece[1]
                    )
                ):  # contiguous in the file and in the object: one write
                    prev_pos, (poid, poff, plen) = out[-1]
                    out[-1] = (prev_pos, (poid, poff, plen + piece[2]))
                else:
                    out.append((pos, piece))
            pos = seg_end
        npos = end
    return out


@dataclass
class Prefetched:
    """Bytes a restore's check read and verified, kept for the restore: whole objects (of
    files written whole) and pieces (object, offset, length) of patched files, at most
    :data:`KEEP_BYTES` in all; what did not fit is read again by the restore.

    Filled from the check's verifying threads; read by the restore's writers.
    """

    objects: dict[ObjectId, bytes] = field(default_factory=dict)
    pieces: dict[Piece, bytes] = field(default_factory=dict)
    size: int = 0
    limit: int = KEEP_BYTES
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def keep(self, oid: ObjectId, data: bytes, slices: list[tuple[int, int]] | None) -> None:
        """Keeps ``data`` (verified to be object ``oid``) whole, or only its ``slices``
        (offset, length), if they fit."""
        with self._lock:
            if slices is None:
                if oid not in self.objects and self.size + len(data) <= self.limit:
                    self.objects[oid] = data
                    self.size += len(data)
                return
            for off, n in slices:
                key = (oid, off, n)
                if key not in self.pieces and self.size + n <= self.limit:
                    self.pieces[key] = data[off : off + n]
                    self.size += n

    def clear(self) -> None:
        with self._lock:
            self.objects.clear()
            self.pieces.clear()
            self.size = 0
