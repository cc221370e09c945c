"""Service definitions: one TOML file per service, inside the layer, so checkpoints carry them.

On-disk format (the one place it is documented): ``ROOT/etc/sprite/services/NAME.toml``,
where NAME matches ``[A-Za-z0-9][A-Za-z0-9_.-]{0,63}``::

    command = "python3 -m http.server 8080"   # run by /bin/sh -c; or an argv list:
    # command = ["python3", "-m", "http.server", "8080"]
    workdir = "/srv/www"        # absolute, as seen inside the environment; default "/"
    env = { PYTHONUNBUFFERED = "1" }   # added to the daemon's environment
    restart = "on-failure"      # "always" | "on-failure" (default) | "never"
    stop_signal = "TERM"        # sent to the service's process group; "SIGTERM" works too
    stop_timeout = 10           # seconds between stop_signal and SIGKILL (0 to 600)

Only ``command`` is required; any other key is an error (a typo must not pass silently).

Where a service runs: the supervisor does not chroot. The command runs in the daemon's own
mount namespace, with ``cwd = ROOT/workdir`` (``workdir`` mapped onto the environment's
root). For the usual daemon, rooted at ``/`` inside the sprite, that is exactly
``workdir``; for an environment rooted elsewhere (an overlay's MERGED directory seen from
the host), only the working directory is mapped, so commands should use relative paths or
``$PWD``. The environment is the daemon's, plus ``env``, plus ``SPRITE_SERVICE=NAME``.

There is no ``user`` key: switching users needs the environment's own passwd database,
which for a non-``/`` root is not the host's; services run as the daemon's user.

Error handling:
    :func:`load_definitions` never raises for a bad file: each one becomes a message
    ``"NAME.toml: reason"`` in the returned error list, and the good files still load.
    :func:`load_definition` (one service, for ``start NAME``) raises
    :class:`DefinitionError` or :class:`UnknownService`.
"""

from __future__ import annotations

import errno
import math
import os
import re
import shlex
import signal
import stat
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from sprite_env.errors import UserError

#: Where definitions live, relative to the environment's root.
DEFINITIONS_DIR = "etc/sprite/services"
#: A definition larger than this is refused (they are a few lines; this guards the daemon).
MAX_DEFINITION_BYTES = 64 * 1024
#: The longest ``stop_timeout``: a restore waits for every service's, in parallel.
MAX_STOP_TIMEOUT = 600.0

Restart = Literal["always", "on-failure", "never"]
RESTART_POLICIES: tuple[str, ...] = get_args(Restart)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_KEYS = {"command", "workdir", "env", "restart", "stop_signal", "stop_timeout"}


class DefinitionError(UserError):
    """A service definition file that cannot be used; the message names the file."""

    def __init__(self, file: str, reason: str) -> None:
        super().__init__(f"{file}: {reason}")
        self.file = file
        self.reason = reason


class UnknownService(UserError):
    """No definition (and no running service) of that name."""

    code = "not_found"  # read by the API's problem_for(): answered with 404

    def __init__(self, name: str) -> None:
        super().__init__(f"no service {name!r} (no {DEFINITIONS_DIR}/{name}.toml)")
        self.name = name


class InvalidServiceName(UserError):
    """A name that can never be a service (the API answers 400)."""


_Bad = Callable[[str], DefinitionError]


@dataclass(frozen=True)
class ServiceDef:
    """One parsed definition. ``command`` is a shell string or an argv tuple."""

    name: str
    command: str | tuple[str, ...]
    workdir: str = "/"
    env: Mapping[str, str] = field(default_factory=dict)
    restart: Restart = "on-failure"
    stop_signal: signal.Signals = signal.SIGTERM
    stop_timeout: float = 10.0

    def argv(self) -> list[str]:
        """What is executed: ``/bin/sh -c COMMAND`` for a string, else the list itself."""
        if isinstance(self.command, str):
            return ["/bin/sh", "-c", self.command]
        return list(self.command)

    def display(self) -> str:
        """The command as one line, for status and logs."""
        if isinstance(self.command, str):
            return self.command
        return shlex.join(self.command)

    def cwd(self, root: str) -> str:
        """The host directory the command starts in: ``workdir`` mapped onto ``root``."""
        return os.path.normpath(os.path.join(root, self.workdir.lstrip("/")))

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` (the daemon's environment) plus ``env`` plus ``SPRITE_SERVICE``."""
        return {**base, **self.env, "SPRITE_SERVICE": self.name}


def validate_name(name: str) -> str:
    """Returns ``name`` if it can be a service name.

    Raises:
        InvalidServiceName: it cannot (also keeps names from reaching paths: no ``/``).
    """
    if not _NAME.fullmatch(name):
        raise InvalidServiceName(
            f"invalid service name {name!r}: use letters, digits, '_', '.' and '-' "
            "(at most 64, starting with a letter or digit)"
        )
    return name


def definitions_dir(root: str) -> str:
    return os.path.join(root, DEFINITIONS_DIR)


def load_definitions(root: str) -> tuple[dict[str, ServiceDef], list[str]]:
    """Every service defined under ``root``.

    Args:
        root: the environment's root (``/``, or an overlay's MERGED directory).

    Returns:
        The good definitions by name, and one ``"FILE: reason"`` message per bad file
        (sorted by file name). A missing directory means no services and no errors. Files
        not ending in ``.toml`` are ignored (editor backups, notes).
    """
    directory = definitions_dir(root)
    try:
        _check_inside(root, directory)
        names = sorted(e.name for e in os.scandir(directory) if e.name.endswith(".toml"))
    except FileNotFoundError:
        return {}, []
    except (OSError, DefinitionError) as e:
        return {}, [f"{DEFINITIONS_DIR}: {_reason(e)}"]
    good: dict[str, ServiceDef] = {}
    errors: list[str] = []
    for file in names:
        try:
            good[file.removesuffix(".toml")] = _load_file(directory, file)
        except DefinitionError as e:
            errors.append(str(e))
    return good, errors


def load_definition(root: str, name: str) -> ServiceDef:
    """The definition of one service.

    Raises:
        InvalidServiceName: ``name`` is not a possible name.
        UnknownService: there is no ``NAME.toml``.
        DefinitionError: there is one, and it is bad.
    """
    validate_name(name)
    directory = definitions_dir(root)
    _check_inside(root, directory)
    try:
        return _load_file(directory, f"{name}.toml")
    except DefinitionError as e:
        if e.reason == "does not exist":
            raise UnknownService(name) from None
        raise


def parse_definition(name: str, data: Mapping[str, Any], file: str | None = None) -> ServiceDef:
    """Checks a decoded TOML table and builds the definition.

    Raises:
        DefinitionError: a missing, unknown or ill-typed key, or a bad value.
    """
    file = file or f"{name}.toml"

    def bad(reason: str) -> DefinitionError:
        return DefinitionError(file, reason)

    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise bad(f"unknown key {unknown[0]!r} (known: {', '.join(sorted(_KEYS))})")
    if "command" not in data:
        raise bad("missing key 'command'")
    command = _command(data["command"], bad)

    workdir = data.get("workdir", "/")
    if not isinstance(workdir, str) or not workdir.startswith("/") or "\0" in workdir:
        raise bad(f"workdir must be an absolute path, not {workdir!r}")
    if ".." in workdir.split("/"):
        raise bad(f"workdir must not contain '..': {workdir!r}")

    env = data.get("env", {})
    if not isinstance(env, dict):
        raise bad("env must be a table of strings")
    for key, value in env.items():
        if not key or "=" in key or "\0" in key:
            raise bad(f"env: invalid variable name {key!r}")
        if not isinstance(value, str) or "\0" in value:
            raise bad(f"env: {key} must be a string without NUL")

    restart = data.get("restart", "on-failure")
    if restart not in RESTART_POLICIES:
        raise bad(f"restart must be one of {', '.join(RESTART_POLICIES)}, not {restart!r}")

    stop_signal = _signal(data.get("stop_signal", "TERM"), bad)

    timeout = data.get("stop_timeout", 10)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or not 0 <= timeout <= MAX_STOP_TIMEOUT
    ):
        raise bad(f"stop_timeout must be a number of seconds from 0 to {MAX_STOP_TIMEOUT:g}")

    return ServiceDef(
        name=name,
        command=command,
        workdir=os.path.normpath(workdir) if workdir != "/" else "/",
        env=dict(env),
        restart=restart,
        stop_signal=stop_signal,
        stop_timeout=float(timeout),
    )


# -- private helpers --------------------------------------------------------------------------


def _command(value: object, bad: _Bad) -> str | tuple[str, ...]:
    if isinstance(value, str):
        if not value.strip() or "\0" in value:
            raise bad("command must not be empty or contain NUL")
        return value
    if isinstance(value, list):
        if not value:
            raise bad("command list must not be empty")
        if not all(isinstance(a, str) and "\0" not in a for a in value):
            raise bad("command list must hold only strings (without NUL)")
        if not value[0]:
            raise bad("command list must start with a program")
        return tuple(value)
    raise bad(f"command must be a string or a list of strings, not {type(value).__name__}")


def _signal(value: object, bad: _Bad) -> signal.Signals:
    if isinstance(value, str):
        upper = value.upper()
        name = upper if upper.startswith("SIG") else f"SIG{upper}"
        try:
            return signal.Signals[name]
        except KeyError:
            pass
    raise bad(f"stop_signal must be a signal name such as TERM or INT, not {value!r}")


def _load_file(directory: str, file: str) -> ServiceDef:
    name = file.removesuffix(".toml")
    if not _NAME.fullmatch(name):
        raise DefinitionError(
            file, "invalid service name: use letters, digits, '_', '.' and '-' (at most 64)"
        )
    path = os.path.join(directory, file)
    try:
        # O_NOFOLLOW: a symlink inside the environment points at a path of the environment,
        # which from here (a non-/ root) would be read from the host instead.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise DefinitionError(file, "does not exist") from None
        if e.errno == errno.ELOOP:
            raise DefinitionError(file, "is a symbolic link (not followed)") from None
        raise DefinitionError(file, _reason(e)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DefinitionError(file, "is not a regular file")
        if st.st_size > MAX_DEFINITION_BYTES:
            raise DefinitionError(file, f"is larger than {MAX_DEFINITION_BYTES} bytes")
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(MAX_DEFINITION_BYTES + 1)
    except OSError as e:
        raise DefinitionError(file, _reason(e)) from None
    finally:
        os.close(fd)
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise DefinitionError(file, "is not UTF-8") from None
    except tomllib.TOMLDecodeError as e:
        raise DefinitionError(file, f"invalid TOML: {e}") from None
    return parse_definition(name, data, file)


def _check_inside(root: str, directory: str) -> None:
    """Refuses a definitions directory reached through a symlink that leaves ``root``."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(directory)
    if real != real_root and not real.startswith(real_root.rstrip("/") + "/"):
        raise DefinitionError(DEFINITIONS_DIR, f"resolves outside the environment ({real})")


def _reason(e: BaseException) -> str:
    if isinstance(e, DefinitionError):
        return e.reason
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e)
