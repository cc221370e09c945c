"""Mounting the view: mount options, stale mounts, serving until unmounted or cancelled.

pyfuse3 keeps its session in module globals, so a process serves at most one mount at a
time: the daemon serves its one view in its own nursery (``await nursery.start(serve,
...)``), the standalone command with :func:`serve_until_signal`.

Mount options: ``ro`` (the kernel itself refuses writes with ``EROFS``), ``nodev`` and
``nosuid`` (a checkpoint's device nodes and setuid binaries are shown as captured, but
opening a device or gaining privileges through the view is impossible),
``default_permissions`` (the kernel checks modes and owners as captured), and
``allow_other`` when mounting as root, so every user who can reach the mount point can
browse what its permissions let it read (the daemon's is in its private STATE: root, and
the ``--socket-group``, only).

Stale mounts: a process that was killed leaves its mount point answering ``ENOTCONN``
("transport endpoint is not connected"). :func:`prepare_mountpoint` detaches such a mount
(``fusermount3 -u -z``, else ``umount -l``) before mounting again.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import shutil
import signal
import subprocess
from typing import TYPE_CHECKING

import pyfuse3
import trio

from sprite_env.errors import SpriteError, UserError
from sprite_env.fuse.operations import ViewConfig, ViewOperations
from sprite_env.mountinfo import mounts

if TYPE_CHECKING:
    from collections.abc import Callable

    from sprite_env.fuse.source import CheckpointSource

log = logging.getLogger(__name__)

FSNAME = "sprite-env"
SUBTYPE = "sprite-env"
#: The kernel's read-ahead for the mount, KiB. Its default (128) makes every read
#: request 128 KiB; 1 MiB requests halve the per-byte cost of the round trips (measured:
#: 970 -> 1,850 MB/s through a no-op pyfuse3 file system on the bench VM).
READ_AHEAD_KIB = 1024


class MountError(UserError):
    """The mount point cannot be used, or FUSE is not available."""


def fuse_options(*, fsname: str = FSNAME, allow_other: bool | None = None) -> set[str]:
    """The mount options (see the module docstring)."""
    opts = set(pyfuse3.default_options)  # default_permissions
    opts |= {"ro", "nodev", "nosuid", f"fsname={fsname}", f"subtype={SUBTYPE}"}
    if allow_other if allow_other is not None else os.geteuid() == 0:
        opts.add("allow_other")
    return opts


def unmount(mountpoint: str, *, lazy: bool = False) -> None:
    """Unmounts ``mountpoint`` with ``fusermount3 -u`` (``-z``: lazily, even if busy).

    Raises:
        MountError: neither ``fusermount3`` nor ``umount`` could do it.
    """
    cmds = []
    if shutil.which("fusermount3"):
        cmds.append(["fusermount3", "-u", *(["-z"] if lazy else []), mountpoint])
    if os.geteuid() == 0:
        cmds.append(["umount", *(["-l"] if lazy else []), mountpoint])
    errors = []
    for argv in cmds:
        r = subprocess.run(argv, capture_output=True, text=True, check=False)
        if r.returncode == 0:
            return
        errors.append(r.stderr.strip() or f"{argv[0]} exited with {r.returncode}")
    raise MountError(f"cannot unmount {mountpoint}: {'; '.join(errors) or 'no fusermount3'}")


def is_stale(mountpoint: str) -> bool:
    """True if ``mountpoint`` is a FUSE mount whose process is gone (``ENOTCONN``).

    A ``stat`` is not enough: the kernel may answer it from attributes it cached, and a
    listing from the listing it cached (the view's mounts without open). ``statfs`` always
    reaches the server.
    """
    mountpoint = os.path.abspath(mountpoint)
    try:
        os.stat(mountpoint)
        if not any(m.mountpoint == mountpoint and m.fstype.startswith("fuse") for m in mounts()):
            return False
        os.statvfs(mountpoint)
    except OSError as e:
        return e.errno == errno.ENOTCONN
    return False


def prepare_mountpoint(mountpoint: str) -> str:
    """Checks that ``mountpoint`` can be mounted on, detaching a stale mount first.

    Returns:
        Its absolute path.

    Raises:
        MountError: FUSE is missing, the path is not a directory, or something is mounted
            there already (by a live process).
    """
    mountpoint = os.path.abspath(mountpoint)
    if not os.path.exists("/dev/fuse"):
        raise MountError("cannot mount: /dev/fuse is missing (is the fuse module loaded?)")
    if is_stale(mountpoint):
        log.warning("%s: detaching a stale mount left by a process that died", mountpoint)
        unmount(mountpoint, lazy=True)
    if not os.path.isdir(mountpoint):
        raise MountError(f"mount point {mountpoint} is not a directory")
    if os.path.ismount(mountpoint):
        raise MountError(f"{mountpoint} is already a mount point (fusermount3 -u it first)")
    return mountpoint


def abort_connection(mountpoint: str) -> None:
    """Aborts the FUSE connection of the mount at ``mountpoint``: every request pending
    or to come fails (``ENOTCONN``). Reads ``/proc/self/mountinfo`` only, never the mount."""
    for m in mounts():
        if m.mountpoint == mountpoint and m.fstype.startswith("fuse"):
            path = f"/sys/fs/fuse/connections/{m.device.partition(':')[2]}/abort"
            try:
                with open(path, "w") as f:
                    f.write("1\n")
            except OSError as e:
                log.warning("cannot abort the connection of %s: %s", mountpoint, e)


def tune_readahead(mountpoint: str, kib: int = READ_AHEAD_KIB) -> bool:
    """Raises the kernel's read-ahead of the mount (root only; best effort).

    Blocking, and it stats the mount: call it from a worker thread once the file system
    serves requests.
    """
    try:
        st = os.stat(mountpoint)
        path = f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb"
        with open(path, "w") as f:
            f.write(f"{kib}\n")
    except OSError as e:
        log.debug("cannot set the read-ahead of %s: %s", mountpoint, e)
        return False
    return True


async def serve(
    source: CheckpointSource,
    mountpoint: str,
    config: ViewConfig | None = None,
    *,
    fsname: str = FSNAME,
    allow_other: bool | None = None,
    task_status: trio.TaskStatus[ViewOperations] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Mounts the view of ``source`` at ``mountpoint`` and serves it.

    Returns when the file system is unmounted from outside (``fusermount3 -u``).
    ``task_status.started`` hands over the :class:`ViewOperations` (call its
    ``refresh()`` after creating or deleting a checkpoint).

    Raises:
        MountError: see :func:`prepare_mountpoint`, or the kernel refused the mount.

    Cancellation:
        Cancelling unmounts (lazily: a process still inside the mount keeps what it has
        open, and new accesses fail) and returns once the view's tasks are done.
    """
    mountpoint = await trio.to_thread.run_sync(prepare_mountpoint, mountpoint)
    ops = ViewOperations(source, config)
    try:
        await ops.shown()  # a store that cannot list fails here, before anything is mounted
        async with trio.open_nursery() as nursery:
            ops.start(nursery)
            try:
                pyfuse3.init(ops, mountpoint, fuse_options(fsname=fsname, allow_other=allow_other))
            except RuntimeError as e:
                nursery.cancel_scope.cancel()
                with contextlib.suppress(Exception):  # frees the half-made session
                    pyfuse3.close(unmount=False)
                raise MountError(f"cannot mount {mountpoint}: {e}") from None
            log.info("mounted at %s", mountpoint)
            ops.mounted = True
            try:
                nursery.start_soon(
                    functools.partial(trio.to_thread.run_sync, tune_readahead, mountpoint)
                )
                task_status.started(ops)
                await pyfuse3.main(min_tasks=4, max_tasks=64)
            finally:
                ops.mounted = False
                ops.stop_pushing(functools.partial(abort_connection, mountpoint))
                pyfuse3.close(unmount=True)
                nursery.cancel_scope.cancel()
                log.info("unmounted %s", mountpoint)
    finally:
        ops.close()


async def serve_until_signal(
    source: CheckpointSource,
    mountpoint: str,
    config: ViewConfig | None = None,
    *,
    on_ready: Callable[[ViewOperations], None] | None = None,
    fsname: str = FSNAME,
) -> None:
    """:func:`serve` until SIGINT, SIGTERM or SIGHUP (then unmounts) or an unmount.

    Must run in the main thread (signals).
    """
    try:
        await _serve_until_signal(source, mountpoint, config, on_ready, fsname)
    except* SpriteError as group:  # a mount error reaches the caller as itself
        raise _first_leaf(group) from None


async def _serve_until_signal(
    source: CheckpointSource,
    mountpoint: str,
    config: ViewConfig | None,
    on_ready: Callable[[ViewOperations], None] | None,
    fsname: str,
) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                async for signum in signals:
                    log.info("%s: unmounting", signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    return

            async def mounted(task_status: trio.TaskStatus[ViewOperations]) -> None:
                await serve(source, mountpoint, config, fsname=fsname, task_status=task_status)
                nursery.cancel_scope.cancel()  # unmounted from outside

            nursery.start_soon(stop_on_signal)
            ops = await nursery.start(mounted)
            if on_ready is not None:
                on_ready(ops)


def _first_leaf(group: BaseExceptionGroup[SpriteError]) -> SpriteError:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first
