"""Options every command accepts."""

from __future__ import annotations

import argparse
from typing import Any


def add_common_options(p: argparse.ArgumentParser, *, top: bool = False) -> None:
    """--root, --store, --json and --exclude, accepted before or after the command words.

    Only the top-level parser sets defaults; a subcommand's copy of an option is SUPPRESSed
    when absent, so it cannot overwrite a value given before the command.
    """

    def default(value: Any) -> dict[str, Any]:
        return {"default": value if top else argparse.SUPPRESS}

    p.add_argument(
        "--root", metavar="DIR", help="the layer to checkpoint (default: /)", **default("/")
    )
    p.add_argument(
        "--store",
        metavar="DIR",
        help="the store directory (default: ROOT/.sprite/store)",
        **default(None),
    )
    p.add_argument("--json", action="store_true", help="machine-readable output", **default(False))
    p.add_argument(
        "--exclude",
        action="append",
        metavar="PATTERN",
        help="leave paths matching PATTERN (relative to ROOT, fnmatch) out of checkpoints and "
        "restores; saved in the store, replacing the saved list",
        **default(None),
    )
