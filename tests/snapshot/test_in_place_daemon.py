"""A database changed in place through the real daemon: found by its page digests, stored
as its pages, restored byte for byte, and the store checks clean afterwards."""

from __future__ import annotations

import os
import random
import sqlite3
import time
from typing import Any

import pytest

from sprite_env.snapshot import pagesums
from sprite_env.snapshot.dircache import RACY_NS
from sprite_env.store import check, open_store
from tests.helpers.daemon import write_file

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not pagesums.NATIVE, reason="the C extension is not built"),
]
PAGE = 4096


def _content(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _row_pieces(state: str) -> bytes | None:
    """The chunk list id the daemon's saved digests of the database describe (read from
    its catalog beside it, read-only: WAL lets a reader in while the daemon runs)."""
    db = sqlite3.connect(f"file:{os.path.join(state, 'store', 'catalog.db')}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT pieces FROM pagesums WHERE path=?", (b"data/app.db",)).fetchone()
    finally:
        db.close()
    return None if row is None else bytes(row[0])


def test_a_database_changed_in_place_through_the_daemon(daemon_factory: Any) -> None:
    d = daemon_factory("--no-view")
    rng = random.Random(11)
    path = os.path.join(d.root, "data", "app.db")
    os.makedirs(os.path.dirname(path))
    write_file(path, rng.randbytes(8 << 20))
    v0_bytes = _content(path)
    d.create("v0")
    saved = [_row_pieces(d.state)]
    for step in range(3):  # each step from the digests the one before saved
        time.sleep(RACY_NS / 1e9 * 1.5)
        with open(path, "r+b") as f:
            for p in rng.sample(range((8 << 20) // PAGE), 25):
                f.seek(p * PAGE)
                f.write(rng.randbytes(PAGE))
        done = d.create(f"step {step}")
        status, info = d.json("GET", f"/v1/checkpoints/{done['id']}")
        assert status == 200
        assert info["bytes_added"] < 25 * PAGE + 16_384, info  # the pages, the chunk list
        saved.append(_row_pieces(d.state))
    assert None not in saved
    assert len(set(saved)) == len(saved)  # new digests with every version
    last = _content(path)
    status, evs = d.stream("POST", "/v1/checkpoints/v0/restore")
    assert status in (200, 202), evs
    assert evs[-1]["type"] == "complete", evs
    assert _content(path) == v0_bytes
    assert d.stop() == 0
    store = open_store(os.path.join(d.state, "store"))
    try:
        ps = pagesums.Lookup(store.catalog)(b"data/app.db")
        assert ps is not None
        # a digest per page, and one more wherever a chunk boundary cuts a page in two
        assert len(ps.sums) % pagesums.SUM_LEN == 0
        assert len(ps.sums) >= pagesums.SUM_LEN * (8 << 20) // PAGE
        assert check(store, read_data=True).ok
    finally:
        store.close()
    assert last != v0_bytes
