"""Remote deletes: freeing the bucket of what no generation needs, after a grace period.

A local delete frees local space at once (``store/prune.py``); the bucket follows once the
generation that no longer names the objects is durable. :func:`plan` decides, from one
listing of ``catalog/`` and ``packs/`` (times by the server's clock, ``s3.Listing``), and
:meth:`GcPlan.execute` deletes, under the prefix's lease (``store/lease.py``):

- **Generations** are kept per writer: the newest :attr:`GcPolicy.keep` *complete* ones
  (sound, and every pack they name listed; a newer incomplete one does not count, since
  readers pass it over), and any generation superseded (by the next newer one of its
  writer) less than :attr:`GcPolicy.grace` ago. The rest are retired. An unreadable
  generation (its bytes do not match its name) is retired once it is ``grace`` old.
- **Packs** are deleted when no kept generation names them and they were stored at least
  ``grace`` ago: a pack another writer uploaded for a generation still on its way is
  younger than that.

So a reader that took a generation while it was its writer's newest has at least
``grace`` seconds to read what it names, and nothing a kept generation names (the newest
of each writer above all) is ever deleted. Generations go first, then packs: a reader
never finds a listed generation whose packs are gone. Just before deleting packs the
catalog is listed again, and the packs of any generation that appeared since the plan are
spared (a forced second writer's push that reused them).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sprite_env.store.lease import Lease
from sprite_env.store.remote import (
    Generation,
    RemoteStoreError,
    _names_in,
    fetch_verified,
)
from sprite_env.store.s3 import env_number

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sprite_env.store.remote import ObjectStorage
    from sprite_env.store.s3 import Listing

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GcPolicy:
    """What remote deletes keep.

    Attributes:
        keep: complete generations kept per writer (``SPRITE_ENV_REMOTE_KEEP``). 2: the
            newest, and one more should the newest be found damaged later.
        grace: seconds a superseded generation, and a pack no generation names, stay
            (``SPRITE_ENV_REMOTE_GRACE``). 1 h: a reader of the previous generation (a
            pull elsewhere, a view reading packs on demand) has an hour to fetch what it
            needs, and a push of another writer an hour between its first pack and its
            generation (kopia keeps 1 h of margin, ``DropContentFromIndexExtraMargin``).
    """

    keep: int = 2
    grace: float = 3600.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GcPolicy:
        """The policy the environment asks for (the defaults where it is silent).

        Raises:
            BadRemoteSetting: a value that is not a number, or out of range.
        """
        env = os.environ if env is None else env
        d = cls()
        return cls(
            keep=int(env_number(env, "SPRITE_ENV_REMOTE_KEEP", d.keep, 1)),
            grace=env_number(env, "SPRITE_ENV_REMOTE_GRACE", d.grace, 0),
        )


@dataclass(frozen=True, slots=True)
class GcPlan:
    """What :meth:`execute` will delete, and why the rest stays."""

    generations: list[Generation]  # retired
    damaged: list[str]  # unreadable generations' names, retired
    packs: dict[str, int]  # name -> bytes
    kept: list[Generation]
    named: frozenset[str] = field(repr=False)  # the packs the kept generations name
    # Seconds until the soonest object this plan spares only for the grace passes it
    # (None: nothing waits): when a later run has something to free.
    due_in: float | None = None

    @property
    def bytes(self) -> int:
        return sum(self.packs.values())

    def execute(self, storage: ObjectStorage, lease: Lease | None) -> GcReport:
        """Deletes the plan's generations, then its packs (see the module docstring).

        Args:
            storage: the bucket.
            lease: the prefix's lease (checked before each phase); None only where the
                caller knows no one else writes (tests).

        Raises:
            LeaseLost: the lease lapsed; what was deleted so far was unneeded anyway.
            RemoteError: a request failed; the next run deletes the rest.
        """
        if lease is not None:
            lease.check()
        for g in self.generations:
            storage.delete(g.name)
        for name in self.damaged:
            storage.delete(name)
        if lease is not None:
            lease.check()
        known = {g.name for g in self.kept}
        spared: set[str] = set()
        with tempfile.TemporaryDirectory(prefix="sprite-remote-gc-") as tmp:
            for name in storage.list("catalog/"):
                new = Generation.parse(name)
                if new is None or name in known:
                    continue
                names = _read(storage, new, tmp)  # new since the plan: spare what it names
                spared.update(f"packs/{n}.pack" for n in names or ())
        freed = 0
        deleted = 0
        for name, size in self.packs.items():
            if name in spared or name in self.named:
                continue
            storage.delete(name)
            deleted += 1
            freed += size
        log.info(
            "%r: %d generations and %d packs (%d bytes) deleted",
            storage,
            len(self.generations) + len(self.damaged),
            deleted,
            freed,
        )
        return GcReport(
            len(self.generations) + len(self.damaged), deleted, freed, len(spared), self.due_in
        )


@dataclass(frozen=True, slots=True)
class GcReport:
    """What :meth:`GcPlan.execute` deleted."""

    generations: int
    packs: int
    bytes: int
    spared: int  # packs named by a generation that appeared meanwhile
    due_in: float | None = None  # see GcPlan.due_in


def _read(storage: ObjectStorage, gen: Generation, tmp: str) -> list[str] | None:
    """The packs ``gen`` names, or None if it is unreadable (damaged in the bucket)."""
    path = os.path.join(tmp, f"{gen.number}-{gen.writer}-{gen.digest}.db")
    try:
        fetch_verified(storage, gen.name, path, gen.digest)
        return _names_in(path)
    except (RemoteStoreError, sqlite3.DatabaseError):
        return None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _by_writer(cat: Listing) -> dict[str, list[Generation]]:
    """The listing's generations by writer id, each list newest first."""
    out: dict[str, list[Generation]] = {}
    for name in cat.objects:
        g = Generation.parse(name)
        if g is not None:
            out.setdefault(g.writer, []).append(g)
    for gens in out.values():
        gens.sort(reverse=True)
    return out


def plan(storage: ObjectStorage, policy: GcPolicy | None = None) -> GcPlan:
    """Decides what the bucket no longer needs (nothing is deleted here: a dry run).

    Raises:
        RemoteError: a request failed.
    """
    policy = policy or GcPolicy.from_env()
    cat: Listing = storage.listing("catalog/")
    packs: Listing = storage.listing("packs/")
    retired: list[Generation] = []
    damaged: list[str] = []
    kept: list[Generation] = []
    named: set[str] = set()
    waits: list[float] = []  # grace left of what is spared only for the grace
    with tempfile.TemporaryDirectory(prefix="sprite-remote-gc-") as tmp:
        for gens in _by_writer(cat).values():  # newest first
            complete = 0
            for i, g in enumerate(gens):
                # Superseded this long ago (by the next newer generation of its writer);
                # a writer's newest is never superseded.
                superseded = cat.age(gens[i - 1].name) if i > 0 else -1.0
                if complete >= policy.keep:
                    if superseded >= policy.grace:
                        retired.append(g)
                        continue
                    waits.append(policy.grace - superseded)
                names = _read(storage, g, tmp)
                if names is None:
                    if cat.age(g.name) >= policy.grace:
                        damaged.append(g.name)
                    else:
                        waits.append(policy.grace - cat.age(g.name))
                    continue
                keys = {f"packs/{n}.pack" for n in names}
                kept.append(g)
                named |= keys
                if keys <= packs.objects.keys():
                    complete += 1
    doomed: dict[str, int] = {}
    for name, info in packs.objects.items():
        if name in named:
            continue
        if packs.age(name) >= policy.grace:
            doomed[name] = info.size
        else:
            waits.append(policy.grace - packs.age(name))
    due = max(0.0, min(waits)) if waits else None
    return GcPlan(sorted(retired), damaged, doomed, sorted(kept), frozenset(named), due)


def due(storage: ObjectStorage, writer: str, policy: GcPolicy | None = None) -> float | None:
    """Seconds until a run of :func:`collect` has one of ``writer``'s generations to
    retire (0: now; None: it has no more than ``keep``), from one listing of ``catalog/``
    and nothing downloaded.

    Every push adds a generation (a whole copy of the catalog), so a writer that never
    deletes still needs runs, or the bucket grows by one catalog per push; and a run
    downloads every kept generation to learn what it names (``plan``), so it is worth
    taking only when something is retirable. Positions stand in for completeness here
    (:func:`plan` decides, and keeps more when a newer generation is incomplete): the
    generation past ``keep`` is retirable once its successor is ``grace`` old.

    Raises:
        RemoteError: the listing failed.
    """
    policy = policy or GcPolicy.from_env()
    cat: Listing = storage.listing("catalog/")
    gens = _by_writer(cat).get(writer, [])
    if len(gens) <= policy.keep:
        return None
    # The newest generation past ``keep`` was superseded when the one above it was stored.
    return max(0.0, policy.grace - cat.age(gens[policy.keep - 1].name))


def collect(
    storage: ObjectStorage,
    writer: str,
    policy: GcPolicy | None = None,
    *,
    lease: Lease | None = None,
) -> GcReport:
    """Plans and executes remote deletes under the prefix's lease (taken for the run
    when ``lease`` is None): call it after a push whose generation dropped objects.

    Raises:
        LeaseHeld: another writer holds the prefix; nothing was deleted.
        RemoteError: a request failed.
    """
    if lease is not None:
        return plan(storage, policy).execute(storage, lease)
    held = Lease.acquire(storage, writer)
    try:
        held.keep_renewed()
        return plan(storage, policy).execute(storage, held)
    except BaseException:
        held.release(wait=False)  # the error first, as for a push
        raise
    finally:
        held.release()


__all__ = ["GcPlan", "GcPolicy", "GcReport", "collect", "due", "plan"]
