"""Where the view gets its checkpoints and objects: the :class:`CheckpointSource` protocol.

The view never opens a store itself. A host hands it a source: the daemon (or a test) the
one of its own :class:`~sprite_env.checkpoints.Engine` (:meth:`StoreSource.from_engine`),
so checkpoints created and deleted through that engine show up in the mount at once; the
standalone ``checkpoints mount`` command one over a store it opened read-only.

Pinning. A checkpoint can be deleted, and its objects pruned, while one of its files is
open. :meth:`CheckpointSource.pin` resolves a file's objects to their pack and offset when
the file is opened and keeps a descriptor of each pack involved: on Linux an unlinked file
stays readable through a descriptor opened before the unlink, and packs are immutable, so
the open file reads the same bytes after a prune dropped its objects from the catalog or
moved them to a new pack. The store does this (``Store.pin``, ``store/reader.py``): the
descriptors are the store's, shared by its readers (one per pack, reference-counted), and a
deleted pack's closes with the last file that uses it; its disk space is freed then (see
``store/prune.py``, "Readers and deleted packs"). The view reads no pack itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sprite_env.checkpoints.registry import Registry
from sprite_env.store.remote import durable_checkpoints

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from sprite_env.checkpoints import Engine
    from sprite_env.ids import ObjectId
    from sprite_env.store import Store
    from sprite_env.store.ports import PinnedReader


@dataclass(frozen=True, slots=True)
class CheckpointRef:
    """What the view needs to know of one checkpoint."""

    id: str
    top_tree: ObjectId  # the tree holding the root directory as its one entry b"."
    create_time_ns: int
    is_auto: bool
    files: int = 0
    bytes: int = 0
    comment: str = ""
    created: str = ""  # RFC 3339 (the API's create_time)
    #: ``remote`` once a generation the store pushed holds it, else ``local`` (issue 14)
    storage: str = "local"


class CheckpointSource(Protocol):
    """The view's window on a store. Every method blocks and may be called from any thread.

    Error handling:
        Methods raise :class:`~sprite_env.errors.SpriteError` (a store error, or
        ``ObjectNotFound`` for an object that is gone); the view turns it into ``EIO``, or
        ``ESTALE`` inside a checkpoint that no longer exists.
    """

    def checkpoints(self) -> Sequence[CheckpointRef]:
        """Every checkpoint (automatic ones included), newest first."""
        ...

    def read(self, oid: ObjectId) -> bytes:
        """An object's raw bytes (trees, chunk lists)."""
        ...

    def pin(self, oids: Iterable[ObjectId]) -> PinnedReader:
        """A reader of ``oids`` that keeps working after a delete and prune removed them.

        Raises:
            ObjectNotFound: one of them is already gone.
        """
        ...


class StoreSource:
    """A :class:`CheckpointSource` over an open store and its checkpoint registry.

    Args:
        store: open writable (an engine's) or read-only; the source never writes.
        registry: the engine's registry, or None to make one over ``store``'s catalog.
    """

    def __init__(self, store: Store, registry: Registry | None = None) -> None:
        self.store = store
        self.registry = registry if registry is not None else Registry(store.catalog)

    @classmethod
    def from_engine(cls, engine: Engine) -> StoreSource:
        """The source a host that owns ``engine`` mounts: it sees the engine's changes."""
        return cls(engine.store, engine.registry)

    def checkpoints(self) -> list[CheckpointRef]:
        """Every checkpoint, newest first, each with its storage as the store recorded it
        (what ``list`` shows; a daemon's uploader records a push before it says so)."""
        remote = durable_checkpoints(self.store)
        return [
            CheckpointRef(
                c.id,
                c.top_tree,
                c.create_time_ns,
                c.is_auto,
                c.files,
                c.bytes,
                c.comment,
                c.create_time,
                "remote" if c.id in remote else "local",
            )
            for c in self.registry.all()
        ]

    def read(self, oid: ObjectId) -> bytes:
        return self.store.read(oid)

    def pin(self, oids: Iterable[ObjectId]) -> PinnedReader:
        return self.store.pin(oids)

    @property
    def open_pack_fds(self) -> int:
        """Pack descriptors the store's readers hold now, the view's open files' among
        them (for tests and statistics)."""
        return self.store.pack_files.held()
