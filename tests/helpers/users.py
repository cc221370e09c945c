"""Another user of the machine: code run as the real unprivileged user ``nobody`` (through
``setpriv``), to test what the store and the daemon's state let other users reach."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING

import pytest

from tests.helpers.cli import REPO

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

#: Opens each path given and reads a byte of it (lists it, for a directory); prints what
#: happened to each: "ok" or the errno's name.
_PROBE = """
import errno, json, os, sys
out = {}
for p in sys.argv[1:]:
    try:
        fd = os.open(p, os.O_RDONLY)
        try:
            if os.path.isdir(p):
                os.listdir(p)
            else:
                os.read(fd, 1)
        finally:
            os.close(fd)
        out[p] = "ok"
    except OSError as e:
        out[p] = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps(out))
"""


def need_nobody() -> None:
    """Skips the test unless it runs as root with ``setpriv`` and a ``nobody`` user."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv")
    try:
        import pwd

        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody")


def as_nobody(argv: list[str], *, groups: Iterable[int] = ()) -> subprocess.CompletedProcess[str]:
    """Runs ``argv`` as user ``nobody``, group ``nogroup``, with only ``groups`` besides."""
    need_nobody()
    gs = list(groups)
    extra = [f"--groups={','.join(map(str, gs))}"] if gs else ["--clear-groups"]
    return subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", *extra, *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


def cli_as_nobody(*args: str) -> subprocess.CompletedProcess[str]:
    """``sprite-env ARGS`` as ``nobody``."""
    return as_nobody([sys.executable, "-m", "sprite_env", *args])


def read_as_nobody(paths: Iterable[str], *, groups: Iterable[int] = ()) -> dict[str, str]:
    """What ``nobody`` gets trying to read each path: "ok" or an errno name ("EACCES")."""
    p = as_nobody([sys.executable, "-c", _PROBE, *paths], groups=groups)
    assert p.returncode == 0, p.stderr
    result: dict[str, str] = json.loads(p.stdout)
    return result


@contextlib.contextmanager
def reachable_dir() -> Iterator[str]:
    """A new directory every user may enter (0755, under /tmp): pytest's ``tmp_path`` is
    under a 0700 directory, which would deny ``nobody`` everything whatever the store did."""
    d = tempfile.mkdtemp(prefix="sprite-privacy-", dir="/tmp")
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def modes(top: str, skip: Iterable[str] = ()) -> dict[str, int]:
    """The permission bits of ``top`` and everything under it (no symlinks), by path
    relative to ``top``; names in ``skip`` (relative paths) are left out, and not entered."""
    left_out = set(skip)
    out = {".": stat.S_IMODE(os.lstat(top).st_mode)}
    for dirpath, dirnames, filenames in os.walk(top):
        rel_dir = os.path.relpath(dirpath, top)
        for name in [*dirnames, *filenames]:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if rel in left_out:
                if name in dirnames:
                    dirnames.remove(name)
                continue
            st = os.lstat(os.path.join(dirpath, name))
            if not stat.S_ISLNK(st.st_mode):
                out[rel] = stat.S_IMODE(st.st_mode)
    return out


def assert_private(top: str, skip: Iterable[str] = (), dir_mode: int = 0o700) -> dict[str, int]:
    """Asserts ``top`` is ``dir_mode`` and everything under it 0700 (directories) or 0600;
    returns the modes it saw."""
    seen = modes(top, skip)
    wrong = {}
    for rel, mode in seen.items():
        path = os.path.join(top, rel)
        want = (dir_mode if rel == "." else 0o700) if os.path.isdir(path) else 0o600
        if mode != want:
            wrong[rel] = f"{mode:04o}, want {want:04o}"
    assert not wrong, wrong
    return seen
