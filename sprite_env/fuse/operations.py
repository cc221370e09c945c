"""The read-only pyfuse3 file system: the newest checkpoints as directories.

Layout: the mount's root lists the ``count`` newest checkpoints (manual ones, or all with
``include_auto``) by id; each is the checkpoint's root directory, with the captured root's
owner, mode, times and xattrs. Everything under it is exactly what was captured. Beside
them the root holds one file of the view's own, ``.checkpoints.json`` (``status.py``):
what each checkpoint shown is (its storage among it), rebuilt at each listing.

Freshness: the root re-lists its source when its listing is older than ``list_ttl``
(on a lookup, ``opendir`` or ``getattr`` of the root), so checkpoints appear and
disappear without a remount; a host that just created or deleted one calls
:meth:`ViewOperations.refresh` to re-list at once. The kernel may trust a checkpoint's
name for ``list_ttl`` and is told to forget a deleted one's at the next listing. Inside a
checkpoint nothing ever changes, so entries and attributes are cached by the kernel for
``timeout`` (a day) and file pages are kept across opens (``keep_cache``).

No open (``ViewConfig.no_open``, with pyfuse3 built with ``.ci/pyfuse3-no-open.patch``):
``open`` and ``opendir`` answer ``ENOSYS``, after which the kernel sends no open, opendir,
release or releasedir at all, keeps file pages across opens and caches every directory's
listing (its defaults for a file system without open, ``fs/fuse/file.c``); symlink targets
are cached too (``FUSE_CAP_CACHE_SYMLINKS``). A second ``diff -r`` of a checkpoint then
sends the view no request (measured on the benchmark layer: ~128k requests before), and a
cold one about one per file and one or two per directory. ``read`` and ``readdir`` then get
the inode (the patch's ``pass_inode_without_fh``); the root's mtime changes with its
listing and ``refresh`` drops the kernel's attributes of the root, so that the kernel,
which checks the mtime before it uses a cached listing, lists the root again.
Without the patch the view opens files as below.

Error handling: handlers raise only ``pyfuse3.FUSEError``. A store error becomes ``EIO``
and one log line (checkpoint, path, error); an object that is missing because its
checkpoint was deleted becomes ``ESTALE``, logged at debug level only, as it is no
fault. Every write operation answers ``EROFS`` (the mount is also read-only, so the
kernel answers most of them itself). An unexpected exception (a bug) is logged with its
traceback and becomes ``EIO``: the file system stays up.

Deleted checkpoints: a file opened before its checkpoint was deleted stays readable until
it is closed: at ``open`` its objects are pinned (see ``source.py``), or, for a small file
whose bytes are already in memory, the handle keeps them. Directories and files not yet
opened in a deleted checkpoint answer ``ESTALE`` once what they need is no longer cached.
Without open, the view cannot know which files are open: a file is pinned at its first read
(unless that read is answered with the whole file, up to ``AHEAD_BATCH``) until the kernel
forgets its inode, which it does not while the file is open (when its checkpoint leaves
the view the kernel is told to drop its names, and forgets the rest). The kernel keeps
every page it was sent; only a small file whose pages it dropped (memory pressure) while
open answers ``ESTALE`` after its checkpoint was deleted and pruned.

Read-ahead, beyond a sequential reader's (``content.py``): opening a small file loads the
small files after it in its directory, and listing a directory loads its subdirectories'
trees, each in one worker call, since a walk (``diff -r``, ``grep -r``, ``cp -r``) reads
them next and a round trip to a worker thread costs as much as reading a small file. The
small files so loaded are also written into the kernel's page cache (``pages.py``), so
their reads cost no request at all; like a small file answered whole, such a file is never
pinned (the kernel keeps its pages). While a walk reads files, the end of a directory's
listing already pushes its small files and loads those of the next directories the walk
will list (``_read_ahead_listed``), and a listing loads two levels of trees ahead.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import logging
import math
import os
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import pyfuse3
import trio

from sprite_env.errors import ObjectNotFound, SnapshotError, SpriteError
from sprite_env.fuse.cache import AsyncLru
from sprite_env.fuse.content import AHEAD_BATCH, Directory, FileLayout, OpenFile
from sprite_env.fuse.inodes import (
    ROOT_INODE,
    InodeTable,
    Node,
    entry_attributes,
    root_attributes,
)
from sprite_env.fuse.pages import PagePusher
from sprite_env.fuse.status import STATUS_INODE, STATUS_NAME, status_attributes, status_bytes
from sprite_env.fuse.workers import Workers
from sprite_env.ids import ObjectId
from sprite_env.snapshot.tree import Kind, decode_chunks

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Sequence

    from sprite_env.fuse.source import CheckpointRef, CheckpointSource
    from sprite_env.snapshot.tree import TreeEntry
    from sprite_env.store.ports import PinnedReader

log = logging.getLogger(__name__)

#: Files up to this size are read ahead when a file of their directory is opened ...
SMALL_FILE = 256 << 10
#: ... up to this many bytes per directory at a time.
DIR_AHEAD_BYTES = 4 << 20
#: Subdirectories whose trees are loaded when a directory is listed.
TREES_AHEAD = 64
#: Seconds after a file's first read during which a directory's small files are read
#: ahead and pushed when its listing ends, before any of them is read (see
#: ``_read_ahead_listed``): a walk that reads files reads those of the directories it
#: lists next. Once nothing was read for this long, listing loads no file again.
READING_WALK = 5.0
#: Directories after a listed one, in the order of a depth-first walk, whose small files
#: are loaded at the end of its listing, up to ``WALK_AHEAD_BYTES`` in all, during a
#: reading walk.
WALK_AHEAD_DIRS = 8
WALK_AHEAD_BYTES = 4 << 20
#: Seconds the read that started a directory's read-ahead waits, at most, for the pages
#: of the files after it to be in the kernel before it answers: its reader (a walk) asks
#: for them next, and a push that lands after that read costs a request all the same
#: (measured: 16.7k of 22k pushed files were still read through the view when the first
#: read did not wait). A push of a 4 MiB batch takes a few milliseconds.
PUSH_WAIT = 0.05

P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class ViewConfig:
    """What the view shows and how much it caches.

    Attributes:
        count: how many checkpoints the root shows, newest first.
        include_auto: show automatic checkpoints too (they count towards ``count``).
        list_ttl: seconds a listing of the root is trusted before the source is asked
            again; also the kernel's entry timeout of the root's names.
        timeout: the kernel's entry and attribute timeout inside a checkpoint.
        object_cache_bytes: the LRU of decoded objects shared by all open files.
        tree_cache_bytes: the LRU of parsed directories and file layouts.
        threads: worker threads reading and decompressing objects (see ``workers.py``).
        readahead_bytes: how far ahead of a sequential reader objects are loaded.
        push_pages: hand the small files read ahead in a directory to the kernel's page
            cache (``pages.py``), so reading them costs no request.
        no_open: answer ``open``/``opendir`` with ``ENOSYS`` (see the module docstring)
            when pyfuse3 passes the inode to handle-less reads (the patched build); with
            a stock pyfuse3 it has no effect.
    """

    count: int = 5
    include_auto: bool = False
    list_ttl: float = 1.0
    timeout: float = 24 * 3600.0
    object_cache_bytes: int = 128 << 20
    tree_cache_bytes: int = 32 << 20
    threads: int = field(default_factory=lambda: max(4, 2 * (os.cpu_count() or 2)))
    readahead_bytes: int = 8 << 20
    push_pages: bool = True
    no_open: bool = True


#: pyfuse3 built with ``.ci/pyfuse3-no-open.patch`` (read and readdir get the inode when
#: the kernel sends no handle).
NO_OPEN_SUPPORTED: bool = hasattr(pyfuse3.Operations, "pass_inode_without_fh")


def _handler(fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
    """The boundary: whatever ``fn`` raises leaves as a ``FUSEError`` (see module doc)."""

    name = fn.__name__

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        args[0].requests[name] += 1  # type: ignore[attr-defined]
        try:
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except SpriteError as e:
            log.error("%s: %s", fn.__name__, e)
            raise pyfuse3.FUSEError(errno.EIO) from None
        except Exception:
            log.exception("%s failed (a bug)", fn.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper


def _erofs() -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(errno.EROFS)


class ViewOperations(pyfuse3.Operations):
    """The request handlers. Runs in one trio thread; see :func:`sprite_env.fuse.serve`.

    Args:
        source: where checkpoints and objects come from.
        config: what to show, cache sizes.
    """

    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False
    enable_cache_symlinks = True  # (patched pyfuse3) readlink once per inode
    pass_inode_without_fh = True  # (patched pyfuse3) see ViewConfig.no_open

    def __init__(self, source: CheckpointSource, config: ViewConfig | None = None) -> None:
        super().__init__()
        self.source = source
        self.config = config = config or ViewConfig()
        self.inodes = InodeTable()
        self.workers = Workers(config.threads)
        self.objects: AsyncLru[ObjectId, bytes] = AsyncLru(
            config.object_cache_bytes, len, self.workers
        )
        self.trees: AsyncLru[bytes, Directory | FileLayout] = AsyncLru(
            config.tree_cache_bytes, _tree_cost, self.workers
        )
        self._nursery: trio.Nursery | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._shown: list[CheckpointRef] = []
        self._all_ids: set[str] = set()
        self._listed_at = -math.inf
        self._list_lock = trio.Lock()
        self._serial: dict[str, int] = {}  # readdir order of the root: first seen first
        #: (directory inode, name) for the kernel to forget
        self._forget_send, self._forget_recv = trio.open_memory_channel[tuple[int, bytes]](math.inf)
        self._dirs: dict[int, list[tuple[bytes, Callable[[], Node | None]]]] = {}
        self._files: dict[int, tuple[Node, OpenFile]] = {}
        self._pins: dict[int, _SharedPin] = {}  # by inode: one pin for all its open files
        #: without open: the files read (and pinned) since the kernel last knew them, by inode
        self._read_files: dict[int, tuple[Node, OpenFile]] = {}
        self.no_open = config.no_open and NO_OPEN_SUPPORTED
        self._root_mtime_ns = 0
        #: ``.checkpoints.json`` (``status.py``): its bytes, their mtime, the handles of a
        #: view that opens files (each keeps the bytes it opened), and a change to tell the
        #: kernel of (set when the bytes change while mounted)
        self._status = status_bytes([])
        self._status_mtime_ns = time.time_ns()
        self._status_fhs: dict[int, bytes] = {}
        self._status_changed = trio.Event()
        #: True while pyfuse3 has a session (set by ``mount.serve``)
        self.mounted = False
        self._dir_ahead: OrderedDict[bytes, int] = OrderedDict()  # tree -> read ahead up to
        self._files_read_at = -math.inf  # the last first read of a file (READING_WALK)
        self._files_ahead: OrderedDict[bytes, None] = OrderedDict()  # trees: files loaded
        self._next_fh = 1
        self._pages: PagePusher | None = None  # see pages.py; started with the view
        self._uid, self._gid = os.getuid(), os.getgid()
        #: requests answered, by handler (what the kernel did not answer from its caches)
        self.requests: Counter[str] = Counter()

    # -- lifecycle (called by mount.serve) -----------------------------------------------

    def start(self, nursery: trio.Nursery) -> None:
        """Binds the view to the nursery its background tasks run in (read-ahead, telling
        the kernel to forget deleted checkpoints' names). Call before mounting."""
        self._nursery = nursery
        self._token = trio.lowlevel.current_trio_token()
        if self.config.push_pages:
            self._pages = PagePusher()
        nursery.start_soon(self._invalidate_names)
        nursery.start_soon(self._invalidate_status)

    def refresh(self) -> None:
        """Lists the checkpoints again now, and from then on at the next access.

        Thread-safe: a host calls it from any thread after creating or deleting a
        checkpoint, so a new one shows at once and a deleted one's name goes at once.
        Without open it also drops the kernel's attributes of the root at once: its next
        listing then asks for them, finds a new mtime, and lists the root again. So it
        does for ``.checkpoints.json`` (open or not): its next read asks for its size and
        mtime, which the listing just changed, and the kernel drops the pages it kept.
        """
        self._listed_at = -math.inf
        if self.mounted:  # attributes only: no page or lock to wait for, from any thread
            for ino in (ROOT_INODE, STATUS_INODE) if self.no_open else (STATUS_INODE,):
                try:
                    pyfuse3.invalidate_inode(ino, attr_only=True)
                except OSError as e:  # ENOENT: the kernel does not know it
                    log.debug("invalidate_inode(%d): %s", ino, e)
        if self._token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._relist_soon)

    def _relist_soon(self) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(self._relist)

    async def _relist(self) -> None:
        try:
            await self.shown()
        except SpriteError as e:
            log.error("listing checkpoints: %s", e)

    def stop_pushing(self, abort: Callable[[], None]) -> None:
        """Stops handing pages to the kernel (``pages.py``): call it before the session is
        destroyed; ``abort`` fails the kernel's pending requests, in case a push waits
        for one."""
        if self._pages is not None:
            self._pages.stop(abort)

    @property
    def pages_pushed(self) -> int:
        """Files whose bytes the view handed to the kernel before it asked (statistics)."""
        return self._pages.pushed if self._pages is not None else 0

    def close(self) -> None:
        """Releases every file still open and stops the workers (after the file system
        was unmounted and the view's tasks ended)."""
        for node, f in [*self._files.values(), *self._read_files.values()]:
            f.release()
            node.opens = 0
        self._files.clear()
        self._read_files.clear()
        self._dirs.clear()
        self.workers.close()

    @property
    def open_files(self) -> int:
        """Files open (or, without open, read and not yet forgotten by the kernel)."""
        return len(self._files) + len(self._read_files)

    @property
    def listing(self) -> Sequence[CheckpointRef]:
        """The checkpoints the root showed at its last listing, newest first."""
        return self._shown

    # -- the root's listing --------------------------------------------------------------

    async def shown(self) -> Sequence[CheckpointRef]:
        """The checkpoints the root shows, newest first, listed again if stale."""
        if trio.current_time() - self._listed_at <= self.config.list_ttl:
            return self._shown
        async with self._list_lock:
            if trio.current_time() - self._listed_at > self.config.list_ttl:
                refs = await self.workers.run(self.source.checkpoints)
                self._listed_at = trio.current_time()
                self._apply_listing(refs)
        return self._shown

    def _apply_listing(self, refs: Sequence[CheckpointRef]) -> None:
        cfg = self.config
        shown = [r for r in refs if cfg.include_auto or not r.is_auto][: cfg.count]
        for r in reversed(shown):  # oldest first, so the newest get the highest serials
            if r.id not in self._serial:
                self._serial[r.id] = len(self._serial) + 1
        new_ids = {r.id for r in shown}
        for r in self._shown:
            if r.id not in new_ids:
                log.info("checkpoint %s left the view", r.id)
                self._forget_read_files(r.id)  # first: their directories are still reachable
                self._forget_send.send_nowait((ROOT_INODE, r.id.encode()))
        if [r.id for r in shown] != [r.id for r in self._shown]:
            # a listing's change always changes the root's mtime: the kernel, which
            # caches the root's listing without open, checks it before each listing
            newest = shown[0].create_time_ns if shown else 0
            self._root_mtime_ns = max(newest, self._root_mtime_ns + 1)
        self._shown = shown
        self._all_ids = {r.id for r in refs}
        data = status_bytes(shown)
        if data != self._status:
            self._status = data
            self._status_mtime_ns = max(time.time_ns(), self._status_mtime_ns + 1)
            if self.mounted:
                self._status_changed.set()

    async def _invalidate_names(self) -> None:
        """Tells the kernel to drop the names of checkpoints that left the view.

        In a worker thread, outside any request handler: the kernel may make the call
        wait for a request in progress on the root, and must not wait for itself.
        """
        async for parent, name in self._forget_recv:
            try:
                await trio.to_thread.run_sync(pyfuse3.invalidate_entry, parent, name)
            except OSError as e:  # ENOENT: the kernel did not know the name
                log.debug("invalidate_entry(%d, %r): %s", parent, name, e)

    async def _invalidate_status(self) -> None:
        """Tells the kernel to drop its pages and attributes of ``.checkpoints.json`` each
        time its bytes change: without open it keeps a file's pages across opens, and a
        reader would see the old bytes (cut to the new size) until memory ran short. In a
        worker thread: the kernel waits for a read of the file in progress to finish."""
        while True:
            await self._status_changed.wait()
            self._status_changed = trio.Event()
            try:
                await trio.to_thread.run_sync(pyfuse3.invalidate_inode, STATUS_INODE, False)
            except OSError as e:  # ENOENT: the kernel did not know the file
                log.debug("invalidate_inode(%s): %s", STATUS_NAME.decode(), e)

    def _status_attrs(self) -> pyfuse3.EntryAttributes:
        return status_attributes(
            len(self._status), self._status_mtime_ns, self._uid, self._gid, self.config.list_ttl
        )

    def _forget_read_files(self, checkpoint_id: str) -> None:
        """Without open: asks the kernel to drop the names of the files of a checkpoint
        that left the view whose objects are pinned since they were read. Dropping the
        checkpoint's name alone leaves the names below it cached (unreachable), so the
        kernel would not forget their inodes (and the view would hold their packs) until
        memory ran short; a dropped name of a file still open goes when it is closed."""
        for node, _f in self._read_files.values():
            if node.checkpoint is not None and node.checkpoint.id == checkpoint_id:
                name = node.path.rpartition(b"/")[2]
                self._forget_send.send_nowait((node.parent, name))

    async def _is_gone(self, node: Node) -> bool:
        """True if ``node``'s checkpoint no longer exists (asks the source again)."""
        if node.checkpoint is None:
            return False
        self._listed_at = -math.inf
        await self.shown()
        return node.checkpoint.id not in self._all_ids

    async def _failure(self, node: Node, e: SpriteError) -> pyfuse3.FUSEError:
        """The error to answer for a store failure under ``node`` (logged unless it is the
        expected consequence of a delete)."""
        cid = node.checkpoint.id if node.checkpoint else "-"
        if isinstance(e, ObjectNotFound) and await self._is_gone(node):
            log.debug("%s/%s: checkpoint deleted: %s", cid, node.path.decode(errors="replace"), e)
            return pyfuse3.FUSEError(errno.ESTALE)
        log.error("%s/%s: %s", cid, node.path.decode(errors="replace"), e)
        return pyfuse3.FUSEError(errno.EIO)

    # -- reading trees ---------------------------------------------------------------------

    async def _directory(self, tree: ObjectId) -> Directory:
        source = self.source
        d = await self.trees.get(tree, lambda: Directory.parse(source.read(tree)))
        assert isinstance(d, Directory)
        return d

    async def _checkpoint_root(self, ref: CheckpointRef) -> Node | None:
        """The node of a checkpoint's root directory; None if it was deleted meanwhile."""
        try:
            top = await self._directory(ref.top_tree)
        except ObjectNotFound:
            self._listed_at = -math.inf
            if ref.id not in {r.id for r in await self.shown()}:
                return None
            raise
        entry = top.get(b".")
        if entry is None or entry.kind is not Kind.DIR:
            raise SnapshotError(f"checkpoint {ref.id}: top tree has no root directory")
        return self.inodes.checkpoint_root(ref, entry)

    async def _children(self, node: Node) -> Directory:
        assert node.entry is not None
        if node.entry.kind is not Kind.DIR:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        try:
            return await self._directory(node.entry.subtree)
        except SpriteError as e:
            raise await self._failure(node, e) from None

    def _node(self, ino: int) -> Node:
        node = self.inodes.get(ino)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return node

    def _attrs(self, node: Node) -> pyfuse3.EntryAttributes:
        if node.entry is None:
            return root_attributes(self._root_mtime_ns, self._uid, self._gid, self.config.list_ttl)
        a = entry_attributes(node, self.config.timeout)
        if node.parent == ROOT_INODE and node.path == b"":
            a.entry_timeout = self.config.list_ttl  # the name may go away; the attrs never change
        return a

    # -- lookups and attributes -------------------------------------------------------------

    @_handler
    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        parent = self._node(parent_inode)
        if name == b".":
            node = parent
        elif name == b"..":
            node = self._node(parent.parent)
        elif parent.entry is None:
            if name == STATUS_NAME:
                await self.shown()
                return self._status_attrs()
            node = await self._lookup_checkpoint(name)
        else:
            entry = (await self._children(parent)).get(name)
            if entry is None:  # cached by the kernel: a checkpoint never gains a name
                miss = pyfuse3.EntryAttributes()
                miss.st_ino = 0
                miss.entry_timeout = self.config.timeout
                return miss
            node = self.inodes.child(parent, entry)
        self.inodes.remember(node)
        return self._attrs(node)

    async def _lookup_checkpoint(self, name: bytes) -> Node:
        for ref in await self.shown():
            if ref.id.encode() == name:
                node = await self._checkpoint_root(ref)
                if node is not None:
                    return node
        raise pyfuse3.FUSEError(errno.ENOENT)  # not cached: it may appear at any time

    @_handler
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if inode == STATUS_INODE:
            await self.shown()
            return self._status_attrs()
        node = self._node(inode)
        if node.entry is None:
            await self.shown()
        return self._attrs(node)

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for ino, n in inode_list:
            self.inodes.forget(ino, n)
            got = self._read_files.get(ino)
            if got is not None and got[0].lookups == 0:  # no open file can use it now
                del self._read_files[ino]
                node, f = got
                f.release()
                node.opens -= 1
                self.inodes.drop_if_unused(node)

    @_handler
    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        node = self._node(inode)
        if node.entry is None or node.entry.kind is not Kind.SYMLINK:
            raise pyfuse3.FUSEError(errno.EINVAL)
        return node.entry.target

    @_handler
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        if inode == STATUS_INODE:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        node = self._node(inode)
        for key, value in node.entry.xattrs if node.entry else ():
            if key == name:
                return value
        raise pyfuse3.FUSEError(pyfuse3.ENOATTR)

    @_handler
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> Sequence[bytes]:
        if inode == STATUS_INODE:
            return []
        node = self._node(inode)
        return [key for key, _value in node.entry.xattrs] if node.entry else []

    @_handler
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        """Sizes of the checkpoints shown (what a full restore of each would write); no
        free space, as nothing can be written."""
        shown = await self.shown()
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_blocks = math.ceil(sum(r.bytes for r in shown) / 4096)
        s.f_bfree = s.f_bavail = 0
        s.f_files = sum(r.files for r in shown) + len(shown) + 1
        s.f_ffree = s.f_favail = 0
        s.f_namemax = 255
        return s

    # -- directories ----------------------------------------------------------------------

    @_handler
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        """Takes the directory's listing once, so a listing in several ``readdir`` calls
        sees one state of the root even if checkpoints come and go meanwhile. Without
        open: ``ENOSYS``, and the kernel opens directories itself from then on."""
        if self.no_open:
            raise pyfuse3.FUSEError(errno.ENOSYS)
        node = self._node(inode)
        listing: list[tuple[bytes, Callable[[], Node | None]]]
        if node.entry is None:
            listing = [(STATUS_NAME, _no_node)]  # .checkpoints.json (not a Node)
            for ref in sorted(await self.shown(), key=lambda r: self._serial[r.id]):
                root = await self._checkpoint_root(ref)
                if root is not None:
                    listing.append((ref.id.encode(), functools.partial(_same, root)))
        else:
            d = await self._children(node)
            listing = [(e.name, functools.partial(self.inodes.child, node, e)) for e in d.entries]
            self._read_ahead_trees(node, d)
        fh = self._new_fh()
        self._dirs[fh] = listing
        return fh

    @_handler
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        if self.no_open:  # fh is the directory's inode
            await self._readdir_inode(fh, start_id, token)
            return
        listing = self._dirs.get(fh)
        if listing is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        for i in range(start_id, len(listing)):
            name, make = listing[i]
            node = make()
            if node is None:
                if not pyfuse3.readdir_reply(token, name, self._status_attrs(), i + 1):
                    break
                continue
            if not pyfuse3.readdir_reply(token, name, self._attrs(node), i + 1):
                self.inodes.drop_if_unused(node)
                break
            self.inodes.remember(node)

    async def _readdir_inode(self, ino: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        """``readdir`` without ``opendir``: a checkpoint's directory never changes, so an
        entry's position is its offset; the root's entries are offset by their serial
        (first seen first) after ``.checkpoints.json`` at 1, so a listing in several calls
        skips or repeats none of those that stay while checkpoints come and go."""
        node = self._node(ino)
        if node.entry is None:
            shown = sorted(await self.shown(), key=lambda r: self._serial[r.id])
            if start_id < 1 and not pyfuse3.readdir_reply(
                token, STATUS_NAME, self._status_attrs(), 1
            ):
                return
            for ref in shown:
                offset = self._serial[ref.id] + 1
                root = await self._checkpoint_root(ref) if offset > start_id else None
                if root is None:
                    continue
                if not pyfuse3.readdir_reply(token, ref.id.encode(), self._attrs(root), offset):
                    self.inodes.drop_if_unused(root)
                    return
                self.inodes.remember(root)
            return
        d = await self._children(node)
        if start_id == 0:
            self._read_ahead_trees(node, d)
        elif start_id >= len(d.entries):  # the end of the listing: the kernel knows all
            await _briefly(self._read_ahead_listed(node, d))
        for i in range(start_id, len(d.entries)):
            child = self.inodes.child(node, d.entries[i])
            if not pyfuse3.readdir_reply(token, d.entries[i].name, self._attrs(child), i + 1):
                self.inodes.drop_if_unused(child)
                return
            self.inodes.remember(child)

    @_handler
    async def releasedir(self, fh: int) -> None:
        self._dirs.pop(fh, None)

    # -- files ----------------------------------------------------------------------------

    @_handler
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        """Opens a file: its objects are pinned (one worker call, which also loads its
        first MiB), unless it is small and already in memory, in which case the handle
        simply keeps the bytes. Either way, a delete cannot take them away while open.
        Without open: ``ENOSYS``, and the kernel opens files itself from then on (a file
        is pinned at its first read instead, see the module docstring)."""
        if self.no_open:
            raise pyfuse3.FUSEError(errno.ENOSYS)
        if flags & os.O_ACCMODE != os.O_RDONLY or flags & os.O_TRUNC:
            raise _erofs()
        if inode == STATUS_INODE:  # the handle keeps the bytes it opened
            await self.shown()
            fh = self._new_fh()
            self._status_fhs[fh] = self._status
            return pyfuse3.FileInfo(fh=fh, keep_cache=False)
        node = self._node(inode)
        if node.entry is None or node.entry.kind is Kind.DIR:
            raise pyfuse3.FUSEError(errno.EISDIR)
        if node.entry.kind is not Kind.FILE:  # devices and fifos never reach us (nodev)
            raise pyfuse3.FUSEError(errno.EACCES)
        assert self._nursery is not None, "start() was not called"
        try:
            layout = await self._layout(node.entry)
            pushed = self._read_ahead_directory(node)  # this and the small ones after it
            oids = layout.objects()
            held: dict[ObjectId, bytes] = {}
            reader: PinnedReader | None = None
            if layout.size <= AHEAD_BATCH and all(oid in self.objects for oid in oids):
                # cached, or being loaded by a read-ahead: wait for it rather than pin
                source = self.source
                held = await self.objects.get_many(
                    list(oids), lambda keys: _read_once(source, keys)
                )
            else:
                reader = await self._pin(node, layout)
        except SpriteError as e:
            raise await self._failure(node, e) from None
        f = self._open_file(layout, held, reader)
        fh = self._new_fh()
        self._files[fh] = (node, f)
        node.opens += 1
        await _briefly(pushed)
        return pyfuse3.FileInfo(fh=fh, keep_cache=True)

    def _open_file(
        self, layout: FileLayout, held: dict[ObjectId, bytes], reader: PinnedReader | None
    ) -> OpenFile:
        assert self._nursery is not None, "start() was not called"
        cfg = self.config
        ahead_tasks = max(2, cfg.readahead_bytes // AHEAD_BATCH)
        return OpenFile(
            layout, held, reader, self.objects, self._nursery, cfg.readahead_bytes, ahead_tasks
        )

    async def _layout(self, entry: TreeEntry) -> FileLayout:
        source = self.source
        if not entry.indirect:  # the pieces are in the entry: nothing to read
            return FileLayout.of(entry, source.read)
        key = b"L" + entry.payload
        lay = await self.trees.get(key, lambda: FileLayout.of(entry, source.read))
        assert isinstance(lay, FileLayout)
        return lay

    async def _pin(self, node: Node, layout: FileLayout) -> PinnedReader:
        """A handle on the pin of ``node``'s objects, shared by its open files."""
        share = self._pins.get(node.ino)
        if share is None:  # the first open of this file pins its objects
            first = [o for o in layout.first_objects(AHEAD_BATCH) if o not in self.objects]
            job = functools.partial(_pin_and_read, self.source, layout.objects(), first)
            pinned, data = await self.workers.run(job)
            for oid, obj in data.items():
                self.objects.put(oid, obj)
            share = self._pins.setdefault(node.ino, _SharedPin(pinned))
            if share.reader is not pinned:  # another open pinned it meanwhile
                pinned.close()
        return share.handle(functools.partial(self._pins.pop, node.ino, None))

    def _read_ahead_directory(self, node: Node) -> trio.Event | None:
        """When a small file is opened, loads it and the small files that follow it in
        its directory (in one worker call, up to ``DIR_AHEAD_BYTES``): ``diff -r``,
        ``grep -r`` and ``cp -r`` read them next, and as they were captured together,
        their objects lie together in the packs. Measured on the benchmark layer (31,636
        files): worker calls fell from 3 per file to 0.2, ``diff -r`` from 41 s to 24 s.
        """
        parent = self.inodes.get(node.parent)
        if parent is None or parent.entry is None or node.entry is None:
            return None
        self._files_read_at = trio.current_time()
        d = self.trees.peek(parent.entry.subtree)
        at = d.index.get(node.entry.name) if isinstance(d, Directory) else None
        if not isinstance(d, Directory) or at is None:
            return None
        return self._read_ahead_files(parent, d, at, at + 1)

    def _read_ahead_listed(self, node: Node, d: Directory) -> trio.Event | None:
        """At the end of a directory's listing, while a walk reads files (a file's first
        read within ``READING_WALK`` seconds), hands the directory's first small files to the
        kernel at once, rather than at the first read, and loads those of the directories
        the walk lists next (``_walk_after``; up to ``WALK_AHEAD_DIRS`` and
        ``WALK_AHEAD_BYTES``), whose inodes the kernel does not know yet: when one is
        listed, its files are in memory and their push is immediate.

        A cold ``diff -r`` of the small benchmark layer otherwise waited 1-4 ms (a worker
        call, then the push) at the first read of each of its ~3,700 directories with
        files; with the push at the end of the listing alone, 3,209 of those reads still
        came while the files were being loaded. The kernel knows every child at the end
        of the listing (its entries were sent), so the push finds their inodes. A walk
        that reads no file (``find``, ``ls -R``) loads nothing.

        Returns:
            An event set once the push is done, or None: the end of the listing waits for
            it (``PUSH_WAIT`` at most), as the walk reads the first files next. Measured
            (in-process, cold ``diff -r`` of the small layer, load 5): with the end
            answered at once, 4,166 of the pushed files were still read through the view
            (the push came after the read; and a push waits for the page lock of a read
            in progress: ``notify_store`` p99 2.1 ms), with the wait 30, and the reads of
            the whole walk 5,983 -> 548.
        """
        if trio.current_time() - self._files_read_at > READING_WALK:
            return None
        first = _first_small_file(d)
        pushed = self._read_ahead_files(node, d, first, first) if first is not None else None
        oids: dict[ObjectId, None] = {}  # one worker call for all: a hand-off each costs
        budget = WALK_AHEAD_BYTES  # the trio thread the GIL for as long as a worker holds it
        for tree, after in itertools.islice(self._walk_after(node, d), WALK_AHEAD_DIRS):
            if tree in self._files_ahead:  # loaded ahead at an earlier listing
                continue
            self._files_ahead[tree] = None
            while len(self._files_ahead) > 4096:
                self._files_ahead.popitem(last=False)
            budget -= self._small_file_objects(after, budget, oids)
            if budget <= 0:
                break
        if oids and self._nursery is not None:
            self._nursery.start_soon(self._load_ahead, list(oids), [], trio.Event())
        return pushed

    def _walk_after(self, node: Node, d: Directory) -> Iterator[tuple[ObjectId, Directory]]:
        """The directories (tree, listing) a depth-first walk in name order lists after
        ``node`` (listed as ``d``), as far as their trees are in memory (a subtree not
        loaded yet is skipped: its own listing reads it ahead)."""

        def below(entries: Iterable[TreeEntry]) -> Iterator[tuple[ObjectId, Directory]]:
            for e in entries:
                if e.kind is Kind.DIR:
                    sub = self._cached_directory(e.subtree)
                    if sub is not None:
                        yield e.subtree, sub
                        yield from below(sub.entries)

        yield from below(d.entries)
        while node.entry is not None and node.path:  # up to the checkpoint's root
            parent = self.inodes.get(node.parent)
            if parent is None or parent.entry is None:
                return
            up = self._cached_directory(parent.entry.subtree)
            at = up.index.get(node.entry.name) if up is not None else None
            if up is None or at is None:
                return
            yield from below(up.entries[at + 1 :])
            node = parent

    def _cached_directory(self, tree: ObjectId) -> Directory | None:
        d = self.trees.peek(tree)
        return d if isinstance(d, Directory) else None

    def _small_file_objects(self, d: Directory, budget: int, oids: dict[ObjectId, None]) -> int:
        """Adds to ``oids`` the objects of ``d``'s first small files not in memory, up to
        ``budget`` bytes; returns their size."""
        size = 0
        for e in d.entries:
            if e.kind is not Kind.FILE or e.indirect or e.size > SMALL_FILE:
                continue
            for oid, _off, n in decode_chunks(e.payload):
                if oid is not None and oid not in self.objects and oid not in oids:
                    oids[oid] = None
                    size += n
            if size >= budget:
                break
        return size

    def _read_ahead_files(
        self, parent: Node, d: Directory, at: int, push_from: int
    ) -> trio.Event | None:
        """Loads the small files of ``d`` (``parent``'s listing) from index ``at`` on, up
        to ``DIR_AHEAD_BYTES``, and pushes those from ``push_from`` on that the kernel
        knows (not the one being read: its page is locked until that read is answered).

        Returns:
            An event set once the push is done, or None if nothing is pushed.
        """
        assert parent.entry is not None
        tree = parent.entry.subtree
        if self._dir_ahead.get(tree, 0) > at:
            return None
        oids: list[ObjectId] = []
        push: list[tuple[int, TreeEntry]] = []  # the files after this one the kernel knows
        size = 0
        i = at
        for i in range(at, len(d.entries)):  # noqa: B007 (i is used after the loop)
            e = d.entries[i]
            if e.kind is not Kind.FILE or e.indirect or e.size > SMALL_FILE:
                continue
            if i >= push_from and e.size and self._pages is not None:
                child = self.inodes.known_child(parent, e)
                if child is not None:
                    push.append((child.ino, e))
            for oid, _off, n in decode_chunks(e.payload):
                # in flight too (loaded ahead by _load_small_files): the push waits for it
                if oid is not None and self.objects.peek(oid) is None and oid not in oids:
                    oids.append(oid)
                    size += n
            if size >= DIR_AHEAD_BYTES:
                break
        self._dir_ahead[tree] = i + 1
        self._dir_ahead.move_to_end(tree)
        while len(self._dir_ahead) > 1024:
            self._dir_ahead.popitem(last=False)
        if not (oids or push) or self._nursery is None:
            return None
        pushed = trio.Event()
        self._nursery.start_soon(self._load_ahead, oids, push, pushed)
        return pushed if push else None

    async def _load_ahead(
        self, oids: list[ObjectId], push: list[tuple[int, TreeEntry]], pushed: trio.Event
    ) -> None:
        """Loads ``oids``, then hands the files ``push`` to the kernel; sets ``pushed``
        once they are in its page cache (or will not be)."""
        source = self.source
        try:
            await self.objects.get_many(oids, lambda keys: _read_once(source, keys))
        except SpriteError as e:  # the files' own reads will report it
            log.debug("read-ahead of %d objects: %s", len(oids), e)
            pushed.set()
            return
        token = self._token
        if not push or self._pages is None or not self.mounted or token is None:
            pushed.set()
            return
        done = functools.partial(_set_from_thread, token, pushed)
        if not self._pages.push(self._whole_files(push), done):
            pushed.set()

    def _whole_files(self, files: list[tuple[int, TreeEntry]]) -> list[tuple[int, bytes]]:
        """Each file's bytes, from the objects in memory (a file with one evicted since
        is left out: its read will load it)."""
        out: list[tuple[int, bytes]] = []
        for ino, entry in files:
            try:
                layout = FileLayout.of(entry, self.source.read)  # inline pieces: no read
                data: dict[ObjectId, bytes] = {}
                for oid in layout.objects():
                    obj = self.objects.peek(oid)
                    if obj is None:
                        break
                    data[oid] = obj
                else:
                    out.append((ino, layout.assemble(data, 0, layout.size)))
            except SpriteError as e:  # a damaged entry: its read will say so
                log.debug("not pushing inode %d: %s", ino, e)
        return out

    def _read_ahead_trees(self, node: Node, d: Directory) -> None:
        """When a directory is listed, loads its subdirectories' trees, and those of its
        next sibling directories (in one worker call), then their subdirectories' (one
        more): a walk (``find``, ``diff -r``) lists them next. Up to ``TREES_AHEAD`` trees
        not yet loaded at each level, children first.

        Siblings too, since a directory with more subdirectories than that (a
        ``node_modules``, a ``site-packages``) would otherwise have each beyond the first
        ``TREES_AHEAD`` loaded by its own listing, a worker round trip in the walk's way;
        and a directory with one subdirectory loads it ahead too: measured on a cold
        ``diff -r`` of the small benchmark layer, 2,771 of its 5,577 listings waited for
        their tree before (0.46 ms median each)."""
        trees = self._unloaded_subdirectories([d])
        parent = self.inodes.get(node.parent) if node.entry is not None else None
        if len(trees) < TREES_AHEAD and parent is not None and parent.entry is not None:
            up = self.trees.peek(parent.entry.subtree)
            name = node.entry.name if node.entry is not None else b""
            at = up.index.get(name) if isinstance(up, Directory) else None
            if isinstance(up, Directory) and at is not None:
                for e in up.entries[at + 1 : at + 1 + 2 * TREES_AHEAD]:
                    if e.kind is not Kind.DIR or e.subtree in self.trees or e.subtree in trees:
                        continue
                    trees.append(e.subtree)
                    if len(trees) >= TREES_AHEAD:
                        break
        if trees and self._nursery is not None:
            self._nursery.start_soon(self._load_trees, trees)

    def _unloaded_subdirectories(self, dirs: Iterable[Directory]) -> list[ObjectId]:
        """The trees of the subdirectories of ``dirs`` not in memory, up to TREES_AHEAD."""
        trees: list[ObjectId] = []
        for d in dirs:
            for e in d.entries:
                if e.kind is Kind.DIR and e.subtree not in self.trees and e.subtree not in trees:
                    trees.append(e.subtree)
                    if len(trees) >= TREES_AHEAD:
                        return trees
        return trees

    async def _load_trees(self, trees: list[ObjectId], deeper: int = 1) -> None:
        """Loads ``trees``, then (``deeper`` levels) their subdirectories': a listing
        loads two levels ahead of the walk, so that ``_walk_after`` sees the directories
        it lists next."""
        source = self.source

        def load(ids: list[bytes]) -> list[Directory | FileLayout]:
            # one pin for the batch: one catalog query and one pread per run of neighbours
            # (trees captured together lie together in a pack), not one of each per tree
            raw = _read_once(source, [ObjectId(i) for i in ids])
            return [Directory.parse(data) for data in raw]

        try:
            got = await self.trees.get_many(list(trees), load)
        except SpriteError as e:  # the directories' own listings will report it
            log.debug("read-ahead of %d trees: %s", len(trees), e)
            return
        below = self._unloaded_subdirectories(d for d in got.values() if isinstance(d, Directory))
        if deeper > 0 and below:
            await self._load_trees(below, deeper - 1)

    @_handler
    async def read(self, fh: int, off: int, size: int) -> bytes:
        if self.no_open and fh == STATUS_INODE:
            await self.shown()
            return self._status[off : off + size]
        if self.no_open:  # fh is the file's inode
            return await self._read_inode(fh, off, size)
        if fh in self._status_fhs:
            return self._status_fhs[fh][off : off + size]
        node, f = self._file(fh)
        try:
            return await f.read(off, size)
        except SpriteError as e:
            raise await self._failure(node, e) from None

    async def _read_inode(self, ino: int, off: int, size: int) -> bytes:
        """``read`` without ``open``. The first read of a small file that asks for all of
        it (as the kernel's read-ahead does) is answered from the objects and leaves
        nothing behind: the kernel keeps the pages. Any other first read pins the file's
        objects (as ``open`` does), until the kernel forgets the inode."""
        got = self._read_files.get(ino)
        if got is None:
            node = self._node(ino)
            if node.entry is None or node.entry.kind is not Kind.FILE:
                raise pyfuse3.FUSEError(errno.EISDIR if node.is_dir else errno.EINVAL)
            try:
                layout = await self._layout(node.entry)
                pushed = self._read_ahead_directory(node)  # this and the small ones after it
                if off == 0 and size >= layout.size and layout.size <= AHEAD_BATCH:
                    source = self.source
                    held = await self.objects.get_many(
                        list(layout.objects()), lambda keys: _read_once(source, keys)
                    )
                    whole = self._open_file(layout, held, None)
                    try:
                        data = await whole.read(off, size)
                    finally:
                        whole.release()
                    await _briefly(pushed)
                    return data
                reader = await self._pin(node, layout)
            except SpriteError as e:
                raise await self._failure(node, e) from None
            f = self._open_file(layout, {}, reader)
            got = self._read_files.setdefault(ino, (node, f))
            if got[1] is f:
                node.opens += 1
            else:  # a concurrent first read got there first
                f.release()
        node, f = got
        try:
            return await f.read(off, size)
        except SpriteError as e:
            raise await self._failure(node, e) from None

    @_handler
    async def release(self, fh: int) -> None:
        if self._status_fhs.pop(fh, None) is not None:
            return
        node, f = self._files.pop(fh, (None, None))
        if node is None or f is None:
            return
        f.release()
        node.opens -= 1
        self.inodes.drop_if_unused(node)

    def _file(self, fh: int) -> tuple[Node, OpenFile]:
        got = self._files.get(fh)
        if got is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        return got

    def _new_fh(self) -> int:
        fh = self._next_fh
        self._next_fh += 1
        return fh

    # -- everything that writes: EROFS ----------------------------------------------------

    async def setattr(self, *args: Any) -> pyfuse3.EntryAttributes:
        raise _erofs()

    async def mknod(self, *args: Any) -> pyfuse3.EntryAttributes:
        raise _erofs()

    async def mkdir(self, *args: Any) -> pyfuse3.EntryAttributes:
        raise _erofs()

    async def unlink(self, *args: Any) -> None:
        raise _erofs()

    async def rmdir(self, *args: Any) -> None:
        raise _erofs()

    async def symlink(self, *args: Any) -> pyfuse3.EntryAttributes:
        raise _erofs()

    async def rename(self, *args: Any) -> None:
        raise _erofs()

    async def link(self, *args: Any) -> pyfuse3.EntryAttributes:
        raise _erofs()

    async def write(self, *args: Any) -> int:
        raise _erofs()

    async def create(self, *args: Any) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        raise _erofs()

    async def setxattr(self, *args: Any) -> None:
        raise _erofs()

    async def removexattr(self, *args: Any) -> None:
        raise _erofs()


def _first_small_file(d: Directory) -> int | None:
    """The index of ``d``'s first file that is read ahead with its directory."""
    for at, e in enumerate(d.entries):
        if e.kind is Kind.FILE and not e.indirect and e.size <= SMALL_FILE:
            return at
    return None


def _same(node: Node) -> Node:
    return node


async def _briefly(event: trio.Event | None) -> None:
    """Waits for ``event`` up to :data:`PUSH_WAIT` seconds."""
    if event is not None:
        with trio.move_on_after(PUSH_WAIT):
            await event.wait()


def _set_from_thread(token: trio.lowlevel.TrioToken, event: trio.Event) -> None:
    """Sets a trio ``event`` from another thread (the page pusher's)."""
    with contextlib.suppress(trio.RunFinishedError):
        token.run_sync_soon(event.set)


def _no_node() -> None:
    return None


def _pin_and_read(
    source: CheckpointSource, oids: set[ObjectId], first: list[ObjectId]
) -> tuple[PinnedReader, dict[ObjectId, bytes]]:
    """Pins a file's objects and reads its first ones (in a worker thread). A failure to
    read is left to the read that needs them, so that it is reported there."""
    reader = source.pin(oids)
    try:
        return reader, dict(zip(first, reader.read_many(first), strict=True))
    except SpriteError:
        return reader, {}


def _read_once(source: CheckpointSource, oids: list[ObjectId]) -> list[bytes]:
    """Reads objects with a short-lived pin (in a worker thread; one ``pread`` per run of
    neighbours in a pack)."""
    reader = source.pin(oids)
    try:
        return reader.read_many(oids)
    finally:
        reader.close()


class _SharedPin:
    """One pin of a file's objects, shared by the file's open handles: eight readers of
    one file, or a file opened again while open, resolve its objects once."""

    def __init__(self, reader: PinnedReader) -> None:
        self.reader = reader
        self.handles = 0

    def handle(self, on_last_close: Callable[[], object]) -> PinnedReader:
        self.handles += 1
        return _PinHandle(self, on_last_close)


class _PinHandle:
    """An open file's share of a :class:`_SharedPin` (closed by the trio thread only)."""

    def __init__(self, share: _SharedPin, on_last_close: Callable[[], object]) -> None:
        self._share = share
        self._on_last_close = on_last_close
        self._closed = False

    def read(self, oid: ObjectId) -> bytes:
        return self.read_many([oid])[0]

    def read_many(self, oids: Sequence[ObjectId]) -> list[bytes]:
        return self._share.reader.read_many(oids)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._share.handles -= 1
        if self._share.handles == 0:
            self._on_last_close()
            self._share.reader.close()


def _tree_cost(value: Directory | FileLayout) -> int:
    if isinstance(value, Directory):
        return 2 * value.encoded_size + 200 * len(value.entries)
    return value.memory()
