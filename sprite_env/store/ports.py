"""The store's narrow ports: the Protocols the layers above read and write objects through.

- :class:`ObjectReader` reads objects by id, one or many at a time. The
  :class:`~sprite_env.store.repository.Store` is one (``read_many`` locates a batch in one
  catalog query and reads it in coalesced runs, ``store/reader.py``); so are the hash-only
  sink of previews and the pinned readers.
- :class:`PinnedReader` is an :class:`ObjectReader` of a fixed set of objects that keeps
  reading them after a delete and prune removed them, until closed (``Store.pin``: the
  view's open files).
- :class:`ObjectSink` takes objects and names them (a ``StoreWriter``, or the hash-only
  sink that names without storing).
- :class:`PackOpener` is the seam below the reader: it turns a pack's name into a
  descriptor of a local file holding the pack's bytes. The local directory is one
  (``reader.LocalPacks``); an object-storage backend with a local cache is another (how,
  in ``store/reader.py``'s docstring), and nothing above it changes.

Every method blocks and may be called from any thread. Errors are
:class:`~sprite_env.errors.StoreError`: ``ObjectNotFound`` for an id the store does not
have, ``CorruptPack`` for bytes that are missing or do not match.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, cast

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from sprite_env.ids import ObjectId, PackName
    from sprite_env.store.pack import ObjectKind


class ObjectReader(Protocol):
    """Reads objects by id."""

    def read(self, oid: ObjectId) -> bytes:
        """An object's raw bytes, verified against its id.

        Raises:
            ObjectNotFound: the store has no such object.
            CorruptPack: its pack is missing or its bytes are bad.
        """
        ...

    def read_many(self, oids: Sequence[ObjectId]) -> list[bytes]:
        """The objects' raw bytes, in the order given (repeats allowed); one batch costs
        about as much as one object where they lie together in a pack.

        Raises:
            ObjectNotFound: one of them is not in the store.
            CorruptPack: a pack is missing or an object's bytes are bad.
        """
        ...


class PinnedReader(ObjectReader, Protocol):
    """Reads a fixed set of objects until closed, even after they left the catalog."""

    def close(self) -> None:
        """Lets go of the pinned objects (idempotent)."""
        ...


class ObjectSink(Protocol):
    """Where a capture puts objects (a ``StoreWriter``, or a hash-only sink)."""

    def put(self, data: bytes, kind: ObjectKind = ...) -> ObjectId:
        """Adds an object (unless there already) and returns its id at once."""
        ...


class PackOpener(Protocol):
    """Where the reader gets a pack's bytes: a descriptor of a local file holding them."""

    def open(self, name: PackName) -> int:
        """A new read-only descriptor of the pack; the caller closes it.

        Raises:
            FileNotFoundError: the store has no such pack (pruned, or lost).
            OSError: it could not be opened.
        """
        ...


class _OneByOne:
    """An :class:`ObjectReader` over a plain ``read`` callable (no batching to gain)."""

    def __init__(self, read: Callable[[ObjectId], bytes]) -> None:
        self.read = read

    def read_many(self, oids: Sequence[ObjectId]) -> list[bytes]:
        return [self.read(oid) for oid in oids]


def reader_of(read: ObjectReader | Callable[[ObjectId], bytes]) -> ObjectReader:
    """``read`` as an :class:`ObjectReader`: a reader itself, the reader whose bound
    ``read`` method it is (``store.read`` gives the store, and its batched ``read_many``),
    or any other callable read one object at a time."""
    if callable(getattr(read, "read_many", None)):
        return cast("ObjectReader", read)
    owner = getattr(read, "__self__", None)
    if callable(getattr(owner, "read_many", None)) and getattr(owner, "read", None) == read:
        return cast("ObjectReader", owner)
    return _OneByOne(cast("Callable[[ObjectId], bytes]", read))


__all__ = ["ObjectReader", "ObjectSink", "PackOpener", "PinnedReader", "reader_of"]
