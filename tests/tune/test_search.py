"""The search against the stub runner (``conftest``): it finds the grid's optimum with
fewer cells, its early rejection skips cells, and it keeps to its cell budget."""
from __future__ import annotations

import pytest
from rich.console import Console

from kvmap.bench.runner import run_scenario
from kvmap.report.analysis import analyze
from kvmap.report.loader import load_run
from kvmap.report.constraints import Constraints
from kvmap.tune.path import read_path
from kvmap.tune.run import run_tune
from kvmap.tune.setup import TuneSetup, build_scenario
from kvmap.tune.space import PolicyAxis, TuneSpace

QUIET = Console(quiet=True)
SPACE = TuneSpace(codecs=("bf16", "int8", "int4"),
                  policies=(PolicyAxis("streaming_llm", (0.125, 0.25, 0.5, 0.75)),))
BUDGET = Constraints(max_accuracy_drop_pct=2.0)


def _tune(tmp_path, stub, objective="memory", max_cells=40, space=SPACE,
          constraints=BUDGET, name="tune"):
    return run_tune(TuneSetup(), space, constraints, objective, tmp_path / name,
                    max_cells=max_cells, backend=stub.backend(), console=QUIET)


def _grid(tmp_path, stub, objective="memory", constraints=BUDGET):
    """The exhaustive grid of the same space: ``kvmap bench`` of the scenario, no screens."""
    scenario = build_scenario(TuneSetup(), SPACE, "grid")
    cells = [c for c in scenario.cells() if c.job != TuneSetup().screen_task]
    run_scenario(scenario, tmp_path / "grid", cells=cells, backend=stub.backend(),
                 console=QUIET, show_progress=False)
    analysis = analyze(load_run(tmp_path / "grid"), constraints, objective)
    return analysis.recommendation.choice, len(cells)


def test_memory_search_finds_the_grid_optimum_with_fewer_cells(tmp_path, stub):
    result = _tune(tmp_path, stub)
    assert result.recommendation.choice == stub.optimum
    grid_stub = type(stub)()
    grid_choice, grid_num_cells = _grid(tmp_path, grid_stub)
    assert grid_choice == stub.optimum
    assert result.num_cells == len(stub.ran) < grid_num_cells == len(grid_stub.ran)


def test_throughput_search_finds_the_grid_optimum(tmp_path, stub):
    result = _tune(tmp_path, stub, objective="throughput")
    grid_choice, grid_num_cells = _grid(tmp_path, type(stub)(), objective="throughput")
    assert result.recommendation.choice == grid_choice == stub.optimum
    assert result.num_cells < grid_num_cells


@pytest.mark.parametrize("objective", ["memory", "throughput"])
def test_early_rejection_runs_no_further_cell_of_a_rejected_point(tmp_path, stub, objective):
    result = _tune(tmp_path, stub, objective=objective)
    early = [s for s in result.steps if s.verdict.startswith("rejected early")]
    assert early, "the stub space has points whose screen already misses the budget"
    for step in early:
        assert stub.jobs_of(step.config) == ["ppl-screen"]      # no task, no workload
        assert stub.figures(step.config)[0] > 2.0
    screened = {c.kv for c in stub.ran if c.job == "ppl-screen"}
    full = {c.kv for c in stub.ran if c.job == "ppl"}
    assert full <= screened - {s.config for s in early}


def test_a_screen_whose_interval_reaches_the_budget_rejects_nothing(tmp_path, stub):
    noisy = type(stub)(screen_ci_pct=5.0)      # every screen: drop +- 5 points
    result = _tune(tmp_path, noisy, objective="throughput")
    assert not [s for s in result.steps if s.verdict.startswith("rejected early")]
    assert {c.kv for c in noisy.ran if c.job == "ppl"} == \
        {c.kv for c in noisy.ran if c.job == "ppl-screen"}
    assert result.recommendation.choice == noisy.optimum


def test_memory_search_prunes_dominated_points(tmp_path, stub):
    result = _tune(tmp_path, stub)
    dominated = [s for s in result.steps if s.verdict.startswith("dominated")]
    assert dominated
    for step in dominated:
        drop, peak = stub.figures(step.config)
        assert peak >= stub.figures(stub.optimum)[1]
        assert "ppl" not in stub.jobs_of(step.config)     # its full task never ran
    # a dominated point ends its family: no larger budget of it is tried
    tried = {c.kv for c in stub.ran}
    assert "streaming_llm(budget=0.75)+bf16" not in tried


def test_the_cell_budget_is_respected(tmp_path, stub):
    result = _tune(tmp_path, stub, max_cells=7)
    assert result.num_cells <= 7 and len(stub.ran) <= 7
    assert result.stopped and "--max-cells 7" in result.stopped
    assert result.recommendation.choice is not None    # from what it measured
    assert read_path(tmp_path / "tune")["stopped"] == result.stopped


def test_the_run_directory_is_an_ordinary_run_with_its_path(tmp_path, stub):
    result = _tune(tmp_path, stub)
    run = load_run(tmp_path / "tune")
    screens = load_run(tmp_path / "tune" / "screens")    # an ordinary run too
    assert {c.cell_id for c in run.cells} == {c.cell_id for c in stub.ran
                                                 if c.job != "ppl-screen"}
    assert {c.cell_id for c in screens.cells} == {c.cell_id for c in stub.ran
                                                     if c.job == "ppl-screen"}
    assert analyze(run, BUDGET, "memory").recommendation.choice == result.recommendation.choice
    path = read_path(tmp_path / "tune")
    assert [s["step"] for s in path["steps"]] == list(range(1, len(result.steps) + 1))
    assert path["steps"][0]["config"] == "bf16" and path["num_cells"] == result.num_cells
    assert path["num_cells_grid"] == 2 * len(SPACE.all_kv())
    assert path["recommendation"]["choice"] == stub.optimum
    assert (tmp_path / "tune" / "tune.md").read_text().count("\n") == len(result.steps) + 2


def test_a_resumed_tune_runs_no_cell_again(tmp_path, stub):
    first = _tune(tmp_path, stub)
    again = type(stub)()
    second = _tune(tmp_path, again)
    assert again.ran == [] and second.recommendation.choice == first.recommendation.choice


def test_max_num_seqs_runs_only_the_best_point_at_other_values(tmp_path, stub):
    space = TuneSpace(codecs=("bf16", "int8"), max_num_seqs=(64, 8))
    result = _tune(tmp_path, stub, space=space)
    seqs = [c for c in stub.ran if c.engine.max_num_seqs == 8]
    assert [(c.kv, c.job) for c in seqs] == [("int8", "throughput")]
    assert result.recommendation.choice in {"int8", "int8 @max_num_seqs=8"}
    assert result.steps[-1].config == "int8 @max_num_seqs=8"


def test_kvmap_report_draws_the_searched_points_and_the_path(tmp_path, stub):
    from kvmap.report.html import write_report
    result = _tune(tmp_path, stub)
    analysis = analyze(load_run(tmp_path / "tune"), BUDGET, "memory")
    measured = {c.kv for c in stub.ran if c.job != "ppl-screen"}
    assert {c.kv for c in analysis.configs} == measured
    assert measured < {c.kv for c in stub.ran}     # rejected early: only in screens/
    html = write_report(analysis).read_text()
    assert "The search path (kvmap tune)" in html
    assert html.count("bisection on streaming_llm budget") == sum(
        "bisection" in s.why for s in result.steps)
    assert f"{result.num_cells} cells (the exhaustive grid of this space: 30)" in html


def test_an_sla_no_point_meets_leaves_no_recommendation(tmp_path, stub):
    tight = Constraints(slo={"ttft_p99_s": 0.05}, max_accuracy_drop_pct=2.0)  # stub: 0.1 s
    result = _tune(tmp_path, stub, constraints=tight)
    assert result.incumbent is None and not result.recommendation.feasible
    assert any("TTFT P99" in s.verdict for s in result.steps)
    loose = Constraints(slo={"ttft_p99_s": 0.5}, max_accuracy_drop_pct=2.0)
    assert _tune(tmp_path, type(stub)(), constraints=loose,
                 name="loose").recommendation.choice == stub.optimum


def test_the_time_budget_stops_the_search_before_the_next_cell(tmp_path, stub):
    from kvmap.tune.executor import BudgetExhausted, Executor
    scenario = build_scenario(TuneSetup(), SPACE, "t")
    now = [0.0]
    ex = Executor([(scenario, tmp_path / "t")], max_cells=100, max_minutes=1.0,
                  backend=stub.backend(), console=QUIET, clock=lambda: now[0])
    first, second = scenario.cells()[:2]
    ex.run([first])
    now[0] = 61.0
    assert ex.fits([first]) and not ex.fits([second])    # a stored cell costs nothing
    with pytest.raises(BudgetExhausted, match="--max-minutes 1.0"):
        ex.run([second])
    assert len(stub.ran) == 1
