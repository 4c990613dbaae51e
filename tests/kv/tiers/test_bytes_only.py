"""DESIGN.md: "tiers know bytes, never the pool". Nothing under ``kv/tiers/`` imports
-- directly or through another module, lazily or not -- the pool, the paged cache, the
offloading machinery (``kv/offload/``, where the pool and the tiers meet) or anything
above ``kv``. The graph is the one the cycle test reads from the source."""
from __future__ import annotations

from tests.test_import_cycles import import_graph

TIERS = "kvmap.kv.tiers"
FORBIDDEN = ("kvmap.kv.pool", "kvmap.kv.cache", "kvmap.kv.layer_pool", "kvmap.kv.offload",
             "kvmap.kv.compaction", "kvmap.engine", "kvmap.model", "kvmap.request")


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def forbidden(module: str) -> bool:
    return any(module == f or module.startswith(f + ".") for f in FORBIDDEN)


def test_tiers_import_no_pool_cache_or_offload():
    graph = import_graph()
    tiers = [m for m in graph if m == TIERS or m.startswith(TIERS + ".")]
    assert len(tiers) >= 10 and f"{TIERS}.serde" in tiers
    bad = {m: sorted(filter(forbidden, reachable(graph, m))) for m in tiers}
    assert not {m: b for m, b in bad.items() if b}, bad


def test_the_check_sees_a_path_through_another_module():
    graph = {"kvmap.kv.tiers.a": {"kvmap.kv.tiers.b"}, "kvmap.kv.tiers.b": {"kvmap.kv.pool"},
             "kvmap.kv.pool": set()}
    assert list(filter(forbidden, reachable(graph, "kvmap.kv.tiers.a"))) == ["kvmap.kv.pool"]
