"""Content-addressed object store: the bottom layer of sprite-env.

Concepts:

- An **object** is a byte string named by its BLAKE3-256 (:class:`~sprite_env.ids.ObjectId`);
  the same bytes are stored once. Kinds: data chunks, trees, chunk lists, metadata
  (:class:`ObjectKind`).
- Objects are zstd-compressed one by one (raw when that saves under 3%) and appended to
  **packs**: immutable ~32 MiB files, data and metadata apart, each with per-object
  headers and a trailing table (format in ``pack.py``).
- The **catalog** (SQLite, WAL; schema in ``catalog.py``) maps object ids to pack and
  offset. It is the single source of truth, and can be rebuilt from the packs.
- A :class:`StoreWriter` (``writer.py``) commits packs and catalog rows in one transaction;
  a crash at any instant leaves the previous state, and orphan packs are deleted at the
  next open. One writer at a time (flock).
- Every read of a pack's objects goes through ``reader.py``: :meth:`Store.read_many`
  (batched lookups, coalesced reads) and :meth:`Store.pin` (objects that stay readable
  across a prune, for the view's open files), over pack descriptors the store shares.
  Layers above depend on the Protocols of ``ports.py`` (``ObjectReader``,
  ``PinnedReader``, ``ObjectSink``); a remote backend plugs in below the reader
  (``PackOpener``).
- The store is private to its owner: directories 0700, files 0600 whatever the umask (a
  pack holds every captured byte, whatever the file's own mode); a writable open tightens
  an older, open store and ``check`` reports one (``sprite_env/privacy.py``).
- The store knows nothing about files; ``snapshot`` builds files out of objects.
- :func:`plan_prune` / :meth:`PrunePlan.execute` garbage-collect it, given the ids still
  reachable (``prune.py``).
"""

from sprite_env.store.check import CheckReport, RebuildReport, Stats, check, rebuild, stats
from sprite_env.store.pack import ObjectKind
from sprite_env.store.prune import PackUsage, PrunePlan, PruneReport, execute_prune, plan_prune
from sprite_env.store.repository import Store, open_store
from sprite_env.store.writer import StoreWriter, WriteStats

__all__ = [
    "CheckReport",
    "ObjectKind",
    "PackUsage",
    "PrunePlan",
    "PruneReport",
    "RebuildReport",
    "Stats",
    "Store",
    "StoreWriter",
    "WriteStats",
    "check",
    "execute_prune",
    "open_store",
    "plan_prune",
    "rebuild",
    "stats",
]
