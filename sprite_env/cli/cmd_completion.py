"""``sprite-env completion SHELL``: a tab-completion script for bash, zsh or tcsh.

shtab writes the script once from the parser, so completing costs no Python start-up at
each TAB (argcomplete runs the program for every completion: measured here, ~0.15 s per
TAB for this command line's imports); the price is that the script is static, so it is
generated again after an upgrade, as the README says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

SHELLS = ("bash", "zsh", "tcsh")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "completion",
        help='print a tab-completion script: eval "$(sprite-env completion bash)"',
        description="Prints a completion script for SHELL. Bash: add "
        '`eval "$(sprite-env completion bash)"` to ~/.bashrc, or save it as '
        "/etc/bash_completion.d/sprite-env.",
    )
    p.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    p.set_defaults(func=cmd_completion)


def cmd_completion(args: argparse.Namespace) -> int:
    import shtab

    from sprite_env.cli.main import build_parser

    print(shtab.complete(build_parser(), shell=args.shell), end="")
    return 0
