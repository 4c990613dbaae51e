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
