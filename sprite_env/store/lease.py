"""The lease: one writer at a time on a prefix of the bucket, without conditional writes.

A writer holds the prefix by keeping a lock object ``locks/<writer>-<random>`` in it
(restic's lock files, ``internal/restic/lock.go``): JSON naming the writer id, the host
and the process. Taking the lease is *write, wait, list, read back*:

1. list ``locks/``; a live lock of another holder refuses the lease (:class:`LeaseHeld`,
   naming it);
2. write our lock under a name never used before;
3. wait :attr:`LeasePolicy.settle`, so a writer racing us has written its lock too;
4. list again and read ours back; if another live lock is older than ours (by the
   server's time, then by name: the same order for every observer), ours is removed and
   the lease refused; else the lease is ours, and stale locks are removed.

Two writers that start together therefore end with one holder, as long as the server's
listing shows a lock within ``settle`` of its PUT. Where it does not, both may hold: the
commit protocol never depended on the lease (``docs/remote.md``), so nothing either
commits is lost; the lease keeps histories from diverging, it does not keep data safe.

A lock is live until :attr:`LeasePolicy.stale_after` seconds after its PUT, by the
server's clock (its ``LastModified`` against the listing's ``Date``: no two machines'
clocks are compared). The holder renews it every ``refresh_every`` seconds by writing a
new lock and deleting the old (nothing is overwritten in place), and stops pushing
(:class:`LeaseLost`) once it has gone ``stale_after / 2`` seconds without a renewal, well
before anyone may call its lock stale.

A lost lease stays lost: a renewal that succeeds after the bound (the server back after an
outage) would not prove that nobody took the prefix meanwhile, so the holder must take the
lease again (:meth:`Lease.acquire`, which lists the other locks). Each renewal, and
:meth:`Lease.confirm` right before a commit, also reads the holder's lock back: one that is
gone was removed by someone else (a writer forced past the lease, or by hand), and the
lease is lost at once rather than at the next bound. ``Lease.on_lost`` is told either way,
from the renewing thread, so an idle holder hears it too.

A lock of the same writer id on the same host by another process is a leftover of a
process that died (the local store's flock admits one writer process), and is removed; so
is one of this process that no lease here holds (its release could not delete it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sprite_env.errors import StoreError
from sprite_env.store.s3 import BadRemoteSetting, RemoteError, RemoteNotFound, env_number

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from sprite_env.store.s3 import Listing

log = logging.getLogger(__name__)

LOCKS = "locks/"
_LOCK = re.compile(r"locks/([0-9a-f]{12})-([0-9a-f]{16})")

#: The locks this process holds now: one of this process's locks not among them is a
#: leftover (a release whose delete failed, when the server was down), not a holder.
_held: set[str] = set()
_held_lock = threading.Lock()


class LeaseStorage(Protocol):
    """What the lease needs of a bucket (``s3.S3Storage`` is one)."""

    def put_bytes(self, name: str, data: bytes) -> None: ...

    def get_bytes(self, name: str) -> bytes: ...

    def delete(self, name: str) -> None: ...

    def listing(self, under: str) -> Listing: ...


@dataclass(frozen=True, slots=True)
class LeasePolicy:
    """The lease's times, in seconds.

    Attributes:
        stale_after: a lock not renewed for this long is ignored and may be removed.
            5 min: a writer that died blocks the prefix no longer than that (restic's
            30 min suits backups run by hand; here a sprite's replacement wants the prefix
            soon), and a holder that cannot reach the server gets 2.5 min of renewals
            (each retried for up to a minute, ``s3.RetryPolicy``) before it stops.
        refresh_every: how often the holder renews (1 min: five renewals per stale time,
            restic's ratio of 5 to 30 min is six).
        settle: the wait between writing our lock and listing again (1 s: Swift's object
            server waits up to ``container_update_timeout``, 1 s by default, for the
            listing to take a new object before it defers the update; restic waits 200 ms).
    """

    stale_after: float = 300.0
    refresh_every: float = 60.0
    settle: float = 1.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LeasePolicy:
        """The policy the environment asks for: ``SPRITE_ENV_LEASE_STALE``,
        ``SPRITE_ENV_LEASE_REFRESH``, ``SPRITE_ENV_LEASE_SETTLE`` (seconds).

        Raises:
            BadRemoteSetting: a value that is not a number, or a refresh that is not
                shorter than half the stale time (the holder would stop between renewals).
        """
        env = os.environ if env is None else env
        d = cls()
        p = cls(
            stale_after=env_number(env, "SPRITE_ENV_LEASE_STALE", d.stale_after, 1),
            refresh_every=env_number(env, "SPRITE_ENV_LEASE_REFRESH", d.refresh_every, 0.1),
            settle=env_number(env, "SPRITE_ENV_LEASE_SETTLE", d.settle, 0),
        )
        if p.refresh_every >= p.stale_after / 2:
            raise BadRemoteSetting(
                f"the lease's refresh ({p.refresh_every:g} s) must be shorter than half its "
                f"stale time ({p.stale_after:g} s)"
            )
        return p


@dataclass(frozen=True, slots=True)
class Holder:
    """A live lock: who holds (or is taking) the lease."""

    key: str
    writer: str
    host: str
    pid: int
    age: float  # seconds since its PUT, by the server's clock
    modified: float

    def describe(self) -> str:
        return (
            f"writer {self.writer} on host {self.host} (pid {self.pid}), "
            f"renewed {self.age:.0f} s ago"
        )


class LeaseHeld(StoreError):
    """Another writer holds the prefix: this one may not push to it."""

    exit_code = 4  # as StoreLocked: someone else has it

    def __init__(self, storage: object, holder: Holder, stale_after: float) -> None:
        super().__init__(
            f"{storage!r} is held by {holder.describe()}: another daemon or machine writes "
            f"this prefix (stop it, or use another prefix; a holder that died lets go "
            f"{stale_after:.0f} s after its last renewal)"
        )
        self.holder = holder


class LeaseLost(StoreError):
    """The lease was released, its lock was removed from the bucket, or it was not renewed
    for long enough that another writer may have taken it: nothing more may be committed
    under it (a lost lease is never renewed; take it again)."""


def _body(writer: str) -> bytes:
    return json.dumps(
        {"writer": writer, "host": socket.gethostname(), "pid": os.getpid(), "time": time.time()},
        sort_keys=True,
    ).encode()


def _holders(
    storage: LeaseStorage, listing: Listing, policy: LeasePolicy, skip: str | None = None
) -> tuple[list[Holder], list[str]]:
    """The live locks in ``listing`` (read back, oldest first) and the stale ones' names."""
    live: list[Holder] = []
    stale: list[str] = []
    for key, info in listing.objects.items():
        m = _LOCK.fullmatch(key)
        if m is None or key == skip:
            continue
        age = listing.now - info.modified
        if age >= policy.stale_after:
            stale.append(key)
            continue
        try:
            d = json.loads(storage.get_bytes(key))
            host, pid = str(d["host"]), int(d["pid"])
        except RemoteNotFound:  # released since the listing
            continue
        except (ValueError, KeyError, TypeError):  # not ours to read: still someone's
            host, pid = "?", 0
        live.append(Holder(key, m[1], host, pid, age, info.modified))
    live.sort(key=lambda h: (h.modified, h.key))
    return live, stale


def holders(storage: LeaseStorage, policy: LeasePolicy | None = None) -> list[Holder]:
    """Who holds the prefix now: its live locks, oldest first (the holder is the first)."""
    policy = policy or LeasePolicy.from_env()
    return _holders(storage, storage.listing(LOCKS), policy)[0]


class Lease:
    """A held lease (:meth:`acquire`); renewed by a thread while :meth:`keep_renewed` runs.

    Thread-safe. Use :func:`open_lease` to hold one for a block.

    Attributes:
        on_lost: called once, with the reason, when the lease is found lost (by the
            renewing thread, :meth:`check` or :meth:`confirm`; not by :meth:`release`).
            It runs in that thread: it must not block.
    """

    def __init__(self, storage: LeaseStorage, writer: str, policy: LeasePolicy, key: str) -> None:
        self.storage = storage
        self.writer = writer
        self.policy = policy
        self.key = key
        self._renewed = time.monotonic()  # set before the PUT that made ``key``
        self._lock = threading.Lock()
        # One renewal or confirmation at a time: a confirmation must not read back a key a
        # renewal is replacing (its delete of the old key would look like a removal).
        self._turn = threading.Lock()
        self._released = False
        self._lost: str | None = None  # why, once lost (for good)
        self._failure: str | None = None  # the last renewal's error, while they fail
        self.on_lost: Callable[[str], None] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        with _held_lock:
            _held.add(key)

    def __repr__(self) -> str:
        return f"Lease({self.storage!r}, {self.key})"

    @classmethod
    def acquire(
        cls, storage: LeaseStorage, writer: str, policy: LeasePolicy | None = None
    ) -> Lease:
        """Takes the prefix for ``writer``: write, wait, list, read back (module docstring).

        Raises:
            LeaseHeld: another live lock holds it (named in the message).
            RemoteError: a request failed; no lock of ours is left behind if it can be
                helped (one that is goes stale).
        """
        policy = policy or LeasePolicy.from_env()
        host, pid = socket.gethostname(), os.getpid()

        def others(live: list[Holder]) -> tuple[list[Holder], list[Holder]]:
            """(someone else's live locks, leftovers of a dead process of this writer)"""
            theirs: list[Holder] = []
            dead: list[Holder] = []
            for h in live:
                with _held_lock:
                    ours = h.pid == pid and h.key in _held
                leftover = (h.writer, h.host) == (writer, host) and not ours
                (dead if leftover else theirs).append(h)
            return theirs, dead

        theirs, _ = others(_holders(storage, storage.listing(LOCKS), policy)[0])
        if theirs:
            raise LeaseHeld(storage, theirs[0], policy.stale_after)
        key = f"{LOCKS}{writer}-{secrets.token_hex(8)}"
        body = _body(writer)
        started = time.monotonic()
        storage.put_bytes(key, body)
        try:
            time.sleep(policy.settle)
            listing = storage.listing(LOCKS)
            if key not in listing.objects or storage.get_bytes(key) != body:
                raise RemoteError(
                    f"{storage!r}: lock {key} was written but does not read back within "
                    f"{policy.settle:g} s (a server whose listings lag cannot hold a lease)"
                )
            live, stale = _holders(storage, listing, policy, skip=key)
            theirs, dead = others(live)
            mine = (listing.objects[key].modified, key)
            older = [h for h in theirs if (h.modified, h.key) < mine]
            if older:
                raise LeaseHeld(storage, older[0], policy.stale_after)
        except BaseException:
            with contextlib.suppress(RemoteError):
                storage.delete(key)
            raise
        for old in [*stale, *(h.key for h in dead)]:
            with contextlib.suppress(RemoteError):
                storage.delete(old)
                log.info("%r: removed the stale lock %s", storage, old)
        lease = cls(storage, writer, policy, key)
        lease._renewed = started
        return lease

    @property
    def lost(self) -> str | None:
        """Why the lease was lost (None: held, or released)."""
        with self._lock:
            return self._lost

    def _lose(self, reason: str) -> LeaseLost:
        """Marks the lease lost for good (the first reason stays) and tells ``on_lost``."""
        with self._lock:
            first = self._lost is None and not self._released
            if self._lost is None:
                self._lost = reason
            reason = self._lost
        if first:
            log.warning("%r lost: %s", self, reason)
            if self.on_lost is not None:
                self.on_lost(reason)
        return LeaseLost(f"{self.storage!r}: {reason}")

    def _removed(self, key: str) -> LeaseLost:
        """Loses the lease whose lock ``key`` is gone from the bucket, naming who holds the
        prefix now if anyone does."""
        try:
            live = [h for h in holders(self.storage, self.policy) if h.key != self.key]
        except RemoteError:
            live = []
        now = f"; the prefix is now held by {live[0].describe()}" if live else ""
        return self._lose(
            f"its lock {key} was removed from the bucket (by another writer, or by hand){now}"
        )

    def renew(self) -> None:
        """Writes a new lock, reads the previous one back, then deletes it.

        Raises:
            LeaseLost: the lease was released or is lost: not renewed within
                ``stale_after / 2`` (nothing is written: someone may hold the prefix now),
                or its lock was removed from the bucket.
            RemoteError: the new lock could not be written (the old one stands).
        """
        with self._turn:
            self.check()
            key = f"{LOCKS}{self.writer}-{secrets.token_hex(8)}"
            started = time.monotonic()
            self.storage.put_bytes(key, _body(self.writer))  # not under _lock: check() waits not
            with self._lock:
                old, self.key, self._renewed, self._failure = self.key, key, started, None
            with _held_lock:
                _held.add(key)
                _held.discard(old)
            try:  # after the new PUT: a removal up to now is seen
                self.storage.get_bytes(old)
            except RemoteNotFound:
                raise self._removed(old) from None
            except RemoteError as e:  # unknown: the next renewal reads the new one back
                log.info("%r: could not read back the previous lock %s: %s", self, old, e)
            try:
                self.storage.delete(old)
            except RemoteError as e:  # it goes stale on its own
                log.info("%r: the previous lock %s stays until stale: %s", self.storage, old, e)

    def check(self) -> None:
        """Raises :class:`LeaseLost` unless the lease is still surely ours (renewed within
        ``stale_after / 2``, not released, not found lost): called before each commit made
        under it. Local only; :meth:`confirm` also asks the bucket."""
        with self._lock:
            if self._released:
                raise LeaseLost(f"{self.storage!r}: the lease was released")
            if self._lost is not None:
                raise LeaseLost(f"{self.storage!r}: {self._lost}")
            quiet = time.monotonic() - self._renewed
            failure = self._failure
        if quiet > self.policy.stale_after / 2:
            why = f"; the last try failed: {failure}" if failure else ""
            raise self._lose(
                f"the lease was not renewed for {quiet:.0f} s{why} (another writer may take it "
                f"after {self.policy.stale_after:.0f} s): nothing is committed under it until "
                "it is taken again"
            )

    def confirm(self) -> None:
        """:meth:`check`, then reads the lock back from the bucket (one GET): called right
        before a commit point, so a lock removed by someone else stops the commit.

        Raises:
            LeaseLost: as :meth:`check`, or the lock is gone from the bucket.
            RemoteError: the lock could not be read.
        """
        with self._turn:
            self.check()
            with self._lock:
                key = self.key
            try:
                self.storage.get_bytes(key)
            except RemoteNotFound:
                raise self._removed(key) from None

    def keep_renewed(self) -> None:
        """Starts the thread that renews the lease every ``refresh_every`` seconds until
        :meth:`release` (a failed renewal is logged and tried at the next turn)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._renewing, name=f"lease {self.key}", daemon=True
            )
            self._thread.start()

    def _renewing(self) -> None:
        while True:
            wait = self.policy.refresh_every
            with self._lock:
                if self._failure is not None:  # wake at the bound too, to say it is lost
                    bound = self._renewed + self.policy.stale_after / 2 - time.monotonic()
                    wait = min(wait, max(0.0, bound) + 0.01)
            if self._stop.wait(wait):
                return
            try:
                self.renew()
            except LeaseLost:
                return
            except (RemoteError, OSError) as e:
                with self._lock:
                    self._failure = str(e)
                log.warning("%r: renewing the lease failed (tried again later): %s", self, e)

    def release(self, *, wait: bool = True) -> None:
        """Stops renewing and deletes the lock (one that cannot be deleted goes stale, or
        is removed as a leftover by this writer's next lease on this host).

        Args:
            wait: False deletes the lock in a background thread: after a failed push the
                error is reported at once, not after the delete's own retries.
        """
        with self._lock:
            if self._released:
                return
            self._released = True
        self._stop.set()
        if not wait:
            threading.Thread(target=self._delete, name=f"release {self.key}", daemon=True).start()
            return
        self._delete()

    def _delete(self) -> None:
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with _held_lock:
            _held.discard(self.key)
        try:
            self.storage.delete(self.key)
        except RemoteError as e:
            log.info("%r: could not delete the lock (it goes stale): %s", self, e)


@contextlib.contextmanager
def open_lease(
    storage: LeaseStorage, writer: str, policy: LeasePolicy | None = None
) -> Iterator[Lease]:
    """Holds the lease for the block, renewed meanwhile; released at its end.

    Raises:
        LeaseHeld: another writer holds the prefix.
    """
    lease = Lease.acquire(storage, writer, policy)
    try:
        lease.keep_renewed()
        yield lease
    finally:
        lease.release()


__all__ = [
    "LOCKS",
    "Holder",
    "Lease",
    "LeaseHeld",
    "LeaseLost",
    "LeasePolicy",
    "LeaseStorage",
    "holders",
    "open_lease",
]
