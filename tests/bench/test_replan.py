"""The re-plan after the first cells: a run whose cells take 4x their estimate re-sizes
what remains and lands inside its budget; the run record says what it cut."""
from __future__ import annotations

import textwrap
from types import SimpleNamespace

import pytest

from kvmap.bench import runner
from kvmap.bench.budget import knobs
from kvmap.bench.cell_backend import CellBackend, CellResult
from kvmap.bench.estimate import CellEstimate, RunEstimate, family_of
from kvmap.bench.replan import replanner_of
from kvmap.bench.scenario import load_scenario
from kvmap.report.power import budget_lines
from kvmap.runs.record import CellRecord
from kvmap.runs.store import RunStore

SCENARIO = """
    models: ["dummy:tiny"]
    engine: {kv_memory: 1MiB, block_size: 4, max_num_batched_tokens: 64}
    kv: [fp32, int8, int4]
    workloads:
      - {name: a, kind: synthetic, num_requests: 100, prompt_len: 8, output_len: 2,
         arrival: closed:4}
      - {name: b, kind: synthetic, num_requests: 60, prompt_len: 8, output_len: 2,
         arrival: closed:4}
    """
SECONDS_PER_REQUEST = 1.0          # the hand-made cost model
RUN_S = 10.0
SLOWER = 4.0                       # what the cells really take, over their estimate


def cost_model(scenario) -> RunEstimate:
    cells = scenario.cells()
    return RunEstimate(tuple(
        CellEstimate(c.cell_id, family_of(c), SECONDS_PER_REQUEST
                     * c.workload.options["num_requests"], {"decode": 0.0})
        for c in cells), RUN_S)


class Clock:
    """The cells' clock; the run's own cost is paid half before them (the preflight),
    half after the last (the report)."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Slow(CellBackend):
    """Each cell advances the clock by ``SLOWER`` x its cost model's seconds."""

    name = "slow"
    reads_todo_lazily = True

    def __init__(self, clock: Clock):
        self.clock, self.ran = clock, []

    def run(self, todo, store, on_fraction):
        for ordinal, cell in todo:
            on_fraction(cell, 0.0)
            n = cell.workload.options["num_requests"]
            self.clock.t += SLOWER * SECONDS_PER_REQUEST * n
            self.ran.append(n)
            yield CellResult(ordinal, cell, CellRecord.of_cell(cell, duration_s=1.0), [])


@pytest.mark.parametrize("budget_s", [600.0, 1200.0])
def test_a_run_4x_slower_than_its_estimate_lands_inside_its_budget(tmp_path, monkeypatch,
                                                                   budget_s):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(SCENARIO))
    scenario = load_scenario(path)
    estimate = cost_model(scenario)
    assert estimate.seconds < budget_s < SLOWER * estimate.seconds   # fits as estimated
    every = knobs(scenario, lambda w: [])
    replan = replanner_of(scenario, every, {k: k.written for k in every}, budget_s,
                          cost_model, estimate, {c.cell_id for c in scenario.cells()})
    replan.spent_before_s = RUN_S / 2
    clock = Clock()
    monkeypatch.setattr(runner, "time", SimpleNamespace(perf_counter=clock))
    backend = Slow(clock)
    runner.run_scenario(scenario, tmp_path / "run", backend=backend, show_progress=False,
                        estimate=estimate, replan=replan)
    assert RUN_S / 2 + clock.t + RUN_S / 2 <= budget_s   # inside the budget
    assert backend.ran[0] == 100 and min(backend.ran) < 60   # the first as written, then cut
    assert len(backend.ran) == len(scenario.cells())      # every configuration still runs
    stored = RunStore(tmp_path / "run").metadata()["replan"]
    assert stored["ratio"] == pytest.approx(SLOWER)
    (first, *_) = stored["replans"]
    assert first["after_cells"] == 1 and first["cuts"] and first["planned_s"] <= budget_s
    assert first["projected_s"] > budget_s
    sized = {w.name: w.options["num_requests"] for w in replan.sized_scenario().workloads}
    assert sized["a"] < 100 and sized["b"] < 60        # what a later search reads
    said = "\n".join(budget_lines(RunStore(tmp_path / "run").metadata()))
    assert "re-plan after 1 cells" in said and "a num_requests 100 -> " in said


def _run_on_course(tmp_path, monkeypatch, text: str):
    """(scenario, backend, result) of ``text`` run with a re-plan whose budget it fits."""
    path = tmp_path / "s.yaml"
    path.write_text(text)
    scenario = load_scenario(path)
    estimate = cost_model(scenario)
    every = knobs(scenario, lambda w: [])
    replan = replanner_of(scenario, every, {k: k.written for k in every}, 5000.0,
                          cost_model, estimate, {c.cell_id for c in scenario.cells()})
    clock = Clock()
    monkeypatch.setattr(runner, "time", SimpleNamespace(perf_counter=clock))
    backend = Slow(clock)
    result = runner.run_scenario(scenario, tmp_path / "run", backend=backend,
                                 show_progress=False, estimate=estimate, replan=replan,
                                 searches=True)
    return scenario, backend, result


def test_on_course_nothing_is_replanned(tmp_path, monkeypatch):
    scenario, backend, _ = _run_on_course(tmp_path, monkeypatch, textwrap.dedent(SCENARIO))
    assert backend.ran == [c.workload.options["num_requests"] for c in scenario.cells()]
    assert RunStore(tmp_path / "run").metadata()["replan"]["replans"] == []


def test_a_search_after_the_cells_does_not_break_the_replan(tmp_path, monkeypatch):
    """A search's probes arrive after the scenario's cells (the searching backend yields
    them past ``todo``): timing them into the re-plan must not index past ``todo``."""
    scenario, _, result = _run_on_course(
        tmp_path, monkeypatch, textwrap.dedent(SCENARIO) + "  - {name: s, kind: synthetic, "
        "num_requests: 12, prompt_len: 8, output_len: 2, arrival: auto, kv: [fp32]}\n"
        "slo: ttft_p90=1s\n")
    assert scenario.searches()
    roles = [(c.load or {}).get("search", {}).get("role") for c in result.cells]
    assert "serial" in roles and "saturated" in roles      # the probes ran and were stored
