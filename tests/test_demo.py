"""The README's demo command runs end to end and checks what it claims."""

import os

from sprite_env.demo import build_sample_tree, run_demo
from sprite_env.snapshot.filedata import ChunkRef, read_chunks, store_file
from sprite_env.store import Store
from sprite_env.store.chunker import Chunker
from tests.helpers.cli import run_cli


def test_demo_command_passes(tmp_path: os.PathLike[str]) -> None:
    r = run_cli("demo", "--dir", os.fspath(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "identical to the original" in r.stdout
    assert "demo passed" in r.stdout


def test_demo_checks_the_store(tmp_path: os.PathLike[str]) -> None:
    lines: list[str] = []
    assert run_demo(os.fspath(tmp_path), say=lines.append)
    assert any("store check --read-data" in line and "ok" in line for line in lines)


def test_sparse_file_becomes_holes(tmp_path: os.PathLike[str], store: Store) -> None:
    root = os.path.join(tmp_path, "tree")
    build_sample_tree(root)
    path = os.path.join(root, "data", "disk.img")
    with store.writer() as w:
        refs = store_file(path, w, Chunker())
        w.commit()
    holes = [r for r in refs if r.oid is None]
    assert sum(r.length for r in holes) > 10 << 20  # most of the 16 MiB image
    with open(path, "rb") as f:
        assert b"".join(read_chunks(store, refs)) == f.read()
    assert all(isinstance(r, ChunkRef) for r in refs)
