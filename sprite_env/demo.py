"""The built-in demo: checkpoints of a sample layer, a change, a diff, a restore, a check.

Run with ``sprite-env demo``. It works in a temporary directory (or ``--dir``) and shows on
real files what the engine promises: a second checkpoint stores only what changed, a diff
names the changes, a restore brings the layer back exactly (and can itself be undone), and
``store check`` finds every object every checkpoint needs.
"""

from __future__ import annotations

import hashlib
import os
import random
import tempfile
import time
from collections.abc import Callable

from sprite_env.checkpoints import Engine
from sprite_env.checkpoints.gc import verify as verify_checkpoints
from sprite_env.store import check, stats

Say = Callable[[str], None]


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


def mutate_sample_tree(root: str) -> None:
    """A small change: one source edited in the middle, the log appended to."""
    path = os.path.join(root, "src", "pkg3", "mod7.py")
    with open(path, "rb") as fh:
        text = fh.read()
    mid = len(text) // 2
    with open(path, "wb") as fh:
        fh.write(text[:mid] + b"# edited by the demo\n" + text[mid:])
    with open(os.path.join(root, "data", "app.log"), "ab") as fh:
        fh.write(b"99999999 INFO demo appended a line\n" * 100)


def _digest_tree(root: str) -> dict[str, tuple[int, int, str]]:
    """(mode, mtime_ns, sha256) of every file and directory, to compare trees."""
    out: dict[str, tuple[int, int, str]] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            digest = ""
            if os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as fh:
                    digest = hashlib.file_digest(fh, "sha256").hexdigest()
            out[os.path.relpath(p, root)] = (st.st_mode, st.st_mtime_ns, digest)
    return out


def run_demo(workdir: str | None = None, say: Say = print) -> bool:
    """Runs the demo; returns True when every check passed."""
    with tempfile.TemporaryDirectory(prefix="sprite-env-demo-") as tmp:
        base = workdir or tmp
        root, store_dir = os.path.join(base, "layer"), os.path.join(base, "store")
        os.makedirs(root, exist_ok=True)
        mib = 1 << 20
        say(f"1. a sample layer in {root}: sources, a log, a duplicated blob, a sparse image")
        build_sample_tree(root)
        original = _digest_tree(root)
        with Engine(root, store_dir) as engine:
            t0 = time.perf_counter()
            v0 = engine.create("sample tree", created_by="demo")
            say(
                f"2. checkpoint {v0.id}: {v0.files} files, {v0.bytes / mib:.1f} MiB, stored in "
                f"{v0.bytes_added / mib:.1f} MiB ({time.perf_counter() - t0:.2f} s)"
            )
            mutate_sample_tree(root)
            t0 = time.perf_counter()
            v1 = engine.create("after an edit", created_by="demo")
            say(
                f"3. changed two files; checkpoint {v1.id} stored only "
                f"{v1.bytes_added / 1024:.0f} KiB new ({time.perf_counter() - t0:.2f} s)"
            )
            changes = engine.diff(v0.id, v1.id)
            say(
                f"4. diff {v0.id} {v1.id}: "
                + ", ".join(f"{d.change.value} {d.path.decode(errors='replace')}" for d in changes)
            )
            pv = engine.preview(v0.id).counts()
            say(
                f"5. restoring {v0.id} would create {pv['create']}, change {pv['change']}, "
                f"remove {pv['remove']}"
            )
            t0 = time.perf_counter()
            rep = engine.restore(v0.id, created_by="demo")
            ok = _digest_tree(root) == original
            say(
                f"6. restored {v0.id} in {time.perf_counter() - t0:.2f} s: the layer is "
                f"{'identical to' if ok else 'DIFFERENT FROM'} the original "
                f"(undo checkpoint: {rep.undo})"
            )
            listing = engine.checkpoints(include_auto=True)
            say(
                "7. checkpoints: "
                + ", ".join(f"{c.id}{' (auto)' if c.is_auto else ''}" for c in listing)
            )
            report = check(engine.store, read_data=True)
            reached, errors = verify_checkpoints(engine.store)
            st = stats(engine.store)
        ok = ok and report.ok and not errors
        say(
            f"8. store check --read-data: {report.packs} packs, {report.objects} objects, "
            f"{reached} reachable: {'ok' if report.ok and not errors else report.errors + errors}"
        )
        say(
            f"   store: {st.stored_bytes / mib:.1f} MiB for {st.ingested_bytes / mib:.1f} MiB "
            f"ingested (dedup {st.dedup_ratio:.2f}x, compression {st.compression_ratio:.2f}x)"
        )
        say("demo " + ("passed" if ok else "FAILED"))
        return ok
