"""Checkpoints of a developer layer: sprite-env side by side with restic and borg.

Usage::

    python benchmarks/bench_checkpoints.py [--profile small|medium] [--reps 3] [--cheap-s 30]
                                           [--tools sprite-env,restic,borg] [--work DIR]
                                           [--keep] [--no-freeze] [--out FILE]

Every tool gets its own ``cp -a`` copy of the same cached layer (``layer.py``) and an empty
repository (store) outside it, then, step by step, alternating the tools within each
round (the first tool rotates from round to round):

a. first snapshot into the empty repository (a repetition wipes the repository, and its
   cache, first);
b. second snapshot, nothing changed, cold and warm (a repetition deletes the previous
   no-change snapshot afterwards, untimed);
c. one agent session (``layer.mutate``, untimed), then a snapshot, cold and warm (a
   repetition first puts back the repository saved after b and resets the live tree with
   ``layer.reset_tree``, which rewrites in place only what the mutation touched);
d. ``du -sb`` of the repository (sprite-env: the store) after every snapshot;
e. full restore of the latest snapshot into an empty directory, verified;
f. restore of the pre-mutation snapshot onto the mutated tree, verified: restic and borg
   have no exact delta restore, so it is wipe + full restore on a ``cp -a`` copy of their
   mutated tree; sprite-env restores in place on its own live layer (``restore ID --yes``:
   an automatic undo checkpoint, then only the differences), and between repetitions its
   layer is brought back to the mutated state by restoring the latest checkpoint (untimed);
g. CPU (``wait4``) and peak RSS (``/usr/bin/time -f %M``: a child of this process would
   inherit its resident set in ``ru_maxrss``) of every timed run.

sprite-env is run from a copy of ``sprite_env/`` as committed at HEAD, taken at the start
(``python -P -m sprite_env``), so that commits landing in the shared working tree during
the run are not measured half-way; ``--no-freeze`` runs the installed (editable) one.

Before every timed run: ``sync``, and ``echo 3 > /proc/sys/vm/drop_caches`` (as root) for
the cold steps; for the warm ones, a ``find`` of the live tree and a read of the tool's
repository and cache instead. A step is repeated ``--reps`` times while its runs take less
than ``--cheap-s`` seconds. Also measured: a ``find -printf`` stat walk of the layer (warm
and cold) and sprite-env's process start-up, to put the checkpoint times in proportion.
Verification compares every entry of the restored tree with the expected one: type,
content hash (symlink target), mode, owner, mtime.

Output: markdown tables on stdout, JSON in ``benchmarks/results/checkpoints-<date>.json``.
A failed step is reported as FAILED, the run goes on.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import stat
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import layer  # noqa: E402
from _peers import (  # noqa: E402
    GNU_TIME,
    Measured,
    drop_caches,
    du_bytes,
    markdown_table,
    ratio,
    run_measured,
    shell,
    today,
    write_results,
)

SPRITE = "sprite-env"
RESTIC = "restic"
BORG = "borg"
ALL_TOOLS = [SPRITE, RESTIC, BORG]

#: (step key, label in the tables, cold?)
STEPS = [
    ("a", "a  first snapshot", True),
    ("b_cold", "b  no-change snapshot, cold", True),
    ("b_warm", "b  no-change snapshot, warm", False),
    ("c_cold", "c  snapshot after the change, cold", True),
    ("c_warm", "c  snapshot after the change, warm", False),
    ("e", "e  full restore into an empty dir", True),
    ("f", "f  restore previous onto the mutated tree", True),
]
STEP_LABEL = {k: lbl for k, lbl, _ in STEPS}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def q(s: str) -> str:
    return shlex.quote(s)


def rmtree(path: str) -> None:
    if os.path.lexists(path):
        subprocess.run(["rm", "-rf", path], check=True)


def cp_a(src: str, dest: str) -> None:
    subprocess.run(["cp", "-a", src, dest], check=True)


# -- the tools ----------------------------------------------------------------------------


@dataclass
class Cmd:
    argv: list[str]
    cwd: str | None = None


class Peer:
    """One tool, its live layer copy, its repository and cache, under ``WORK/<name>/``."""

    name = ""
    f_method = ""

    def __init__(self, work: str) -> None:
        self.dir = os.path.join(work, self.name)
        self.live = os.path.join(self.dir, "live")
        self.target = os.path.join(self.dir, "target")
        self.saved = os.path.join(self.dir, "saved")
        self.env = dict(os.environ)
        self.snaps: dict[str, str] = {}

    # state
    def state_dirs(self) -> list[str]:
        raise NotImplementedError

    def repo_dir(self) -> str:
        return self.state_dirs()[0]

    def cache_dir(self) -> str | None:
        return None

    def wipe(self) -> None:
        for d in self.state_dirs():
            rmtree(d)

    def save_state(self) -> None:
        rmtree(self.saved)
        os.makedirs(self.saved)
        for d in self.state_dirs():
            if os.path.exists(d):
                cp_a(d, os.path.join(self.saved, os.path.basename(d)))

    def load_state(self) -> None:
        for d in self.state_dirs():
            rmtree(d)
            src = os.path.join(self.saved, os.path.basename(d))
            if os.path.exists(src):
                cp_a(src, d)

    def untimed(self, cmd: Cmd) -> str:
        p = subprocess.run(
            cmd.argv, cwd=cmd.cwd, env=self.env, capture_output=True, text=True, check=False
        )
        if p.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd.argv)} exited {p.returncode}: {p.stderr.strip()[-500:]}"
            )
        return p.stdout

    # operations
    def version(self) -> str:
        raise NotImplementedError

    def init(self) -> None:
        """Creates the empty repository (wiped first); untimed."""
        raise NotImplementedError

    def snapshot(self, label: str) -> Cmd:
        raise NotImplementedError

    def snapshot_id(self, label: str, stdout: str) -> str:
        raise NotImplementedError

    def forget(self, sid: str) -> None:
        raise NotImplementedError

    def restore_full(self, sid: str, target: str) -> Cmd:
        raise NotImplementedError

    def prepare_f(self, rep: int) -> None:
        """Untimed: a mutated tree to restore onto (a fresh ``cp -a`` of the live one)."""
        rmtree(self.target)
        cp_a(self.live, self.target)

    def restore_prev(self, sid: str) -> Cmd:
        raise NotImplementedError

    def f_path(self) -> str:
        return self.target

    def details(self, step: str, stdout: str) -> dict[str, Any]:
        return {}


class Restic(Peer):
    name = RESTIC
    f_method = "wipe + restic restore into the copy"

    def __init__(self, work: str) -> None:
        super().__init__(work)
        self.repo = os.path.join(self.dir, "repo")
        self.cache = os.path.join(self.dir, "cache")
        self.env.update(RESTIC_PASSWORD="bench", RESTIC_CACHE_DIR=self.cache)

    def state_dirs(self) -> list[str]:
        return [self.repo, self.cache]

    def cache_dir(self) -> str | None:
        return self.cache

    def version(self) -> str:
        return self.untimed(Cmd(["restic", "version"])).splitlines()[0]

    def init(self) -> None:
        self.wipe()
        self.untimed(Cmd(["restic", "init", "-q", "-r", self.repo]))

    def snapshot(self, label: str) -> Cmd:
        argv = ["restic", "-r", self.repo, "backup", "--json", "--quiet", "--tag", label, "."]
        return Cmd(argv, cwd=self.live)

    def snapshot_id(self, label: str, stdout: str) -> str:
        for line in reversed(stdout.splitlines()):
            if '"snapshot_id"' in line:
                return str(json.loads(line)["snapshot_id"])
        raise RuntimeError(f"no snapshot_id in restic's output: {stdout[-300:]!r}")

    def forget(self, sid: str) -> None:
        self.untimed(Cmd(["restic", "-r", self.repo, "forget", "-q", sid]))

    def restore_full(self, sid: str, target: str) -> Cmd:
        return Cmd(["restic", "-r", self.repo, "restore", sid, "--target", target])

    def restore_prev(self, sid: str) -> Cmd:
        t = q(self.target)
        script = (
            f"find {t} -mindepth 1 -delete\nrestic -r {q(self.repo)} restore {sid} --target {t}"
        )
        return Cmd(shell(script))


class Borg(Peer):
    name = BORG
    f_method = "wipe + borg extract into the copy"

    def __init__(self, work: str) -> None:
        super().__init__(work)
        self.repo = os.path.join(self.dir, "repo")
        self.cache = os.path.join(self.dir, "cache")
        self.env.update(
            BORG_BASE_DIR=self.cache,
            BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK="yes",
            BORG_RELOCATED_REPO_ACCESS_IS_OK="yes",
        )

    def state_dirs(self) -> list[str]:
        return [self.repo, self.cache]

    def cache_dir(self) -> str | None:
        return self.cache

    def version(self) -> str:
        return self.untimed(Cmd(["borg", "--version"])).strip()

    def init(self) -> None:
        self.wipe()
        self.untimed(Cmd(["borg", "init", "-e", "none", self.repo]))

    def snapshot(self, label: str) -> Cmd:
        argv = ["borg", "create", "--compression", "zstd,3", f"{self.repo}::{label}", "."]
        return Cmd(argv, cwd=self.live)

    def snapshot_id(self, label: str, stdout: str) -> str:
        return label

    def forget(self, sid: str) -> None:
        self.untimed(Cmd(["borg", "delete", f"{self.repo}::{sid}"]))

    def restore_full(self, sid: str, target: str) -> Cmd:
        return Cmd(["borg", "extract", f"{self.repo}::{sid}"], cwd=target)

    def restore_prev(self, sid: str) -> Cmd:
        t = q(self.target)
        script = f"find {t} -mindepth 1 -delete\ncd {t}\nborg extract {q(self.repo)}::{sid}"
        return Cmd(shell(script))


#: How sprite-env is started (set by :func:`setup_sprite`): the console script next to this
#: interpreter, or ``python -m sprite_env`` from a frozen copy of the package.
SPRITE_CMD: list[str] = []
SPRITE_ENV: dict[str, str] = {}
REPO = os.path.dirname(HERE)


def sprite_argv() -> list[str]:
    return list(SPRITE_CMD)


def setup_sprite(work: str, freeze: bool) -> str:
    """Chooses how to run sprite-env; returns a description of what is measured.

    With ``freeze``, the package as committed at HEAD (``git archive``; the working tree's
    copy if that fails) plus the built extension from the working tree is copied into
    ``WORK/sprite-env-src`` and run from there, so that edits made to the shared working
    tree during the run (the package is installed editable) are not measured half-way.
    """
    exe = os.path.join(os.path.dirname(sys.executable), "sprite-env")
    if not freeze:
        SPRITE_CMD[:] = [exe] if os.path.exists(exe) else [sys.executable, "-m", "sprite_env"]
        return "the working tree, live (installed editable)"
    dest = os.path.join(work, "sprite-env-src")
    os.makedirs(dest)
    what = "HEAD"
    try:
        archive = subprocess.run(
            ["git", "-C", REPO, "archive", "HEAD", "sprite_env"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    except (OSError, subprocess.CalledProcessError):
        shutil.copytree(
            os.path.join(REPO, "sprite_env"),
            os.path.join(dest, "sprite_env"),
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        what = "the working tree"
    for name in os.listdir(os.path.join(REPO, "sprite_env")):
        if name.endswith(".so"):  # the built chunker (not in git)
            shutil.copy2(os.path.join(REPO, "sprite_env", name), os.path.join(dest, "sprite_env"))
    # -P: not the current directory first (run from the repository, it holds sprite_env/)
    SPRITE_CMD[:] = [sys.executable, "-P", "-m", "sprite_env"]
    SPRITE_ENV["PYTHONPATH"] = dest
    where = subprocess.run(
        [sys.executable, "-P", "-c", "import sprite_env; print(sprite_env.__file__)"],
        env={**os.environ, **SPRITE_ENV},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not where.startswith(dest):
        raise RuntimeError(f"the frozen copy is not the one imported: {where}")
    native = subprocess.run(
        ["git", "-C", REPO, "status", "--porcelain", "--", "native"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    note = " (WARNING: native/ differs from HEAD: the extension may not match)" if native else ""
    return f"a frozen copy of {what}, run as python -P -m sprite_env{note}"


class Sprite(Peer):
    name = SPRITE
    f_method = "restore ID --yes in place on its live layer"

    def __init__(self, work: str) -> None:
        super().__init__(work)
        self.store = os.path.join(self.dir, "store")
        self.base = [*sprite_argv(), "--root", self.live, "--store", self.store]
        self.env.update(SPRITE_ENV)

    def state_dirs(self) -> list[str]:
        return [self.store]

    def version(self) -> str:
        return self.untimed(Cmd([*sprite_argv(), "--version"])).strip()

    def init(self) -> None:
        self.wipe()
        # Offline, only ``store init`` creates a store (issue 10), not the first create.
        self.untimed(Cmd([*self.base, "store", "init"]))

    def snapshot(self, label: str) -> Cmd:
        return Cmd([*self.base, "checkpoints", "create", "--comment", label, "--json"])

    def snapshot_id(self, label: str, stdout: str) -> str:
        return str(json.loads(stdout)["id"])

    def forget(self, sid: str) -> None:
        self.untimed(Cmd([*self.base, "checkpoints", "delete", sid, "--json"]))

    def restore_full(self, sid: str, target: str) -> Cmd:
        return Cmd([*self.base, "checkpoints", "export", sid, target, "--json"])

    def prepare_f(self, rep: int) -> None:
        if rep == 0:
            return  # the live layer is the mutated tree that c captured
        # bring the layer back to the mutated state: restore the latest checkpoint (untimed)
        self.untimed(Cmd([*self.base, "restore", self.snaps["c"], "--yes", "--json"]))

    def restore_prev(self, sid: str) -> Cmd:
        return Cmd([*self.base, "restore", sid, "--yes", "--json"])

    def f_path(self) -> str:
        return self.live

    def details(self, step: str, stdout: str) -> dict[str, Any]:
        try:
            j = json.loads(stdout)
        except ValueError:
            return {}
        # --json of a job is its complete event: the checkpoint's or the restore's counters
        # sit in "checkpoint" and "stats".
        j = {**(j.get("checkpoint") or {}), **(j.get("stats") or {}), **j}
        keep = (
            "id",
            "files",
            "bytes",
            "bytes_added",
            "undo",
            "created",
            "modified",
            "removed",
            "meta",
            "bytes_written",
            "warnings",
        )
        return {k: j[k] for k in keep if k in j}


TOOL_CLASSES: dict[str, type[Peer]] = {SPRITE: Sprite, RESTIC: Restic, BORG: Borg}


# -- verification -------------------------------------------------------------------------

Entry = tuple[str, int, int, int, int, str, int]  # kind, mode, uid, gid, size, digest, mtime


def _hasher() -> Callable[[], Any]:
    try:
        from blake3 import blake3

        return blake3
    except ImportError:
        return hashlib.sha1


def manifest(root: str) -> dict[str, Entry]:
    """Every entry under root (root itself left out): type, mode, owner, size, content
    hash (symlinks: the target), mtime in ns. Directory sizes are not compared."""
    new = _hasher()
    out: dict[str, Entry] = {}
    for rel, st in layer.walk(root):
        full = os.path.join(root, rel)
        mode = st.st_mode
        if stat.S_ISREG(mode):
            h = new()
            with open(full, "rb", buffering=0) as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            kind, size, digest = "file", st.st_size, h.hexdigest()
        elif stat.S_ISDIR(mode):
            kind, size, digest = "dir", 0, ""
        elif stat.S_ISLNK(mode):
            kind, size, digest = "symlink", 0, os.readlink(full)
        else:
            kind, size, digest = f"other:{stat.S_IFMT(mode):o}", 0, ""
        out[rel] = (kind, stat.S_IMODE(mode), st.st_uid, st.st_gid, size, digest, st.st_mtime_ns)
    return out


@dataclass
class Verdict:
    ok: bool
    counts: dict[str, int]
    examples: dict[str, list[str]]

    def text(self) -> str:
        if self.ok:
            return "ok"
        return "MISMATCH " + " ".join(f"{k}={v}" for k, v in self.counts.items() if v)


def compare(expected: dict[str, Entry], actual: dict[str, Entry]) -> Verdict:
    """Entry by entry; any difference (mtime included) is a mismatch."""
    cats = ["missing", "extra", "type", "content", "mode", "owner", "mtime"]
    counts = dict.fromkeys(cats, 0)
    examples: dict[str, list[str]] = {c: [] for c in cats}

    def bad(cat: str, path: str) -> None:
        counts[cat] += 1
        if len(examples[cat]) < 5:
            examples[cat].append(path)

    for path, e in expected.items():
        a = actual.get(path)
        if a is None:
            bad("missing", path)
            continue
        if a[0] != e[0]:
            bad("type", path)
            continue
        if a[4] != e[4] or a[5] != e[5]:
            bad("content", path)
        if a[1] != e[1]:
            bad("mode", path)
        if a[2:4] != e[2:4]:
            bad("owner", path)
        if a[6] != e[6]:
            bad("mtime", path)
    for path in actual:
        if path not in expected:
            bad("extra", path)
    ok = not any(counts.values())
    return Verdict(ok, counts, {k: v for k, v in examples.items() if v})


# -- running ------------------------------------------------------------------------------


@dataclass
class Run:
    """One timed run of one tool in one step."""

    step: str
    tool: str
    rep: int
    wall: float | None = None
    user: float | None = None
    sys: float | None = None
    max_rss_kib: int | None = None
    rss_exact: bool | None = None
    returncode: int | None = None
    error: str | None = None
    verify: str | None = None
    verify_detail: dict[str, Any] | None = None
    repo_bytes: int | None = None
    cache_bytes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None and self.returncode == 0

    @property
    def cpu(self) -> float | None:
        return None if self.user is None or self.sys is None else self.user + self.sys


class Bench:
    def __init__(self, tools: list[Peer], reps: int, cheap_s: float, can_drop: bool) -> None:
        self.tools = tools
        self.reps = reps
        self.cheap_s = cheap_s
        self.can_drop = can_drop
        self.runs: list[Run] = []
        self.anomalies: list[str] = []
        self.step_no = 0

    def anomaly(self, msg: str) -> None:
        log("ANOMALY: " + msg)
        self.anomalies.append(msg)

    def warm(self, t: Peer) -> None:
        parts = [f"find {q(t.live)} -printf '%i %s %T@ %C@\\n' > /dev/null"]
        for d in t.state_dirs():
            if os.path.isdir(d):
                parts.append(f"find {q(d)} -type f -exec cat {{}} + > /dev/null")
        subprocess.run(shell("\n".join(parts)), check=False)

    def step(
        self,
        key: str,
        cold: bool,
        command: Callable[[Peer, int], Cmd],
        prepare: Callable[[Peer, int, Run], None] | None = None,
        after: Callable[[Peer, int, Measured, Run], None] | None = None,
    ) -> None:
        log(f"step {STEP_LABEL[key]} ({'cold' if cold else 'warm'})")
        stopped: set[str] = set()
        n = len(self.tools)
        for rep in range(self.reps):
            k = (rep + self.step_no) % n
            for t in self.tools[k:] + self.tools[:k]:
                if t.name in stopped:
                    continue
                run = Run(key, t.name, rep)
                self.runs.append(run)
                try:
                    if prepare is not None:
                        prepare(t, rep, run)
                    cmd = command(t, rep)
                except Exception as e:
                    run.error = f"prepare: {type(e).__name__}: {e}"
                    self.anomaly(f"{t.name} {key} rep {rep + 1}: FAILED ({run.error})")
                    stopped.add(t.name)
                    continue
                os.sync()
                if cold and self.can_drop:
                    drop_caches()
                elif not cold:
                    self.warm(t)
                try:
                    m = run_measured(cmd.argv, cwd=cmd.cwd, env=t.env)
                except OSError as e:
                    run.error = f"could not start: {e}"
                    self.anomaly(f"{t.name} {key} rep {rep + 1}: FAILED ({run.error})")
                    stopped.add(t.name)
                    continue
                run.wall, run.user, run.sys = m.wall, m.user, m.sys
                run.max_rss_kib, run.returncode = m.max_rss_kib, m.returncode
                run.rss_exact = m.rss_exact
                if not m.ok:
                    run.error = f"exit {m.returncode}: {m.stderr.strip()[-800:]}"
                    self.anomaly(f"{t.name} {key} rep {rep + 1}: FAILED ({run.error})")
                else:
                    run.extra.update(t.details(key, m.stdout))
                    try:
                        if after is not None:
                            after(t, rep, m, run)
                    except Exception as e:
                        run.error = f"after the run: {type(e).__name__}: {e}"
                        self.anomaly(f"{t.name} {key} rep {rep + 1}: FAILED ({run.error})")
                        traceback.print_exc()
                log(
                    f"  {key:<7} rep {rep + 1}/{self.reps} {t.name:<11} {m.wall:7.2f} s "
                    f"cpu {m.cpu:6.2f} s rss {m.max_rss_kib / 1024:6.1f} MiB"
                    + (f"  verify {run.verify}" if run.verify else "")
                    + ("" if run.ok else "  FAILED")
                )
                if m.wall >= self.cheap_s or not run.ok:
                    stopped.add(t.name)
        self.step_no += 1

    def of(self, key: str, tool: str) -> list[Run]:
        return [r for r in self.runs if r.step == key and r.tool == tool]


def sizes(t: Peer, run: Run) -> None:
    run.repo_bytes = du_bytes(t.repo_dir())
    cache = t.cache_dir()
    run.cache_bytes = du_bytes(cache) if cache else None


def time_cmd(argv: list[str], n: int, cold: bool, env: dict[str, str] | None = None) -> list[float]:
    out = []
    for _ in range(n):
        os.sync()
        if cold:
            drop_caches()
        m = run_measured(argv, env=env)
        if not m.ok:
            raise RuntimeError(f"{argv} exited {m.returncode}: {m.stderr[-300:]}")
        out.append(m.wall)
    return out


# -- summarizing --------------------------------------------------------------------------


@dataclass
class Cell:
    n: int
    failed: int
    median: float | None
    lo: float | None
    hi: float | None
    cpu: float | None
    rss_mib: float | None
    verify: list[str]

    def time_text(self) -> str:
        if self.median is None:
            return "FAILED" if self.failed else "-"
        s = f"{self.median:.2f}"
        if self.n > 1:
            s += f" ({self.lo:.2f}-{self.hi:.2f})"
        s += f" n={self.n}"
        if self.failed:
            s += f" +{self.failed} FAILED"
        if any(v != "ok" for v in self.verify):
            s += " **MISMATCH**"
        return s


def cell(runs: list[Run]) -> Cell:
    good = [r for r in runs if r.ok and r.wall is not None]
    walls = [r.wall for r in good if r.wall is not None]
    cpus = [r.cpu for r in good if r.cpu is not None]
    rss = [r.max_rss_kib for r in runs if r.max_rss_kib is not None]
    return Cell(
        n=len(good),
        failed=len(runs) - len(good),
        median=statistics.median(walls) if walls else None,
        lo=min(walls) if walls else None,
        hi=max(walls) if walls else None,
        cpu=statistics.median(cpus) if cpus else None,
        rss_mib=max(rss) / 1024 if rss else None,
        verify=[r.verify for r in runs if r.verify is not None],
    )


def mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:,.1f}"


def last_size(bench: Bench, key: str, tool: str) -> tuple[int | None, int | None]:
    for r in reversed(bench.of(key, tool)):
        if r.ok and r.repo_bytes is not None:
            return r.repo_bytes, r.cache_bytes
    return None, None


def verdict_summary(vs: list[str]) -> str:
    if not vs:
        return "-"
    counts: dict[str, int] = {}
    for v in vs:
        counts[v] = counts.get(v, 0) + 1
    return "; ".join(
        f"{'**' + v + '**' if v != 'ok' else v} x{c}" if c > 1 else (v if v == "ok" else f"**{v}**")
        for v, c in counts.items()
    )


def source_state() -> dict[str, Any]:
    """The sprite-env commit measured, and its uncommitted changes (they are measured too)."""
    repo = os.path.dirname(HERE)

    def git(*a: str) -> str:
        p = subprocess.run(["git", "-C", repo, *a], capture_output=True, text=True, check=False)
        return p.stdout.strip()

    dirty = git("status", "--porcelain", "--", "sprite_env", "native", "pyproject.toml")
    h = hashlib.sha1()
    for top in ("sprite_env", "native"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(repo, top)):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith((".py", ".c", ".h")):
                    with open(os.path.join(dirpath, name), "rb") as f:
                        h.update(name.encode() + b"\0" + f.read())
    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": dirty.splitlines(),
        "source_sha1": h.hexdigest(),
    }


# -- main ---------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--profile", choices=sorted(layer.PROFILES), default="small")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per step (default 3)")
    parser.add_argument(
        "--cheap-s",
        type=float,
        default=30.0,
        help="repeat a tool's step only while its runs take less than this (default 30 s)",
    )
    parser.add_argument(
        "--tools", default=",".join(ALL_TOOLS), help="comma-separated subset, in round order"
    )
    parser.add_argument(
        "--work",
        default=os.path.join(layer.DATA, "scratch-checkpoints"),
        help="scratch directory (emptied first; default benchmarks/.data/scratch-checkpoints)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument(
        "--no-freeze",
        action="store_true",
        help="run the installed (editable) sprite-env, not a copy of HEAD taken at the start",
    )
    parser.add_argument("--out", help="JSON path (default benchmarks/results/checkpoints-<date>)")
    args = parser.parse_args()
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    names = [n.strip() for n in args.tools.split(",") if n.strip()]
    unknown = [n for n in names if n not in TOOL_CLASSES]
    if unknown or not names:
        parser.error(f"unknown tools {unknown}; choose from {ALL_TOOLS}")
    can_drop = os.geteuid() == 0
    if not can_drop:
        log("WARNING: not root, cannot drop the page cache: the 'cold' steps run warm")
    t_start = time.monotonic()
    load0 = os.getloadavg()
    src0 = source_state()  # the package is installed editable: edits during the run count

    pristine, info = layer.pristine(args.profile, log)
    st = info["stats"]
    log(
        f"layer {args.profile}: {st['files']:,} files, {st['bytes'] / 1e6:,.1f} MB, "
        f"{st['dirs']:,} dirs, {st['symlinks']} symlinks"
        + (f"; skipped: {info['skipped']}" if info.get("skipped") else "")
    )
    work = os.path.abspath(args.work)
    rmtree(work)
    os.makedirs(work)
    sprite_source = setup_sprite(work, freeze=not args.no_freeze) if SPRITE in names else "-"
    log(f"sprite-env: {sprite_source}")
    tools = [TOOL_CLASSES[n](work) for n in names]
    versions: dict[str, str] = {}
    for t in tools:
        os.makedirs(t.dir)
        layer.copy_layer(pristine, t.live)
        try:
            versions[t.name] = t.version()
        except (OSError, RuntimeError) as e:
            versions[t.name] = f"unknown ({e})"
    log(f"copied the layer for {', '.join(names)} under {work}; versions {versions}")
    log("manifest of the pristine layer")
    m_pristine = manifest(pristine)

    bench = Bench(tools, args.reps, args.cheap_s, can_drop)
    mutations: dict[str, list[dict[str, Any]]] = {t.name: [] for t in tools}

    # a: first snapshot into an empty repository
    def prep_a(t: Peer, rep: int, run: Run) -> None:
        t0 = time.perf_counter()
        t.init()
        run.extra["init_s"] = round(time.perf_counter() - t0, 3)

    def after_snap(key: str) -> Callable[[Peer, int, Measured, Run], None]:
        def after(t: Peer, rep: int, m: Measured, run: Run) -> None:
            sid = t.snapshot_id(f"{key}{rep}", m.stdout)  # the label snap_cmd gave it
            run.extra["snapshot"] = sid
            slot = key[0]
            prev = t.snaps.get(slot)
            t.snaps[slot] = sid
            if slot == "b" and prev is not None and prev != sid:
                try:
                    t.forget(prev)  # keep one no-change snapshot, as after one run
                except (OSError, RuntimeError) as e:
                    bench.anomaly(f"{t.name}: deleting the extra no-change snapshot {prev}: {e}")
            sizes(t, run)

        return after

    def snap_cmd(key: str) -> Callable[[Peer, int], Cmd]:
        return lambda t, rep: t.snapshot(f"{key}{rep}")

    bench.step("a", True, snap_cmd("a"), prep_a, after_snap("a"))

    # the stat walk and sprite-env's start-up, for proportion
    ref = next((t for t in tools if t.name == SPRITE), tools[0])
    find_argv = shell(f"find {q(ref.live)} -printf '%i %s %T@ %C@ %m\\n' > /dev/null")
    subprocess.run(find_argv, check=True)
    extra_timings: dict[str, list[float]] = {
        "find_stat_walk_warm": time_cmd(find_argv, 5, cold=False),
        "find_stat_walk_cold": time_cmd(find_argv, 3, cold=can_drop),
    }
    if any(t.name == SPRITE for t in tools):
        extra_timings["sprite_env_version_warm"] = time_cmd(
            [*sprite_argv(), "--version"], 5, cold=False, env={**os.environ, **SPRITE_ENV}
        )
    for k, ts in extra_timings.items():
        log(f"{k}: median {statistics.median(ts):.3f} s ({min(ts):.3f}-{max(ts):.3f})")

    # b: no change
    for key, cold in (("b_cold", True), ("b_warm", False)):
        bench.step(key, cold, snap_cmd(key), None, after_snap(key))

    manifests_b: dict[str, dict[str, Entry]] = {}
    for t in tools:
        manifests_b[t.name] = manifest(t.live)
        v = compare(m_pristine, manifests_b[t.name])
        if not v.ok:
            bench.anomaly(f"{t.name}: the live layer changed during a-b: {v.text()} {v.examples}")
        try:
            t.save_state()
        except (OSError, subprocess.CalledProcessError) as e:
            bench.anomaly(f"{t.name}: saving the repository after b: {e}")

    # c: the agent session (untimed), then a snapshot
    c_runs: dict[str, int] = {t.name: 0 for t in tools}

    def prep_c(t: Peer, rep: int, run: Run) -> None:
        if c_runs[t.name]:
            t.load_state()
            run.extra["reset"] = layer.reset_tree(pristine, t.live)
        c_runs[t.name] += 1
        summary = layer.mutate(t.live)
        mutations[t.name].append(summary)
        run.extra["mutate_s"] = summary["mutate_s"]

    for key, cold in (("c_cold", True), ("c_warm", False)):
        bench.step(key, cold, snap_cmd(key), prep_c, after_snap(key))

    manifests_c: dict[str, dict[str, Entry]] = {t.name: manifest(t.live) for t in tools}
    store_stats: dict[str, Any] = {}
    for t in tools:
        if isinstance(t, Sprite):
            try:
                store_stats = json.loads(
                    t.untimed(Cmd([*sprite_argv(), "--store", t.store, "store", "stats", "--json"]))
                )
            except (OSError, RuntimeError, ValueError) as e:
                bench.anomaly(f"sprite-env store stats: {e}")

    # e: full restore of the latest snapshot into an empty directory
    def prep_e(t: Peer, rep: int, run: Run) -> None:
        rmtree(t.target)
        os.makedirs(t.target)

    def verify_into(
        key: str, path: Callable[[Peer], str], expected: dict[str, dict[str, Entry]]
    ) -> Callable[[Peer, int, Measured, Run], None]:
        def after(t: Peer, rep: int, m: Measured, run: Run) -> None:
            v = compare(expected[t.name], manifest(path(t)))
            run.verify = v.text()
            run.verify_detail = {"counts": v.counts, "examples": v.examples}
            if not v.ok:
                bench.anomaly(f"{t.name} {key} rep {rep + 1}: {v.text()} e.g. {v.examples}")
            if path(t) == t.target:
                rmtree(t.target)

        return after

    bench.step(
        "e",
        True,
        lambda t, rep: t.restore_full(t.snaps["c"], t.target),
        prep_e,
        verify_into("e", lambda t: t.target, manifests_c),
    )

    # f: restore the pre-mutation snapshot onto the mutated tree
    def prep_f(t: Peer, rep: int, run: Run) -> None:
        t.prepare_f(rep)
        if isinstance(t, Sprite) and rep > 0:
            v = compare(manifests_c[t.name], manifest(t.live))
            run.extra["forward_restore_verify"] = v.text()
            if not v.ok:
                bench.anomaly(
                    f"sprite-env: untimed forward restore to {t.snaps['c']} before f rep "
                    f"{rep + 1}: {v.text()} e.g. {v.examples}"
                )

    bench.step(
        "f",
        True,
        lambda t, rep: t.restore_prev(t.snaps["b"]),
        prep_f,
        verify_into("f", lambda t: t.f_path(), manifests_b),
    )

    if not args.keep:
        rmtree(work)

    # -- report ----------------------------------------------------------------------------
    cells = {(k, t.name): cell(bench.of(k, t.name)) for k, _l, _c in STEPS for t in tools}
    peers = [t.name for t in tools if t.name != SPRITE]
    has_sprite = any(t.name == SPRITE for t in tools)
    date = today()
    loadavg = os.getloadavg()
    out: list[str] = []
    out.append(
        f"## Checkpoints, {date}: layer `{args.profile}`, {st['files']:,} files, "
        f"{st['bytes'] / 1e6:,.1f} MB, {st['dirs']:,} dirs; reps {args.reps}, "
        f"{os.cpu_count()} CPUs, load average {load0[0]:.1f} before / {loadavg[0]:.1f} after"
        + ("" if can_drop else "; NOT ROOT: every run warm")
    )
    out.append("")
    out.append("Wall seconds, median (min-max) of n runs:")
    out.append("")
    headers = ["step", *names]
    if has_sprite:
        headers += [f"sprite-env / {p}" for p in peers]
    rows = []
    for k, lbl, _c in STEPS:
        row = [lbl, *[cells[(k, n)].time_text() for n in names]]
        if has_sprite:
            row += [ratio(cells[(k, SPRITE)].median, cells[(k, p)].median) for p in peers]
        rows.append(row)
    out.append(markdown_table(headers, rows))
    out.append("")
    out.append("CPU seconds (median) / peak RSS MiB (largest process, max over runs):")
    out.append("")
    rows = []
    for k, lbl, _c in STEPS:
        cs = []
        for n in names:
            c = cells[(k, n)]
            cs.append(
                "-"
                if c.cpu is None
                else f"{c.cpu:.2f} / {c.rss_mib:.0f}"
                if c.rss_mib is not None
                else f"{c.cpu:.2f}"
            )
        rows.append([lbl, *cs])
    out.append(markdown_table(["step", *names], rows))
    out.append("")
    out.append(
        "d: repository size, MB (`du -sb`; sprite-env: its store, which holds its files "
        "cache; restic and borg: repository, + their cache dir):"
    )
    out.append("")
    size_rows = []
    size_data: dict[str, dict[str, int | None]] = {}
    for k, lbl in (("a", "after a"), ("b_warm", "after b"), ("c_warm", "after c")):
        row = [lbl]
        vals: dict[str, int | None] = {}
        for n in names:
            repo, cache = last_size(bench, k, n)
            vals[n] = repo
            row.append(mb(repo) + (f" (+{mb(cache)})" if cache is not None else ""))
        if has_sprite:
            row += [ratio(vals[SPRITE], vals[p]) for p in peers]
        size_rows.append(row)
        size_data[lbl] = vals
    added = {
        n: (
            size_data["after c"][n] - size_data["after b"][n]  # type: ignore[operator]
            if size_data["after c"][n] is not None and size_data["after b"][n] is not None
            else None
        )
        for n in names
    }
    row = ["added by c", *[mb(added[n]) for n in names]]
    if has_sprite:
        row += [ratio(added[SPRITE], added[p]) for p in peers]
    size_rows.append(row)
    out.append(markdown_table(["after", *headers[1:]], size_rows))
    out.append("")
    out.append("Verification of every restore (type, content, mode, owner, mtime of each entry):")
    out.append("")
    vrows = []
    for k in ("e", "f"):
        vrows.append([STEP_LABEL[k], *[verdict_summary(cells[(k, n)].verify) for n in names]])
    vrows.append(["f method", *[t.f_method for t in tools]])
    out.append(markdown_table(["step", *names], vrows, align="l" * (len(names) + 1)))

    fw = statistics.median(extra_timings["find_stat_walk_warm"])
    fc = statistics.median(extra_timings["find_stat_walk_cold"])
    out.append("")
    out.append(
        f"Stat walk `find LAYER -printf '%i %s %T@ %C@ %m\\n'`: warm {fw:.3f} s, cold {fc:.3f} s"
        + (
            f"; sprite-env process start-up (`sprite-env --version`, warm): "
            f"{statistics.median(extra_timings['sprite_env_version_warm']):.3f} s"
            if "sprite_env_version_warm" in extra_timings
            else ""
        )
    )

    goals: list[dict[str, Any]] = []
    if has_sprite:

        def med(k: str, n: str) -> float | None:
            return cells[(k, n)].median if (k, n) in cells else None

        cw = med("c_warm", SPRITE)
        cc = med("c_cold", SPRITE)
        goals.append(
            {
                "goal": "after a typical change, a checkpoint in <= 300 ms and <= 1.5x one "
                "find stat walk (warm metadata; the goal's layer has ~100k files)",
                "measured": (
                    f"c warm {cw:.3f} s = {cw / fw:.2f}x find ({fw:.3f} s); c cold {cc:.3f} s"
                    if cw is not None and cc is not None
                    else "FAILED"
                ),
                "met": bool(cw is not None and cw <= 0.300 and cw <= 1.5 * fw),
            }
        )
        if RESTIC in names:
            sa, ra = med("a", SPRITE), med("a", RESTIC)
            goals.append(
                {
                    "goal": "a first checkpoint >= 2x faster than restic's first snapshot",
                    "measured": f"restic/sprite-env = {ra / sa:.2f}x" if sa and ra else "FAILED",
                    "met": bool(sa and ra and ra / sa >= 2),
                }
            )
            sf, re_, rf = med("f", SPRITE), med("e", RESTIC), med("f", RESTIC)
            f_ok = all(v == "ok" for v in cells[("f", SPRITE)].verify)
            goals.append(
                {
                    "goal": "a delta restore >= 10x faster than restic's full restore",
                    "measured": (
                        f"restic e / sprite-env f = {re_ / sf:.2f}x"
                        + (
                            f"; restic f (wipe + restore) / sprite-env f = {rf / sf:.2f}x"
                            if rf
                            else ""
                        )
                        + ("" if f_ok else "; sprite-env f verify MISMATCH")
                        if sf and re_
                        else "FAILED"
                    ),
                    "met": bool(sf and re_ and re_ / sf >= 10 and f_ok),
                }
            )
            ss, rs = size_data["after c"][SPRITE], size_data["after c"][RESTIC]
            goals.append(
                {
                    "goal": "a store no larger than restic's repository (after c)",
                    "measured": f"{mb(ss)} MB vs {mb(rs)} MB = {ratio(ss, rs)}"
                    if ss and rs
                    else "FAILED",
                    "met": bool(ss and rs and ss <= rs),
                }
            )
        out.append("")
        out.append(
            markdown_table(
                ["goal", "this run", "met?"],
                [[g["goal"], g["measured"], "yes" if g["met"] else "**no**"] for g in goals],
                align="llr",
            )
        )
    m0 = next((m[0] for m in mutations.values() if m), None)
    if m0:
        out.append("")
        out.append(
            f"Mutation: {m0['edited']} of {m0['files_total']:,} files edited "
            f"({m0['edited_bytes'] / 1e6:.1f} MB), {m0['new_files']} new files "
            f"({m0['new_bytes'] / 1e6:.1f} MB), pip install {' '.join(m0['pip_installed'])}, "
            f"SQLite +{m0['sqlite']['events_added']:,} events / {m0['sqlite']['users_updated']} "
            f"users updated, deleted {m0['deleted_dir']} ({m0.get('deleted_files', 0)} files), "
            f"git commit {m0['git_commit']}"
        )
    if has_sprite:
        det = []
        for k in ("a", "b_warm", "c_cold", "c_warm", "e", "f"):
            r = next((r for r in bench.of(k, SPRITE) if r.ok), None)
            if r is not None and r.extra:
                keep = {x: v for x, v in r.extra.items() if x not in ("reset", "snapshot")}
                if k.startswith("c_"):
                    keep["bytes_added_every_run"] = [
                        x.extra.get("bytes_added") for x in bench.of(k, SPRITE) if x.ok
                    ]
                det.append(f"{k} {json.dumps(keep)}")
        if det:
            out.append("")
            out.append("sprite-env's own report of its first good run of each step:")
            out.append("")
            out.extend(f"- {d}" for d in det)
    if not all(r.rss_exact for r in bench.runs if r.rss_exact is not None):
        out.append("")
        out.append(
            f"Peak RSS NOT exact ({GNU_TIME} missing): wait4's figure includes this "
            "benchmark's own resident set"
        )
    src1 = source_state()
    if src1["source_sha1"] != src0["source_sha1"] and args.no_freeze:
        bench.anomaly(
            f"sprite-env's source changed during the run ({src0['commit']} -> "
            f"{src1['commit']}): its figures mix two versions; run again"
        )
    if bench.anomalies:
        out.append("")
        out.append("Anomalies:")
        out.extend(f"- {a}" for a in bench.anomalies)
    elapsed = time.monotonic() - t_start
    out.append("")
    out.append(
        f"Versions: {versions}; sprite-env: {sprite_source}, commit {src0['commit']}"
        + (
            f" (the working tree had uncommitted changes to {len(src0['dirty'])} files)"
            if src0["dirty"]
            else ""
        )
        + f". Elapsed {elapsed / 60:.1f} min."
    )
    text = "\n".join(out)
    print(text)

    payload = {
        "benchmark": "checkpoints",
        "profile": args.profile,
        "layer": info,
        "reps": args.reps,
        "cheap_s": args.cheap_s,
        "cold_possible": can_drop,
        "tools": names,
        "versions": versions,
        "sprite_env_source": {"measured": sprite_source, "start": src0, "end": src1},
        "loadavg_at_start": load0,
        "elapsed_s": elapsed,
        "extra_timings_s": extra_timings,
        "summary": {k: {n: asdict(cells[(k, n)]) for n in names} for k, _l, _c in STEPS},
        "sizes_bytes": size_data,
        "added_by_c_bytes": added,
        "sprite_env_store_stats_after_c": store_stats,
        "goals": goals,
        "mutations": mutations,
        "anomalies": bench.anomalies,
        "runs": [asdict(r) for r in bench.runs],
        "markdown": text,
    }
    if has_sprite:
        payload["time_ratios_sprite_env_over_peer"] = {
            k: {
                p: (
                    s / o
                    if (s := cells[(k, SPRITE)].median) and (o := cells[(k, p)].median)
                    else None
                )
                for p in peers
            }
            for k, _l, _c in STEPS
        }
    path = write_results("checkpoints", payload, args.out)
    print(f"\nresults: {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
