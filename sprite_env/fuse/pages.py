"""Pages the view hands the kernel before it asks: FUSE's ``notify_store``.

A walk that reads every file (``diff -r``, ``grep -r``, ``cp -r``) costs the view one
``read`` request per small file, and a request is a round trip through the kernel, the
trio loop and a handler: ~27k of the ~38k requests of a cold ``diff -r`` of the benchmark
layer. When the first of a directory's small files is read, the view already loads the
small files after it in one worker call (``operations.py``, ``_read_ahead_directory``); the
:class:`PagePusher` then writes their bytes into the kernel's page cache
(``pyfuse3.notify_store``), so the reads that follow are answered by the kernel. Without
open the kernel keeps those pages as it keeps the ones it read (``FOPEN_KEEP_CACHE``). The
read that started the read-ahead waits for the push (``operations.PUSH_WAIT`` at most)
before it answers, as its reader asks for the next file at once. Measured on the benchmark
layer (in-process mount, load 9): a cold ``diff -r`` sent 16.5k requests instead of 41k
(reads 5.2k instead of 29.4k) and took 17-21 s instead of 30-32 s.

Why a thread of its own. ``notify_store`` locks each page it fills; a page the kernel is
reading at that moment stays locked until the view answers that read, so the call must
not run in the trio thread that answers it (it would wait for itself) nor in the view's
workers (the read may wait for them). The pusher's thread waits instead, and the read is
answered meanwhile. At unmount the thread is stopped before the session is destroyed; if
it is waiting for such a read when nothing answers any more, the connection is aborted
first (the read fails, the page is released), so it never writes to a destroyed session.

Profiling: py-spy's default (blocking) sampling stops every thread of the process, and a
thread in ``notify_store`` waiting for such a page cannot stop until the read is answered,
by the thread py-spy already stopped: the server hangs until py-spy detaches. Sample the
view with ``py-spy --nonblocking``.

Nothing depends on a push: one that fails (``ENOENT``: the kernel forgot the inode;
``ENOSYS``) or is dropped because the queue is full leaves the read to the view as before.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import TYPE_CHECKING

import pyfuse3

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger(__name__)

#: Files (inode, bytes) and what to call once they are handed over.
_Batch = tuple[list[tuple[int, bytes]], "Callable[[], None]"]

#: Batches waiting for the thread at most (each up to ``operations.DIR_AHEAD_BYTES``): a
#: walk faster than the pusher loses pushes, not memory.
QUEUE_BATCHES = 16
#: Seconds :meth:`PagePusher.stop` waits for a push in progress before it aborts, and
#: after the abort.
STOP_WAIT = 1.0
ABORT_WAIT = 30.0


class PagePusher:
    """Writes file contents into the kernel's page cache from its own thread.

    Call :meth:`push` from any thread while the file system is mounted and :meth:`stop`
    before its session is destroyed (``pyfuse3.close``).
    """

    def __init__(self) -> None:
        self._queue: queue.Queue[_Batch | None] = queue.Queue(QUEUE_BATCHES)
        self._stopping = False
        #: files handed to the kernel, and batches dropped for a full queue (statistics)
        self.pushed = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="sprite-fuse-pages", daemon=True)
        self._thread.start()

    def push(self, files: list[tuple[int, bytes]], done: Callable[[], None]) -> bool:
        """Queues ``(inode, the whole file's bytes)`` pairs for the kernel; the thread
        calls ``done()`` once it handed them over (failed or not).

        Returns:
            False if nothing was queued (nothing to push, stopping, or the queue is full):
            ``done`` is then never called.
        """
        if self._stopping or not files:
            return False
        try:
            self._queue.put_nowait((files, done))
        except queue.Full:
            self.dropped += 1
            return False
        return True

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            files, done = batch
            for ino, data in files:
                if self._stopping:
                    break
                try:
                    pyfuse3.notify_store(ino, 0, data)
                except OSError as e:  # ENOENT: the kernel forgot it; nothing is lost
                    log.debug("notify_store(%d, %d bytes): %s", ino, len(data), e)
                else:
                    self.pushed += 1
            done()

    def stop(self, abort: Callable[[], None]) -> None:
        """Ends the thread; calls ``abort`` (which must fail the kernel's pending
        requests) if a push waits for a page longer than :data:`STOP_WAIT`."""
        self._stopping = True
        while True:  # make room for the end marker: what is queued is never pushed now
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._queue.put(None)
        self._thread.join(STOP_WAIT)
        if self._thread.is_alive():
            log.warning("a page push waits for a read nobody answers now: aborting")
            abort()
            self._thread.join(ABORT_WAIT)
            if self._thread.is_alive():  # the abort failed: say so rather than hang
                log.error("a page push is still waiting after the connection was aborted")
