"""``STATE/daemon.lock``: which daemon serves a state directory, and what it is doing.

The daemon holds an exclusive ``flock`` on the file for its whole life (one daemon per
state) and keeps two lines in it::

    <pid>
    <phase>      starting | finishing-restore | serving | stopping

Clients read it (never lock it: a shared lock taken to test would make a daemon starting
at that instant fail its own) to tell, when the socket is missing or refuses them, a
daemon that is on its way (wait for it, and say why) from one that is gone (say so at
once, with the dead pid, instead of waiting 30 s: issue 10). This module is imported by
the CLI, so it stays standard library only and cheap.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

NAME = "daemon.lock"
PHASES = ("starting", "finishing-restore", "serving", "stopping")
#: What a waiting client says of each phase.
DOING = {
    "starting": "is starting",
    "finishing-restore": "is finishing a restore it was interrupted in",
    "serving": "is starting its API",
    "stopping": "is stopping",
}


@dataclass(frozen=True)
class Holder:
    pid: int | None
    phase: str | None
    alive: bool  # a process with that pid runs sprite-env


def write(fd: int, phase: str) -> None:
    """Records this process and ``phase`` in the lock file open at ``fd``."""
    assert phase in PHASES
    data = f"{os.getpid()}\n{phase}\n".encode()
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))


def read(state: str) -> Holder | None:
    """Who holds ``state``'s lock. None when that cannot be known (no permission).

    Returns a Holder with ``pid`` None when there is no lock file (no daemon ever ran
    there), and ``alive`` False when the recorded daemon is gone.
    """
    try:
        with open(os.path.join(state, NAME), "rb") as f:
            text = f.read(64).decode(errors="replace")
    except FileNotFoundError:
        return Holder(None, None, False) if os.path.isdir(state) or _missing(state) else None
    except OSError:  # not ours to read: the store's owner decides (see privacy.py)
        return None
    lines = text.split("\n")
    pid = int(lines[0]) if lines[0].strip().isascii() and lines[0].strip().isdigit() else None
    phase = lines[1].strip() if len(lines) > 1 and lines[1].strip() in PHASES else None
    return Holder(pid, phase, pid is not None and _runs_sprite_env(pid))


def _missing(path: str) -> bool:
    try:
        os.stat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


def _runs_sprite_env(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:  # gone (or /proc hidden: then assume it runs, and wait as before)
        return not os.path.isdir("/proc/self")
    # Empty while the process is between fork and exec (seen: 12 of 50 right after
    # Popen): it exists, which is what counts then.
    return not cmd or b"sprite_env" in cmd or b"sprite-env" in cmd


def starting_daemon(state: str, young_s: float = 30.0) -> int | None:
    """The pid of a ``sprite-env daemon`` for ``state`` started less than ``young_s`` ago
    that holds no lock yet, as far as a scan of /proc can tell (a few ms), else None.

    A daemon spends its first second or so importing before it takes its lock (more on a
    loaded machine), and a client started together with it should wait for it, not say
    that none runs. Only a daemon whose ``--state`` (or ``--root``/.sprite, the default,
    or those flags in its ``@FILE``) is ``state`` counts.
    """
    want = os.path.realpath(state)
    try:
        names = os.listdir("/proc")
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None
    for name in names:
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = [os.fsdecode(a) for a in f.read().split(b"\0") if a]
            if "daemon" not in argv or not any("sprite" in a for a in argv[:3]):
                continue
            with open(f"/proc/{name}/stat") as f:
                started = int(f.read().rsplit(")", 1)[1].split()[19]) / ticks
            if uptime - started > young_s:
                continue
            cwd = os.readlink(f"/proc/{name}/cwd")
        except (OSError, ValueError, IndexError):
            continue
        if _state_of(argv[argv.index("daemon") + 1 :], cwd) == want:
            return int(name)
    return None


def _state_of(args: list[str], cwd: str) -> str | None:
    """The state directory a daemon's arguments name (as ``config_from_args`` reads them)."""
    import shlex

    words: list[str] = []
    for a in args:
        if a.startswith("@"):
            try:
                with open(os.path.join(cwd, a[1:])) as f:
                    words += [w for line in f for w in shlex.split(line, comments=True)]
            except (OSError, ValueError):
                return None
        else:
            words.append(a)
    found: dict[str, str] = {}
    for i, w in enumerate(words):
        for flag in ("--state", "--root"):
            if w == flag and i + 1 < len(words):
                found[flag] = words[i + 1]
            elif w.startswith(flag + "="):
                found[flag] = w.split("=", 1)[1]
    if "--state" in found:
        return os.path.realpath(os.path.join(cwd, found["--state"]))
    if "--root" in found:
        return os.path.realpath(os.path.join(cwd, found["--root"], ".sprite"))
    return None
