"""No import cycle through the API: the router depends on ``api/backend.py``'s protocol,
not on the daemon's class (issue 13, point 5).

The graph counts every import of a ``sprite_env`` module anywhere in a file: at the top,
under ``TYPE_CHECKING`` and inside functions. The cycle this removed was one of each (the
router named ``Daemon`` for mypy; the daemon imported the router when it served), which
an ``import`` at run time never shows.
"""

from __future__ import annotations

import ast
import os

import sprite_env

PACKAGE = os.path.dirname(sprite_env.__file__)


def _modules() -> dict[str, str]:
    out = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__")] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the ``sprite_env`` modules it imports (``from a import b`` counts as
    ``a.b`` when that is a module, else ``a``)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        with open(path) as f:
            tree = ast.parse(f.read())
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                for a in node.names:
                    deps.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base)
        graph[module] = {d for d in deps if d in modules and d != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_walk_finds_a_cycle_of_type_only_and_function_level_imports() -> None:
    # The shape of the cycle that was: a TYPE_CHECKING import one way, a lazy one back.
    graph = {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert cycles(graph) == [{"a", "b"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_router_depends_on_the_backend_protocol_not_the_daemon() -> None:
    graph = import_graph()
    assert "sprite_env.daemon.service" not in graph["sprite_env.api.routes"]
    assert "sprite_env.api.backend" in graph["sprite_env.api.routes"]
    assert "sprite_env.api.routes" in graph["sprite_env.daemon.service"]  # it serves it


def test_no_import_cycle_through_the_api_the_daemon_or_their_clients() -> None:
    seam = ("sprite_env.api", "sprite_env.daemon", "sprite_env.client", "sprite_env.mcp_server")
    through = [c for c in cycles(import_graph()) if any(m.startswith(seam) for m in c)]
    assert through == []


def test_the_shapes_import_nothing_of_sprite_env() -> None:
    # The online CLI and MCP load them on their start-up path; any layer may use them.
    assert import_graph()["sprite_env.api.shapes"] == set()
