from __future__ import annotations

import contextlib
import os
import subprocess
from typing import TYPE_CHECKING, Any

import pytest

from sprite_env.overlay import Overlay

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def overlay(tmp_path: Any) -> Iterator[Overlay]:
    """Empty LOWER, UPPER, WORK and MERGED directories; MERGED is unmounted at the end."""
    dirs = [os.path.join(tmp_path, n) for n in ("lower", "upper", "work", "merged")]
    for d in dirs:
        os.makedirs(d)
    o = Overlay(*dirs)
    yield o
    with contextlib.suppress(Exception):
        subprocess.run(["umount", "-l", o.merged], capture_output=True, check=False)


@pytest.fixture
def overlay_daemon(overlay: Overlay, daemon_factory: Any, tmp_path: Any) -> Any:
    """A daemon on ``overlay`` (LOWER holds a small base image), view mounted."""
    base = overlay.lower
    os.makedirs(os.path.join(base, "etc"))
    with open(os.path.join(base, "etc", "hosts"), "w") as f:
        f.write("127.0.0.1 localhost\n")
    os.makedirs(os.path.join(base, "usr", "lib", "pkg"))
    for i in range(3):
        with open(os.path.join(base, "usr", "lib", "pkg", f"m{i}.py"), "w") as f:
            f.write(f"# module {i}\n")
    spec = f"{overlay.lower}:{overlay.upper}:{overlay.work}:{overlay.merged}"
    d = daemon_factory("--overlay", spec, root=overlay.merged, state=str(tmp_path / "state"))
    d.overlay = overlay
    return d
