"""A bounded local cache of a remote store's packs: the object-storage ``PackOpener``.

:class:`RemotePacks` gives the reader (``store/reader.py``'s :class:`PackFiles`) a
descriptor of a local file holding a pack, as the local directory does; on a miss it
downloads the pack from the bucket first. So a machine that pulled only a catalog reads
(restores, browses) by fetching just the packs it touches.

- A cache entry is ``<dir>/<name>.pack``, downloaded under a temporary name, verified
  against its name (a pack's name is the BLAKE3 of its bytes) and renamed. Packs are
  immutable, so an entry never goes stale and needs no invalidation; entries left by an
  earlier process are used as they are (``open`` re-verifies none: a damaged one is found
  by the reader's per-object hash, as in a local store).
- The cache holds at most ``max_bytes``: after a fetch (or an adopt, and at open, for a
  bound smaller than the last process's), the least recently opened entries are unlinked
  until it fits (the newest entry is always kept, so one pack larger than the bound still
  works). A reader holding a descriptor of an evicted entry keeps
  reading it (an unlinked file stays readable; ``PackFiles`` closes such a descriptor when
  its last reader lets go, so the space comes back).
- Downloads of different packs run in parallel; two threads missing the same pack fetch
  it once.
- In a store (``Store(remote=...)``, made by ``backend.py``) the cache is ``<store>/cache``,
  beside ``packs/``: a pack captured here stays in ``packs/``, out of the bound, until a
  generation naming it is durable in the bucket; then :meth:`RemotePacks.adopt` moves it
  here (a rename), and it may be evicted like any fetched pack. So the bound never
  pushes out the only copy of a pack.

- A read of a few objects of a pack that is not cached (the view or ``checkpoints cat``
  of one small file on a fresh machine) may fetch just their byte ranges instead
  (:meth:`RemotePacks.open_entries`): one ranged GET per run of nearby objects, into a
  private, unlinked file of the pack's size that only its caller reads (its other bytes
  are holes, never read: the caller reads only those objects, each checked by the
  reader's hash, as it is not verified against the pack's name). Only while the ranges
  are a small part of the pack (:data:`RANGE_SHARE`, :data:`RANGE_MAX` requests) and the
  pack has not been read so :data:`RANGE_READS` times already; else the pack is fetched
  whole and cached as above.

- A disk that fills before the bound is reached (the cache shares it with the layer, or
  the bound is larger than the disk): a download that fails with ``ENOSPC`` unlinks the
  least recently opened entries until the pack fits and is tried once more; if the disk
  still cannot hold it, the error says where and what to do (:class:`CacheFull`). The
  partial download is removed either way.

Errors: a pack the bucket does not have is ``FileNotFoundError`` (the ``PackOpener``
contract: the reader reports it as a missing pack); a failed request is
:class:`~sprite_env.store.s3.RemoteError`; bytes that do not match the name are
:class:`~sprite_env.store.remote.RemoteStoreError`, and nothing is cached.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sprite_env import privacy
from sprite_env.errors import StoreError
from sprite_env.ids import PackName
from sprite_env.store.pack import pack_path
from sprite_env.store.remote import fetch_verified
from sprite_env.store.s3 import RemoteNotFound

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from sprite_env.store.remote import ObjectStorage

#: The default bound of a cache: 2 GiB, 64 packs of the 32 MiB target size.
DEFAULT_MAX_BYTES = 2 << 30
#: Downloads at once when a reader asks for many packs (:meth:`RemotePacks.prefetch`). One
#: at a time, an export on a fresh machine from the local Swift ran at 24 MB/s against
#: restic's 4 connections; more than the two cores can verify gains nothing.
PREFETCH_WORKERS = 4
#: A read fetches only its byte ranges while they are at most this share of the pack (a
#: 32 MiB pack: 4 MiB); more, and the whole pack is worth its one download and a place in
#: the cache for the reads that follow.
RANGE_SHARE = 1 / 8
#: ... in at most this many ranged GETs (each a round trip, ~7 ms on the local Swift)...
RANGE_MAX = 16
#: ... merging ranges this close (the bytes between are fetched and unused), as the
#: reader's runs do (``reader.MAX_GAP``).
RANGE_GAP = 64 << 10
#: A pack read by ranges this many times is fetched whole at the next read: it is being
#: read often (a walk of many trees in one tree pack), and the cache keeps it.
RANGE_READS = 4


@dataclass
class CacheStats:
    """What a :class:`RemotePacks` did since it was made."""

    hits: int = 0
    fetched: int = 0
    bytes_fetched: int = 0
    evicted: int = 0
    ranged: int = 0  # ranged GETs (open_entries)
    bytes_ranged: int = 0


class CacheFull(StoreError):
    """The cache's disk cannot hold a pack even with every other entry gone."""


class RemotePacks:
    """The :class:`~sprite_env.store.ports.PackOpener` of a store in object storage, with
    a bounded cache in ``cache_dir``; see the module docstring. Thread-safe.

    Args:
        storage: the bucket (names relative to the store's prefix).
        cache_dir: the cache (made 0700 if missing).
        max_bytes: the bound on the cached packs' total size.
    """

    def __init__(
        self, storage: ObjectStorage, cache_dir: str, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self.storage = storage
        self.dir = cache_dir
        self.max_bytes = max_bytes
        self.stats = CacheStats()
        privacy.make_dir(cache_dir)
        self._lock = threading.Lock()
        self._fetching: dict[str, threading.Lock] = {}
        self._range_reads: dict[str, int] = {}  # pack -> reads by range so far
        #: The bucket's packs (name -> size), listed at the first :meth:`size` of a pack
        #: not cached; a lock of its own, so no open waits for a listing.
        self._listed: dict[str, int] | None = None
        self._list_lock = threading.Lock()
        #: Told of each evicted pack (a store drops its idle descriptor of it, so the
        #: unlinked file's space comes back); called under the cache's lock.
        self.on_evict: Callable[[PackName], None] | None = None
        # name -> size, least recently opened first; an earlier process's entries by mtime
        found = []
        for fname in os.listdir(cache_dir):
            path = os.path.join(cache_dir, fname)
            if fname.endswith(".part"):  # a download cut short
                os.unlink(path)
            elif fname.endswith(".pack"):
                st = os.stat(path)
                found.append((st.st_mtime_ns, fname[: -len(".pack")], st.st_size))
        self._entries: OrderedDict[str, int] = OrderedDict(
            (name, size) for _, name, size in sorted(found)
        )
        if self._entries:  # a smaller bound than the last process had (--cache-size)
            with self._lock:
                self._evict(keep=next(reversed(self._entries)))

    def cached_bytes(self) -> int:
        with self._lock:
            return sum(self._entries.values())

    def cached(self) -> list[PackName]:
        """The names of the packs in the cache, least recently opened first."""
        with self._lock:
            return [PackName(n) for n in self._entries]

    def size(self, name: PackName) -> int | None:
        """The pack's size where it can be read from: its cache entry, else the bucket's
        listing (made at the first ask, again by :meth:`refresh`); None: neither has it.

        Raises:
            RemoteError: the listing failed.
        """
        with self._lock:
            if name in self._entries:
                return self._entries[name]
        return self._listing().get(name)

    def refresh(self) -> None:
        """Lists the bucket's packs again at the next :meth:`size` (another process may
        have uploaded some)."""
        with self._list_lock:
            self._listed = None

    def _listing(self) -> dict[str, int]:
        with self._list_lock:
            if self._listed is None:
                cut = len("packs/")
                self._listed = {
                    k[cut : -len(".pack")]: n
                    for k, n in self.storage.list("packs/").items()
                    if k.endswith(".pack")
                }
            return self._listed

    def adopt(self, name: PackName, path: str) -> None:
        """Moves a local pack file that is durable in the bucket (named by a generation
        whose PUT answered) into the cache, where the bound applies to it: a rename, so a
        reader holding a descriptor of it reads on.

        Raises:
            OSError: ``path`` cannot be moved (it stays where it is).
        """
        with self._lock:
            size = os.stat(path).st_size
            os.rename(path, pack_path(self.dir, name))
            self._entries[name] = size
            self._entries.move_to_end(name)
            self._evict(keep=name)
        with self._list_lock:
            if self._listed is not None:
                self._listed[name] = size

    def discard(self, name: PackName) -> None:
        """Drops the pack's cache entry, if any (a prune dropped the pack: only the local
        copy goes, never the bucket's)."""
        with self._lock:
            if self._entries.pop(name, None) is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(pack_path(self.dir, name))

    def download(self, name: PackName, dest: str) -> None:
        """The bucket's bytes of the pack into a new file ``dest``, as they are (not
        verified, not cached): what ``store check --read-data`` reads.

        Raises:
            FileNotFoundError: the bucket has no such pack.
            RemoteError: the download failed.
        """
        try:
            self.storage.get_file(f"packs/{name}.pack", dest)
        except RemoteNotFound:
            raise FileNotFoundError(f"pack {name} is not in {self.storage!r}") from None

    def open(self, name: PackName) -> int:
        """A read-only descriptor of the pack's cache entry, fetched first on a miss.

        Raises:
            FileNotFoundError: the bucket has no such pack.
            RemoteError: the download failed.
            RemoteStoreError: the downloaded bytes are not the pack's.
        """
        fd = self._open_cached(name)
        if fd is not None:
            return fd
        with self._lock:
            gate = self._fetching.setdefault(name, threading.Lock())
        with gate:  # one download per pack, however many threads miss it
            fd = self._open_cached(name)
            if fd is not None:
                return fd
            path = pack_path(self.dir, name)
            try:
                self._fetch(name, path)
            except RemoteNotFound:
                raise FileNotFoundError(f"pack {name} is not in {self.storage!r}") from None
            finally:
                with self._lock:
                    self._fetching.pop(name, None)
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            size = os.fstat(fd).st_size
            with self._lock:
                self._entries[name] = size
                self.stats.fetched += 1
                self.stats.bytes_fetched += size
                self._evict(keep=name)
            return fd

    def open_entries(self, name: PackName, spans: Iterable[tuple[int, int]]) -> int | None:
        """A descriptor of a new private file of the pack's size that holds the pack's
        bytes at ``spans`` (``(offset, length)`` pairs) and holes elsewhere, fetched by
        ranged GETs; or None: the pack is cached, not listed, or the spans are too large
        a part of it (see the module docstring), so :meth:`open` it whole.

        The file is unlinked from its birth (``O_TMPFILE`` in the cache's directory): no
        one else can open it, and its space goes when the caller closes it. The caller
        must read nothing outside ``spans``; an object read from them is checked by the
        reader's hash (the bytes cannot be verified against the pack's name).

        Raises:
            FileNotFoundError: the pack left the bucket since it was listed.
            RemoteError: a request failed.
            OSError: the file could not be made (a full disk).
        """
        with self._lock:
            if name in self._entries or self._range_reads.get(name, 0) >= RANGE_READS:
                return None
        size = self._listing().get(name)
        if size is None:
            return None  # open() asks the bucket, and says it is missing
        runs: list[list[int]] = []  # [start, end)
        for offset, length in sorted(spans):
            end = min(offset + length, size)
            if runs and offset - runs[-1][1] <= RANGE_GAP:
                runs[-1][1] = max(runs[-1][1], end)
            elif offset < end:
                runs.append([offset, end])
        if not runs or len(runs) > RANGE_MAX:
            return None
        if sum(end - start for start, end in runs) > size * RANGE_SHARE:
            return None
        fd = _private_file(self.dir)
        try:
            os.ftruncate(fd, size)  # holes: reads keep to the pack's bounds
            got = 0
            for start, end in runs:
                try:
                    data = self.storage.get_range(f"packs/{name}.pack", start, end - start)
                except RemoteNotFound:
                    raise FileNotFoundError(f"pack {name} is not in {self.storage!r}") from None
                os.pwrite(fd, data, start)
                got += len(data)
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            self._range_reads[name] = self._range_reads.get(name, 0) + 1
            self.stats.ranged += len(runs)
            self.stats.bytes_ranged += got
        return fd

    def prefetch(self, names: Iterable[PackName]) -> None:
        """Fetches the packs of ``names`` not cached, several at once (a reader about to
        open them one by one would wait for each download in turn). At most half the
        cache's bound is fetched ahead, so what is fetched is not evicted before it is
        read; an error is left for the reader's own :meth:`open` to raise."""
        with self._lock:
            missing = [n for n in dict.fromkeys(names) if n not in self._entries]
        if len(missing) < 2:
            return
        listing = self._listing()
        chosen, total = [], 0
        for n in missing:
            size = listing.get(n)
            if size is None:
                continue  # not in the bucket: the reader's open says so
            if total + size > self.max_bytes // 2:
                break
            chosen.append(n)
            total += size
        if len(chosen) < 2:
            return

        def fetch(name: PackName) -> None:
            with contextlib.suppress(Exception):  # the reader's open raises it again
                os.close(self.open(name))

        with ThreadPoolExecutor(min(PREFETCH_WORKERS, len(chosen)), "pack-fetch") as pool:
            list(pool.map(fetch, chosen))

    def _fetch(self, name: PackName, path: str) -> None:
        """The download, with room made on a full disk (see the module docstring)."""
        try:
            fetch_verified(self.storage, f"packs/{name}.pack", path, name)
            return
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
        need = self.size(name) or 0
        with self._lock:
            freed = 0
            for victim in list(self._entries):
                if need and freed >= need:
                    break
                freed += self._drop(victim)
        try:
            fetch_verified(self.storage, f"packs/{name}.pack", path, name)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            raise CacheFull(
                f"the pack cache {self.dir} is on a full disk: pack {name} ({need} bytes) "
                "does not fit even with the rest of the cache removed; free space there "
                "or give the cache another disk"
            ) from None

    def _open_cached(self, name: str) -> int | None:
        with self._lock:
            if name not in self._entries:
                return None
            try:
                fd = os.open(pack_path(self.dir, name), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:  # removed behind our back: fetch it again
                del self._entries[name]
                return None
            self._entries.move_to_end(name)
            self.stats.hits += 1
            # The order survives a restart: the entry's mtime is its last use.
            with contextlib.suppress(OSError):
                os.utime(fd)
            return fd

    def _evict(self, keep: str) -> None:
        total = sum(self._entries.values())
        for victim in list(self._entries):
            if total <= self.max_bytes:
                break
            if victim == keep:
                continue
            total -= self._drop(victim)

    def _drop(self, victim: str) -> int:
        """Evicts one entry (the lock held); returns its size."""
        size = self._entries.pop(victim)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(pack_path(self.dir, victim))
        self.stats.evicted += 1
        if self.on_evict is not None:
            self.on_evict(PackName(victim))
        return size


def _private_file(directory: str) -> int:
    """A new read-write file in ``directory`` that no name points to (0600)."""
    try:
        return os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise
    # A file system without O_TMPFILE: a name for an instant.
    path = os.path.join(directory, f".ranges-{os.getpid()}-{threading.get_ident()}.part")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    os.unlink(path)
    return fd


__all__ = [
    "DEFAULT_MAX_BYTES",
    "RANGE_MAX",
    "RANGE_READS",
    "RANGE_SHARE",
    "CacheFull",
    "CacheStats",
    "RemotePacks",
]
