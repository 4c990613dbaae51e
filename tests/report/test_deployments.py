"""Per-deployment recommendations on a hand-made run of two workloads with known answers:
``chat`` (swept, the scenario's SLA) and ``long`` (one level, its own SLA)."""
from __future__ import annotations

from kvmap.metrics import aggregate
from kvmap.report.analysis import analyze
from kvmap.report.deployments import deployment_cells
from kvmap.report.loader import load_run
from kvmap.report.constraints import Constraints
from tests.report.conftest import (SWEEP_SLO, _record, level_rows, store_run,
                                   sweep_cells)

LONG_SLO = {"ttft_p99_s": 10.0, "tbt_p99_s": 0.5}
# kv -> (TTFT s, TBT s, host bytes read, cell seconds): bf16 misses LONG_SLO's TTFT, the
# tier (read here, unlike in chat) meets it, snapkv has the most output tokens/s but
# misses TTFT.
LONG = {"bf16": (12.0, 0.2, None, 20.0), "tiers(host=64MiB)": (8.0, 0.2, 1 << 20, 16.0),
        "snapkv(budget=0.25)": (15.0, 0.1, None, 8.0)}


def long_cells():
    out = []
    for kv, (ttft_s, gap_s, read, duration_s) in LONG.items():
        cell_id = f"m-{kv}-long"
        rows = level_rows(cell_id, kv, ttft_s, gap_s, n=4)
        metrics = aggregate(rows, duration_s=duration_s, slo=LONG_SLO)
        rate = metrics["output_tokens_per_s"]
        metrics.update(peak_kv_resident_bytes=(16 if "snapkv" in kv else 64) << 20,
                       output_throughput_windows_tok_s=[rate * (1 + 0.002 * (k % 2))
                                                        for k in range(10)],
                       tiers={"host": {"bytes_read": read, "num_hits": 3}} if read else {},
                       num_evicted_tokens=1000 if "snapkv" in kv else None)
        out.append((_record(cell_id, kv, "workload", metrics, workload="long"), rows))
    return out


def two_deployments(tmp_path, long_slo=LONG_SLO):
    cells = sweep_cells(["bf16", "int8", "tiers(host=64MiB)"]) + long_cells()
    workloads = [{"name": "chat", "slo": None}, {"name": "long", "slo": long_slo}]
    return store_run(tmp_path / "run", cells, {"name": "two", "slo": SWEEP_SLO,
                                               "workloads": workloads,
                                               "engine": {"kv_memory": "128MiB"}})


def test_each_deployment_has_its_own_sla_and_answer(tmp_path):
    a = analyze(load_run(two_deployments(tmp_path)))
    chat, long = a.deployments
    assert (chat.workload, chat.slo_source, chat.slo) == ("chat", "scenario", SWEEP_SLO)
    assert (long.workload, long.slo_source, long.slo) == ("long", "workload", LONG_SLO)
    # chat: int8's SLA capacity (40) beats bf16's (10); the tier never acted there
    assert chat.recommendation.choice == "int8"
    assert {c.name for c in chat.configs} == {"bf16", "int8", "tiers(host=64MiB)"}
    tier_in_chat = next(c for c in chat.configs if c.kv.startswith("tiers"))
    assert tier_in_chat.equal_to == "bf16"
    # long: only the tier meets TTFT <= 10 s, and it acted there (read 1 MiB)
    assert long.recommendation.choice == "tiers(host=64MiB)"
    assert {c.name for c in long.configs} == set(LONG)
    assert next(c for c in long.configs if c.kv.startswith("tiers")).equal_to is None
    # the run's headline is its primary deployment's (chat: 8 requests a cell against 4)
    assert a.recommendation.choice == "int8"
    assert a.slo_of("long") == LONG_SLO and a.slo_of("chat") == SWEEP_SLO


def test_the_answer_moves_with_the_sla(tmp_path):
    run = load_run(two_deployments(tmp_path))
    loose = {"ttft_p99_s": 20.0, "tbt_p99_s": 0.5}
    a = analyze(run, Constraints(loose, max_accuracy_drop_pct=1.0), per_workload_slo=False)
    long = next(d for d in a.deployments if d.workload == "long")
    assert long.slo_source == "--slo" and long.slo == loose
    # every long configuration meets it: the most output tokens/s wins
    assert long.recommendation.choice == "snapkv(budget=0.25)"
    tight = analyze(run, Constraints({"ttft_p99_s": 5.0}, max_accuracy_drop_pct=1.0),
                    per_workload_slo=False)
    long = next(d for d in tight.deployments if d.workload == "long")
    assert long.recommendation.choice is None
    assert long.recommendation.closest_miss == "tiers(host=64MiB)"


def test_a_workload_slo_names_a_bad_metric_before_anything_runs():
    import pytest
    from kvmap.bench.scenario import ScenarioError
    from kvmap.bench.scenario_parse import parse_scenario
    data = {"name": "x", "workloads": [{"name": "chat", "slo": "ttfx_p99=1s",
                                        "num_requests": 2}]}
    with pytest.raises(ScenarioError, match=r"workloads\[0\].*slo.*ttfx"):
        parse_scenario(data)


def test_deployment_cells_keep_only_the_configurations_that_ran_it(tmp_path):
    cells = load_run(two_deployments(tmp_path)).cells
    assert {c.kv for c in deployment_cells(cells, "long")} == set(LONG)
    assert {c.kv for c in deployment_cells(cells, "chat")} == {"bf16", "int8",
                                                                  "tiers(host=64MiB)"}


def test_one_workload_has_no_separate_deployments(sweep_run):
    assert analyze(load_run(sweep_run)).deployments == []


def test_the_headline_checklist_is_read_on_the_primary_deployment(tmp_path):
    a = analyze(load_run(two_deployments(tmp_path)))
    assert a.constraints.slo == SWEEP_SLO                 # chat's (the scenario's) SLA
    # the checklist lists chat's configurations only: S2's snapkv never ran chat
    assert set(a.checklist) == {"bf16", "int8", "tiers(host=64MiB)"}
    assert a.recommendation.choice in a.checklist


def test_one_workload_with_its_own_sla_is_held_to_it(tmp_path):
    cells = long_cells()
    run = store_run(tmp_path / "one", cells, {"name": "one", "slo": {},
                                              "workloads": [{"name": "long", "slo": LONG_SLO}],
                                              "engine": {"kv_memory": "128MiB"}})
    a = analyze(load_run(run))
    assert a.deployments == [] and a.constraints.slo == LONG_SLO
    assert a.recommendation.choice == "tiers(host=64MiB)"


def test_a_block_size_sweep_is_one_deployment():
    from kvmap.report.deployments import workload_names
    cells = [_record(f"c-{w}", "bf16", "workload", {}, workload=w)
             for w in ("frag@bs8", "frag@bs16", "long", "frag@bs32")]
    assert workload_names(cells) == ["frag@bs8", "long"]
