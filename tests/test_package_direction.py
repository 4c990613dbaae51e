"""The packages of ``src/kvmap`` import in one direction (``docs/architecture.md``).

``MAY_IMPORT`` is the architecture: for each package (a top-level module counts as its
own package; ``kvmap`` is the root ``__init__``: ``LLM``, ``SamplingParams``), the
packages it may import. The test holds three things: that table is acyclic (one
direction, not merely no module cycle), every package of the tree is in it (a new one
must be placed), and every import of the source -- lazy ones included, read with the
cycle test's ``ast`` walk -- follows it. Notably: the HTTP transport (``loadgen``) is
below the bench; the report reads runs (``runs``: records and the run store) and never
imports the bench's machinery; the server imports nothing of the bench or of runs.
"""
from __future__ import annotations

from tests.test_import_cycles import cycles, import_graph

FLOOR = {"registry", "cli_errors", "jsonable", "hosts", "hardware", "config", "metrics",
         "request", "workloads", "cli_options", "native_build"}
ENGINE = FLOOR | {"kv", "model", "engine", "kvmap"}       # the engine and what it stands on

MAY_IMPORT: dict[str, set[str]] = {
    "registry": set(), "cli_errors": set(), "native_build": set(), "jsonable": set(), "hosts": set(),
    "hardware": set(), "metrics": set(), "request": set(), "workloads": {"registry"},
    "config": {"hardware"},
    "cli_options": {"config", "hardware", "cli_errors"},   # EngineArgs as --options
    "kv": FLOOR,
    "model": FLOOR | {"kv"},
    "engine": FLOOR | {"kv", "model"},
    "kvmap": FLOOR | {"kv", "model", "engine"},
    "perf": FLOOR | {"kv", "model"},       # what a step costs: beside the engine
    "evals": ENGINE,
    "runs": ENGINE | {"perf"},
    "loadgen": ENGINE | {"runs", "perf"},
    "bench": ENGINE | {"evals", "runs", "loadgen", "perf"},
    "report": ENGINE | {"evals", "runs", "perf"},
    "server": ENGINE | {"evals"},
    "plan": ENGINE | {"perf"},
    "tune": ENGINE | {"evals", "runs", "loadgen", "bench", "report", "perf"},
    "cli": ENGINE | {"evals", "runs", "loadgen", "bench", "report", "server", "plan", "tune",
                     "perf"},
}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """(importer package, imported package) -> the module imports that make the edge."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module, targets in graph.items():
        for target in targets:
            a, b = package_of(module), package_of(target)
            if a != b:
                edges.setdefault((a, b), []).append(f"{module} -> {target}")
    return edges


def test_the_architecture_is_one_direction():
    allowed = {p: set(deps) for p, deps in MAY_IMPORT.items()}
    assert not cycles(allowed), cycles(allowed)
    assert all(deps <= set(MAY_IMPORT) for deps in allowed.values())


def test_every_package_is_placed():
    packages = {package_of(m) for m in import_graph()}
    assert packages == set(MAY_IMPORT), (packages ^ set(MAY_IMPORT))


def test_every_import_follows_the_direction():
    bad = {edge: examples for edge, examples in package_edges(import_graph()).items()
           if edge[1] not in MAY_IMPORT[edge[0]]}
    assert not bad, "imports against the direction:\n" + "\n".join(
        f"  {a} -> {b}: {', '.join(sorted(ex)[:3])}" for (a, b), ex in sorted(bad.items()))


def test_a_lazy_import_against_the_direction_is_seen():
    graph = {"kvmap.report.x": {"kvmap.bench.runner"}, "kvmap.bench.runner": set()}
    (edge,) = package_edges(graph)
    assert edge == ("report", "bench") and "bench" not in MAY_IMPORT["report"]
