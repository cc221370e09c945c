"""The real sprite shape: a read-only base image below, a writable layer above, overlayfs
merging them. Checkpoints hold the writable layer (UPPER); a restore swaps it while the
overlay is down."""

from sprite_env.overlay.mount import Overlay, OverlayError

__all__ = ["Overlay", "OverlayError"]
