"""Options every command accepts, and the two ways a command reaches the checkpoints.

- **Online** (the default): the command is a client of the daemon's API socket
  (``--socket``, ``$SPRITE_API_SOCK``, ``/.sprite/api.sock``); the daemon owns the store.
- **Offline**: given ``--root`` or ``--store`` explicitly, the checkpoint commands open the
  store themselves and run the engine in this process (no daemon may hold that store).
  ``store`` and ``checkpoints mount`` always work this way, on ``/`` unless told
  otherwise. No offline command but ``store init`` creates a store.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sprite_env.store.backend import RemoteConfig


def add_common_options(
    p: argparse.ArgumentParser, *, top: bool = False, offline: bool = True
) -> None:
    """--root, --store, --socket, --as, --json and --exclude, accepted before or after the
    command words (without ``offline``, a command that only talks to the daemon: no
    --root, --store or --exclude after its name).

    Only the top-level parser sets defaults; a subcommand's copy of an option is SUPPRESSed
    when absent, so it cannot overwrite a value given before the command. ``--root`` and
    ``--store`` default to None, so that :func:`is_offline` can tell they were given.
    """

    def default(value: Any) -> dict[str, Any]:
        return {"default": value if top else argparse.SUPPRESS}

    if offline:
        p.add_argument(
            "--root",
            metavar="DIR",
            help="work offline on the layer DIR, without the daemon (default: the daemon's; /)",
            **default(None),
        )
        p.add_argument(
            "--store",
            metavar="DIR|s3://BUCKET/PREFIX",
            help="work offline on this store directory (default: ROOT/.sprite/store), or on "
            "a store in object storage (its local copy and pack cache in ROOT/.sprite/store; "
            "endpoint and keys from the AWS_* variables or ~/.aws/)",
            **default(None),
        )
        p.add_argument(
            "--cache-size",
            metavar="SIZE",
            help="with --store s3://...: the bound of the local pack cache, e.g. 512M or 4G "
            "(default: 2G)",
            **default(None),
        )
    p.add_argument(
        "--socket",
        metavar="PATH",
        help="the daemon's API socket (default: $SPRITE_API_SOCK, else /.sprite/api.sock)",
        **default(None),
    )
    p.add_argument(
        "--as",
        dest="actor",
        metavar="NAME",
        help="who is asking, as the activity log records it (default: $SPRITE_ACTOR, else user)",
        **default(None),
    )
    p.add_argument("--json", action="store_true", help="machine-readable output", **default(False))
    if offline:
        p.add_argument(
            "--exclude",
            action="append",
            metavar="PATTERN",
            help="offline: leave paths matching PATTERN (relative to ROOT, fnmatch) out of "
            "checkpoints and restores; saved in the store, replacing the saved list",
            **default(None),
        )


def is_offline(args: argparse.Namespace) -> bool:
    """Whether ``--root`` or ``--store`` was given: run the engine here, not the daemon."""
    return args.root is not None or args.store is not None


def root_dir(args: argparse.Namespace) -> str:
    """The layer an offline command works on (``--root``, default ``/``)."""
    return str(args.root) if args.root is not None else "/"


def store_dir(args: argparse.Namespace) -> str:
    """The store directory an offline command opens (``--store DIR``, default
    ``ROOT/.sprite/store``, which is also where a store in object storage keeps its local
    copy and cache)."""
    if args.store and not _is_url(args.store):
        return str(args.store)
    return os.path.join(root_dir(args), ".sprite", "store")


def store_given(args: argparse.Namespace) -> bool:
    """Whether ``--store DIR`` names the store directory (not the default in ROOT)."""
    return bool(args.store) and not _is_url(args.store)


def _is_url(store: str) -> bool:
    return "://" in store  # as store.backend.is_remote, without loading the store


def remote(args: argparse.Namespace) -> RemoteConfig | None:
    """``--store s3://...`` with ``--cache-size``, or None for a local store.

    Raises:
        BadStoreUrl: a malformed URL; BadCacheSize: a bad size, or one without a remote.
    """
    from sprite_env.store.backend import BadCacheSize, RemoteConfig

    cache_size = getattr(args, "cache_size", None)
    if not args.store or not _is_url(args.store):
        if cache_size is not None:
            raise BadCacheSize(
                "--cache-size bounds a remote store's cache: it needs --store s3://BUCKET/PREFIX"
            )
        return None
    return RemoteConfig.parse(args.store, cache_size)


def actor(args: argparse.Namespace, named: str | None = None) -> str:
    """Who asks: ``named`` (a ``--created-by``), else ``--as``, else ``$SPRITE_ACTOR``, else
    ``user``; checked as the daemon checks it, before anything is sent or written.

    Raises:
        InvalidActor: the name holds a control character, a line separator or a lone
            surrogate (exit 2, like the daemon's ``invalid_actor``).
    """
    from sprite_env.actor import clean_actor
    from sprite_env.client import resolve_actor

    return clean_actor(named or resolve_actor(args.actor), "user")
