"""The moment a race against a restore needs: after the live layer was captured (the undo
checkpoint) and the restore was checked, just before it writes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    import pytest

    from sprite_env.checkpoints import Engine


def when_restore_starts(
    monkeypatch: pytest.MonkeyPatch, engine: Engine, act: Callable[[], None]
) -> None:
    """Runs ``act`` once the engine has recorded its restore's intent, before any write."""
    original = engine._write_intent

    def write_intent(intent: dict[str, Any]) -> None:
        original(intent)
        act()

    monkeypatch.setattr(engine, "_write_intent", write_intent)
