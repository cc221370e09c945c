"""Checkpoints of a layer: the registry (ids, records, the active one) and the engine.

Concepts:

- A **checkpoint** is a committed capture of the layer root: a top tree id plus a record
  (id, comment, time, who, parent and history, counts, warnings).
- Ids: ``v0, v1, ...`` for manual checkpoints, never reused; ``auto-<UTC time>`` for
  automatic ones (before each restore, by the scheduler), hidden from lists unless asked.
- The **active** checkpoint is the last one created or restored; it cannot be deleted.
- :class:`Engine` is the API: create, list, info, diff, preview, restore, delete.
"""

from sprite_env.checkpoints.engine import (
    ActiveCheckpoint,
    DeleteReport,
    Engine,
    Preview,
    RestoreReport,
)
from sprite_env.checkpoints.registry import Checkpoint, InvalidCheckpointId, UnknownCheckpoint

__all__ = [
    "ActiveCheckpoint",
    "Checkpoint",
    "DeleteReport",
    "Engine",
    "InvalidCheckpointId",
    "Preview",
    "RestoreReport",
    "UnknownCheckpoint",
]
