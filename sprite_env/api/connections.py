"""Connection slots: how many connections the API serves, per client and in all.

Every accepted connection holds a :class:`Slot` until it closes. A client is the process
at the other end of the Unix socket, known by its credentials (``SO_PEERCRED``: pid and
uid). The bounds:

==============  =====  ==================================================================
bound           value  why
==============  =====  ==================================================================
in all          256    descriptors: the daemon also holds the store's packs, the catalog
                       and the view's open files under the default limit of 1,024
per uid         128    one user (a compromised sandbox user given the socket group)
                       cannot take every slot: the others always find half of them
per pid         64     one runaway process (a client looping on ``connect``) cannot take
                       its user's share, while 50 threads of one client polling during a
                       job (each waiting its turn: ``pacing.py``) all fit
==============  =====  ==================================================================

With the daemon's front process (``front.py``), the front accepts every connection and
answers repeated list and info requests itself; a connection enters this table when the
front hands it over (anything else, or no whole request within its 0.5 s grace), so the
bounds apply from then on.

A slot is *idle* while its connection has no complete request: a new connection before
its first byte, a request still arriving, a kept-alive connection between requests.
Idle connections make room: when a new connection finds its client at a bound, the
client's longest-idle connection is closed; when the daemon is at its bound in all, the
longest-idle connection of anyone is. A connection being answered is never closed, so
the bounds only ever wait (the listen backlog) or refuse (503 ``busy``) when that many
requests are really being served. Measured before (issue 15): 300 connections that sent
nothing held all 256 slots for their 60 s idle timeout, and a normal request waited 58 s;
with eviction it is served at once.
"""

from __future__ import annotations

import contextlib
import socket as stdsocket
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

MAX_TOTAL = 256
MAX_PER_UID = 128
MAX_PER_PID = 64

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True)
class Peer:
    """Who is at the other end of a Unix socket connection."""

    pid: int
    uid: int


def peer_of(stream: trio.abc.Stream) -> Peer | None:
    """The peer's credentials; None for a stream that is not a Unix socket (memory streams
    in tests), which is then bound only by the total."""
    sock = getattr(stream, "socket", None)
    if sock is None or sock.family != stdsocket.AF_UNIX:
        return None
    try:
        raw = sock.getsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_PEERCRED, _UCRED.size)
    except OSError:
        return None
    pid, uid, _gid = _UCRED.unpack(raw)
    return Peer(pid, uid)


class Slot:
    """One connection's place in the table."""

    def __init__(self, peer: Peer | None) -> None:
        self.peer = peer
        #: ``trio.current_time()`` since when the connection has been idle; None: busy.
        self.idle_since: float | None = None
        #: Closed to make room: the connection ends at its next step.
        self.evicted = False
        self._scope: trio.CancelScope | None = None

    @contextlib.contextmanager
    def idle(self) -> Iterator[trio.CancelScope]:
        """Marks the connection idle for the block; the block is cancelled if the slot is
        evicted meanwhile (then ``scope.cancelled_caught`` or :attr:`evicted` is true)."""
        with trio.CancelScope() as scope:
            self._scope = scope
            self.idle_since = trio.current_time()
            try:
                yield scope
            finally:
                self._scope = None
                self.idle_since = None

    def evict(self) -> None:
        self.evicted = True
        if self._scope is not None:
            self._scope.cancel()


class ConnectionTable:
    """The slots of one listener (see the module docstring for the bounds).

    Only the accept loop calls :meth:`wait_for_room` and :meth:`admit`; connections call
    :meth:`release` when they end.
    """

    def __init__(
        self, total: int = MAX_TOTAL, per_uid: int = MAX_PER_UID, per_pid: int = MAX_PER_PID
    ) -> None:
        self.total = total
        self.per_uid = per_uid
        self.per_pid = per_pid
        self.slots: set[Slot] = set()
        self.evictions = 0
        self._freed = trio.lowlevel.ParkingLot()

    def __len__(self) -> int:
        return len(self.slots)

    async def wait_for_room(self) -> None:
        """Returns once a new connection fits the total: at once if a slot is free or an
        idle connection could be closed, else when a connection ends."""
        while len(self.slots) >= self.total:
            if not self.evict_idle(lambda s: True):
                await self._freed.park()

    def admit(self, peer: Peer | None) -> Slot | None:
        """A slot for a new connection from ``peer``; None if that client is at a bound with
        none of its connections idle (the caller refuses it). Call after
        :meth:`wait_for_room`."""
        if peer is not None:
            bounds: list[tuple[Callable[[Slot], bool], int]] = [
                (lambda s: s.peer is not None and s.peer.uid == peer.uid, self.per_uid),
                (lambda s: s.peer == peer, self.per_pid),
            ]
            for match, bound in bounds:
                while sum(1 for s in self.slots if match(s)) >= bound:
                    if not self.evict_idle(match):
                        return None
        slot = Slot(peer)
        self.slots.add(slot)
        return slot

    def release(self, slot: Slot) -> None:
        if slot in self.slots:
            self.slots.discard(slot)
            self._freed.unpark()

    def evict_idle(self, match: Callable[[Slot], bool]) -> bool:
        """Closes the longest-idle connection that ``match``es; False if none is idle.

        The slot is free at once (its connection closes its socket as its next step).
        """
        idle = [s for s in self.slots if s.idle_since is not None and match(s)]
        if not idle:
            return False
        oldest = min(idle, key=lambda s: s.idle_since or 0.0)
        oldest.evict()
        self.release(oldest)
        self.evictions += 1
        return True
