"""The built-in demo: a sample tree stored, changed, stored again, read back and checked.

Run with ``sprite-env demo``. It works in a temporary directory (or ``--dir``) and proves
on real files what the store promises: byte-exact read-back, incremental storage (the
second pass stores only what changed), holes for zero runs, and a clean ``check``.
"""

from __future__ import annotations

import hashlib
import os
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from sprite_env.snapshot.filedata import ChunkRef, read_chunks, store_file
from sprite_env.store import check, open_store, stats
from sprite_env.store.chunker import Chunker

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


def _files(root: str) -> list[str]:
    out: list[str] = []
    for dirpath, _dirs, files in os.walk(root):
        out.extend(os.path.join(dirpath, f) for f in files)
    return sorted(out)


@dataclass
class PassResult:
    files: dict[str, list[ChunkRef]]
    bytes_in: int
    bytes_new: int
    bytes_stored: int
    seconds: float


def _store_tree(store_dir: str, root: str) -> PassResult:
    chunker = Chunker()
    t0 = time.perf_counter()
    with open_store(store_dir, create=True) as s, s.writer() as w:
        files = {p: store_file(p, w, chunker) for p in _files(root)}
        w.commit()
        st = w.stats
    return PassResult(
        files, st.bytes_offered, st.bytes_new, st.bytes_stored, time.perf_counter() - t0
    )


def _sha(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def run_demo(workdir: str | None = None, say: Say = print) -> bool:
    """Runs the demo; returns True when every check passed."""
    with tempfile.TemporaryDirectory(prefix="sprite-env-demo-") as tmp:
        base = workdir or tmp
        root, store_dir = os.path.join(base, "layer"), os.path.join(base, "store")
        os.makedirs(root, exist_ok=True)
        say(f"1. building a sample tree in {root}")
        build_sample_tree(root)
        first = _store_tree(store_dir, root)
        mib = 1 << 20
        say(
            f"2. stored {len(first.files)} files, {first.bytes_in / mib:.1f} MiB read, "
            f"{first.bytes_new / mib:.1f} MiB unique, {first.bytes_stored / mib:.1f} MiB "
            f"in packs, in {first.seconds:.2f} s"
        )
        mutate_sample_tree(root)
        second = _store_tree(store_dir, root)
        say(
            f"3. changed 2 files and stored the tree again: {second.bytes_new / 1024:.0f} KiB "
            f"new of {second.bytes_in / mib:.1f} MiB read"
        )
        ok = True
        with open_store(store_dir, writable=False) as s:
            for path, refs in second.files.items():
                h = hashlib.sha256()
                for piece in read_chunks(s, refs):
                    h.update(piece)
                if h.hexdigest() != _sha(path):
                    say(f"   MISMATCH: {path}")
                    ok = False
            say(
                f"4. read back {len(second.files)} files from the store: "
                f"{'all byte-exact' if ok else 'MISMATCHES'}"
            )
            report = check(s, read_data=True)
            st = stats(s)
        say(
            f"5. store check --read-data: {report.packs} packs, {report.objects} objects, "
            f"{'ok' if report.ok else report.errors}"
        )
        say(
            f"   store: {st.stored_bytes / mib:.1f} MiB for {st.ingested_bytes / mib:.1f} MiB "
            f"ingested (dedup {st.dedup_ratio:.2f}x, compression {st.compression_ratio:.2f}x)"
        )
        ok = ok and report.ok
        say("demo " + ("passed" if ok else "FAILED"))
        return ok
