"""Crash injection for reliability tests.

Setting ``SPRITE_ENV_CRASH_AT=<point>`` in a process's environment makes it SIGKILL itself
when it reaches the named point (``SPRITE_ENV_CRASH_AT=<point>:<n>`` on the n-th time), so
tests can prove that a kill at that instant loses nothing. Points are named where they are
placed; ``grep -r crashpoint sprite_env`` lists them.

``SPRITE_ENV_CRASH_AT=<point>:<n>:<ERRNO>`` (``ERRNO`` a name such as ``ENOSPC`` or
``EIO``) raises that ``OSError`` there, the n-th time only, instead of killing: the
failure a real disk gives, at an instant a test cannot otherwise choose (borg's failing
reader, at a named point).
"""

from __future__ import annotations

import errno
import os
import signal

_spec = os.environ.get("SPRITE_ENV_CRASH_AT", "")
_point, _, _rest = _spec.partition(":")
_nth, _, _errno_name = _rest.partition(":")
_remaining = int(_nth) if _nth else 1
_errno = getattr(errno, _errno_name, None) if _errno_name else None


def crashpoint(name: str) -> None:
    """SIGKILLs this process if ``name`` is the configured crash point."""
    global _remaining
    if not _point or name != _point:
        return
    _remaining -= 1
    if _errno is not None:
        if _remaining == 0:  # once: the cause is then gone, as after freeing space
            raise OSError(_errno, f"{os.strerror(_errno)} (injected at {name})")
    elif _remaining <= 0:
        os.kill(os.getpid(), signal.SIGKILL)
