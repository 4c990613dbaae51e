"""The recommender on hand-made results whose right answer is known."""
from __future__ import annotations

import pytest

from kvmap.report.configs import ConfigSummary
from kvmap.report.constraints import Constraints
from kvmap.report.recommend import recommend

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


# ---- load sweeps: SLA capacity ranks the throughput objective -------------------------

def test_the_recommendation_changes_with_the_sla_and_the_objective(sweep_run):
    from kvmap.report.analysis import analyze
    from kvmap.report.loader import load_run
    run = load_run(sweep_run)
    loose = analyze(run, Constraints(run.slo))                     # TTFT 1 s, TBT 100 ms
    assert loose.recommendation.by_capacity
    assert loose.recommendation.choice == "int4"                   # >= top level (64)
    # TBT <= 50 ms: int4 crosses at 4 + (1 - .9) / (1.4 - .9) * 12 = 6.4; bf16 at
    # 4 + (1 - .9) / (1.6 - .9) * 12 = 5.71; int8 at 4 + (1 - .8) / (1.2 - .8) * 12 = 10
    tight = analyze(run, Constraints({"ttft_p99_s": 1.0, "tbt_p99_s": 0.05}))
    caps = {c.name: c.capacity.value for c in tight.configs}
    assert caps["int8"] == pytest.approx(10.0) and caps["bf16"] == pytest.approx(4 + 12 / 7)
    assert caps["int4"] == pytest.approx(6.4)
    assert tight.recommendation.choice == "int8"
    # the latency objective: least P99 TBT at the top level -> int8 (85 ms)
    assert analyze(run, Constraints(run.slo), "latency").recommendation.choice == "int8"
    # memory: the least peak KV among those within the SLA (snapkv misses it) -> int4
    memory = analyze(run, Constraints(run.slo), "memory").recommendation
    assert memory.choice == "int4" and "snapkv" in memory.binding
    text = "\n".join(loose.recommendation.lines())
    assert "SLA capacity" in text and "≥ top level (64 concurrent)" in text


def test_a_tier_that_was_never_read_is_not_ranked_above_its_base(tmp_path):
    from kvmap.report.analysis import analyze
    from kvmap.report.loader import load_run
    from tests.report.conftest import SWEEP_SLO, sweep_cells, write_run
    run = load_run(write_run(tmp_path / "r", sweep_cells(["bf16", "tiers(host=64MiB)"]),
                             SWEEP_SLO))
    a = analyze(run)
    tiers = next(c for c in a.configs if c.kv == "tiers(host=64MiB)")
    assert tiers.idle == ["tiers"] and tiers.equal_to == "bf16"
    assert tiers.capacity.value == pytest.approx(10.6)        # measures better by noise...
    assert a.recommendation.choice == "bf16"                  # ...but it is bf16 there
    assert any("tier was never read" in n and "equals bf16" in n
               for n in a.recommendation.notes)
    items = {i.item: i for i in a.checklist["tiers(host=64MiB)"]}
    assert items["every part of the configuration acted"].status == "WARN"
    from kvmap.report.table import metric_rows
    headers, rows = metric_rows(a.configs)
    col = headers.index("never acted") - 1
    flags = {r.cells[col] for r in rows if r.config == "tiers(host=64MiB)"}
    assert flags == {"tiers never acted: = bf16 here"}              # every level
    assert {r.cells[col] for r in rows if r.config == "bf16"} == {"-"}
    assert all(p.idle == ("tiers",) for p in tiers.curves["chat"])


def test_a_margin_inside_the_noise_prefers_the_simpler_configuration(configs):
    int8 = next(c for c in configs if c.name == "int8")
    bf16 = next(c for c in configs if c.name == "bf16")
    int8.complexity, bf16.complexity = 1, 0
    int8.throughput_ci, bf16.throughput_ci = (110.0, 130.0), (90.0, 111.0)
    rec = recommend(configs, Constraints(SLO, max_accuracy_drop_pct=1.0), "throughput")
    assert rec.choice == "bf16"
    assert "inside the 95% intervals" in rec.margin and "simpler bf16" in rec.margin
    assert any(line.startswith("Within the noise") for line in rec.lines())
    assert rec.leader == "int8" and rec.binding_constraints == ("ttft_p99_s",)
    assert not any("bf16 is the best" in line for line in rec.lines())
    bf16.throughput_ci = (90.0, 109.0)                        # separable: int8 again
    rec = recommend(configs, Constraints(SLO, max_accuracy_drop_pct=1.0), "throughput")
    assert rec.choice == "int8" and rec.margin is None


def test_the_recommender_says_whether_a_drop_is_distinguishable_from_zero(configs):
    from kvmap.report.samples import Rate
    from kvmap.report.tasks import TaskResult
    int8 = next(c for c in configs if c.name == "int8")
    int8.tasks = {"passkey": TaskResult("passkey", "accuracy", 0.95, drop_pct=0.4,
                                        drop_ci=(-2.0, 3.0),
                                        negative=Rate(0.025, (0.004, 0.13), 40)),
                  "ppl": TaskResult("ppl", "ppl", 10.1, drop_pct=0.3, drop_ci=(0.1, 0.5))}
    rec = recommend(configs, Constraints(SLO, max_accuracy_drop_pct=1.0), "throughput")
    assert rec.choice == "int8"
    assert any("passkey: drop +0.40 points [-2.00, +3.00], not distinguishable from zero"
               in a for a in rec.accuracy)
    assert any("ppl" in a and "% perplexity" in a and ", distinguishable from zero" in a
               for a in rec.accuracy)
    assert "2% of samples right in the baseline are wrong here" in "\n".join(rec.lines())


def test_runners_up_say_when_their_accuracy_is_not_separable(configs):
    from kvmap.report.tasks import TaskResult
    for c, drop, ci in ((configs[0], 0.0, (-0.5, 0.5)), (configs[1], 0.4, (-0.2, 1.0))):
        c.tasks = {"passkey": TaskResult("passkey", "accuracy", 0.9, drop_pct=drop,
                                         drop_ci=ci)}
    rec = recommend(configs, Constraints(SLO, max_accuracy_drop_pct=1.0), "throughput")
    assert rec.choice == "int8"
    assert "not separable: their intervals overlap" in rec.runners_up[0].costs
    configs[0].tasks["passkey"].drop_ci = (-0.5, -0.3)
    rec = recommend(configs, Constraints(SLO, max_accuracy_drop_pct=1.0), "throughput")
    assert "not separable" not in rec.runners_up[0].costs


def test_after_a_swap_within_the_noise_nothing_is_called_the_best():
    bf16 = config("bf16", 100.0, 200, 120, 0.0, baseline=True)
    int8 = config("int8", 104.0, 100, 110, 0.1)
    int8.complexity, int8.throughput_ci, bf16.throughput_ci = 1, (98.0, 110.0), (95.0, 105.0)
    rec = recommend([bf16, int8], Constraints(SLO, 1.0), "throughput")
    assert rec.choice == "bf16" and rec.leader == "int8" and rec.binding is None
    assert "No constraint binds." in rec.lines()
    assert not any("is the best on" in line for line in rec.lines())


def test_a_random_weight_model_is_never_the_recommendation(configs):
    # faster than everything and no accuracy to check: a dummy-weight model's point is for
    # speed and memory only, not a deployment choice beside measured models
    dummy = config("dummy:llama-3-8b: bf16", 500.0, 10, 50, None)
    dummy.accuracy_na = True
    rec = recommend([*configs, dummy], Constraints(SLO, max_accuracy_drop_pct=1.0),
                    "throughput")
    assert rec.choice == "int8"
    assert any("dummy:llama-3-8b: bf16: random weights" in n for n in rec.notes)
    alone = recommend([dummy], Constraints(SLO), "throughput")   # nothing else: it may win
    assert alone.choice == "dummy:llama-3-8b: bf16"



def test_a_reference_layout_is_measured_but_never_recommended(configs):
    # auto+all_global gives the windowed layout's tokens for more memory: the baseline of
    # the hybrid saving; even where it measures fastest it is no deployment choice
    from kvmap.report.noise import reference_part
    assert reference_part("bf16+all_global") == "all_global"
    assert reference_part("int8+all_global") == "all_global"
    assert reference_part("int8") is None and reference_part("not a spec((") is None
    ref = config("bf16+all_global", 500.0, 400, 50, 0.0)
    ref.reference = reference_part(ref.kv)
    rec = recommend([*configs, ref], Constraints(SLO, max_accuracy_drop_pct=1.0),
                    "throughput")
    assert rec.choice == "int8"
    assert "bf16+all_global" not in rec.checks
    assert any(n.startswith("bf16+all_global: the all_global layout is a reference")
               for n in rec.notes)


def test_a_configuration_that_fails_its_own_goodput_check_is_never_recommended(configs):
    # int8 meets the P99 keys but most of its output misses the SLA request by request:
    # its checklist's goodput item fails, so it is not the recommendation
    configs[1].goodput_tok_s = 0.3 * configs[1].throughput_tok_s
    for c in configs[:1]:
        c.goodput_tok_s = 0.95 * c.throughput_tok_s
    rec = recommend(configs, Constraints(SLO, max_accuracy_drop_pct=1.0), "throughput")
    assert rec.choice == "bf16"
    miss = next(k for k in rec.checks["int8"] if k.name == "goodput_miss")
    assert not miss.ok and miss.measured == pytest.approx(0.7)


def test_an_infeasible_deployment_says_which_part_of_the_step_misses(configs):
    # every configuration misses TBT P99 through its tail: decode steps with a prefill
    # chunk beside them (P99 far above P50)
    for c in configs:
        c.slo_measured["tbt_p99_s"] = c.tbt_p99_s = 1.4
        c.tbt_p50_s = 0.09
    rec = recommend(configs, Constraints(SLO), "throughput")
    assert rec.choice is None
    assert "16x its P50 (90 ms)" in rec.why and "prefill chunk" in rec.why
    assert any(line.startswith("Why: its TBT P99 (1400 ms)") for line in rec.lines())
