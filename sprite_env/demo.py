"""The built-in demo: the whole checkpoint loop against a real daemon, as a terminal session.

Run with ``sprite-env demo``. In a temporary directory (or ``--dir``) it builds a sample
layer, starts ``sprite-env daemon`` on it as a subprocess, and runs the real command line
against the daemon's socket, printing each command and its output: a checkpoint, a change,
a second checkpoint that stores only what changed, the diffs, the read-only view of the
checkpoints, a restore (which can itself be undone), the activity log and the raw API. It
then checks that the layer is back to the sample tree exactly (contents, modes, owners,
nanosecond mtimes), stops the daemon with SIGTERM (it must exit 0 and unmount its view),
and runs ``store check --read-data`` on the store it leaves behind.

Without ``/dev/fuse`` the daemon runs with ``--no-view`` and the browse step is skipped.

Error handling:
    Every step checks what it shows: a command that exits with an unexpected status, or
    output that does not say what it should, ends the demo with ``demo FAILED: ...`` (and
    the end of the daemon's log); :func:`run_demo` returns False. Whatever happens, the
    daemon is stopped and its view unmounted before the demo returns; a temporary
    directory is removed unless ``keep`` (or the demo failed: it is kept to look at).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

from sprite_env.client import Client
from sprite_env.errors import SpriteError

Say = Callable[[str], None]

#: The files the demo changes between v0 and v1 (relative to the layer).
EDITED = "src/pkg3/mod7.py"
DELETED = "data/blob-copy.bin"
ADDED = "src/NOTES.md"
EDIT_LINE = b"# edited by the demo\n"
ADDED_TEXT = b"checkpoints are cheap: take one before anything risky\n"

_START_TIMEOUT = 60.0  # seconds for the daemon to answer on its socket
_STOP_TIMEOUT = 60.0  # seconds for it to exit after SIGTERM
_CMD_TIMEOUT = 300.0  # seconds for a command of the session to exit once its output ends
_MAX_LINE = 160  # longer output lines are cut (the raw API answers are one long line)


def _print(line: str) -> None:
    print(line, flush=True)  # as each step happens, through a pipe too


class DemoFailed(Exception):
    """A step of the demo did not do what it shows."""


def build_sample_tree(root: str, seed: int = 7) -> None:
    """Writes a small but varied tree: sources, a log, random blobs, a sparse image."""
    rng = random.Random(seed)
    words = [b"checkpoint", b"restore", b"sprite", b"layer", b"chunk", b"pack", b"tree"]
    for d in range(6):
        sub = os.path.join(root, "src", f"pkg{d}")
        os.makedirs(sub, exist_ok=True)
        for f in range(25):
            lines = [b" ".join(rng.choices(words, k=8)) for _ in range(rng.randint(5, 400))]
            with open(os.path.join(sub, f"mod{f}.py"), "wb") as fh:
                fh.write(b"\n".join(lines) + b"\n")
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    blob = rng.randbytes(3 << 20)
    for name in ("blob.bin", "blob-copy.bin"):  # a duplicate costs nothing
        with open(os.path.join(root, "data", name), "wb") as fh:
            fh.write(blob)
    with open(os.path.join(root, "data", "app.log"), "wb") as fh:
        for i in range(120_000):
            fh.write(b"%08d INFO request served in %d ms\n" % (i, rng.randint(1, 900)))
    with open(os.path.join(root, "data", "disk.img"), "wb") as fh:  # mostly holes
        fh.truncate(16 << 20)
        for off in (0, 5 << 20, 11 << 20):
            fh.seek(off)
            fh.write(rng.randbytes(300_000))


def mutate_sample_tree(root: str) -> list[str]:
    """A small change: one source edited in the middle, one file deleted, one added.

    Returns the shell commands that make the same change (run from the layer's parent,
    with the layer named ``layer``), to show it.
    """
    path = os.path.join(root, EDITED)
    with open(path, "rb") as fh:
        lines = fh.read().splitlines(keepends=True)
    at = len(lines) // 2
    with open(path, "wb") as fh:
        fh.write(b"".join(lines[:at] + [EDIT_LINE] + lines[at:]))
    os.remove(os.path.join(root, DELETED))
    with open(os.path.join(root, ADDED), "wb") as fh:
        fh.write(ADDED_TEXT)
    return [
        f"sed -i '{at + 1}i {EDIT_LINE.decode().strip()}' layer/{EDITED}",
        f"rm layer/{DELETED}",
        f"echo {shlex.quote(ADDED_TEXT.decode().strip())} > layer/{ADDED}",
    ]


def describe_sample_tree(root: str) -> str:
    """One line on what :func:`build_sample_tree` wrote."""
    mib = 1 << 20
    sources = sum(len(files) for _, _, files in os.walk(os.path.join(root, "src")))
    log = os.path.getsize(os.path.join(root, "data", "app.log"))
    blob = os.path.getsize(os.path.join(root, "data", "blob.bin"))
    img = os.stat(os.path.join(root, "data", "disk.img"))
    return (
        f"a sample layer: {sources} sources, a {log / mib:.1f} MiB log, a {blob / mib:.0f} MiB "
        f"blob twice, a {img.st_size / mib:.0f} MiB image holding "
        f"{img.st_blocks * 512 / mib:.1f} MiB (the rest is holes)"
    )


Digest = tuple[int, int, int, int, int, str]


def digest_tree(root: str) -> dict[str, Digest]:
    """(mode, uid, gid, size, mtime_ns, sha256 or link target) of every entry under
    ``root``, to compare two trees byte- and metadata-exact."""
    out: dict[str, Digest] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            digest = ""
            if os.path.islink(p):
                digest = os.readlink(p)
            elif os.path.isfile(p):
                with open(p, "rb") as fh:
                    digest = hashlib.file_digest(fh, "sha256").hexdigest()
            size = st.st_size if not os.path.isdir(p) else 0  # a directory's size varies
            out[os.path.relpath(p, root)] = (
                st.st_mode,
                st.st_uid,
                st.st_gid,
                size,
                st.st_mtime_ns,
                digest,
            )
    return out


def mounted_under(path: str) -> list[str]:
    """Mount points at or under ``path`` (from ``/proc/self/mountinfo``)."""
    path = os.path.abspath(path)
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            if len(fields) < 5:
                continue
            # mountinfo escapes space, tab, newline and backslash as \ooo
            mp = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            if mp == path or mp.startswith(path + "/"):
                found.append(mp)
    return found


def _detach(mountpoint: str) -> None:
    """Lazily unmounts what a daemon that did not stop cleanly left behind."""
    for argv in (["fusermount3", "-u", "-z", mountpoint], ["umount", "-l", mountpoint]):
        if shutil.which(argv[0]):
            r = subprocess.run(argv, capture_output=True, check=False)
            if r.returncode == 0:
                return


def _clip(line: str) -> str:
    return line if len(line) <= _MAX_LINE else f"{line[:_MAX_LINE]} ...[{len(line)} characters]"


class Session:
    """Runs commands in the demo's directory and prints them like a terminal session."""

    def __init__(self, base: str, env: dict[str, str], say: Say) -> None:
        self.base = base
        self.env = env
        self.say = say

    def note(self, text: str) -> None:
        self.say(f"# {text}")

    def run(self, shown: str, argv: Sequence[str], *, ok: Sequence[int] = (0,)) -> str:
        """Prints ``$ shown``, runs ``argv`` (stdout and stderr merged, printed as they
        come), and returns the output; raises :class:`DemoFailed` on an exit status not
        in ``ok``."""
        self.say(f"$ {shown}")
        lines: list[str] = []
        with subprocess.Popen(
            list(argv),
            cwd=self.base,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        ) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                self.say(_clip(lines[-1]))
            try:
                code = proc.wait(_CMD_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise DemoFailed(f"`{shown}` did not finish in {_CMD_TIMEOUT:g} s") from None
        if code not in ok:
            raise DemoFailed(f"`{shown}` exited with {code}")
        return "\n".join(lines)

    def sprite(self, *args: str, ok: Sequence[int] = (0,)) -> str:
        """``sprite-env ARGS``, run with this interpreter."""
        return self.run(
            "sprite-env " + shlex.join(args), [sys.executable, "-m", "sprite_env", *args], ok=ok
        )


class DaemonProcess:
    """``sprite-env daemon`` as a subprocess of the demo, on ``BASE/layer`` and
    ``BASE/state`` (named relative to ``BASE``, its working directory, to show them short),
    logging to ``BASE/daemon.log``."""

    def __init__(self, base: str, *, view: bool) -> None:
        self.base = base
        self.state = os.path.join(base, "state")
        self.socket = os.path.join(self.state, "api.sock")
        self.mountpoint = os.path.join(self.state, "checkpoints")
        self.log_path = os.path.join(base, "daemon.log")
        self.args = ["daemon", "--root", "layer", "--state", "state", "--auto-interval", "0"]
        if not view:
            self.args.append("--no-view")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> int:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sprite_env", *self.args],
                cwd=self.base,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the demo, which stops the daemon
            )
        return self.proc.pid

    def wait_ready(self) -> dict[str, object]:
        """Waits (with the client's own waiting) until the daemon answers; its status."""
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise DemoFailed(f"the daemon exited with {self.proc.returncode} at start")
            try:
                # a short wait each time, to notice a daemon that died while starting
                return dict(Client(self.socket, wait=1.0, notice=lambda _line: None).status())
            except SpriteError as e:
                if time.monotonic() >= deadline:
                    raise DemoFailed(
                        f"the daemon did not answer in {_START_TIMEOUT:g} s: {e}"
                    ) from None

    def stop(self) -> int:
        """SIGTERM; returns the exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise DemoFailed(f"the daemon did not stop in {_STOP_TIMEOUT:g} s") from None

    def cleanup(self) -> None:
        """Leaves no daemon and no mount behind, whatever happened."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for mp in reversed(mounted_under(self.state)):
            _detach(mp)

    def log_tail(self, lines: int = 15) -> list[str]:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read().splitlines()[-lines:]
        except OSError:
            return []


def run_demo(
    workdir: str | None = None, *, keep: bool = False, view: bool | None = None, say: Say = _print
) -> bool:
    """Runs the demo; returns True when every step did what it shows.

    Args:
        workdir: work (and leave the files) here instead of in a temporary directory; it
            must not hold a ``layer`` or ``state`` already.
        keep: keep the temporary directory (its path is printed).
        view: mount the checkpoint view (default: when ``/dev/fuse`` exists).
        say: prints one line of the session.
    """
    if workdir is not None:
        base = os.path.abspath(workdir)
        for name in ("layer", "state"):
            if os.path.lexists(os.path.join(base, name)):
                say(f"demo FAILED: {base} already holds a {name}/; choose an empty directory")
                return False
        os.makedirs(base, exist_ok=True)
    else:
        base = tempfile.mkdtemp(prefix="sprite-env-demo-")
    no_view = None  # why the daemon runs without its view
    if view is None and not os.path.exists("/dev/fuse"):
        no_view = "no /dev/fuse here"
    elif view is False:
        no_view = "demo --no-view"
    daemon = DaemonProcess(base, view=no_view is None)
    failure: str | None = "interrupted"
    started = time.monotonic()
    try:
        _session(base, daemon, no_view, say)
        failure = None
    except (DemoFailed, SpriteError, OSError) as e:
        failure = str(e) or type(e).__name__
        tail = daemon.log_tail()
        if tail:
            say(f"the end of {daemon.log_path}:")
            for line in tail:
                say(f"  {line}")
    finally:
        daemon.cleanup()
        if workdir is None and (keep or failure is not None):
            say(f"(the files are kept in {base})")
        elif workdir is None:
            shutil.rmtree(base, ignore_errors=True)
    if failure is not None:
        say(f"demo FAILED: {failure}")
        return False
    say(f"demo OK ({time.monotonic() - started:.1f} s)")
    return True


def _session(base: str, daemon: DaemonProcess, no_view: str | None, say: Say) -> None:
    layer = os.path.join(base, "layer")
    env = {
        **os.environ,
        "SPRITE_API_SOCK": daemon.socket,
        "SPRITE_ACTOR": "demo",
        "SPRITE_API_WAIT": "30",
        "PYTHONUNBUFFERED": "1",  # the CLI's stdout and stderr interleave as they happen
    }
    sh = Session(base, env, say)
    say(f"$ cd {base}")
    build_sample_tree(layer)
    sh.note(describe_sample_tree(layer))
    original = digest_tree(layer)

    # -- the daemon ------------------------------------------------------------------------
    if no_view is not None:
        sh.note(f"{no_view}: the daemon runs with --no-view (no checkpoint view)")
    say(f"$ sprite-env {shlex.join(daemon.args)} >daemon.log 2>&1 &")
    say(f"[1] {daemon.start()}")
    status = daemon.wait_ready()
    say("$ export SPRITE_API_SOCK=$PWD/state/api.sock SPRITE_ACTOR=demo")

    # -- two checkpoints -------------------------------------------------------------------
    out = sh.sprite("checkpoints", "create", "--comment", "sample tree")
    _expect(out, "Checkpoint created: v0", "the first checkpoint is not v0")
    out = sh.sprite("checkpoints", "list")
    _expect(out, "sample tree", "the list does not show v0")
    for shown in mutate_sample_tree(layer):
        say(f"$ {shown}")
    out = sh.sprite("checkpoints", "create", "--comment", "after an edit")
    _expect(out, "Checkpoint created: v1", "the second checkpoint is not v1")
    client = Client(daemon.socket, actor="demo")
    v0, v1 = client.info("v0"), client.info("v1")
    if v1["bytes_added"] > 64 << 10:
        raise DemoFailed(f"v1 stored {v1['bytes_added']} bytes for a small change")
    sh.note(
        f"v1 stored {v1['bytes_added'] / 1024:.1f} KiB new for {v1['bytes'] / (1 << 20):.1f} "
        f"MiB of files (v0 stored {v0['bytes_added'] / (1 << 20):.1f} MiB): the rest is shared"
    )
    changes = [f"M {EDITED}", f"- {DELETED}", f"+ {ADDED}"]
    out = sh.sprite("checkpoints", "diff", "v0", "v1")
    _expect_all(out, changes, "diff v0 v1")

    # -- the view --------------------------------------------------------------------------
    view_dir = os.path.join("state", "checkpoints")
    if no_view is not None:
        sh.note(f"skipped: browsing {view_dir}/ ({no_view})")
    elif status.get("mount") is None:
        sh.note(f"skipped: browsing {view_dir}/ (the view did not mount; see daemon.log)")
    else:
        out = sh.run(f"ls {view_dir}", ["ls", view_dir])
        _expect_all(out, ["v0", "v1"], f"ls {view_dir}")
        seen = os.path.join(view_dir, "v0", EDITED)
        # diff exits 1: the files differ (v0 has the line the demo added since)
        out = sh.run(f"diff {seen} layer/{EDITED}", ["diff", seen, f"layer/{EDITED}"], ok=(1,))
        _expect(out, "> " + EDIT_LINE.decode().strip(), "the view's diff misses the edit")
        with open(os.path.join(base, seen), "rb") as fh:
            if hashlib.file_digest(fh, "sha256").hexdigest() != original[EDITED][5]:
                raise DemoFailed(f"{seen} is not the file as it was at v0")

    # -- back to v0 ------------------------------------------------------------------------
    out = sh.sprite("checkpoints", "diff", "v0")
    _expect_all(out, changes, "diff v0 (live)")
    out = sh.sprite("restore", "v0", "--preview")
    _expect(out, "Restoring v0 would", "the preview says nothing")
    out = sh.sprite("restore", "v0", "--yes")
    undo = re.search(r"undo with: sprite-env restore (\S+)", out)
    if "Restored v0" not in out or undo is None:
        raise DemoFailed("the restore did not say it restored v0 and how to undo it")
    if not client.info(undo.group(1)).get("is_auto"):
        raise DemoFailed(f"the undo checkpoint {undo.group(1)} is not an automatic one")
    now = digest_tree(layer)
    if now != original:
        wrong = sorted(set(now) ^ set(original) | {p for p in now if now[p] != original.get(p)})
        raise DemoFailed(f"the layer differs from the sample tree at: {', '.join(wrong[:5])}")
    sh.note(
        f"the layer equals the sample tree: {len(now)} entries, same bytes, modes, owners "
        "and mtimes (ns)"
    )
    out = sh.sprite("checkpoints", "log")
    _expect_all(out, ["create", "restore"], "the activity log")
    out = sh.sprite("curl", "/v1/checkpoints")
    try:
        ids = [c["id"] for c in json.loads(out)]
    except (ValueError, TypeError, KeyError) as e:
        raise DemoFailed(f"GET /v1/checkpoints did not answer a list of checkpoints: {e}") from e
    if ids != ["v1", "v0"]:
        raise DemoFailed(f"GET /v1/checkpoints listed {ids}, not v1 and v0")

    # -- stop, check -----------------------------------------------------------------------
    assert daemon.proc is not None
    say(f"$ kill -TERM {daemon.proc.pid}")
    code = daemon.stop()
    left = mounted_under(daemon.state)
    if code != 0 or left:
        raise DemoFailed(f"the daemon exited with {code}, leaving mounted: {left or 'nothing'}")
    unmounted = f"; {view_dir} unmounted" if status.get("mount") else ""
    say(f"[1]+ Done (exit status 0){unmounted}")
    out = sh.sprite("--root", "layer", "--store", "state/store", "store", "check", "--read-data")
    _expect(out, ": ok", "store check did not say ok")


def _expect(output: str, needle: str, problem: str) -> None:
    if needle not in output:
        raise DemoFailed(f"{problem} (no {needle!r} in the output)")


def _expect_all(output: str, needles: Sequence[str], what: str) -> None:
    lines = output.splitlines()
    missing = [n for n in needles if not any(n in line for line in lines)]
    if missing:
        raise DemoFailed(f"{what} does not show {', '.join(missing)}")
