"""The overlay fixtures (a daemon on a real overlayfs with a base image), shared with
tests/overlay: ``environment_reset`` and a restore that ends sessions need one."""

from tests.overlay.conftest import overlay, overlay_daemon

__all__ = ["overlay", "overlay_daemon"]
