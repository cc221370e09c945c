"""Which object ids the catalog cannot have: a filter in memory before the SQL lookup.

A capture asks the catalog, for every chunk it makes, whether the store has it already
(dedup). Asked one by one that is a statement on a reader connection, 15-25 us with the
pool and the GIL: after the benchmark's agent step on the medium layer it was a quarter of
the reader threads' time, most chunks of a changed file being new. This filter answers
"certainly not there" without SQL for almost every new id; anything it cannot rule out is
asked as before.

It is the sorted first 8 bytes of every id in the ``objects`` table (8 bytes an object:
4.8 MB for 600k objects, built in one scan of the id index the first time it is worth it)
plus a set of the ids committed since. BLAKE3 ids are uniform, so an 8-byte prefix of a
new id matches one of n stored prefixes with probability n / 2**64: a false "maybe" costs
one SQL lookup, never a wrong answer.

What keeps it sound: it may only ever say "absent" for an id that is absent. Every id a
writer of this process commits is added (``note``) after its transaction commits; until
then the writer's own pending set answers for it. Deletions (prune) are never removed:
a stale prefix only makes a "maybe". An insert it does not hear of (another store object
in this process on the same directory: tests, a second open) would make it say "absent"
for an id the catalog has: the object is then written again (``INSERT OR IGNORE`` keeps
the first row; the copy is garbage for the next prune), space and never data. The daemon
holds the store's lock, so no other process writes meanwhile.
"""

from __future__ import annotations

import bisect
import threading
from array import array
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sprite_env.ids import ObjectId

#: Lookups one by one before the filter is built: the scan costs about 0.3 s for 600k
#: objects, 15k lookups' worth; a long-lived daemon reaches it within its first capture,
#: a one-shot command that asks a few hundred times never pays it.
BUILD_AFTER = 2_000
#: Committed ids kept in the side set before they are merged into the sorted array.
MERGE_AT = 50_000


def _prefix(oid: bytes) -> int:
    return int.from_bytes(oid[:8], "little")


class KnownIds:
    """The filter; see the module docstring. Thread-safe."""

    def __init__(self, ids: Iterable[bytes]) -> None:
        self._sorted = array("Q", sorted(_prefix(i) for i in ids))
        self._recent: set[int] = set()
        self._lock = threading.Lock()

    def may_have(self, oid: ObjectId) -> bool:
        """False only if the catalog certainly lacks ``oid``."""
        p = _prefix(oid)
        with self._lock:
            if p in self._recent:
                return True
            a = self._sorted
            i = bisect.bisect_left(a, p)
            return i < len(a) and a[i] == p

    def note(self, oids: Iterable[bytes]) -> None:
        """Ids just committed to the catalog."""
        with self._lock:
            self._recent.update(_prefix(o) for o in oids)
            if len(self._recent) >= MERGE_AT:
                self._sorted = array("Q", sorted((*self._sorted, *self._recent)))
                self._recent.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._sorted) + len(self._recent)
