"""``sprite-env store ...`` as a user runs it: output, JSON and exit codes."""

import json
import os

from sprite_env.store import open_store
from sprite_env.store.pack import ENTRY, pack_path
from tests.helpers.cli import run_cli


def _make(store_dir: str) -> list[bytes]:
    blobs = [os.urandom(3000) + b"x" * 5000 for _ in range(10)]
    with open_store(store_dir, create=True) as s, s.writer() as w:
        oids = [w.put(b) for b in blobs]
        w.commit()
    return oids


def test_init_check_stats(store_dir: str) -> None:
    r = run_cli("store", "init", "--store", store_dir)
    assert r.returncode == 0, r.stderr
    _make(store_dir)
    r = run_cli("store", "check", "--store", store_dir, "--read-data")
    assert r.returncode == 0
    assert "10 objects read and hashed: ok" in r.stdout
    r = run_cli("store", "stats", "--store", store_dir, "--json")
    st = json.loads(r.stdout)
    assert st["objects"] == 10
    assert st["packs"] == 1
    assert st["raw_bytes"] == 80000
    assert st["stored_bytes"] < 80000
    assert st["compression_ratio"] > 1.0
    r = run_cli("store", "stats", "--store", store_dir)
    assert "dedup:" in r.stdout
    assert "compression:" in r.stdout


def test_check_exit_code_and_message_on_damage(store_dir: str) -> None:
    oids = _make(store_dir)
    with open_store(store_dir) as s:
        loc = s.catalog.locate(oids[4])
    assert loc is not None
    path = pack_path(os.path.join(store_dir, "packs"), loc.pack)
    with open(path, "r+b") as f:
        f.seek(loc.entry.offset + ENTRY.size + 100)
        f.write(b"\xff\xfe")
    assert run_cli("store", "check", "--store", store_dir).returncode == 0
    r = run_cli("store", "check", "--store", store_dir, "--read-data")
    assert r.returncode == 3
    assert f"pack {loc.pack} at offset {loc.entry.offset}" in r.stderr
    r = run_cli("store", "check", "--store", store_dir, "--read-data", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 3
    assert out["ok"] is False
    assert out["errors"]


def test_rebuild_catalog(store_dir: str) -> None:
    _make(store_dir)
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(os.path.join(store_dir, "catalog.db" + suffix)):
            os.unlink(os.path.join(store_dir, "catalog.db" + suffix))
    r = run_cli("store", "check", "--store", store_dir)
    assert r.returncode == 3
    assert "rebuild-catalog" in r.stderr
    assert len(os.listdir(os.path.join(store_dir, "packs"))) == 1
    r = run_cli("store", "rebuild-catalog", "--store", store_dir)
    assert r.returncode == 0, r.stderr
    assert "10 objects" in r.stdout
    assert run_cli("store", "check", "--store", store_dir, "--read-data").returncode == 0


def test_not_a_store_is_a_clear_error(tmp_path: os.PathLike[str]) -> None:
    d = os.fspath(tmp_path)
    with open(os.path.join(d, "file"), "w") as f:
        f.write("x")
    r = run_cli("store", "check", "--store", d)
    assert r.returncode == 3
    assert "is not a sprite-env store" in r.stderr
    assert "Traceback" not in r.stderr


def test_usage_errors_exit_2() -> None:
    assert run_cli("store").returncode == 2
    assert run_cli("no-such-command").returncode == 2
    assert run_cli("--version").stdout.startswith("sprite-env ")
