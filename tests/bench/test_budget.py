"""The time budget: durations parsed, the scenario sized to fit (paired samples, stated
minimums, the pool still binding), refusal below the minimum, a cell that would pass
its timeout left out with the reason; the CLI's errors and its dry run."""
from __future__ import annotations

import textwrap

import pytest
import typer
from typer.testing import CliRunner

from kvmap.bench.budget import (BudgetError, MIN_REQUESTS, OVERRUN_WARNING, check_only,
                                knobs, parse_duration, size_to_budget)
from kvmap.bench.command import register
from kvmap.report.command import bench_tradeoff_map
from kvmap.bench.estimate import Estimator, estimate_run
from kvmap.bench.scenario import load_scenario

RATES = {"matmul_flops": {"fp32": {"prefill": 1e11}}, "read_bandwidth_bytes_per_s": 1e10}

SCENARIO = """
    models: ["dummy:tiny"]
    engine: {kv_memory: 1MiB, block_size: 4, max_num_batched_tokens: 64, max_num_seqs: 64}
    kv: [fp32, int8]
    cell_timeout_s: 600
    workloads:
      - {name: tp, kind: synthetic, num_requests: 200, prompt_len: 32, output_len: 8,
         arrival: closed:4}
      - {name: big, kind: synthetic, num_requests: 400, prompt_len: 16, output_len: 4,
         arrival: closed:64, kv_memory: 64 tokens}
    """


@pytest.fixture
def scenario(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(SCENARIO))
    return load_scenario(path)


@pytest.mark.parametrize("text, seconds", [("40m", 2400), ("3m", 180), ("90s", 90),
                                           ("1h30m", 5400), ("2.5m", 150), ("1 h", 3600)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["40", "forty minutes", "", "3x", "0m", "-3m", "m"])
def test_bad_durations_name_the_value(text):
    with pytest.raises(ValueError, match=f"--budget {text!r}"):
        parse_duration(text)


def _sizing(scenario):
    est = Estimator(RATES)
    cells = scenario.cells() + scenario.searches()
    return (lambda s: estimate_run(s, est)), (lambda w: est.pool_requests(cells, w))


def test_sized_to_fit_keeping_the_minimums(scenario):
    estimate, pools = _sizing(scenario)
    written = estimate(scenario).seconds
    minimum = {k.name: k.minimum for k in knobs(scenario, pools)}
    # big: closed:64 keeps 64 in flight; tp: the pool (64 bf16 tokens ... 1MiB) or 8
    assert minimum["big#1"] == 64
    assert all(m >= MIN_REQUESTS for m in minimum.values())
    budget = (written + estimate(_at_minimum(scenario, pools)).seconds) / 2
    plan = size_to_budget(scenario, budget, estimate, pools)
    assert plan.estimate_s <= budget < written
    assert plan.cuts and all(value >= knob.minimum for knob, value in plan.cuts)
    sized = {w.name: w.options["num_requests"] for w in plan.scenario.workloads}
    assert sized["big"] >= 64 and sized["tp"] < 200
    assert plan.to_dict()["cuts"][0]["written"] > plan.to_dict()["cuts"][0]["value"]
    # as written, nothing is cut
    assert size_to_budget(scenario, 2 * written, estimate, pools).cuts == ()


def _at_minimum(scenario, pools):
    from kvmap.bench.budget import apply
    return apply(scenario, {k: k.minimum for k in knobs(scenario, pools)})


def test_a_budget_below_the_minimum_is_refused_naming_it(scenario):
    estimate, pools = _sizing(scenario)
    with pytest.raises(BudgetError) as e:
        size_to_budget(scenario, 5.0, estimate, pools)
    text = str(e.value)
    assert "--budget 5s cannot hold the minimum" in text and "the minimum is estimated" in text
    assert "big" in text and "or more" in text


def test_overrun_is_said_before_the_run(scenario):
    estimate, _ = _sizing(scenario)
    est = estimate(scenario)
    plan = check_only(scenario, est.seconds / (OVERRUN_WARNING + 0.1), est)
    assert any("overrun its budget by" in line for line in plan.lines())
    assert not any("overrun" in line for line in
                   check_only(scenario, est.seconds * 1.1, est).lines())


def test_samples_are_paired_and_never_below_the_minimum(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent("""
        models: [smollm2]
        engine: {kv_memory: 4096 tokens}
        kv: [auto, int8, int4]
        tasks:
          - {name: passkey, params: {context_tokens: [512], depths: [0.5], num_samples: 40}}
          - {name: ppl, params: {context_tokens: 256, continuation_tokens: 16, num_samples: 64}}
        """))
    scenario = load_scenario(path)
    estimate, pools = _sizing(scenario)
    full, least = estimate(scenario).seconds, estimate(_at_minimum(scenario, pools)).seconds
    plan = size_to_budget(scenario, (full + least) / 2, estimate, pools)
    # one value per task for every configuration (the task's params): paired
    values = {t.name: t.params["num_samples"] for t in plan.scenario.tasks}
    assert 1 <= values["passkey"] < 40 and 4 <= values["ppl"] < 64
    cells = plan.scenario.cells()
    assert len({c.task.params["num_samples"] for c in cells if c.task.name == "ppl"}) == 1


def test_a_cell_over_its_timeout_is_left_out_with_the_reason(scenario):
    from dataclasses import replace
    estimate, pools = _sizing(scenario)
    tight = replace(scenario, cell_timeout_s=0.5)
    plan = size_to_budget(tight, 1e9, estimate, pools)
    assert plan.left_out and "over its cell_timeout_s 0.5 s" in plan.left_out[0][1]


@pytest.mark.parametrize("args, message", [
    (["--budget", "forty"], "--budget 'forty' is not a duration"),
    (["--budget", "1s"], "cannot hold the minimum"),
])
def test_cli_refuses_before_any_cell(tmp_path, args, message):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(SCENARIO))
    app = typer.Typer()
    register(app, tradeoff_map=bench_tradeoff_map)
    app.command("noop")(lambda: None)
    result = CliRunner().invoke(app, ["bench", str(path), "--out", str(tmp_path / "run"),
                                      *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "run").exists()


def test_cli_dry_run_prints_the_estimate_only(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(SCENARIO))
    app = typer.Typer()
    register(app, tradeoff_map=bench_tradeoff_map)
    app.command("noop")(lambda: None)
    result = CliRunner().invoke(app, ["bench", str(path), "--out", str(tmp_path / "run"),
                                      "--dry-run", "--budget", "2h"])
    assert result.exit_code == 0, result.output
    assert "total" in result.output and "budget 2h" not in result.output
    assert "budget 120m00s" in result.output
    assert not (tmp_path / "run").exists()


def test_a_resumed_run_keeps_its_stored_sizes(scenario):
    from kvmap.bench.budget import replay
    estimate, pools = _sizing(scenario)
    written = estimate(scenario).seconds
    least = estimate(_at_minimum(scenario, pools)).seconds
    plan = size_to_budget(scenario, (written + least) / 2, estimate, pools)
    assert plan.cuts
    again = replay(scenario, plan.to_dict(), estimate, pools)
    assert again.scenario.fingerprint() == plan.scenario.fingerprint()
    assert [v for _, v in again.cuts] == [v for _, v in plan.cuts]


# SCENARIO with its big workload optional or not, and an optional SLA capacity search
OPTIONAL = SCENARIO.replace("kv_memory: 64 tokens}", "kv_memory: 64 tokens, optional: %s}") \
    .rstrip() + """
      - {name: search, kind: synthetic, num_requests: 48, prompt_len: 32, output_len: 8,
         arrival: auto, optional: %s}
    slo: ttft_p90=1s
    """
assert OPTIONAL.count("optional: %s") == 2


def _load(tmp_path, text: str):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(text))
    return load_scenario(path)


def _family_s(est, family: str) -> float:
    return sum(c.seconds for c in est.cells if c.family == family)


def test_optional_entries_go_costliest_first_when_the_minimum_does_not_fit(tmp_path):
    scenario = _load(tmp_path, OPTIONAL % ("true", "true"))
    estimate, pools = _sizing(scenario)
    least = estimate(_at_minimum(scenario, pools))
    big, search = _family_s(least, "big"), _family_s(least, "search")
    assert big != search
    costly = "big" if big > search else "search"
    # room for everything but the costlier optional entry
    budget = least.seconds - max(big, search) + 1.0
    plan = size_to_budget(scenario, budget, estimate, pools)
    reasons = dict(plan.left_out)
    gone = {c.workload.name for c in plan.scenario.cells() + plan.scenario.searches()
            if c.cell_id in reasons}
    assert gone == {costly}
    assert all(why.startswith("optional, and the minimum does not fit --budget")
               for why in reasons.values())
    assert plan.estimate_s <= budget and plan.minimum_estimate_s <= budget
    # the plan says the entry once, naming every cell or search it left out
    said = [line for line in plan.lines() if line.startswith("  left out")]
    assert len(said) == 1 and all(cid in said[0] for cid in reasons), said
    # a search goes whole, by its template's id (the runner skips that search)
    if costly == "search":
        assert set(reasons) == {t.cell_id for t in plan.scenario.searches()}
    # below what the entries that are not optional need: refused, naming it
    with pytest.raises(BudgetError, match="cannot hold the minimum"):
        size_to_budget(scenario, _family_s(least, "tp") / 2, estimate, pools)
    # nothing optional: the same budget is refused
    strict = _load(tmp_path, OPTIONAL % ("false", "false"))
    estimate, pools = _sizing(strict)
    with pytest.raises(BudgetError):
        size_to_budget(strict, budget, estimate, pools)


def test_a_cell_over_its_timeout_even_at_the_minimum_costs_the_budget_nothing(tmp_path):
    from dataclasses import replace
    scenario = _load(tmp_path, OPTIONAL % ("false", "false"))
    estimate, pools = _sizing(scenario)
    least = estimate(_at_minimum(scenario, pools))
    # the family whose every cell costs more at the minimum than any other family's (tp:
    # each of its cells runs its configuration's checklist probes)
    costly = [f for f in {c.family for c in least.cells}
              if min(c.seconds for c in least.cells if c.family == f)
              > max(c.seconds for c in least.cells if c.family != f)]
    assert len(costly) == 1
    family = costly[0]
    lowest = min(c.seconds for c in least.cells if c.family == family)
    others = max(c.seconds for c in least.cells if c.family != family)
    tight = replace(scenario, cell_timeout_s=(lowest + others) / 2)
    # enough for what can run, not for that family's cells as well
    budget = least.seconds - _family_s(least, family) + 1.0
    plan = size_to_budget(tight, budget, estimate, pools)
    assert plan.minimum_estimate_s <= budget < least.seconds
    killed = {c.cell_id for c in plan.scenario.cells() + plan.scenario.searches()
              if c.workload.name == family}
    assert killed and killed <= {cid for cid, _ in plan.left_out}
    assert all("over its cell_timeout_s" in why for _, why in plan.left_out)
    assert plan.estimate_s <= budget


def test_a_left_out_search_is_not_run(tmp_path):
    from kvmap.bench.search_backend import SearchingBackend, with_searches
    scenario = _load(tmp_path, OPTIONAL % ("false", "false"))
    templates = scenario.searches()
    assert len(templates) == 2
    from kvmap.bench.local_backend import LocalBackend
    inner = LocalBackend()
    assert with_searches(inner, scenario, scenario.cells(),
                         left_out={t.cell_id for t in templates}) is inner
    one = with_searches(inner, scenario, scenario.cells(), left_out={templates[0].cell_id})
    assert isinstance(one, SearchingBackend)
    assert [t.cell_id for t in one.templates] == [templates[1].cell_id]


def test_optional_is_a_boolean_and_does_not_change_what_a_cell_computes(tmp_path):
    from kvmap.bench.scenario import ScenarioError
    with pytest.raises(ScenarioError, match=r"optional: 'yes' must be true or false"):
        _load(tmp_path, OPTIONAL % ("'yes'", "false"))
    on = _load(tmp_path, OPTIONAL % ("true", "true"))
    off = _load(tmp_path, OPTIONAL % ("false", "false"))
    assert [c.cell_id for c in on.cells()] == [c.cell_id for c in off.cells()]
    assert [c.cell_id for c in on.searches()] == [c.cell_id for c in off.searches()]
    assert on.fingerprint() == off.fingerprint()
    assert {w.name: w.optional for w in on.workloads} == {"tp": False, "big": True,
                                                          "search": True}


def _shipped():
    from kvmap.perf.calibration import shipped, shipped_name
    return [pytest.param(c, id=shipped_name(c)) for c in shipped()]


@pytest.mark.parametrize("cal", _shipped())
def test_the_default_scenario_fits_its_budget_on_every_shipped_class(cal, monkeypatch):
    # `kvmap bench` (the README's first command) on each machine class a calibration
    # was fitted on, at that class's reference rates and `auto` dtype: its 40 minutes
    # hold the scenario's minimum once what cannot run (over its timeout) and what may go
    # (optional) are left out -- on x86-avx2 the minimum counted W8A8's cells, estimated
    # past their 600 s timeout, and the command refused to run
    from pathlib import Path
    monkeypatch.setenv("KVMAP_NATIVE_BF16", "1" if cal.dtype == "bf16" else "0")
    scenarios = Path(__import__("kvmap.bench.scenarios", fromlist=["x"]).__file__).parent
    scenario = load_scenario(scenarios / "default.yaml")
    assert {m.dtype for m in scenario.models} == {cal.dtype}
    est = Estimator(None, calibration=cal)
    cells = scenario.cells() + scenario.searches()
    plan = size_to_budget(scenario, parse_duration("40m"), lambda s: estimate_run(s, est),
                          lambda w: est.pool_requests(cells, w))
    assert plan.estimate_s <= 2400
    # never the baseline: what is left out is optional, or a cell that would be killed
    left = {cid for cid, _ in plan.left_out}
    kept = [c for c in plan.scenario.cells() + plan.scenario.searches()
            if c.cell_id not in left]
    assert {c.kv for c in kept if c.model.label == "smollm2"} >= {cal.dtype, "int8", "int4"}
    for c in plan.scenario.cells() + plan.scenario.searches():
        if c.cell_id in left:
            job = c.workload if c.workload is not None else c.task
            reason = dict(plan.left_out)[c.cell_id]
            assert job.optional or "over its cell_timeout_s" in reason, (c.cell_id, reason)


def test_the_report_says_a_left_out_entry_once_as_the_plan_does():
    from kvmap.report.power import budget_lines
    left = [("a_int8", "optional (its entry 3s)"), ("a_fp32", "optional (its entry 3s)"),
            ("w8a8_ppl", "its cell estimated 700 s, over its cell_timeout_s 600 s")]
    plan = {"budget_s": 60, "estimate_s": 50, "written_estimate_s": 90, "cuts": [],
            "left_out": [{"cell_id": c, "reason": r} for c, r in left]}
    said = [line for line in budget_lines({"preflight": {"budget": plan}})
            if line.startswith("  left out")]
    assert said == ["  left out 2 cells or searches (a_int8, a_fp32): optional (its entry 3s)",
                    "  left out w8a8_ppl: its cell estimated 700 s, over its cell_timeout_s "
                    "600 s"]
