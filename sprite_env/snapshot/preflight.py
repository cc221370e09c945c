"""What a restore will need, checked before it changes anything.

A restore that fails part-way leaves the layer between two states (issue 15: a full disk
or one damaged chunk left a layer half restored, once empty). Most such failures can be
known in advance, from the same diff the restore walks (``diff.classify`` drives both):

- **Space.** Every file a restore writes is written whole under a temporary name beside
  the old one and renamed over it, so until the rename both exist: the peak need is the
  new data itself, rounded up to the file system's blocks, plus a block per new entry.
  Deletions are not credited (they may come after the writes). A big file patched in place
  needs only what it grows by. :func:`check_space` compares that with ``statvfs``.
- **Damage.** Every data object and chunk list the restore will read is read and hashed
  first (:func:`verify_objects`). A damaged one is named with the checkpoint and the path
  that needs it, and nothing has been touched. The check costs one extra read of the
  changed data only (an undo of one agent step: a few MB); equal subtrees are never read,
  here or in the restore.

What cannot be known in advance (another writer filling the disk meanwhile, an I/O error,
a symlink swapped in during the restore) still fails the restore part-way; the engine
then records the failure in the restore's intent and the daemon keeps serving (see
``checkpoints/engine.py``).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sprite_env.errors import SnapshotError, SpriteError, StoreError
from sprite_env.ids import ObjectId
from sprite_env.snapshot.diff import (
    Change,
    Difference,
    ReadTree,
    TreeMemo,
    diff_trees,
    prefetch_trees,
    read_entries,
)
from sprite_env.snapshot.patch import changed_ranges
from sprite_env.snapshot.tree import Kind, Piece, TreeEntry, decode_chunks

if TYPE_CHECKING:
    from collections.abc import Callable

    from sprite_env.snapshot.patch import Prefetched

#: What a restore may use beyond its estimate: directory blocks, xattrs, the files cache's
#: own growth elsewhere. 64 KiB plus 1% of the estimate.
SLACK_BYTES = 64 << 10
SLACK_RATIO = 0.01
#: Objects verified in parallel: zstd and BLAKE3 release the GIL.
VERIFY_THREADS = 2
#: Objects read per call when the reader reads many at once.
VERIFY_BATCH = 64


@dataclass
class RestoreNeeds:
    """What making a live tree equal to a target will write and read."""

    data_bytes: int = 0  # file bytes written, each file rounded up to whole blocks
    entries: int = 0  # new directory entries (files, dirs, links, ...)
    #: Every data object to read, with the first path (relative to the root) needing it.
    objects: dict[ObjectId, bytes] = field(default_factory=dict)
    #: The objects of which a patched file needs only slices: (offset, length) each.
    slices: dict[ObjectId, list[tuple[int, int]]] = field(default_factory=dict)


class RestoreWontFit(SnapshotError):
    """The layer's file system has too little room for a restore: nothing was changed."""

    code = "no_space"


class CheckpointDamaged(StoreError):
    """An object a restore needs is missing or damaged: nothing was changed."""

    def __init__(self, checkpoint: str | None, path: bytes, cause: SpriteError) -> None:
        what = f"checkpoint {checkpoint}" if checkpoint else "the target"
        shown = path.decode(errors="backslashreplace")
        super().__init__(
            f"{what} cannot be restored: {shown} needs data that is damaged ({cause}); "
            "nothing was changed. Run: sprite-env store check --read-data"
        )
        self.checkpoint = checkpoint
        self.path = path


def plan_needs(
    read_tree: ReadTree,
    read_object: Callable[[ObjectId], bytes],
    live_top: ObjectId | None,
    target_top: ObjectId,
    *,
    block: int = 4096,
    patch_min: int,
    memo: TreeMemo | None = None,
    read_many: Callable[[list[ObjectId]], list[bytes]] | None = None,
) -> RestoreNeeds:
    """Walks the restore's diff (live -> target) and adds up what it will write and read.

    Args:
        read_tree: reads tree objects of both sides (the live side may be hash-only).
        read_object: reads the target's chunk lists (verified: a damaged one raises).
        live_top: the live tree's top (None: an empty directory).
        target_top: the target's top tree.
        block: the file system's block size, for rounding.
        patch_min: files at least this big are patched in place (``restore.PATCH_MIN``).
        memo: trees decoded, kept for the restore that follows (``diff.TreeMemo``).
        read_many: reads many trees of both sides at once (``diff.prefetch_trees``).
    """
    needs = RestoreNeeds()

    def pieces(e: TreeEntry) -> list[Piece]:
        return decode_chunks(read_object(ObjectId(e.payload)) if e.indirect else e.payload)

    def whole_file(path: bytes, e: TreeEntry) -> None:
        needs.entries += 1
        if e.link:  # another name of an inode written once, for its first member
            return
        for oid, _off, _n in pieces(e):
            if oid is not None:
                needs.objects.setdefault(oid, path)
        needs.data_bytes += -(-e.size // block) * block

    def whole_tree(path: bytes, tree: ObjectId) -> None:
        for name, e in read_entries(read_object, tree, memo).items():
            child = path + b"/" + name
            if e.kind is Kind.DIR:
                needs.entries += 1
                whole_tree(child, e.subtree)
            elif e.kind is Kind.FILE:
                whole_file(child, e)
            else:
                needs.entries += 1

    def one(d: Difference) -> None:
        old, new = d.old, d.new
        if new is None or d.path == b".":
            return
        if d.change is Change.ADDED or (d.change is Change.MODIFIED and old_kind(old) != new.kind):
            if new.kind is Kind.DIR:
                needs.entries += 1
                whole_tree(d.path, new.subtree)
            elif new.kind is Kind.FILE:
                whole_file(d.path, new)
            else:
                needs.entries += 1
            return
        if new.kind is not Kind.FILE:
            return
        assert old is not None
        if d.change is Change.MODIFIED:
            plan = (
                changed_ranges(pieces_live(old), pieces(new))
                if _patched(old, new, patch_min)
                else None
            )
            if plan is not None:  # the restore's own plan: exactly the pieces it reads
                for _at, (oid, off, n) in plan:
                    assert oid is not None
                    needs.objects.setdefault(oid, d.path)
                    needs.slices.setdefault(oid, []).append((off, n))
                needs.data_bytes += max(0, -(-(new.size - old.size) // block) * block)
            else:  # written whole (a hole where data was, too)
                whole_file(d.path, new)
        elif old.link != new.link and not new.link:  # leaves a hard-link group: rewritten
            whole_file(d.path, new)

    def pieces_live(e: TreeEntry) -> list[Piece]:
        return decode_chunks(read_tree(ObjectId(e.payload)) if e.indirect else e.payload)

    if read_many is not None and memo is not None:
        prefetch_trees(read_many, live_top, target_top, memo)
    for d in diff_trees(read_tree, live_top, target_top, memo):
        one(d)
    return needs


def old_kind(e: TreeEntry | None) -> Kind | None:
    return None if e is None else e.kind


def _patched(old: TreeEntry, new: TreeEntry, patch_min: int) -> bool:
    """Mirrors ``restore._patchable``: a big file rewritten piece by piece, in place."""
    return (
        not old.link
        and not new.link
        and old.nlink == 1
        and new.nlink == 1
        and min(old.size, new.size) >= patch_min
    )


def check_space(root: str | bytes, needs: RestoreNeeds, *, what: str) -> None:
    """Raises :class:`RestoreWontFit` if ``root``'s file system cannot hold ``needs``.

    ``f_bavail`` (not ``f_bfree``): the blocks reserved for root stay for the system, which
    a restore run as root should not eat into either.
    """
    st = os.statvfs(root)
    need = needs.data_bytes + needs.entries * st.f_frsize
    need += SLACK_BYTES + int(need * SLACK_RATIO)
    free = st.f_bavail * st.f_frsize
    if need > free:
        raise RestoreWontFit(
            f"{what} needs about {_size(need)} on the layer's file system, which has "
            f"{_size(free)} free; nothing was changed (free space, then try again)"
        )
    if st.f_files and needs.entries > st.f_favail:
        raise RestoreWontFit(
            f"{what} creates {needs.entries} entries and the layer's file system has "
            f"{st.f_favail} free inodes; nothing was changed (free some, then try again)"
        )


def verify_objects(
    read_object: Callable[[ObjectId], bytes],
    needs: RestoreNeeds,
    checkpoint: str | None,
    keep: Prefetched | None = None,
    read_many: Callable[[list[ObjectId]], list[bytes]] | None = None,
) -> None:
    """Reads and hashes every object in ``needs``; raises :class:`CheckpointDamaged` for
    the first damaged or missing one, naming the path that needs it. ``keep``: where the
    bytes read are kept for the restore (only the slices of patched files' objects).
    ``read_many``: reads (and verifies) ``VERIFY_BATCH`` objects at a time, one catalog
    query and one read per run of neighbours in a pack each (a batch that fails is read
    again object by object, to name the damaged one): one at a time, the lookups were half
    of the check's verifying on the medium step (2,400 objects).
    """
    items = list(needs.objects.items())

    def check(item: tuple[ObjectId, bytes]) -> tuple[bytes, SpriteError] | None:
        try:
            data = read_object(item[0])
        except SpriteError as e:
            return item[1], e
        if keep is not None:
            keep.keep(item[0], data, needs.slices.get(item[0]))
        return None

    def check_batch(batch: list[tuple[ObjectId, bytes]]) -> tuple[bytes, SpriteError] | None:
        assert read_many is not None
        try:
            datas = read_many([oid for oid, _path in batch])
        except SpriteError:
            return next((bad for bad in map(check, batch) if bad is not None), None)
        if keep is not None:
            for (oid, _path), data in zip(batch, datas, strict=True):
                keep.keep(oid, data, needs.slices.get(oid))
        return None

    with ThreadPoolExecutor(VERIFY_THREADS, thread_name_prefix="restore-verify") as pool:
        if read_many is None:
            results = pool.map(check, items)
        else:
            batches = [items[i : i + VERIFY_BATCH] for i in range(0, len(items), VERIFY_BATCH)]
            results = pool.map(check_batch, batches)
        for bad in results:
            if bad is not None:
                raise CheckpointDamaged(checkpoint, bad[0], bad[1])


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    x = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        x /= 1024
        if x < 1024 or unit == "GiB":
            break
    return f"{x:.1f} {unit}"
