"""A search held to its run's budget while it runs (``bench.search_budget``): on the
hand-made M/M/1 engine of ``test_capacity_search`` with a simulated clock (a probe of N
requests at rate r takes N / r seconds), a search stops before the probe that would
overrun, says so in ``searches.json``, and the run stays inside its budget; with room, it
runs exactly as without a budget."""
from __future__ import annotations

import json
import textwrap
from dataclasses import replace

import pytest

from kvmap.bench.runner import run_scenario
from kvmap.bench.scenario import load_scenario
from kvmap.bench.search_backend import SEARCHES_FILE, with_searches
from kvmap.bench.search_budget import SearchBudget
from kvmap.runs.search import NextProbe, Probe

from tests.bench.test_capacity_search import (NUM_REQUESTS, SCENARIO, SERVICE_RATE,
                                              ModelBackend, predictor)


class TimedBackend(ModelBackend):
    """The hand-made engine on a simulated clock: each probe's wall time is its span."""

    def __init__(self):
        super().__init__()
        self.spent_s = 0.0

    def run(self, todo, store, on_fraction):
        for res in super().run(todo, store, on_fraction):
            load = res.cell.workload.load
            n = res.cell.workload.options["num_requests"]
            span = n / load["value"] if load["kind"] == "poisson" else n / SERVICE_RATE
            self.spent_s += span
            yield replace(res, record=replace(res.record, duration_s=span))


def _search(tmp_path, budget_s: float | None) -> tuple[dict, TimedBackend]:
    tmp_path.mkdir()
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(SCENARIO))
    scenario = load_scenario(path)
    inner = TimedBackend()
    left = None if budget_s is None else (lambda: budget_s - inner.spent_s)
    backend = with_searches(inner, scenario, [], predict=predictor(0.05), time_left=left)
    run_scenario(scenario, tmp_path / "run", backend=backend, cells=[], searches=False,
                 show_progress=False)
    (entry,) = json.loads((tmp_path / "run" / SEARCHES_FILE).read_text()).values()
    return entry, inner


def test_a_search_stops_before_the_probe_that_would_overrun_and_says_so(tmp_path):
    free, unbounded = _search(tmp_path / "free", None)
    assert free["result"]["stopped"] is None and free["result"]["status"] == "decided"
    # room for the serial and saturated runs and about one level of 40 requests
    budget = 0.4 + NUM_REQUESTS / SERVICE_RATE + NUM_REQUESTS / 6.0
    held, timed = _search(tmp_path / "held", budget)
    assert unbounded.spent_s > budget                     # unbounded, it would overrun
    assert timed.spent_s <= budget, (timed.spent_s, budget)
    stopped = held["result"]["stopped"]
    assert stopped and "stopped by the budget" in stopped and "s left" in stopped
    assert stopped in held["result"]["describe"]
    assert len(held["probes"]) < len(free["probes"])


def test_with_room_the_search_runs_as_without_a_budget(tmp_path):
    free, _ = _search(tmp_path / "free", None)
    roomy, _ = _search(tmp_path / "roomy", 10_000.0)
    assert [p["label"] for p in roomy["probes"]] == [p["label"] for p in free["probes"]]
    assert roomy["result"]["stopped"] is None


def test_a_probe_is_projected_from_the_last_level_or_the_saturated_run():
    budget = SearchBudget(lambda: 100.0, num_searches=3)
    level = NextProbe("level", "poisson:2", 40)
    assert budget.projected_s(level, [], []) is None           # nothing says yet
    saturated = Probe("saturated", None, True, requests_per_s=8.0)
    assert budget.projected_s(level, [saturated], [5.0]) == pytest.approx(5.0 * 8 / 2)
    done = Probe("level", 4.0, True)
    assert budget.projected_s(level, [saturated, done], [5.0, 10.0]) == pytest.approx(20.0)
    # a closed run: the same role's time in an earlier search
    budget.ran("serial", 1.5)
    budget.ran("saturated", 5.0)
    assert budget.projected_s(NextProbe("serial", "closed:1", 4), [], []) == 1.5
    # two later searches each need serial + saturated + a level at 0.8 of its rate
    assert budget.later_s(0) == pytest.approx(2 * (1.5 + 5.0 + 5.0 / 0.8))
    assert budget.stop(0, level, [saturated], [5.0]) is None        # 20 + 25.6 <= 100
    assert budget.stop(2, level, [saturated], [5.0]) is None        # the last: 20
    tight = SearchBudget(lambda: 30.0, num_searches=3, seen=dict(budget.seen))
    assert "projected 20 s + 26 s" in tight.stop(0, level, [saturated], [5.0])
    assert tight.stop(2, level, [saturated], [5.0]) is None
