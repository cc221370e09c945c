"""A realistic developer layer to benchmark checkpoints on, and one typical agent change.

Usage::

    python benchmarks/layer.py build [--profile small|medium]   # build (or reuse) the cache
    python benchmarks/layer.py copy DEST [--profile small]      # cp -a of the cached build
    python benchmarks/layer.py mutate DIR                       # one agent session, in place
    python benchmarks/layer.py reset PRISTINE DIR               # undo it (rsync-like)
    python benchmarks/layer.py stats DIR

The layer is built only from real packages plus generated data, and cached under
``benchmarks/.data/layer-<profile>/`` (git-ignored; downloads in ``benchmarks/.data/cache/``
so that a rebuild is offline). Its layout, rooted at the layer directory:

============================  ===================================================  =========
path                          what                                                 profile
============================  ===================================================  =========
``home/dev/venv/``            ``python -m venv`` + pinned wheels from PyPI,        both
                              ``pip install --no-deps`` (``.pyc`` compiled)
``home/dev/webapp/``          ``package.json`` with pinned versions,               both
                              ``npm install --ignore-scripts --before DATE``
``home/dev/.npm/_cacache``    the real npm cache of that install                   medium
``home/dev/project/``         a git repository: one commit per Django release      both
                              (the sdists from PyPI, fixed dates, so fixed commit
                              ids), the first commit packed, later ones loose;
                              ``__pycache__`` from compileall; ``dist/*.tar.gz``
``home/dev/data/app.sqlite3``  generated with ``sqlite3`` from a seeded PRNG:       both
                              users, events (2 secondary indexes), a blob table
============================  ===================================================  =========

Deterministic where possible: the same pinned wheels, sdists and (with ``--before``) npm
versions, the same database rows, the same file choice and bytes in :func:`mutate`.
What differs between two builds: timestamps, ``.pyc`` headers (source mtimes), git's index
stat data, absolute paths in the venv's scripts. The build needs PyPI and npm once; if npm
fails, the layer is built without ``webapp/`` and the build info says so.

:func:`mutate` is one agent session (deterministic: the same files, the same bytes, the
same git commit id on every run): edit ~1% of the files (a line inserted in the middle of
text sources, written in place), add 40 source files and one 4 MiB random file,
``pip install rich`` (with its three dependencies, from the wheel cache), update ~1% of the
SQLite users and append ~2% more events, delete one directory, ``git commit``.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import random
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, ".data")
CACHE = os.path.join(DATA, "cache")
PIP_CACHE = os.path.join(CACHE, "pip")
SDIST_CACHE = os.path.join(CACHE, "sdist")
NPM_CACHE = os.path.join(CACHE, "npm")

HOME = "home/dev"
VENV = f"{HOME}/venv"
WEBAPP = f"{HOME}/webapp"
PROJECT = f"{HOME}/project"
DB = f"{HOME}/data/app.sqlite3"
#: npm resolves transitive versions as of this date, so the tree is the same every build.
NPM_BEFORE = "2024-12-01"

_SMALL_PIP = [
    "numpy==2.2.6",
    "requests==2.32.3",
    "certifi==2026.10.19.post1",
    "charset-normalizer==3.5.3",
    "idna==3.20",
    "urllib3==2.8.0",
    "Django==5.1.3",
    "asgiref==3.13.0",
    "sqlparse==0.6.1",
]
_SMALL_NPM = {
    "@babel/core": "7.26.0",
    "@babel/preset-env": "7.26.0",
    "core-js": "3.39.0",
    "eslint": "8.57.1",
    "express": "4.21.1",
    "lodash": "4.17.21",
    "moment": "2.30.1",
    "react": "18.3.1",
    "react-dom": "18.3.1",
    "rxjs": "7.8.1",
    "typescript": "5.6.3",
}
#: What the mutation installs: rich and the three packages it depends on.
MUTATE_PIP = ["rich==13.9.4", "markdown-it-py==4.3.0", "mdurl==0.1.2", "pygments==2.21.0"]


@dataclass(frozen=True)
class Profile:
    name: str
    pip: list[str]
    npm: dict[str, str]
    django_sdists: list[str]  # one git commit each, in this order
    sqlite_mib: int
    npm_cache_in_layer: bool


PROFILES = {
    "small": Profile("small", _SMALL_PIP, _SMALL_NPM, ["5.0.9", "5.1.3"], 100, False),
    "medium": Profile(
        "medium",
        [
            *_SMALL_PIP,
            "pandas==2.2.3",
            "python-dateutil==4.0.0",
            "pytz==2026.6",
            "tzdata==2026.6",
            "scipy==1.14.1",
            "matplotlib==3.9.2",
            "contourpy==1.3.3",
            "cycler==0.12.1",
            "fonttools==4.68.0",
            "kiwisolver==1.5.1",
            "packaging==26.4",
            "pillow==13.0.0",
            "pyparsing==3.3.3",
            "scikit-learn==1.5.2",
            "joblib==1.6.0",
            "threadpoolctl==3.8.0",
            "sympy==1.13.3",
            "mpmath==1.3.0",
            "pyarrow==17.0.0",
            "cloudpickle==3.1.3",
        ],
        {
            **_SMALL_NPM,
            "@aws-sdk/client-s3": "3.693.0",
            "@emotion/react": "11.13.3",
            "@emotion/styled": "11.13.0",
            "@mui/icons-material": "6.1.7",
            "@mui/material": "6.1.7",
            "date-fns": "4.1.0",
            "jest": "29.7.0",
            "next": "14.2.18",
            "webpack": "5.96.1",
            "webpack-cli": "5.1.4",
        },
        ["4.2.16", "5.0.9", "5.1.1", "5.1.2", "5.1.3"],
        200,
        True,
    ),
}

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Bench Dev",
    "GIT_AUTHOR_EMAIL": "dev@example.test",
    "GIT_COMMITTER_NAME": "Bench Dev",
    "GIT_COMMITTER_EMAIL": "dev@example.test",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",  # no user git config
}

Log = Callable[[str], None]


def _log(msg: str) -> None:
    print(f"[layer {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _run(argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None) -> str:
    """Runs a command, raising with its stderr on failure; returns its stdout."""
    full_env = {**os.environ, **env} if env else None
    p = subprocess.run(argv, cwd=cwd, env=full_env, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
    return p.stdout


# -- downloads ----------------------------------------------------------------------------


def _python() -> str:
    """The interpreter that builds the venv: this one (the wheels are for its version)."""
    return sys.executable


def fetch_wheels(specs: list[str]) -> None:
    """``pip download`` the pinned wheels into the cache (once; offline afterwards)."""
    os.makedirs(PIP_CACHE, exist_ok=True)
    stamp = os.path.join(
        PIP_CACHE, ".ok-" + hashlib.sha1("\n".join(sorted(specs)).encode()).hexdigest()[:16]
    )
    if os.path.exists(stamp):
        return
    _log(f"pip download {len(specs)} wheels")
    _run(
        [
            _python(),
            "-m",
            "pip",
            "download",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "--only-binary",
            ":all:",
            "-d",
            PIP_CACHE,
            *specs,
        ]
    )
    with open(stamp, "w") as f:
        f.write("\n".join(specs) + "\n")


def fetch_sdist(version: str) -> str:
    """The Django ``version`` release tarball from PyPI (cached)."""
    os.makedirs(SDIST_CACHE, exist_ok=True)
    for name in (f"django-{version}.tar.gz", f"Django-{version}.tar.gz"):
        path = os.path.join(SDIST_CACHE, name)
        if os.path.exists(path) and os.path.getsize(path) > 0:
            return path
    _log(f"pip download Django=={version} (sdist)")
    _run(
        [
            _python(),
            "-m",
            "pip",
            "download",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-binary",
            ":all:",
            "-d",
            SDIST_CACHE,
            f"Django=={version}",
        ]
    )
    for name in (f"django-{version}.tar.gz", f"Django-{version}.tar.gz"):
        path = os.path.join(SDIST_CACHE, name)
        if os.path.exists(path):
            return path
    raise RuntimeError(f"pip did not fetch the Django {version} sdist")


# -- building -----------------------------------------------------------------------------


def build_layer(dest: str, profile: str = "small", log: Log = _log) -> dict[str, Any]:
    """Builds the layer of ``profile`` into ``dest`` (created; must not exist or be empty).

    Returns the build info (what went in, what was skipped, the tree's statistics).
    """
    prof = PROFILES[profile]
    if os.path.exists(dest) and os.listdir(dest):
        raise FileExistsError(f"{dest} is not empty")
    t0 = time.monotonic()
    info: dict[str, Any] = {"profile": profile, "skipped": []}
    home = os.path.join(dest, HOME)
    os.makedirs(os.path.join(home, "data"), exist_ok=True)

    fetch_wheels(prof.pip)
    fetch_wheels(MUTATE_PIP)  # so that mutate() is offline
    venv = os.path.join(dest, VENV)
    log(f"venv + {len(prof.pip)} wheels")
    _run([_python(), "-m", "venv", venv])
    vpy = os.path.join(venv, "bin", "python")
    _run(
        [
            vpy,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-index",
            "--no-deps",
            "--find-links",
            PIP_CACHE,
            *prof.pip,
        ]
    )
    info["pip"] = _run([vpy, "-m", "pip", "freeze", "--disable-pip-version-check"]).split()

    log(f"npm install ({len(prof.npm)} packages, --before {NPM_BEFORE})")
    webapp = os.path.join(dest, WEBAPP)
    os.makedirs(webapp)
    pkg = {
        "name": "webapp",
        "version": "1.0.0",
        "private": True,
        "description": "benchmark developer layer: a web app",
        "dependencies": dict(sorted(prof.npm.items())),
    }
    with open(os.path.join(webapp, "package.json"), "w") as f:
        json.dump(pkg, f, indent=2)
        f.write("\n")
    npm = shutil.which("npm")
    try:
        if npm is None:
            raise RuntimeError("no npm on PATH")
        _run(
            [
                npm,
                "install",
                "--ignore-scripts",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
                f"--before={NPM_BEFORE}",
                "--cache",
                NPM_CACHE,
            ],
            cwd=webapp,
        )
        info["npm"] = dict(sorted(prof.npm.items()))
        if prof.npm_cache_in_layer:
            shutil.copytree(
                os.path.join(NPM_CACHE, "_cacache"),
                os.path.join(home, ".npm", "_cacache"),
                symlinks=True,
            )
    except (OSError, RuntimeError) as e:
        log(f"npm FAILED, the layer has no node_modules: {e}")
        shutil.rmtree(webapp, ignore_errors=True)
        info["skipped"].append(f"webapp (npm failed: {str(e)[:300]})")

    log(f"git project: Django {' '.join(prof.django_sdists)}")
    _build_project(os.path.join(dest, PROJECT), prof.django_sdists, vpy)

    log(f"sqlite {prof.sqlite_mib} MiB")
    info["sqlite"] = generate_sqlite(os.path.join(dest, DB), prof.sqlite_mib)

    info["stats"] = tree_stats(dest)
    info["build_s"] = round(time.monotonic() - t0, 1)
    info["built"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return info


def _git(project: str, *args: str, date: str | None = None) -> str:
    env = dict(GIT_ENV)
    if date is not None:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = date
    return _run(["git", "-C", project, *args], env=env)


def _build_project(project: str, versions: list[str], vpy: str) -> None:
    os.makedirs(project)
    _git(project, "init", "-q", "-b", "main")
    _git(project, "config", "gc.auto", "0")
    _git(project, "config", "gc.autoDetach", "false")
    for i, version in enumerate(versions, 1):
        if i == 2:  # the first ("cloned") commit is packed; later commits stay loose
            _git(project, "-c", "pack.threads=1", "gc", "-q")
        for name in os.listdir(project):
            if name != ".git":
                _remove(os.path.join(project, name))
        sdist = fetch_sdist(version)
        _run(["tar", "-xzf", sdist, "-C", project, "--strip-components=1"])
        with open(os.path.join(project, ".gitignore"), "w") as f:
            f.write("__pycache__/\n*.pyc\n/dist/\n/build/\n")
        _git(project, "add", "-A")
        date = f"2024-{i:02d}-01T12:00:00Z"
        _git(project, "commit", "-q", "-m", f"Import Django {version}", date=date)
        _git(project, "tag", f"v{version}")
    # __pycache__ as a developer's test runs leave it (some test files are not valid Python)
    subprocess.run(
        [vpy, "-m", "compileall", "-q", "-j", "1", "django", "tests"],
        cwd=project,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.makedirs(os.path.join(project, "dist"))
    for version in versions:
        sdist = fetch_sdist(version)
        shutil.copy2(sdist, os.path.join(project, "dist", os.path.basename(sdist)))


_WORD_TEXT = (
    "account active admin alert api app archive audit auth backend batch billing branch build "
    "cache call cancel card cart channel check client cluster commit config connect container "
    "cost count create cron customer dashboard data deploy device disk domain draft email "
    "endpoint error event export feature file filter flag fleet gateway group health host "
    "image import incident index invoice item job key label latency layer limit log login "
    "machine memory merge message metric migrate model monitor network node notify order "
    "owner package page password patch payment pipeline plan policy pool port price project "
    "queue quota record region release report request resource restore retry role route rule "
    "sandbox schedule schema search secret service session shard snapshot source stage status "
    "storage stream subscription sync task team tenant test ticket token trace update upload "
    "usage user version volume webhook worker workspace zone"
)
_WORDS = _WORD_TEXT.split()
_KINDS = [
    "page_view",
    "api_call",
    "login",
    "logout",
    "purchase",
    "error",
    "deploy",
    "build",
    "checkpoint",
    "restore",
    "upload",
    "search",
]
N_USERS = 50_000


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _event(rng: random.Random, eid: int, ts: int) -> tuple[Any, ...]:
    payload = json.dumps(
        {
            "msg": _sentence(rng, rng.randrange(4, 25)),
            "status": rng.choice([200, 200, 200, 201, 204, 301, 404, 500]),
            "ms": round(rng.expovariate(1 / 120.0), 2),
            "tags": [rng.choice(_WORDS) for _ in range(rng.randrange(0, 5))],
        },
        separators=(",", ":"),
    )
    return (
        eid,
        rng.randrange(1, N_USERS + 1),
        ts,
        rng.choice(_KINDS),
        f"/{rng.choice(_WORDS)}/{rng.choice(_WORDS)}/{rng.randrange(10**6)}",
        payload,
        f"{rng.getrandbits(128):032x}",
    )


def generate_sqlite(path: str, target_mib: int, seed: int = 1234) -> dict[str, int]:
    """An app-like database of about ``target_mib`` MiB from a seeded PRNG.

    JSON-ish text from a word list plus a random digest per row, so it compresses about as
    well as real application data (~2-3x), not like zeros.
    """
    rng = random.Random(seed)
    target = target_mib << 20
    if os.path.exists(path):
        os.unlink(path)
    db = sqlite3.connect(path)
    try:
        db.executescript(
            """
            PRAGMA page_size=4096;
            CREATE TABLE users(
                id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL,
                created_at INTEGER NOT NULL, plan TEXT, bio TEXT);
            CREATE TABLE events(
                id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL REFERENCES users(id),
                ts INTEGER NOT NULL, kind TEXT NOT NULL, path TEXT, payload TEXT, digest TEXT);
            CREATE INDEX events_user_ts ON events(user_id, ts);
            CREATE INDEX events_kind_ts ON events(kind, ts);
            CREATE TABLE kv(key TEXT PRIMARY KEY, value BLOB) WITHOUT ROWID;
            """
        )
        users = []
        for i in range(1, N_USERS + 1):
            name = f"{rng.choice(_WORDS)}_{rng.choice(_WORDS)}_{i}"
            users.append(
                (
                    i,
                    name,
                    f"{name}@example.test",
                    1_600_000_000 + rng.randrange(10**8),
                    rng.choice(["free", "pro", "team", "enterprise"]),
                    _sentence(rng, rng.randrange(5, 30)),
                )
            )
        db.executemany("INSERT INTO users VALUES (?,?,?,?,?,?)", users)
        kv = [(f"blob/{i:06d}", rng.randbytes(rng.randrange(512, 8192))) for i in range(2000)]
        db.executemany("INSERT INTO kv VALUES (?,?)", kv)
        db.commit()
        ts, eid = 1_700_000_000, 0
        while True:
            rows = []
            for _ in range(20_000):
                eid += 1
                ts += rng.randrange(0, 30)
                rows.append(_event(rng, eid, ts))
            db.executemany("INSERT INTO events VALUES (?,?,?,?,?,?,?)", rows)
            db.commit()
            if db.execute("PRAGMA page_count").fetchone()[0] * 4096 >= target:
                break
    finally:
        db.close()
    return {"bytes": os.path.getsize(path), "users": N_USERS, "events": eid}


# -- the cache ----------------------------------------------------------------------------


def pristine_path(profile: str) -> str:
    return os.path.join(DATA, f"layer-{profile}")


def pristine(profile: str = "small", log: Log = _log) -> tuple[str, dict[str, Any]]:
    """The cached build of ``profile`` (built first if missing): its path and build info.

    Never modify it: copy it with :func:`copy_layer`. Delete ``layer-<profile>.json`` next
    to it to rebuild.
    """
    path = pristine_path(profile)
    marker = path + ".json"
    if os.path.exists(marker) and os.path.isdir(path):
        with open(marker) as f:
            return path, dict(json.load(f))
    tmp = path + ".building"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(path, ignore_errors=True)
    log(f"building the {profile} layer in {tmp}")
    info = build_layer(tmp, profile, log)
    os.rename(tmp, path)
    with open(marker, "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
    s = info["stats"]
    log(
        f"built {path}: {s['files']:,} files, {s['bytes'] / 1e6:,.1f} MB, {s['dirs']:,} dirs, "
        f"{s['symlinks']} symlinks in {info['build_s']} s"
    )
    return path, info


def copy_layer(src: str, dest: str) -> None:
    """``cp -a src dest``: every tool starts from the same tree (times, modes, links kept)."""
    if os.path.exists(dest):
        raise FileExistsError(dest)
    _run(["cp", "-a", src, dest])


# -- the mutation -------------------------------------------------------------------------

_EDIT = {
    ".py": "# agent-session edit {n}\n",
    ".js": "/* agent-session edit {n} */\n",
    ".mjs": "/* agent-session edit {n} */\n",
    ".cjs": "/* agent-session edit {n} */\n",
    ".ts": "/* agent-session edit {n} */\n",
    ".css": "/* agent-session edit {n} */\n",
    ".md": "<!-- agent-session edit {n} -->\n",
    ".txt": "agent-session edit {n}\n",
    ".rst": "\n.. agent-session edit {n}\n\n",
    ".html": "<!-- agent-session edit {n} -->\n",
}
DELETED_DIR = f"{PROJECT}/tests/admin_views"
NEW_FILES = 40


def _files_sorted(root: str) -> list[str]:
    """Relative paths of the regular files under root, ``.git`` left out, in a fixed order."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            if stat.S_ISREG(os.lstat(full).st_mode):
                out.append(os.path.relpath(full, root))
    return out


def mutate(root: str) -> dict[str, Any]:
    """Applies one typical agent session to the layer at ``root``, in place; deterministic.

    Returns a summary (counts, bytes, the git commit id). Not idempotent: meant for a tree
    equal to the pristine build (see :func:`reset_tree`).
    """
    root = os.path.abspath(root)
    t0 = time.monotonic()
    out: dict[str, Any] = {}

    # 0. a copied layer has a stale git index (inodes and ctimes differ): refresh it first,
    # as any `git status` would, or `git add -A` below re-hashes every tracked file and
    # freshens (touches) every loose object it finds again
    project = os.path.join(root, PROJECT)
    _git(project, "update-index", "-q", "--refresh")

    # 1. edit ~1% of the files (count over the tree without .git), in place (same inode)
    files = _files_sorted(root)
    want = max(1, len(files) // 100)
    cands = [
        f
        for f in files
        if os.path.splitext(f)[1] in _EDIT and os.path.getsize(os.path.join(root, f)) < (2 << 20)
    ]
    cands.sort(key=lambda f: hashlib.sha1(("bench-mutate:" + f).encode()).hexdigest())
    edited_bytes = 0
    for n, rel in enumerate(cands[:want]):
        full = os.path.join(root, rel)
        with open(full, "r+b") as f:
            data = f.read()
            mid = data.find(b"\n", len(data) // 2)
            mid = len(data) if mid < 0 else mid + 1
            line = _EDIT[os.path.splitext(rel)[1]].format(n=n).encode()
            f.seek(0)
            f.write(data[:mid] + line + data[mid:])
        edited_bytes += len(data)
    out.update(files_total=len(files), edited=min(want, len(cands)), edited_bytes=edited_bytes)

    # 2. new files: 40 modules derived from the project's sources, one 4 MiB random blob
    newdir = os.path.join(project, "newfeature")
    os.makedirs(newdir, exist_ok=True)
    srcs = [f for f in files if f.startswith(f"{PROJECT}/django/") and f.endswith(".py")]
    srcs.sort(key=lambda f: hashlib.sha1(("bench-new:" + f).encode()).hexdigest())
    new_bytes = 0
    for i, rel in enumerate(srcs[:NEW_FILES]):
        with open(os.path.join(root, rel), "rb") as src:
            body = src.read()
        text = f'"""newfeature module {i}: adapted from {os.path.basename(rel)}."""\n'
        data = text.encode() + body
        with open(os.path.join(newdir, f"mod_{i:03d}.py"), "wb") as dst:
            dst.write(data)
        new_bytes += len(data)
    with open(os.path.join(newdir, "__init__.py"), "w") as init:
        init.write("# a package added during the agent session\n")
    os.makedirs(os.path.join(project, "build"), exist_ok=True)
    blob = random.Random(4242).randbytes(4 << 20)
    with open(os.path.join(project, "build", "artifact.bin"), "wb") as dst:
        dst.write(blob)
    out.update(new_files=min(NEW_FILES, len(srcs)) + 2, new_bytes=new_bytes + len(blob))

    # 3. pip install one more package (rich and its dependencies), offline
    fetch_wheels(MUTATE_PIP)
    vpy = os.path.join(root, VENV, "bin", "python")
    _run(
        [
            vpy,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-index",
            "--no-deps",
            "--find-links",
            PIP_CACHE,
            *MUTATE_PIP,
        ]
    )
    out["pip_installed"] = MUTATE_PIP

    # 4. SQLite: update ~1% of the users, append ~2% more events
    out["sqlite"] = _mutate_sqlite(os.path.join(root, DB))

    # 5. delete a directory
    gone = os.path.join(root, DELETED_DIR)
    out["deleted_dir"] = DELETED_DIR if os.path.isdir(gone) else None
    if os.path.isdir(gone):
        out["deleted_files"] = sum(len(fs) for _d, _s, fs in os.walk(gone))
        shutil.rmtree(gone)

    # 6. git commit (fixed dates: the same commit id every time)
    date = "2024-12-01T12:00:00Z"
    _git(project, "add", "-A")
    _git(project, "commit", "-q", "-m", "Agent session: edits, newfeature, fewer tests", date=date)
    out["git_commit"] = _git(project, "rev-parse", "--short", "HEAD").strip()
    out["mutate_s"] = round(time.monotonic() - t0, 2)
    return out


def _mutate_sqlite(path: str) -> dict[str, int]:
    rng = random.Random(777)
    db = sqlite3.connect(path)
    try:
        (rows,) = db.execute("SELECT count(*) FROM events").fetchone()
        (last_id, last_ts) = db.execute("SELECT max(id), max(ts) FROM events").fetchone()
        add = rows // 50
        new = []
        ts = int(last_ts)
        for i in range(add):
            ts += rng.randrange(0, 30)
            new.append(_event(rng, int(last_id) + 1 + i, ts))
        ids = sorted(rng.sample(range(1, N_USERS + 1), N_USERS // 100))
        with db:
            db.executemany("INSERT INTO events VALUES (?,?,?,?,?,?,?)", new)
            db.executemany(
                "UPDATE users SET plan = ?, bio = bio || ? WHERE id = ?",
                [(rng.choice(["pro", "team"]), " (updated by the agent)", i) for i in ids],
            )
    finally:
        db.close()
    return {"events_added": add, "users_updated": len(ids)}


# -- resetting a mutated copy -------------------------------------------------------------


def reset_tree(src: str, dest: str) -> dict[str, int]:
    """Makes ``dest`` equal to ``src`` again (like ``rsync -a --delete src/ dest/``).

    Only what differs is touched: a regular file whose size or mtime differs is rewritten
    in place (it keeps its inode, unlike rsync, which renames a new copy over it: the
    mutation edits files and the database in place, and a tool may rely on the inode to
    compare a file with its previous version), extra entries are removed, missing ones
    copied (``cp -a``), modes, owners and times fixed. Unchanged files keep their inode and
    ctime, so a tool's change detection sees only what the mutation touched. Hard links
    are not preserved.
    """
    counts = {"rewritten": 0, "replaced": 0, "created": 0, "removed": 0, "meta": 0}
    _reset_dir(src, dest, counts)
    return counts


def _reset_dir(src: str, dest: str, counts: dict[str, int]) -> None:
    want = {e.name: e for e in os.scandir(src)}
    have = {e.name: e for e in os.scandir(dest)}
    for name, e in have.items():
        if name not in want:
            _remove(e.path)
            counts["removed"] += 1
    for name, s in sorted(want.items()):
        sst = s.stat(follow_symlinks=False)
        d = have.get(name)
        dpath = os.path.join(dest, name)
        dst = d.stat(follow_symlinks=False) if d is not None else None
        if dst is not None and stat.S_IFMT(dst.st_mode) != stat.S_IFMT(sst.st_mode):
            _remove(dpath)
            counts["removed"] += 1
            dst = None
        if dst is None:  # missing: a copy with everything (owner, times, the subtree)
            _run(["cp", "-a", s.path, dpath])
            counts["created"] += 1
            continue
        if stat.S_ISDIR(sst.st_mode):
            _reset_dir(s.path, dpath, counts)
        elif stat.S_ISLNK(sst.st_mode):
            if os.readlink(dpath) == os.readlink(s.path):
                if dst.st_mtime_ns != sst.st_mtime_ns:
                    _copy_times(sst, dpath)
                    counts["meta"] += 1
                continue
            os.unlink(dpath)
            os.symlink(os.readlink(s.path), dpath)
            _copy_times(sst, dpath)
            counts["replaced"] += 1
            continue
        elif stat.S_ISREG(sst.st_mode):
            if dst.st_size != sst.st_size or dst.st_mtime_ns != sst.st_mtime_ns:
                if dst.st_nlink == 1:
                    # in place, keeping the inode: the mutation's edits and the database's
                    # writes are in place too, and a tool may compare with the old version
                    with open(s.path, "rb") as fsrc, open(dpath, "r+b") as fdst:
                        shutil.copyfileobj(fsrc, fdst, 1 << 20)
                        fdst.truncate()
                    counts["rewritten"] += 1
                else:
                    fd, tmp = tempfile.mkstemp(dir=dest, prefix=".reset-")
                    os.close(fd)
                    shutil.copy2(s.path, tmp)
                    os.replace(tmp, dpath)
                    counts["replaced"] += 1
        else:
            continue  # no devices, fifos or sockets in the layer
        dst = os.lstat(dpath)
        if stat.S_IMODE(dst.st_mode) != stat.S_IMODE(sst.st_mode):
            os.chmod(dpath, stat.S_IMODE(sst.st_mode))
            counts["meta"] += 1
        if (dst.st_uid, dst.st_gid) != (sst.st_uid, sst.st_gid):
            os.lchown(dpath, sst.st_uid, sst.st_gid)
            counts["meta"] += 1
        if dst.st_mtime_ns != sst.st_mtime_ns:
            _copy_times(sst, dpath)
            counts["meta"] += 1
    # the directory itself, after its children (which move its mtime)
    sst, dst = os.lstat(src), os.lstat(dest)
    if stat.S_IMODE(dst.st_mode) != stat.S_IMODE(sst.st_mode):
        os.chmod(dest, stat.S_IMODE(sst.st_mode))
    if dst.st_mtime_ns != sst.st_mtime_ns:
        _copy_times(sst, dest)


def _copy_times(st: os.stat_result, path: str) -> None:
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


# -- statistics ---------------------------------------------------------------------------


def walk(root: str) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of every entry under root, root excluded, sorted by name."""
    stack = [""]
    while stack:
        rel = stack.pop()
        base = os.path.join(root, rel) if rel else root
        entries = sorted(os.scandir(base), key=lambda e: e.name, reverse=True)
        for e in entries:
            r = os.path.join(rel, e.name) if rel else e.name
            st = e.stat(follow_symlinks=False)
            yield r, st
            if stat.S_ISDIR(st.st_mode):
                stack.append(r)


def tree_stats(root: str) -> dict[str, int]:
    files = dirs = links = other = nbytes = 0
    for _rel, st in walk(root):
        if stat.S_ISREG(st.st_mode):
            files += 1
            nbytes += st.st_size
        elif stat.S_ISDIR(st.st_mode):
            dirs += 1
        elif stat.S_ISLNK(st.st_mode):
            links += 1
        else:
            other += 1
    return {"files": files, "bytes": nbytes, "dirs": dirs, "symlinks": links, "other": other}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("build", help="build (or reuse) the cached layer; print its path")
    p.add_argument("--profile", choices=sorted(PROFILES), default="small")
    p = sub.add_parser("copy", help="cp -a the cached layer to DEST")
    p.add_argument("dest")
    p.add_argument("--profile", choices=sorted(PROFILES), default="small")
    p = sub.add_parser("mutate", help="apply one agent session to DIR, in place")
    p.add_argument("dir")
    p = sub.add_parser("reset", help="make DIR equal to PRISTINE again, touching only changes")
    p.add_argument("pristine")
    p.add_argument("dir")
    p = sub.add_parser("stats", help="files, bytes, dirs, symlinks of DIR")
    p.add_argument("dir")
    args = parser.parse_args()
    if args.cmd == "build":
        path, info = pristine(args.profile)
        print(path)
        print(json.dumps(info["stats"]))
    elif args.cmd == "copy":
        path, _info = pristine(args.profile)
        copy_layer(path, args.dest)
    elif args.cmd == "mutate":
        print(json.dumps(mutate(args.dir)))
    elif args.cmd == "reset":
        print(json.dumps(reset_tree(args.pristine, args.dir)))
    else:
        print(json.dumps(tree_stats(args.dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
