"""Where a store's packs live: the local directory alone, or a bucket with a bounded local
cache (issue 14, ``--store s3://BUCKET/PREFIX``).

A store in object storage is still a local store directory (the daemon's
``STATE/store``, an offline command's ``ROOT/.sprite/store``): its catalog, the packs
captured here and not yet durable in the bucket (``packs/``), and a bounded cache of packs
that are (``cache/``, see ``cache.py``). :class:`RemoteConfig` is the one value the
command line hands down (the URL and the cache's bound); :func:`open_backed_store` opens
the store with it:

- the bucket is asked first (one listing of ``catalog/``), so a bad endpoint, wrong
  credentials or a missing bucket stop the start with one clear error
  (:class:`RemoteUnusable`), after the client's retry bound;
- a store directory that does not exist yet, over a bucket that holds generations, is made
  from the newest complete generation's catalog alone (a lazy pull, ``remote.pull``):
  packs are fetched when first read, so a fork shares the parent's objects instead of
  copying them;
- reads of packs not in ``packs/`` then go through :class:`~sprite_env.store.cache.RemotePacks`.

Every function blocks.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sprite_env.errors import NotAStore, UserError
from sprite_env.store.cache import DEFAULT_MAX_BYTES, RemotePacks
from sprite_env.store.remote import WRITER_KEY, generations, pull
from sprite_env.store.remote_gc import GcPolicy
from sprite_env.store.repository import MARKER, open_store
from sprite_env.store.s3 import RemoteError, S3Storage, StoreUrl

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sprite_env.store.remote import ObjectStorage
    from sprite_env.store.repository import Store

#: The default bound of the local pack cache (``--cache-size``): 64 packs of 32 MiB.
DEFAULT_CACHE_BYTES = DEFAULT_MAX_BYTES
#: The cache's directory inside the local store directory.
CACHE_DIR = "cache"

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", re.IGNORECASE)


class BadCacheSize(UserError):
    """A ``--cache-size`` that is no positive size."""


class RemoteUnusable(UserError):
    """The bucket cannot be used at all: no such bucket, an endpoint that does not answer,
    credentials it refuses. Said at start, before anything is opened or written."""


def parse_size(text: str) -> int:
    """``2G``, ``512MiB``, ``1.5g``, ``1000000`` (binary units; a bare number is bytes).

    Raises:
        BadCacheSize: not a size, or not positive.
    """
    m = _SIZE.fullmatch(text)
    if m is None:
        raise BadCacheSize(f"not a size: {text!r} (say e.g. 2G, 512M or a number of bytes)")
    size = int(float(m[1]) * _UNITS[m[2].lower()])
    if size <= 0:
        raise BadCacheSize(f"the cache size must be positive: {text!r}")
    return size


def is_remote(store: str | None) -> bool:
    """Whether a ``--store`` value names object storage (``s3://...``), not a directory."""
    return store is not None and "://" in store


@dataclass(frozen=True, slots=True)
class RemoteConfig:
    """A store whose packs and catalog live in object storage: the bucket and prefix, the
    bound of the local pack cache (bytes), and what remote deletes keep. Endpoint and
    credentials come from the standard AWS configuration (``s3.make_client``)."""

    url: StoreUrl
    cache_bytes: int = DEFAULT_CACHE_BYTES
    gc: GcPolicy = GcPolicy()

    @classmethod
    def parse(
        cls, store: str, cache_size: str | None = None, env: Mapping[str, str] | None = None
    ) -> RemoteConfig:
        """From ``--store s3://BUCKET/PREFIX``, ``--cache-size`` and the environment's
        ``SPRITE_ENV_REMOTE_KEEP`` and ``SPRITE_ENV_REMOTE_GRACE``: a bad value is said
        here, before a daemon starts anything, not at its first remote delete.

        Raises:
            BadStoreUrl: not an ``s3://`` URL with a bucket.
            BadCacheSize: not a positive size.
            BadRemoteSetting: a keep or grace that is not a number, or out of range.
        """
        size = parse_size(cache_size) if cache_size is not None else DEFAULT_CACHE_BYTES
        return cls(StoreUrl.parse(store), size, GcPolicy.from_env(env))

    def __str__(self) -> str:
        return f"s3://{self.url.bucket}/{self.url.prefix}"

    def storage(self) -> S3Storage:
        """A client of the bucket (0.3 s to make: once per process)."""
        return S3Storage(self.url)


def connect(remote: RemoteConfig) -> S3Storage:
    """The bucket, asked once (a listing of ``catalog/``) so that a store that cannot be
    used fails here, with the server's words and what to check.

    Raises:
        RemoteUnusable: the request failed (after the client's retries: ``AWS_MAX_ATTEMPTS``).
    """
    storage = remote.storage()
    try:
        storage.list("catalog/")
    except RemoteError as e:
        raise RemoteUnusable(
            f"cannot use the store {remote}: {e}. Check the bucket's name, AWS_ENDPOINT_URL "
            "and the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or ~/.aws/)"
        ) from None
    return storage


def open_backed_store(
    path: str,
    remote: RemoteConfig | None,
    *,
    create: bool = False,
    writable: bool = True,
    repair: bool = False,
    storage: ObjectStorage | None = None,
) -> Store:
    """Opens the store at ``path``, its packs in the bucket of ``remote`` if given.

    Args:
        path: the local store directory.
        remote: where its packs and catalog generations live; None: ``path`` alone.
        create: create the local store if missing. With a remote, a missing local store is
            also made (``create`` or not) when the bucket holds a generation: from its
            catalog alone, the packs fetched as they are read.
        writable, repair: as for :func:`~sprite_env.store.repository.open_store`.
        storage: the bucket's client (default: :func:`connect` to ``remote``).

    Raises:
        RemoteUnusable: the bucket cannot be used.
        RemoteStoreError: the bucket holds generations but none complete.
        NotAStore: no store at ``path`` and, with a remote, none in the bucket either
            (and ``create`` is false).
    """
    if remote is None:
        return open_store(path, create=create, writable=writable, repair=repair)
    if storage is None:
        storage = connect(remote)
    if _never_used(path) and generations(storage):
        pull(storage, path, lazy=True)
    elif not os.path.lexists(os.path.join(path, MARKER)):
        if not create:
            raise NotAStore(
                f"no sprite-env store at {path}, and {remote} holds none either (nothing "
                "was created)"
            )
        open_store(path, create=True).close()
    packs = RemotePacks(storage, os.path.join(path, CACHE_DIR), remote.cache_bytes)
    return open_store(path, create=create, writable=writable, repair=repair, remote=packs)


def _never_used(path: str) -> bool:
    """Whether the local store at ``path`` is missing, or holds nothing and never pushed (a
    ``store init``, or a lazy pull interrupted before its catalog's rename): then the
    bucket's newest generation is the store, not an empty catalog that would shadow it."""
    if not os.path.lexists(os.path.join(path, MARKER)):
        return True
    with open_store(path, writable=False) as s:
        return not s.catalog.packs() and s.catalog.meta(WRITER_KEY) is None


__all__ = [
    "CACHE_DIR",
    "DEFAULT_CACHE_BYTES",
    "BadCacheSize",
    "RemoteConfig",
    "RemoteUnusable",
    "connect",
    "is_remote",
    "open_backed_store",
    "parse_size",
]
