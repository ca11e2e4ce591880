"""The package's layers import one way, downward (see docs/contributing.md, Layout):

    cli -> controller -> backends -> client (its public API only) -> contract, connection,
    names, api, errors

A test walks every import in operator/dbq (function-level ones included) and fails on a
circle, or on an import that goes up or reaches into another layer's internals.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "operator" / "dbq"

# Layer -> the layers it must never import.
FORBIDDEN = {
    "dbq.errors": ("dbq.",),
    "dbq.api": ("dbq.client", "dbq.backends", "dbq.controller", "dbq.cli", "dbq.connection", "dbq.contract"),
    "dbq.names": ("dbq.client", "dbq.backends", "dbq.controller", "dbq.cli", "dbq.connection"),
    "dbq.contract": ("dbq.client", "dbq.backends", "dbq.controller", "dbq.cli", "dbq.connection"),
    "dbq.connection": ("dbq.client", "dbq.backends", "dbq.controller", "dbq.cli", "dbq.contract"),
    "dbq.settings": ("dbq.client", "dbq.backends", "dbq.controller", "dbq.cli"),
    "dbq.resource": ("dbq.client", "dbq.backends", "dbq.controller", "dbq.cli"),
    "dbq.kube": ("dbq.client", "dbq.backends", "dbq.controller", "dbq.cli"),
    "dbq.client": ("dbq.backends", "dbq.controller", "dbq.cli", "dbq.devstack", "dbq.spark"),
    "dbq.backends": ("dbq.controller", "dbq.cli", "dbq.devstack", "dbq.spark"),
    "dbq.controller": ("dbq.cli", "dbq.devstack", "dbq.spark"),
    "dbq.spark": ("dbq.backends", "dbq.controller", "dbq.cli", "dbq.devstack"),
}


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(("dbq", *path.relative_to(PACKAGE).with_suffix("").parts))
        found[name.removesuffix(".__init__")] = path
    return found


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the dbq modules it imports (an imported name that is a module counts as one)."""
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                wanted = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                wanted = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for target in wanted:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    targets.add(target)
        graph[name] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def within(module: str, prefix: str) -> bool:
    """Whether `module` is `prefix` or inside it ("dbq." is everything of dbq)."""
    return (
        module.startswith(prefix)
        if prefix.endswith(".")
        else module == prefix or module.startswith(prefix + ".")
    )


def layer_of(module: str) -> str | None:
    return next((layer for layer in FORBIDDEN if within(module, layer)), None)


def violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in graph.items():
        layer = layer_of(module)
        for target in targets:
            if layer is None or layer_of(target) == layer:
                continue
            if any(within(target, f) for f in FORBIDDEN[layer]):
                found.append(f"{module} imports {target}")
            # Above the client, only its public API: `dbq.client`, never `dbq.client.ring`.
            if target.startswith("dbq.client.") and layer in ("dbq.backends", "dbq.controller", "dbq.cli"):
                found.append(f"{module} reaches into the client's internals: {target}")
    return sorted(found)


def test_no_import_circle_in_the_package():
    assert circles(imports(modules())) == []


def test_layers_import_one_way_and_only_public_apis():
    assert violations(imports(modules())) == []


def test_the_checks_catch_a_circle_and_an_upward_import():
    graph = {"dbq.client.ring": {"dbq.backends.odbc_ring"}, "dbq.backends.odbc_ring": {"dbq.client.ring"}}
    assert circles(graph) == [["dbq.backends.odbc_ring", "dbq.client.ring"]]
    assert violations(graph) == [
        "dbq.backends.odbc_ring reaches into the client's internals: dbq.client.ring",
        "dbq.client.ring imports dbq.backends.odbc_ring",
    ]
