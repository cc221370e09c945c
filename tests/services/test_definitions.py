from __future__ import annotations

import signal
from typing import TYPE_CHECKING

import pytest

from sprite_env.services import (
    DEFINITIONS_DIR,
    DefinitionError,
    InvalidServiceName,
    ServiceDef,
    UnknownService,
    load_definition,
    load_definitions,
    validate_name,
)

if TYPE_CHECKING:
    from pathlib import Path


def write(root: Path, file: str, text: str | bytes) -> None:
    d = root / DEFINITIONS_DIR
    d.mkdir(parents=True, exist_ok=True)
    data = text.encode() if isinstance(text, str) else text
    (d / file).write_bytes(data)


def test_minimal_definition_gets_the_defaults(tmp_path: Path) -> None:
    write(tmp_path, "web.toml", 'command = "python3 -m http.server"\n')
    defs, errors = load_definitions(str(tmp_path))
    assert errors == []
    assert defs == {
        "web": ServiceDef(
            name="web",
            command="python3 -m http.server",
            workdir="/",
            env={},
            restart="on-failure",
            stop_signal=signal.SIGTERM,
            stop_timeout=10.0,
        )
    }
    web = defs["web"]
    assert web.argv() == ["/bin/sh", "-c", "python3 -m http.server"]
    assert web.cwd(str(tmp_path)) == str(tmp_path)
    assert web.cwd("/") == "/"


def test_full_definition(tmp_path: Path) -> None:
    write(
        tmp_path,
        "db.v2.toml",
        """
        command = ["postgres", "-D", "/var/lib/pg data"]
        workdir = "/var/lib/"
        env = { PGPORT = "5433", LANG = "C.UTF-8" }
        restart = "always"
        stop_signal = "SIGINT"
        stop_timeout = 2.5
        """,
    )
    d = load_definition(str(tmp_path), "db.v2")
    assert d.command == ("postgres", "-D", "/var/lib/pg data")
    assert d.argv() == ["postgres", "-D", "/var/lib/pg data"]
    assert d.display() == "postgres -D '/var/lib/pg data'"
    assert d.workdir == "/var/lib"
    assert d.cwd("/srv/merged") == "/srv/merged/var/lib"
    assert d.restart == "always"
    assert d.stop_signal == signal.SIGINT
    assert d.stop_timeout == 2.5
    env = d.environment({"PATH": "/bin", "LANG": "en"})
    assert env == {"PATH": "/bin", "LANG": "C.UTF-8", "PGPORT": "5433", "SPRITE_SERVICE": "db.v2"}


def test_no_directory_means_no_services(tmp_path: Path) -> None:
    assert load_definitions(str(tmp_path)) == ({}, [])


# Each bad file, and the reason its error message must give.
BAD: list[tuple[str, str | bytes, str]] = [
    ("syntax.toml", "command = ", "invalid TOML"),
    ("latin1.toml", b'command = "caf\xe9"', "not UTF-8"),
    ("nocmd.toml", 'workdir = "/"', "missing key 'command'"),
    ("typo.toml", 'command = "x"\nrestrat = "always"', "unknown key 'restrat'"),
    ("cmdtype.toml", "command = 3", "command must be a string or a list"),
    ("cmdempty.toml", 'command = "  "', "must not be empty"),
    ("cmdlist.toml", "command = []", "list must not be empty"),
    ("cmditems.toml", 'command = ["a", 1]', "only strings"),
    ("relative.toml", 'command = "x"\nworkdir = "srv"', "workdir must be an absolute path"),
    ("dotdot.toml", 'command = "x"\nworkdir = "/srv/../.."', "must not contain '..'"),
    ("envtype.toml", 'command = "x"\nenv = "A=1"', "env must be a table"),
    ("envvalue.toml", 'command = "x"\nenv = { A = 1 }', "env: A must be a string"),
    ("envname.toml", 'command = "x"\nenv = { "A=B" = "1" }', "invalid variable name"),
    ("restart.toml", 'command = "x"\nrestart = "sometimes"', "restart must be one of"),
    ("signal.toml", 'command = "x"\nstop_signal = "SIGNOPE"', "stop_signal must be"),
    ("signum.toml", 'command = "x"\nstop_signal = 15', "stop_signal must be"),
    ("negative.toml", 'command = "x"\nstop_timeout = -1', "stop_timeout must be"),
    ("huge.toml", 'command = "x"\nstop_timeout = 1e9', "stop_timeout must be"),
    ("boolean.toml", 'command = "x"\nstop_timeout = true', "stop_timeout must be"),
    ("-dash.toml", 'command = "x"', "invalid service name"),
    ("big.toml", "# " + "x" * 70_000 + '\ncommand = "x"', "larger than"),
]


@pytest.mark.parametrize(("file", "text", "reason"), BAD, ids=[b[0] for b in BAD])
def test_bad_file_is_reported_and_the_others_load(
    tmp_path: Path, file: str, text: str | bytes, reason: str
) -> None:
    write(tmp_path, "good.toml", 'command = "true"')
    write(tmp_path, file, text)
    write(tmp_path, "notes.txt", "not a definition: ignored")
    defs, errors = load_definitions(str(tmp_path))
    assert list(defs) == ["good"]
    assert len(errors) == 1
    assert errors[0].startswith(f"{file}: ")
    assert reason in errors[0]


def test_every_bad_file_at_once(tmp_path: Path) -> None:
    for file, text, _ in BAD:
        write(tmp_path, file, text)
    write(tmp_path, "good.toml", 'command = "true"')
    defs, errors = load_definitions(str(tmp_path))
    assert list(defs) == ["good"]
    assert [e.split(":")[0] for e in errors] == sorted(b[0] for b in BAD)


def test_symlinks_and_non_files_are_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside.toml"
    outside.write_text('command = "cat /etc/shadow"')
    write(tmp_path / "root", "good.toml", 'command = "true"')
    services = tmp_path / "root" / DEFINITIONS_DIR
    (services / "link.toml").symlink_to(outside)
    (services / "dir.toml").mkdir()
    defs, errors = load_definitions(str(tmp_path / "root"))
    assert list(defs) == ["good"]
    assert errors == [
        "dir.toml: is not a regular file",
        "link.toml: is a symbolic link (not followed)",
    ]


def test_definitions_directory_leaving_the_root_is_refused(tmp_path: Path) -> None:
    write(tmp_path / "elsewhere", "evil.toml", 'command = "true"')
    etc = tmp_path / "root" / "etc"
    etc.mkdir(parents=True)
    (etc / "sprite").symlink_to(tmp_path / "elsewhere" / "etc" / "sprite")
    defs, errors = load_definitions(str(tmp_path / "root"))
    assert defs == {}
    assert len(errors) == 1
    assert "resolves outside the environment" in errors[0]


def test_load_one_definition(tmp_path: Path) -> None:
    write(tmp_path, "bad.toml", "command = 1")
    with pytest.raises(UnknownService, match="no service 'missing'"):
        load_definition(str(tmp_path), "missing")
    with pytest.raises(DefinitionError, match=r"^bad.toml: command must be") as info:
        load_definition(str(tmp_path), "bad")
    assert info.value.file == "bad.toml"
    with pytest.raises(InvalidServiceName):
        load_definition(str(tmp_path), "../etc/passwd")


@pytest.mark.parametrize("name", ["a", "web", "db.v2", "x_y-z", "9", "a" * 64])
def test_valid_names(name: str) -> None:
    assert validate_name(name) == name


@pytest.mark.parametrize("name", ["", "-a", ".hidden", "a/b", "a b", "é", "a" * 65, ".."])
def test_invalid_names(name: str) -> None:
    with pytest.raises(InvalidServiceName):
        validate_name(name)


def test_errors_map_to_api_codes() -> None:
    # problem_for() reads ``code`` from a UserError; these are the answers the API gives.
    from sprite_env.api.problems import problem_for

    assert problem_for(UnknownService("x")).status == 404
    assert problem_for(InvalidServiceName("bad")).status == 400
    assert problem_for(DefinitionError("x.toml", "bad")).status == 400
