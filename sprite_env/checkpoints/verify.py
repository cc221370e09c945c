"""``verify_store``: the one oracle for "is this store sound" (the CLI's ``store check``
and every crash test ask it).

It joins the two layers' halves without mixing them: the store's :func:`check` proves the
catalog and the packs (SQLite's integrity check, each row against its pack's table, with
``read_data`` every byte against its hash) and says which objects are damaged; this module
walks every checkpoint's trees, finds the objects they need that the catalog lacks or the
store found damaged, and names each checkpoint and the paths in it that need them. It also
proves the files cache's rows against their checksums (``snapshot/dircache.py``).

Cost: every tree and chunk list of every checkpoint is read once (a subtree shared by many
checkpoints once in all), data chunks only when ``read_data`` re-hashes the packs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from sprite_env.checkpoints.registry import Checkpoint, Registry
from sprite_env.errors import SpriteError, StoreError
from sprite_env.ids import ObjectId
from sprite_env.snapshot import dircache
from sprite_env.snapshot.tree import Kind, decode_chunks, decode_tree
from sprite_env.store.check import CheckReport, check

if TYPE_CHECKING:
    from sprite_env.store import Store

Progress = Callable[[int, int], None]

#: Paths named per checkpoint in the text output; JSON carries up to ``MAX_PATHS``.
SHOWN_PATHS = 10
MAX_PATHS = 1000


@dataclass
class Affected:
    """A checkpoint that needs damaged or missing objects."""

    checkpoint: str
    #: Paths (text, non-UTF-8 bytes escaped as ``\\xNN``) whose content or listing is lost,
    #: at most ``MAX_PATHS``; ``"."`` is the root directory.
    paths: list[str] = field(default_factory=list)
    #: How many paths in all (``paths`` may hold fewer).
    total: int = 0
    #: Its record (the META object ``rebuild-catalog`` recovers it from) is lost.
    record_lost: bool = False


@dataclass
class StoreVerdict:
    """What :func:`verify_store` found. ``ok`` only when ``errors`` is empty."""

    report: CheckReport
    objects_reachable: int = 0
    affected: list[Affected] = field(default_factory=list)
    #: Paths of files-cache rows whose checksum fails.
    bad_cache_rows: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def warnings(self) -> list[str]:
        return self.report.warnings

    @property
    def rebuild_catalog(self) -> bool:
        """True when ``store rebuild-catalog`` would repair what was found: the catalog is
        damaged or wrong, or objects it lacks are in orphan packs."""
        return self.report.rebuild_helps

    def advice(self, store_path: str) -> list[str]:
        """What to do, one line each (empty when sound)."""
        if self.ok:
            return []
        out = []
        if self.rebuild_catalog:
            out.append(
                "the catalog is damaged or wrong while the packs hold the objects: repair it "
                f"with: sprite-env store rebuild-catalog --store {store_path}"
            )
        if self.affected and not self.rebuild_catalog:
            out.append(
                "the bytes of damaged or missing objects are gone from the packs "
                "(rebuild-catalog cannot bring them back): the checkpoints named above cannot "
                "restore those paths; delete them, or restore their other paths"
            )
        return out

    def to_json(self) -> dict[str, Any]:
        r = self.report
        return {
            "ok": self.ok,
            "packs": r.packs,
            "objects": r.objects,
            "objects_reachable": self.objects_reachable,
            "bytes_read": r.bytes_read,
            "errors": self.errors,
            "warnings": self.warnings,
            "damaged_objects": sorted(o.hex() for o in r.damaged),
            "affected": [
                {
                    "checkpoint": a.checkpoint,
                    "paths": a.paths,
                    "paths_total": a.total,
                    "record_lost": a.record_lost,
                }
                for a in self.affected
            ],
            "bad_files_cache_rows": self.bad_cache_rows,
            "rebuild_catalog": self.rebuild_catalog,
        }


def show_path(path: bytes) -> str:
    """A path inside a checkpoint as text: ``"."`` for the root, bad UTF-8 as ``\\xNN``."""
    return path.decode(errors="backslashreplace") if path else "."


def verify_store(
    store: Store, *, read_data: bool = False, progress: Progress | None = None
) -> StoreVerdict:
    """Checks the whole store: catalog, packs, every checkpoint, the files cache.

    Args:
        store: an open store (read-only is enough).
        read_data: also re-read and re-hash every pack and object.
        progress: called with (packs done, packs) while the packs are checked.

    Returns:
        The verdict; never raises for damage it finds (each problem is a line in
        ``errors``, and the checkpoints and paths it touches are in ``affected``).
    """
    report = check(store, read_data=read_data, progress=progress)
    out = StoreVerdict(report, errors=list(report.errors))
    if report.catalog_unreadable:
        return out
    try:
        bad = dircache.bad_rows(store.catalog)
        store.catalog.meta_items()  # every value decodes
        rows = Registry(store.catalog).all()[::-1]
    except (StoreError, ValueError, TypeError) as e:
        report.rebuild_helps = True
        out.errors.append(str(e))
        return out
    if bad:
        out.bad_cache_rows = [show_path(p) for p in bad]
        out.errors.append(
            f"files cache: {len(bad)} rows fail their checksum (first: {out.bad_cache_rows[0]}); "
            "the next checkpoint drops them and reads those directories afresh"
        )
    walker = _Walker(store, report)
    for cp in rows:
        assert cp.record is not None  # rows always have one
        paths = walker.affected(cp.top_tree)
        walker.reached.add(cp.record)
        lost = not walker.present(cp.record)
        if not lost:
            differs = _differs(store, cp)
            if differs:
                out.errors.append(
                    f"checkpoint {cp.id}: its catalog row differs from its record in the packs "
                    f"({differs}): the catalog is damaged"
                )
        if paths or lost:
            a = Affected(cp.id, [show_path(p) for p in paths[:MAX_PATHS]], len(paths), lost)
            out.affected.append(a)
            out.errors.append(_describe(a))
    out.objects_reachable = len(walker.reached)
    if walker.missing & report.in_orphans:
        report.rebuild_helps = True  # rebuild-catalog adopts the orphan packs holding them
    return out


def _differs(store: Store, cp: Checkpoint) -> str:
    """The fields in which a checkpoint's row and its META record disagree ("" if none; a
    record that cannot be read or decoded is named as such)."""
    assert cp.record is not None
    try:
        d = json.loads(store.read(cp.record))["checkpoint"]
        d["top_tree"] = ObjectId(bytes.fromhex(d["top_tree"]))
        rec = Checkpoint(**d, record=cp.record)
    except (SpriteError, ValueError, KeyError, TypeError) as e:
        return f"the record is unreadable: {e}"
    return ", ".join(k for k, v in asdict(rec).items() if asdict(cp)[k] != v)


def _describe(a: Affected) -> str:
    parts = []
    if a.total:
        shown = ", ".join(a.paths[:SHOWN_PATHS])
        more = f" and {a.total - SHOWN_PATHS} more" if a.total > SHOWN_PATHS else ""
        parts.append(f"{a.total} paths need damaged or missing objects: {shown}{more}")
    if a.record_lost:
        parts.append("its record is lost (rebuild-catalog could not recover it)")
    return f"checkpoint {a.checkpoint}: " + "; ".join(parts)


class _Walker:
    """Walks trees, memoized by tree id: the paths below each tree that need an object the
    store lacks or found damaged (relative to that tree)."""

    def __init__(self, store: Store, report: CheckReport) -> None:
        self.store = store
        self.report = report
        self.memo: dict[ObjectId, list[bytes]] = {}
        self.reached: set[ObjectId] = set()
        self.missing: set[ObjectId] = set()

    def present(self, oid: ObjectId) -> bool:
        ok = oid in self.report.listed and oid not in self.report.damaged
        if oid not in self.report.listed:
            self.missing.add(oid)
        return ok

    def _read(self, oid: ObjectId) -> bytes | None:
        self.reached.add(oid)
        if not self.present(oid):
            return None
        try:
            return self.store.read(oid)
        except SpriteError as e:
            self.report.damaged.setdefault(oid, str(e))
            return None

    def _file_lost(self, payload: bytes, indirect: bool) -> bool:
        if indirect:
            raw = self._read(ObjectId(payload))
            if raw is None:
                return True
            payload = raw
        try:
            chunks = [oid for oid, _, _ in decode_chunks(payload) if oid is not None]
        except SpriteError:
            return True
        self.reached.update(chunks)
        return not all(self.present(c) for c in chunks)

    def affected(self, top: ObjectId) -> list[bytes]:
        """The affected paths of the checkpoint whose top tree is ``top``; a directory whose
        listing is lost is named itself (what was below it is unknown)."""
        # Iterative post-order (a layer may be deeper than Python's recursion limit): a
        # frame is (tree, its entries, the index of the next one, paths found so far).
        Frame = tuple[ObjectId, list[Any], list[int], list[bytes]]

        def enter(tree: ObjectId) -> Frame | list[bytes]:
            if tree in self.memo:
                return self.memo[tree]
            raw = self._read(tree)
            try:
                entries = decode_tree(raw) if raw is not None else None
            except SpriteError:
                entries = None
            if entries is None:
                self.memo[tree] = [b""]  # the directory itself
                return self.memo[tree]
            return (tree, entries, [0], [])

        def join(name: bytes, sub: bytes) -> bytes:
            """``sub`` (relative to the directory ``name``) relative to its parent; the top
            tree's one entry ``.`` is the root, which adds nothing."""
            base = b"" if name == b"." else name
            return base + (b"/" + sub if sub and base else sub)

        first = enter(top)
        if isinstance(first, list):
            return list(first)
        stack: list[tuple[Frame, bytes]] = [(first, b"")]
        result: list[bytes] = []
        while stack:
            (tree, entries, idx, found), _ = stack[-1]
            if idx[0] == len(entries):
                stack.pop()
                self.memo[tree] = found
                if stack:
                    (_, pentries, pidx, pfound), _ = stack[-1]
                    name = pentries[pidx[0]].name
                    pfound.extend(join(name, p) for p in found)
                    pidx[0] += 1
                else:
                    result = found
                continue
            ent = entries[idx[0]]
            if ent.kind is Kind.DIR:
                sub = enter(ObjectId(ent.subtree))
                if isinstance(sub, list):
                    found.extend(join(ent.name, p) for p in sub)
                    idx[0] += 1
                else:
                    stack.append((sub, ent.name))
                continue
            if ent.kind is Kind.FILE and self._file_lost(ent.payload, ent.indirect):
                found.append(join(ent.name, b""))
            idx[0] += 1
        return result
