"""Who asks: the actor name recorded in the activity log, checked the same way by the
daemon (the ``X-Sprite-Actor`` header) and the CLI (``--as``). Standard library only: the
CLI imports it, and a client's start-up must not load the daemon."""

from __future__ import annotations

import unicodedata

from sprite_env.errors import UserError

MAX_ACTOR = 64


class InvalidActor(UserError):
    code = "invalid_actor"  # read by the API's problem_for(): answered with 400


def clean_actor(name: str | None, default: str) -> str:
    """Returns the actor name to record for ``name`` (an ``X-Sprite-Actor`` header).

    Surrounding whitespace is stripped and the name cut to :data:`MAX_ACTOR` characters;
    a missing or blank name becomes ``default``.

    Raises:
        InvalidActor: the name contains control characters (or line separators), which
            could forge lines in a terminal or a log viewer, or lone surrogates.
    """
    if name is None:
        return default
    name = name.strip()
    bad = [c for c in name if unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp")]
    if bad:
        raise InvalidActor(
            f"invalid actor {name[:80]!r}: contains {bad[0]!r} (control characters, line "
            "separators and lone surrogates are refused)"
        )
    return name[:MAX_ACTOR].rstrip() or default
