"""Running the command line as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Runs ``sprite-env ARGS`` with this interpreter; never raises on a non-zero exit."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "sprite_env", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=full_env,
        timeout=300,
    )
