"""Big files changed in place (databases) store only the pages that changed."""

from __future__ import annotations

import os
import random
import sqlite3
from typing import TYPE_CHECKING

from sprite_env.store import check
from tests.helpers import trees

if TYPE_CHECKING:
    from sprite_env.checkpoints import Engine


def test_scattered_page_writes_store_about_the_pages(engine: Engine, root: str) -> None:
    path = os.path.join(root, "disk.img")
    with open(path, "wb") as f:
        f.write(os.urandom(16 << 20))
    v0 = engine.create()
    before = trees.snapshot_tree(root)
    rng = random.Random(5)
    with open(path, "r+b") as f:  # 20 pages rewritten in place: same inode
        for _ in range(20):
            f.seek(rng.randrange(0, (16 << 20) // 4096) * 4096)
            f.write(os.urandom(4096))
    v1 = engine.create()
    after = trees.snapshot_tree(root)
    # content-defined chunks of ~64 KiB would store ~20 x 80 KiB; pages store 20 x 4 KiB
    assert v1.bytes_added < 200_000, v1.bytes_added
    assert v0.bytes_added > 16 << 20
    ino = os.stat(path).st_ino
    rep = engine.restore(v0.id)
    trees.assert_trees_equal(before, root)
    # patched in place: only the changed pages were written, the inode is the same
    assert rep.stats.bytes_written <= 20 * 4096
    assert os.stat(path).st_ino == ino
    engine.restore(v1.id)
    trees.assert_trees_equal(after, root)
    with open(path, "ab") as f:  # grown in place: the tail is chunked as usual
        f.write(os.urandom(300_000))
    v2 = engine.create()
    assert 300_000 < v2.bytes_added < 500_000
    grown = trees.snapshot_tree(root)
    engine.restore(v0.id)
    trees.assert_trees_equal(before, root)
    engine.restore(v2.id)
    trees.assert_trees_equal(grown, root)
    assert check(engine.store, read_data=True).ok


def test_sqlite_update_round_trips_and_stays_small(engine: Engine, root: str) -> None:
    db_path = os.path.join(root, "app.sqlite3")
    db = sqlite3.connect(db_path)
    db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT, score INTEGER)")
    rng = random.Random(1)
    db.executemany(
        "INSERT INTO users VALUES (?, ?, ?)",
        ((i, f"user{rng.randrange(10**8):08d}", rng.randrange(1000)) for i in range(300_000)),
    )
    db.commit()
    db.close()
    size = os.path.getsize(db_path)
    v0 = engine.create()
    db = sqlite3.connect(db_path)
    db.executemany(
        "UPDATE users SET score = ? WHERE id = ?",
        ((rng.randrange(1000), rng.randrange(300_000)) for _ in range(300)),
    )
    db.commit()
    db.close()
    v1 = engine.create()
    assert v1.bytes_added < size * 0.25, (v1.bytes_added, size)
    for cid in (v0.id, v1.id):
        engine.restore(cid)
        db = sqlite3.connect(db_path)
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("SELECT count(*) FROM users").fetchone()[0] == 300_000
        db.close()
