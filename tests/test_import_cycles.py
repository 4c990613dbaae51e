"""No import cycles among the modules of ``src/kvmap``, lazy imports included.

The graph is read from the source (``ast``), not from ``sys.modules``: every ``import`` and
``from ... import`` anywhere in a module -- at the top, inside a function, under
``if TYPE_CHECKING:`` -- is an edge. ``from pkg import name`` is an edge to the submodule
``pkg.name`` when there is one, else to ``pkg`` (its ``__init__``); ``import a.b.c`` is an
edge to ``a.b.c``. A package's ``__init__`` may import its own members (that is how a
family fills its registry); a member that imports a *name* from its package's
``__init__`` closes a cycle and fails here. There is no list of allowed cycles.
"""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT_PACKAGE = "kvmap"


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module under ``src/kvmap``."""
    out = {}
    for path in sorted((SRC / ROOT_PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that module ``name`` imports, anywhere in its body."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    edges = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:   # `import kvmap.x.y` where y is a name
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
    return edges


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    modules = set(files)
    return {name: imports_of(name, path, modules) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

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
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def a_cycle_in(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One closed path through ``component``, for the failure message."""
    members, start = set(component), component[0]
    path, seen = [start], {start}
    while True:
        nxt = next(w for w in sorted(graph[path[-1]]) if w in members)
        if nxt in seen:
            return path[path.index(nxt):] + [nxt]
        path.append(nxt)
        seen.add(nxt)


def test_the_graph_sees_lazy_and_relative_imports(tmp_path):
    pkg = tmp_path / "kvmap" / "sub"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from kvmap.sub import a\nVALUE = 1\n")
    (pkg / "a.py").write_text("def f():\n    from kvmap.sub import VALUE\n")
    (pkg / "b.py").write_text("from . import a\nimport kvmap.sub.a.f\n")
    modules = {"kvmap.sub", "kvmap.sub.a", "kvmap.sub.b"}
    assert imports_of("kvmap.sub", pkg / "__init__.py", modules) == {"kvmap.sub.a"}
    assert imports_of("kvmap.sub.a", pkg / "a.py", modules) == {"kvmap.sub"}    # lazy
    assert imports_of("kvmap.sub.b", pkg / "b.py", modules) == {"kvmap.sub.a"}
    graph = {m: imports_of(m, pkg / (m.split(".")[-1] + ".py") if m != "kvmap.sub"
                           else pkg / "__init__.py", modules) for m in modules}
    assert cycles(graph) == [["kvmap.sub", "kvmap.sub.a"]]


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 100 and "kvmap.kv.pool" in graph
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(
        "  " + " -> ".join(a_cycle_in(c, graph)) for c in found)
