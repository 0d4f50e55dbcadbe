"""No import cycle anywhere in lcx/ (shared/DESIGN.md: "no two modules import each other").

The graph is built from the source with ``ast``, every import statement at any depth of a file (an
import inside a function or under ``if TYPE_CHECKING`` is an edge too: moving an import into a
function hides a cycle from Python's import order, not from a reader). ``lint-imports`` checks the
same rule, and the layers, in CI (pyproject.toml, ``[tool.importlinter]``); this test needs no
tool beyond pytest and names each cycle with the imports that close it.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def modules(package_dir: pathlib.Path) -> dict[str, pathlib.Path]:
    """``{dotted module name: file}`` for every ``.py`` file under ``package_dir`` (a package's
    ``__init__.py`` is the package's own name)."""
    out = {}
    for f in sorted(package_dir.rglob("*.py")):
        parts = list(f.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def import_graph(package_dir: pathlib.Path) -> dict[str, dict[str, int]]:
    """``{module: {imported module: line of the first such import}}`` within the package.

    ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``; relative
    imports are resolved against the importing module. An import of the module's own package or
    one of its ancestors (``from lcx.cost import x`` inside ``lcx.cost.ledger``) is not an edge:
    every submodule's import runs its packages' ``__init__`` first, whatever it names, so such an
    edge would put each package face in a loop with every module it re-exports.
    """
    mods = modules(package_dir)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {m: {} for m in mods}
    for m, f in mods.items():
        is_package = f.name == "__init__.py"
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = m.split(".") if is_package else m.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [f"{mod}.{a.name}" for a in node.names] + [mod]
            else:
                continue
            for t in targets:
                r = resolve(t)
                if r is not None and r != m and not m.startswith(r + "."):
                    graph[m].setdefault(r, node.lineno)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def describe(graph: dict[str, dict[str, int]], comp: list[str]) -> str:
    """One cycle in words: its modules, and each import between two of them with its line."""
    inside = set(comp)
    edges = [f"{a} -> {b} (line {graph[a][b]})" for a in comp for b in sorted(graph[a]) if b in inside]
    return " <-> ".join(comp) + ": " + "; ".join(edges)


def test_lcx_has_no_import_cycle():
    graph = import_graph(ROOT / "lcx")
    assert len(graph) > 50 and sum(map(len, graph.values())) > 100  # the walk saw the package
    found = [describe(graph, c) for c in cycles(graph)]
    assert not found, "import cycles in lcx/ (break each by moving what both sides share):\n" + "\n".join(found)


def test_a_cycle_through_a_function_local_import_is_found(tmp_path):
    """The check can fail: a planted cycle, one side hidden inside a function, is named."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.a import f\n")
    (pkg / "sub" / "a.py").write_text("from . import b\n\ndef f():\n    return b\n")
    (pkg / "sub" / "b.py").write_text("def g():\n    from pkg.sub.a import f\n    return f\n")
    (pkg / "c.py").write_text("from pkg.sub import a\n")
    graph = import_graph(pkg)
    assert graph["pkg.sub.a"] == {"pkg.sub.b": 1} and graph["pkg.sub.b"] == {"pkg.sub.a": 2}
    assert graph["pkg.c"] == {"pkg.sub.a": 1, "pkg.sub": 1} and graph["pkg.sub"] == {"pkg.sub.a": 1}
    assert cycles(graph) == [["pkg.sub.a", "pkg.sub.b"]]
    assert describe(graph, ["pkg.sub.a", "pkg.sub.b"]) == (
        "pkg.sub.a <-> pkg.sub.b: pkg.sub.a -> pkg.sub.b (line 1); pkg.sub.b -> pkg.sub.a (line 2)"
    )
