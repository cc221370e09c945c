"""Crash injection for reliability tests.

Setting ``SPRITE_ENV_CRASH_AT=<point>`` in a process's environment makes it SIGKILL itself
when it reaches the named point (``SPRITE_ENV_CRASH_AT=<point>:<n>`` on the n-th time), so
tests can prove that a kill at that instant loses nothing. Points are named where they are
placed; ``grep -r crashpoint sprite_env`` lists them.
"""

from __future__ import annotations

import os
import signal

_spec = os.environ.get("SPRITE_ENV_CRASH_AT", "")
_point, _, _nth = _spec.partition(":")
_remaining = int(_nth) if _nth else 1


def crashpoint(name: str) -> None:
    """SIGKILLs this process if ``name`` is the configured crash point."""
    global _remaining
    if not _point or name != _point:
        return
    _remaining -= 1
    if _remaining <= 0:
        os.kill(os.getpid(), signal.SIGKILL)
