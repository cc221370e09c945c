"""Private files: the store and the daemon's state directory are for their owner (root) only.

A pack holds every checkpointed byte whatever the captured file's own mode was, and the
catalog, the activity log and the services' logs say what the layer holds: issue 15's
audit decoded two 0600 root secrets from packs an unprivileged user could read (0644 in
0755 directories). So:

- Everything is created with an explicit mode, :data:`DIR_MODE` 0700 or :data:`FILE_MODE`
  0600, and then set to exactly that: the umask can only take bits away (0 and 022 leave
  0700/0600 as they are), and the ``chmod`` after it undoes one that would take the owner's
  own bits (0277). SQLite gives a database's ``-wal`` and ``-shm`` the database file's mode,
  so ``store/catalog.py`` creates that file 0600 before SQLite opens it.
- What an older version made open (0755/0644) is made private when its owner opens it for
  writing (:func:`tighten`, which logs what it changed); a read-only open changes nothing,
  and ``store check`` reports what :func:`exposed` finds.

The exceptions live with their owners. Given ``--socket-group G``, STATE is 0710 for G
(``daemon/service.py``): connecting to the socket needs search permission on its directory.
The API socket is 0600, or 0660 for G (``api/server.py``). ``STATE/llm.txt`` is 0644: it is
the package's public guide, for whoever can reach STATE (root, and G: the agents allowed
the API, whom it is written for). The store inside STATE stays 0700 in every case.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass

from sprite_env.errors import UserError

log = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600
#: Permission bits for the group and for others: none of them on a private path.
OPEN_BITS = 0o077


class AccessDenied(UserError):
    """This user may not open a private directory (the store, the state): it belongs to
    another user. A user error, not damage (exit 2): the same command as the owner works,
    and ``store check`` must not report a sound store as damaged (its exit 3)."""

    def __init__(self, what: str, path: str, error: OSError) -> None:
        where = error.filename if isinstance(error.filename, str) else path
        try:
            owner, verb, why = os.stat(path).st_uid, "open", "; it is private to its owner"
        except OSError:  # missing: its parent refused the creation
            owner, verb, why = _owner_of_parent(path), "create", ""
        who = "root" if owner == 0 else f"uid {owner}"
        super().__init__(
            f"cannot {verb} the {what} {path}: permission denied ({where}){why}: run this "
            f"command as {who}"
        )


def _owner_of_parent(path: str) -> int:
    parent = os.path.dirname(os.path.abspath(path))
    while True:
        try:
            return os.stat(parent).st_uid
        except OSError:
            if parent == "/":
                return 0
            parent = os.path.dirname(parent)


def make_dir(path: str, mode: int = DIR_MODE, gid: int = -1) -> int | None:
    """Creates directory ``path`` if missing (and its parents, as ``os.makedirs`` does) and
    gives it exactly ``mode``, and group ``gid`` unless -1.

    Returns:
        The mode it had before, if it existed with another mode; else None.

    Raises:
        OSError: it cannot be created, or its mode not set.
    """
    existed = os.path.isdir(path)
    os.makedirs(path, mode=mode, exist_ok=True)
    st = os.stat(path)
    if gid != -1 and st.st_gid != gid:
        os.chown(path, -1, gid)
    before = stat.S_IMODE(st.st_mode)
    if before == mode:
        return None
    os.chmod(path, mode)
    return before if existed else None


def open_file(path: str, flags: int, mode: int = FILE_MODE) -> int:
    """``os.open`` with ``O_CREAT | O_CLOEXEC``; a file it creates, or one found with another
    mode, gets exactly ``mode`` (one ``fstat``, and an ``fchmod`` if needed).

    Raises:
        OSError: as ``os.open``.
    """
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, mode)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
            os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


@dataclass(frozen=True)
class OpenPath:
    """A path under a private directory that the group or others may use."""

    path: str
    mode: int
    is_dir: bool


def exposed(top: str) -> list[OpenPath]:
    """Every directory and file at and under ``top`` with a group or other permission bit,
    parents before their contents. Follows no symlink below ``top`` (``top`` itself may be
    one, to the directory) and enters no other file system (a mount point is not the
    directory's own); entries that vanish or cannot be stat'ed are skipped.

    Raises:
        OSError: ``top`` itself cannot be stat'ed or listed.
    """
    out: list[OpenPath] = []
    st = os.stat(top)
    if stat.S_IMODE(st.st_mode) & OPEN_BITS:
        out.append(OpenPath(top, stat.S_IMODE(st.st_mode), stat.S_ISDIR(st.st_mode)))
    if stat.S_ISDIR(st.st_mode):
        _walk(top, st.st_dev, out)
    return out


def _walk(path: str, dev: int, out: list[OpenPath]) -> None:
    with os.scandir(path) as it:
        entries = list(it)
    for e in entries:
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:  # gone, or a stale mount point (ENOTCONN)
            continue
        if stat.S_ISLNK(st.st_mode) or st.st_dev != dev:
            continue
        is_dir = stat.S_ISDIR(st.st_mode)
        if stat.S_IMODE(st.st_mode) & OPEN_BITS:
            out.append(OpenPath(e.path, stat.S_IMODE(st.st_mode), is_dir))
        if is_dir:
            try:
                _walk(e.path, dev, out)
            except OSError:
                continue


def tighten(top: str, what: str, level: int = logging.WARNING) -> list[OpenPath]:
    """Takes the group and other bits off everything at and under ``top`` (directories
    first, so the contents are unreachable at once) and logs a warning saying what it did.

    Cost: one ``lstat`` per entry, at every writable open: with nothing to change, 1,000
    packs (~32 GiB) took 2-3 ms and 10,000 took 22-54 ms (2 shared cores, load 2.9).

    Args:
        top: the directory.
        what: how the warning names it ("store", "state directory").
        level: of the log record saying what changed (failures are always warnings).

    Returns:
        What was open before (empty when ``top`` was private already).

    Error handling:
        A path whose mode cannot be changed (EPERM on a file system without modes, a file
        of another owner) is logged as a warning and left; opening goes on.
    """
    found = exposed(top)
    if not found:
        return found
    failed = []
    for p in found:
        try:
            os.chmod(p.path, p.mode & ~OPEN_BITS)  # no symlinks: exposed() skips them
        except FileNotFoundError:
            continue
        except OSError as e:
            failed.append(f"{p.path}: {e.strerror}")
    dirs = sum(p.is_dir for p in found)
    log.log(
        level,
        "%s %s was open to other users (%d directories, %d files with group or other "
        "permissions, e.g. %s %04o): made private (those permissions removed)",
        what,
        top,
        dirs,
        len(found) - dirs,
        found[0].path,
        found[0].mode,
    )
    for f in failed:
        log.warning("%s %s: could not make private: %s", what, top, f)
    return found
