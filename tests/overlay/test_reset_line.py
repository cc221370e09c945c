"""``reset`` as llm.txt shows it, in a sprite: a daemon with a base image (--overlay)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.daemon import write_file
from tests.test_llm_txt import shown_commands

pytestmark = pytest.mark.integration


def test_llm_txt_reset_line_works_in_a_sprite(overlay_daemon: Any) -> None:
    """The line llm.txt shows, as written, against a daemon with a base image."""
    (line,) = [c for c in shown_commands() if c.startswith("sprite-env reset")]
    d, o = overlay_daemon, overlay_daemon.overlay
    write_file(os.path.join(o.merged, "app", "main.py"), b"print(1)\n")
    r = run_cli("--socket", d.socket, *line.split()[1:])
    assert r.returncode == 0, r
    assert "undo with: sprite-env restore auto-" in r.stdout
    assert os.listdir(o.upper) == []
    assert sorted(os.listdir(o.merged)) == ["etc", "usr"]  # the base image only
