"""sprite-env: a checkpoint engine for the writable filesystem layer of a sandbox VM.

Packages, by layer (data flows down for a capture, up for a restore):

- ``store``: content-addressed objects (BLAKE3 ids, zstd, packs, SQLite catalog). Knows
  nothing about files.
- ``snapshot``: files <-> objects (chunk lists today; trees, capture and restore next).
- ``cli``: the ``sprite-env`` command.
"""

__version__ = "0.1.0"
