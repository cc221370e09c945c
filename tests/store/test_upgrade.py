"""A store written by an older sprite-env opens and upgrades (issue 15, point 9).

``tests/data/store-schema2`` was written by the code at commit ea0708aa (catalog schema 2:
no ``walk`` columns, no files-cache checksums; see ``tests/data/README.md``), and its
manifest is what that code's ``export`` wrote. Today's code must list its checkpoints,
export them byte-exact, and find it sound, before and after the upgrade.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import stat

from sprite_env.checkpoints import Engine
from sprite_env.checkpoints.verify import verify_store
from sprite_env.store import open_store
from sprite_env.store.catalog import SCHEMA_VERSION
from tests.helpers.cli import run_cli

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
OLD = os.path.join(DATA, "store-schema2")


def _manifest(root: str) -> dict[str, dict[str, str]]:
    """The old code's manifest format: per path, its mode and sha256 or symlink target."""
    out: dict[str, dict[str, str]] = {}
    for dp, dns, fns in os.walk(root):
        for n in sorted(dns + fns):
            p = os.path.join(dp, n)
            st = os.lstat(p)
            rel = os.fsencode(os.path.relpath(p, root)).decode(errors="backslashreplace")
            ent = {"mode": oct(st.st_mode)}
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    ent["sha256"] = hashlib.sha256(f.read()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                ent["target"] = os.readlink(p)
            out[rel] = ent
    return out


def _version(store: str) -> int:
    c = sqlite3.connect(os.path.join(store, "catalog.db"))
    try:
        return int(c.execute("PRAGMA user_version").fetchone()[0])
    finally:
        c.close()


def test_schema2_store_opens_upgrades_lists_exports_and_checks_clean(
    tmp_path: os.PathLike[str],
) -> None:
    tmp = os.fspath(tmp_path)
    store = os.path.join(tmp, "store")
    shutil.copytree(OLD, store)
    os.chmod(store, 0o700)  # git keeps no directory modes
    for dp, dns, fns in os.walk(store):
        for n in dns:
            os.chmod(os.path.join(dp, n), 0o700)
        for n in fns:
            os.chmod(os.path.join(dp, n), 0o600)
    for sub in ("tmp",):
        os.makedirs(os.path.join(store, sub), mode=0o700, exist_ok=True)
    with open(os.path.join(DATA, "store-schema2.manifest.json")) as f:
        want = json.load(f)
    assert _version(store) == 2

    # read-only, before any upgrade: a clear refusal that names the upgrade, no traceback
    p = run_cli("store", "check", "--store", store)
    assert p.returncode == 3, p.stderr
    assert "catalog schema 2 is older" in p.stderr
    assert "store init --store" in p.stderr
    assert "Traceback" not in p.stderr
    assert _version(store) == 2
    p = run_cli("store", "init", "--store", store)  # what the message says upgrades it
    assert p.returncode == 0, p.stderr
    assert _version(store) == SCHEMA_VERSION
    with open_store(store, writable=False) as s:
        v = verify_store(s, read_data=True)
        assert v.ok, v.errors
        assert v.objects_reachable > 0

    root = os.path.join(tmp, "layer")
    os.mkdir(root)
    with Engine(root, store) as e:
        cps = {c.id: c for c in e.checkpoints()}
        assert sorted(cps) == ["v0", "v1"]
        assert cps["v0"].comment == "first"
        assert cps["v1"].comment == "second"
        assert cps["v1"].walk == "full"  # rows older than schema 3 read as full walks
        for cid in ("v0", "v1"):
            out = os.path.join(tmp, f"out-{cid}")
            os.mkdir(out)
            e.export(cid, out)
            assert _manifest(out) == want[cid], cid
        # the upgraded store keeps working: restore the old checkpoint, capture anew
        e.restore("v1")
        assert _manifest(root) == want["v1"]
        e.create("after the upgrade")
    assert _version(store) == SCHEMA_VERSION
    c = sqlite3.connect(os.path.join(store, "catalog.db"))
    sums = c.execute("SELECT count(*), count(sum) FROM dircache").fetchone()
    c.close()
    assert sums[0] > 0
    assert sums[0] == sums[1]

    p = run_cli("store", "check", "--read-data", "--store", store)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
