"""The recommender on hand-made results whose right answer is known."""
from __future__ import annotations

import pytest

from kvmap.report.configs import ConfigSummary
from kvmap.report.recommend import Constraints, recommend

MIB = 1024 * 1024
SLO = {"tbt_p99_s": 0.150, "ttft_p99_s": 2.0}


def config(name, tok_s, kv_mib, tbt_ms, drop, ttft_s=1.0, baseline=False):
    return ConfigSummary(name=name, kv=name, is_baseline=baseline, num_cells=2,
                         throughput_tok_s=tok_s, peak_kv_bytes=kv_mib * MIB,
                         tbt_p99_s=tbt_ms / 1000, accuracy_drop_pct=drop,
                         slo_measured={"tbt_p99_s": tbt_ms / 1000, "ttft_p99_s": ttft_s})


@pytest.fixture
def configs():
    return [config("bf16", 100.0, 200, 120, 0.0, baseline=True),
            config("int8", 120.0, 100, 110, 0.4),
            config("int4", 150.0, 50, 100, 3.0),          # fastest, but loses accuracy
            config("snapkv", 140.0, 60, 180, 0.2),        # misses the TBT SLO
            config("int2", 160.0, 25, 90, 0.5, ttft_s=2.5)]   # misses the TTFT SLO


def test_throughput_picks_the_fastest_feasible_and_names_the_binding_constraint(configs):
    rec = recommend(configs, Constraints(SLO, max_accuracy_drop_pct=1.0), "throughput")
    assert rec.choice == "int8"
    # int2 (160 tok/s) is the best excluded one: it fails the TTFT P99 limit
    assert rec.binding_constraints == ("ttft_p99_s",)
    assert "int2" in rec.binding and "TTFT" in rec.binding
    assert [r.name for r in rec.runners_up] == ["bf16"]
    assert "-17% throughput" in rec.runners_up[0].costs
    assert rec.lines()[0].startswith("Recommended: int8")


def test_memory_objective_and_kv_budget(configs):
    rec = recommend(configs, Constraints(SLO, 1.0, kv_budget_bytes=150 * MIB), "memory")
    assert rec.choice == "int8"          # int2, int4, snapkv are smaller but excluded
    rec = recommend(configs, Constraints({}, 5.0, kv_budget_bytes=150 * MIB), "memory")
    assert rec.choice == "int2"
    assert rec.binding is None and "No constraint binds" in rec.lines()[1]
    assert [r.name for r in rec.runners_up] == ["int4", "snapkv", "int8"]


def test_latency_objective(configs):
    rec = recommend(configs, Constraints(SLO, 1.0), "latency")
    assert rec.choice == "int8"
    assert set(rec.binding_constraints) == {"ttft_p99_s"}


def test_accuracy_budget_binds(configs):
    rec = recommend(configs, Constraints({}, 1.0), "throughput")
    assert rec.choice == "int2"
    rec = recommend(configs, Constraints({}, 0.3), "throughput")
    assert rec.choice == "snapkv"
    assert rec.binding_constraints == ("accuracy_drop",)   # int2 at 0.5% is the one


def test_infeasible_sla_says_so_and_names_the_closest_miss(configs):
    rec = recommend(configs, Constraints({"tbt_p99_s": 0.080}, 1.0), "throughput")
    assert not rec.feasible and rec.choice is None
    # relative shortfalls: int2 90/80 -> 12.5% (the smallest), int4 fails accuracy 3x over
    assert rec.closest_miss == "int2"
    text = "\n".join(rec.lines())
    assert "No measured configuration meets" in text
    assert "Closest miss: int2" in text and "90 ms (limit 80 ms)" in text
    assert rec.to_dict()["feasible"] is False


def test_a_budget_nothing_fits(configs):
    rec = recommend(configs, Constraints({}, None, kv_budget_bytes=10 * MIB), "memory")
    assert rec.choice is None and rec.closest_miss == "int2"


def test_missing_figures_fail_a_constraint_and_unmeasured_accuracy_is_noted(configs):
    configs[1].slo_measured = {"tbt_p99_s": None, "ttft_p99_s": 1.0}
    rec = recommend(configs, Constraints(SLO, 1.0), "throughput")
    assert rec.choice == "bf16"
    for c in configs:
        c.accuracy_drop_pct = None
    rec = recommend(configs, Constraints({}, 1.0), "throughput")
    assert rec.choice == "int2" and any("accuracy" in n for n in rec.notes)


def test_bad_objective_is_refused(configs):
    with pytest.raises(ValueError, match="objective 'cost'"):
        recommend(configs, Constraints(), "cost")
    with pytest.raises(ValueError, match="max_accuracy_drop_pct"):
        Constraints(max_accuracy_drop_pct=-1.0)
