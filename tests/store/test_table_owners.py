"""Every catalog table has one owning module, and SQL that names it lives only there.

The schema itself is described in one place, ``store/catalog.py``, whose migrations create
every table; outside its ``_MIGRATIONS`` a table appears in SQL only in its owner.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import sprite_env
from sprite_env.store import catalog

PACKAGE = Path(sprite_env.__file__).parent

#: Table -> the modules (paths relative to the package) that may name it in SQL.
OWNERS: dict[str, tuple[str, ...]] = {
    # the store's own tables: only store/ reads packs or runs their SQL (DESIGN.md);
    # the checkpoint layer sets its meta keys through catalog.set_meta
    "objects": ("store/",),  # a view (schema 6) over the two that follow
    "objects_main": ("store/",),
    "objects_new": ("store/",),
    "packs": ("store/",),
    "meta": ("store/",),
    "checkpoints": ("checkpoints/registry.py",),
    "dircache": ("snapshot/dircache.py",),
    "pagesums": ("snapshot/pagesums.py",),
}

_SQL = re.compile(r"\b(?:FROM|INTO|UPDATE|JOIN|TABLE|EXISTS)\s+(\w+)", re.IGNORECASE)
_VERB = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|ALTER|DROP|REPLACE)\b", re.I)


def _tables_named(source: str) -> set[str]:
    """Tables named by SQL in the string literals of ``source``."""
    out = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.STRING:
            continue
        text = tok.string.lstrip("rbuRBUfF").strip("\"'")
        if _VERB.search(text) or re.search(r"\b(FROM|INTO|SET)\b", text):
            out.update(m.group(1).lower() for m in _SQL.finditer(text))
    return out & set(OWNERS)


def _created_tables() -> set[str]:
    sql = " ".join(catalog._MIGRATIONS)
    return {m.lower() for m in re.findall(r"(?:CREATE TABLE|RENAME TO) (\w+)", sql)}


def test_every_table_has_an_owner() -> None:
    assert _created_tables() == set(OWNERS)


def test_sql_names_a_table_only_in_its_owner() -> None:
    strays = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        source = path.read_text()
        if rel == "store/catalog.py":  # its migrations create every table
            start = source.index("_MIGRATIONS: list[str] = [")
            source = source[:start] + source[source.index("\n]\n", start) + 3 :]
        for table in _tables_named(source):
            if not any(rel == o or (o.endswith("/") and rel.startswith(o)) for o in OWNERS[table]):
                strays.append(f"{rel} names table {table}")
    assert strays == []


def test_the_grep_sees_sql() -> None:
    """The check would catch a stray statement (it is not vacuous)."""
    assert _tables_named('x = "DELETE FROM dircache WHERE path=?"\n') == {"dircache"}
    assert _tables_named('q = f"SELECT {c} FROM checkpoints ORDER BY id"\n') == {"checkpoints"}
    assert _tables_named('s = "the packs from the store"\n') == set()
