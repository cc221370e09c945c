"""A store's copy in object storage: packs and catalog generations (issue 14).

The layout and the ordering invariants are in ``docs/remote.md``; in short, under the
store's prefix::

    packs/<name>.pack                      a pack, under its content name (BLAKE3 of the
                                           file): written once, never overwritten
    catalog/<gen:016d>-<writer>-<b3>.db    generation ``gen`` of the catalog, a consistent
                                           SQLite copy uploaded by writer ``writer``; ``b3``
                                           is the BLAKE3 of its bytes

:func:`push` uploads every pack a consistent copy of the local catalog names and that the
bucket lacks, then that copy as the next generation: a generation exists in the bucket
only after every pack it names is durable there (a PUT that answered 200). :func:`pull`
makes a local store out of the newest complete generation (its bytes hash to its name and
every pack it names is listed; an incomplete one is skipped with a warning) and the packs
it names, each verified against its name. No request is conditional (Swift 2.30 refuses
``If-None-Match``, and many servers ignore it): names are never reused, so no write can
replace another.

Every function blocks (the daemon calls them from a thread). Errors:
:class:`~sprite_env.store.s3.RemoteError` for the bucket, :class:`RemoteStoreError` for a
bucket that holds no usable generation.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import blake3

from sprite_env import privacy
from sprite_env.errors import StoreError
from sprite_env.store.catalog import Catalog
from sprite_env.store.faults import crashpoint
from sprite_env.store.lease import Lease, LeaseStorage
from sprite_env.store.pack import _fsync_dir, pack_path
from sprite_env.store.repository import open_store

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from sprite_env.store.repository import Store

log = logging.getLogger(__name__)

#: ``catalog/<gen>-<writer>-<b3>.db``: zero-padded so names sort as numbers do.
_GENERATION = re.compile(r"catalog/(\d{16})-([0-9a-f]{12})-([0-9a-f]{64})\.db")
#: The catalog ``meta`` key holding this store's writer id (made at its first push).
WRITER_KEY = "remote_writer"
#: The catalog ``meta`` key recording what this store made durable in the bucket: the
#: newest generation it pushed and the checkpoints that generation holds (JSON; see
#: :func:`record_durable`). It survives a restart: a daemon pushes on start whatever it
#: does not cover.
DURABLE_KEY = "remote_durable"
#: Meta keys that describe one machine, not the checkpoints: a pulled copy drops them (a
#: fork gets its own writer id, never resumes its parent's unfinished restore, and calls a
#: checkpoint ``remote`` only once a generation of its own holds it).
_MACHINE_KEYS = (WRITER_KEY, DURABLE_KEY, "restore_intent")
_COPY_BYTES = 1 << 20


class RemoteStoreError(StoreError):
    """The bucket holds no generation that can be used (none, or none complete)."""


class ObjectStorage(LeaseStorage, Protocol):
    """What the remote store needs of a bucket (``s3.S3Storage`` is one). Names are
    relative to the store's prefix."""

    def put_file(self, name: str, path: str) -> None: ...

    def get_file(self, name: str, path: str) -> None: ...

    def get_range(self, name: str, offset: int, length: int) -> bytes: ...

    def list(self, under: str) -> dict[str, int]: ...


@dataclass(frozen=True, slots=True, order=True)
class Generation:
    """One catalog generation in the bucket."""

    number: int
    writer: str
    digest: str

    @property
    def name(self) -> str:
        return f"catalog/{self.number:016d}-{self.writer}-{self.digest}.db"

    @classmethod
    def parse(cls, name: str) -> Generation | None:
        m = _GENERATION.fullmatch(name)
        return None if m is None else cls(int(m[1]), m[2], m[3])


@dataclass(frozen=True, slots=True)
class PushReport:
    """What :func:`push` did."""

    generation: Generation
    packs_uploaded: int
    bytes_uploaded: int
    packs_present: int  # named by the generation and already in the bucket


@dataclass(frozen=True, slots=True)
class PushProgress:
    """How far a push is: packs and bytes uploaded of those the bucket lacked."""

    packs: int
    packs_total: int
    bytes: int
    bytes_total: int


@dataclass(frozen=True, slots=True)
class Durable:
    """What the bucket holds of this store (:func:`durable`): the newest generation the
    store pushed and the ids of the checkpoints in it."""

    generation: int
    checkpoints: frozenset[str]


@dataclass(frozen=True, slots=True)
class PullReport:
    """What :func:`pull` did."""

    generation: Generation
    packs: int
    bytes: int
    skipped: list[str]  # newer generations passed over, and why


def generations(storage: ObjectStorage) -> list[Generation]:
    """The bucket's catalog generations, newest first (other names are ignored)."""
    found = [Generation.parse(n) for n in storage.list("catalog/")]
    return sorted((g for g in found if g is not None), reverse=True)


def heads(storage: ObjectStorage) -> dict[str, Generation]:
    """Each writer's newest generation, by writer id: where writers diverged, the states a
    user can pick from (``pull(writer=...)``)."""
    out: dict[str, Generation] = {}
    for g in generations(storage):  # newest first: the first of each writer is its head
        out.setdefault(g.writer, g)
    return out


def _file_b3(path: str) -> str:
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_COPY_BYTES), b""):
            h.update(block)
    return h.hexdigest()


def _backup(store: Store, dest: str) -> list[str]:
    """A consistent copy of the catalog as one file (no WAL), made durable; returns the
    names of the packs it lists.

    SQLite's backup API copies one snapshot of the database: a commit made meanwhile is
    either wholly in the copy or not at all.
    """
    os.close(privacy.open_file(dest, os.O_WRONLY | os.O_TRUNC))  # 0600 before it holds data
    src = sqlite3.connect(f"file:{store.catalog.path}?mode=ro", uri=True)
    try:
        out = sqlite3.connect(dest)
        try:
            src.backup(out)
            out.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
            names = [r[0] for r in out.execute("SELECT name FROM packs ORDER BY name")]
        finally:
            out.close()
    finally:
        src.close()
    fd = os.open(dest, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return names


def writer_id(store: Store) -> str:
    """This store's writer id in generation names (made and saved at its first push)."""
    wid = store.catalog.meta(WRITER_KEY)
    if wid is None or not re.fullmatch(r"[0-9a-f]{12}", wid):
        wid = secrets.token_hex(6)
        with store.catalog.transaction() as db:
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (WRITER_KEY, wid))
    return wid


def push(
    store: Store,
    storage: ObjectStorage,
    progress: Callable[[PushProgress], None] | None = None,
    *,
    lease: Lease | None = None,
    bypass_lease: bool = False,
) -> PushReport:
    """Uploads the store's committed state as the bucket's next catalog generation.

    Order (``docs/remote.md``): a consistent copy of the catalog; every pack it names that
    the bucket does not list, one PUT each; then the copy, under the next generation
    number. A crash or an error at any step leaves the bucket's newest complete
    generation as it was (packs uploaded meanwhile are reused by the next push).

    Args:
        store: a writable store. A prune that unlinks a pack the copy names while this
            runs fails the push with ``FileNotFoundError`` (nothing committed); the next
            push takes a new copy (the daemon's uploader retries at once).
        storage: the bucket.
        progress: called before the first PUT and after each pack's; an exception it
            raises ends the push there, committing nothing (the daemon stops a push so).
        lease: the prefix's lease, held by the caller (``store/lease.py``); without one
            the push takes it for its own duration.
        bypass_lease: push without any lease (tests of two writers at once; never needed
            for correctness, which the commit protocol keeps without it).

    Raises:
        RemoteError: a request failed (after the client's retries); nothing is committed.
        StoreError: the store is read-only.
        FileNotFoundError: a pack the copy names was pruned meanwhile.
        LeaseHeld: another writer holds the prefix; nothing was sent.
        LeaseLost: the lease lapsed during the push, or its lock was gone from the bucket
            right before the generation's PUT (``Lease.confirm``); the generation was not
            sent.
    """
    if not store.writable:
        raise StoreError("store is open read-only")
    wid = writer_id(store)
    held = None if lease is not None or bypass_lease else Lease.acquire(storage, wid)
    if held is not None:
        held.keep_renewed()
    lease = lease or held
    tmp = os.path.join(store.tmp_dir, f"remote-catalog-{secrets.token_hex(4)}.db")
    try:
        names = _backup(store, tmp)
        remote = storage.list("packs/")
        todo: list[tuple[str, str, int]] = []  # (key, path, size) of the packs to send
        present = 0
        for name in names:
            key = f"packs/{name}.pack"
            path = pack_path(store.packs_dir, name)
            if key in remote:  # a pack's name is its content: the bytes are the same
                try:
                    size = os.stat(path).st_size
                except FileNotFoundError:  # in the bucket only (a store made by a pull)
                    present += 1
                    continue
                if remote[key] != size:
                    raise RemoteStoreError(
                        f"{storage!r}: {key} has {remote[key]} bytes, not "
                        f"{size}: damaged in the bucket (never overwritten)"
                    )
                present += 1
                continue
            todo.append((key, path, os.stat(path).st_size))
        total = sum(size for _, _, size in todo)
        uploaded = sent = 0
        if progress is not None:
            progress(PushProgress(0, len(todo), 0, total))
        for key, path, size in todo:
            crashpoint("remote-before-pack-put")
            storage.put_file(key, path)
            crashpoint("remote-after-pack-put")
            uploaded += 1
            sent += size
            if progress is not None:
                progress(PushProgress(uploaded, len(todo), sent, total))
        digest = _file_b3(tmp)
        gens = generations(storage)
        gen = Generation((gens[0].number + 1) if gens else 0, wid, digest)
        crashpoint("remote-before-catalog-put")
        if lease is not None:
            lease.confirm()  # the commit point: only while the prefix is surely ours
        storage.put_file(gen.name, tmp)
        crashpoint("remote-after-catalog-put")
        store.packs_durable(names)  # now the bucket holds them: the cache's bound applies
        log.info("store %s: generation %d pushed to %r", store.path, gen.number, storage)
        return PushReport(gen, uploaded, sent + os.stat(tmp).st_size, present)
    except BaseException:
        if held is not None:  # the error first; the lock goes meanwhile (or goes stale)
            held.release(wait=False)
        raise
    finally:
        if held is not None:
            held.release()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def durable(store: Store) -> Durable | None:
    """What this store last made durable in the bucket (None: nothing yet, or a record
    that does not parse, which counts as nothing: the next push writes it again)."""
    raw = store.catalog.meta(DURABLE_KEY)
    if raw is None:
        return None
    try:
        d = json.loads(raw)
        return Durable(int(d["generation"]), frozenset(str(c) for c in d["checkpoints"]))
    except (ValueError, KeyError, TypeError):
        log.warning("store %s: meta %s does not parse; counted as nothing", store.path, raw)
        return None


def durable_checkpoints(store: Store) -> frozenset[str]:
    """The ids of the checkpoints a generation this store pushed holds (``remote``)."""
    d = durable(store)
    return frozenset() if d is None else d.checkpoints


def record_durable(store: Store, generation: Generation, checkpoints: Iterable[str]) -> None:
    """Records that ``generation`` (durable: its PUT answered) holds ``checkpoints``.

    The caller lists the checkpoints before the push that made ``generation``: each of
    them was committed before the push's copy of the catalog, so the copy holds it (a
    checkpoint deleted in between is named here, but shown nowhere).
    """
    value = json.dumps({"generation": generation.number, "checkpoints": sorted(checkpoints)})
    with store.catalog.transaction() as db:
        db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (DURABLE_KEY, value))


def fetch_verified(storage: ObjectStorage, name: str, dest: str, digest: str) -> None:
    """Downloads ``name`` to ``dest`` through a temporary name, if its BLAKE3 is ``digest``.

    Raises:
        RemoteStoreError: the bytes do not match (nothing is left at ``dest``).
    """
    tmp = f"{dest}.part"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    try:
        storage.get_file(name, tmp)
        if _file_b3(tmp) != digest:
            raise RemoteStoreError(f"{name}: its bytes do not match its name")
        fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _names_in(path: str) -> list[str]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        if db.execute("PRAGMA quick_check").fetchone() != ("ok",):
            raise sqlite3.DatabaseError("quick_check failed")
        return [r[0] for r in db.execute("SELECT name FROM packs")]
    finally:
        db.close()


def pull(
    storage: ObjectStorage,
    store_dir: str,
    *,
    writer: str | None = None,
    generation: Generation | None = None,
    lazy: bool = False,
) -> PullReport:
    """Makes a new local store at ``store_dir`` from the bucket's newest complete
    generation: a fork, whose own pushes go on from there under its own writer id.

    Where two writers diverged (``docs/remote.md``), the newest generation is the last
    push of either; ``writer`` takes that writer's newest complete one instead (its
    ``heads``), ``generation`` exactly that one.

    A generation is complete when its bytes hash to its name, it is a sound SQLite
    database, and every pack it names is in the bucket; newer ones that are not are
    passed over (logged, and listed in the report). Packs are downloaded before the
    catalog is put in place: a pull interrupted before its end leaves a store with no
    checkpoints, whose stray packs the next writable open deletes.

    Args:
        storage: the bucket.
        store_dir: a missing or empty directory.
        writer: only that writer's generations are candidates.
        generation: only that generation is a candidate.
        lazy: take the catalog alone: the packs stay in the bucket, to be fetched as they
            are read (a store opened with a remote, ``backend.py``), so a fork shares its
            parent's objects instead of copying them.

    Raises:
        RemoteStoreError: the bucket has no complete generation (of those asked for).
        RemoteError: a request failed.
        NotAStore: ``store_dir`` is not empty.
    """
    gens = generations(storage)
    if not gens:
        raise RemoteStoreError(f"{storage!r} holds no catalog generation (nothing pushed)")
    if writer is not None or generation is not None:
        gens = [g for g in gens if g.writer == (writer or g.writer) and g == (generation or g)]
        if not gens:
            asked = generation.name if generation is not None else f"writer {writer}"
            raise RemoteStoreError(f"{storage!r} holds no generation of {asked}")
    remote = storage.list("packs/")
    with open_store(store_dir, create=True) as store:  # the directories, marker and lock
        if store.catalog.packs():
            raise StoreError(f"{store_dir}: not an empty store; pull into a new directory")
        skipped: list[str] = []
        chosen: tuple[Generation, str, list[str]] | None = None
        for gen in gens:
            tmp = os.path.join(store.tmp_dir, f"pulled-{gen.number}.db")
            try:
                fetch_verified(storage, gen.name, tmp, gen.digest)
                names = _names_in(tmp)
            except (RemoteStoreError, sqlite3.DatabaseError) as e:
                skipped.append(f"{gen.name}: {e}")
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                continue
            missing = [n for n in names if f"packs/{n}.pack" not in remote]
            if missing:
                skipped.append(f"{gen.name}: {len(missing)} of its packs are missing")
                os.unlink(tmp)
                continue
            chosen = (gen, tmp, names)
            break
        for line in skipped:
            log.warning("%r: generation passed over: %s", storage, line)
        if chosen is None:
            raise RemoteStoreError(
                f"{storage!r}: no complete catalog generation ({'; '.join(skipped)})"
            )
        gen, tmp, names = chosen
        got = 0
        for name in [] if lazy else names:
            crashpoint("remote-pull-before-pack")
            fetch_verified(storage, f"packs/{name}.pack", pack_path(store.packs_dir, name), name)
            got += remote[f"packs/{name}.pack"]
        _fsync_dir(store.packs_dir)
        db = sqlite3.connect(tmp)
        try:
            with db:
                db.executemany("DELETE FROM meta WHERE key = ?", [(k,) for k in _MACHINE_KEYS])
        finally:
            db.close()
        catalog_path = store.catalog.path
        store.catalog.close()
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(catalog_path + suffix)
        crashpoint("remote-pull-before-catalog")
        os.rename(tmp, catalog_path)  # the commit point of the pull
        _fsync_dir(store.path)
        store.catalog = Catalog(catalog_path)  # migrated here if it is of an older version
    return PullReport(gen, len(names), got, skipped)


__all__ = [
    "DURABLE_KEY",
    "Durable",
    "Generation",
    "ObjectStorage",
    "PullReport",
    "PushProgress",
    "PushReport",
    "RemoteStoreError",
    "durable",
    "durable_checkpoints",
    "fetch_verified",
    "generations",
    "heads",
    "pull",
    "push",
    "record_durable",
    "writer_id",
]
