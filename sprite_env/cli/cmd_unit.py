"""``sprite-env install-unit``: a systemd unit that starts the daemon at boot inside a VM.

The unit runs ``sprite-env daemon @CONFIG``: the daemon's flags live in a config file
(one or more a line, ``#`` comments; see ``sprite-env daemon --help``), so changing them
needs no edit of the unit. A missing config file is written as a template that names no
layer, and a daemon started on it refuses to run until one is named (``--overlay`` or
``--root``): nothing is checkpointed, or reset, by accident (issue 10).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING

from sprite_env.errors import UserError

if TYPE_CHECKING:
    import argparse

UNIT_NAME = "sprite-env.service"
DEFAULT_UNIT_DIR = "/etc/systemd/system"
DEFAULT_CONFIG = "/etc/sprite-env/daemon.conf"

CONFIG_TEMPLATE = """\
# Flags of `sprite-env daemon`, one or more a line (see: sprite-env daemon --help).
# Flags given after @FILE on the command line override these.
#
# Name the layer the daemon owns (there is no default). In a sprite, the overlay:
#--overlay /base:/layer/upper:/layer/work:/merged
#--state /layer/state
# or a plain directory (no reset: there is no base image below it):
#--root /srv/data
#
#--auto-interval 60
#--max-checkpoints 200
#--socket-group sprite
"""


def unit_text(exe: str, config: str) -> str:
    """The unit file for the daemon run by ``exe`` with its flags in ``config``."""
    return f"""\
[Unit]
Description=sprite-env checkpoint daemon
Documentation=file://{shlex.quote(config)}
After=local-fs.target
RequiresMountsFor=/

[Service]
Type=simple
ExecStart={shlex.quote(exe)} daemon @{shlex.quote(config)}
# SIGTERM: the daemon stops accepting, lets the running job end, takes a checkpoint of
# what changed and unmounts its view; a big layer's last checkpoint may take a while.
KillMode=mixed
TimeoutStopSec=300
Restart=on-failure
RestartSec=2

[Install]
WantedBy=multi-user.target
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "install-unit",
        help="install a systemd unit that starts the daemon at boot (flags in a config file)",
        description="Writes UNIT_DIR/sprite-env.service, which runs `sprite-env daemon "
        "@CONFIG`, and CONFIG as a template if it is missing (it names no layer: edit it). "
        "With systemd running, then reloads it and enables the unit.",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        default=DEFAULT_CONFIG,
        help=f"the daemon's flags, one or more a line (default: {DEFAULT_CONFIG})",
    )
    p.add_argument(
        "--unit-dir",
        metavar="DIR",
        default=DEFAULT_UNIT_DIR,
        help=f"where the unit goes (default: {DEFAULT_UNIT_DIR})",
    )
    p.add_argument("--print", action="store_true", help="print the unit instead of installing it")
    p.set_defaults(func=cmd_install_unit)


def _executable() -> str:
    """This sprite-env's own command, absolute: a unit must not depend on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "sprite-env")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("sprite-env")
    if found is None:
        raise UserError("cannot find the sprite-env command to run from the unit")
    return os.path.abspath(found)


def cmd_install_unit(args: argparse.Namespace) -> int:
    config = os.path.abspath(args.config)
    text = unit_text(_executable(), config)
    if args.print:
        print(text, end="")
        return 0
    unit = os.path.join(args.unit_dir, UNIT_NAME)
    try:
        os.makedirs(args.unit_dir, exist_ok=True)
        _write(unit, text, 0o644)
        if not os.path.exists(config):
            os.makedirs(os.path.dirname(config), exist_ok=True)
            _write(config, CONFIG_TEMPLATE, 0o644)
            print(f"wrote {config}: name the daemon's layer in it (--overlay or --root)")
    except PermissionError as e:
        raise UserError(f"cannot write {e.filename}: permission denied (run as root)") from None
    print(f"installed {unit}")
    if os.path.isdir("/run/systemd/system") and shutil.which("systemctl"):
        subprocess.run(["systemctl", "daemon-reload"], check=False)
        subprocess.run(["systemctl", "enable", UNIT_NAME], check=False)
        print(f"enabled; start it with: systemctl start {UNIT_NAME}")
    else:
        print(f"systemd is not running here; where it is: systemctl enable --now {UNIT_NAME}")
    return 0


def _write(path: str, text: str, mode: int) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
