"""What ``kvmap bench`` does before the first cell: measure how fast this machine runs
now, estimate every cell (``estimate``), size the scenario to its time budget
(``budget``), and print both. ``kvmap bench --dry-run`` stops here.

The budget: ``--budget DURATION``; without it the built-in scenarios have their own
(``BUILTIN_BUDGETS``: default 40 min, quick 3 min) and a scenario file has none (it runs
as written, estimate printed). ``--no-sizing`` keeps the scenario as written and only
says whether it fits.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvmap.bench.budget import (BudgetPlan, check_only, parse_duration, replay,
                                size_to_budget)
from kvmap.bench.cellspec import Scenario
from kvmap.bench.estimate import Estimator, RunEstimate, current_slowdown, estimate_run

BUILTIN_BUDGETS = {"builtin:default": "40m", "builtin:quick": "3m"}


@dataclass(frozen=True)
class Preflight:
    scenario: Scenario               # as it will run (sized to the budget)
    estimate: RunEstimate
    plan: BudgetPlan | None
    slowdown: float
    wait_policy: str
    calibration: str = ""            # the record of this class's calibration (its source)
    replanner: object = None         # ``bench.replan.Replanner`` for the run (a budget's)

    def lines(self) -> list[str]:
        out = [f"estimate on this machine (calibration {self.calibration}; decode-step "
               f"proxy {self.slowdown:.2f}x the calibration's, OpenMP wait policy "
               f"{self.wait_policy}):",
               *self.estimate.lines()]
        if self.plan is not None:
            out += self.plan.lines()
        return out

    def to_dict(self) -> dict:
        return {"estimate_s": round(self.estimate.seconds, 1), "slowdown": self.slowdown,
                "wait_policy": self.wait_policy, "calibration": self.calibration,
                "by_family_s": {f: round(s, 1) for f, (_, s)
                                in self.estimate.by_family().items()},
                **({"budget": self.plan.to_dict()} if self.plan is not None else {})}


def budget_of(scenario: Scenario, given: str | None) -> float | None:
    """The budget in seconds: ``given`` (ValueError naming a bad one), else the built-in
    scenario's own, else None."""
    if given is not None:
        return parse_duration(given)
    default = BUILTIN_BUDGETS.get(scenario.source)
    return parse_duration(default) if default else None


def preflight(scenario: Scenario, budget: str | None = None, sizing: bool = True,
              warm: bool = True, stored: dict | None = None) -> Preflight:
    """Estimate and size ``scenario`` (module docstring); ``BudgetError`` when its
    minimum does not fit the budget, ValueError for a bad budget. ``stored``: the plan of
    the run being resumed (``BudgetPlan.to_dict``), whose sizes are kept."""
    import os

    from kvmap.hardware.threads import choose
    budget_s = budget_of(scenario, budget)
    settings = choose(given=os.environ.get("KVMAP_CELL_OMP_WAIT_POLICY"))
    from kvmap.hardware import profile
    from kvmap.perf.calibration import calibration_for
    hw = profile()
    cal = calibration_for(hw, hw.auto_dtype("cpu"))
    slowdown = current_slowdown(settings, cal)
    est = Estimator(hw.rates, warm=warm, slowdown=slowdown, hw=hw)

    def estimate(s: Scenario) -> RunEstimate:
        return estimate_run(s, est)

    written = estimate(scenario)
    written_scenario = scenario
    plan = None
    cells = scenario.cells() + scenario.searches()
    if stored is not None:
        plan = replay(scenario, stored, estimate, lambda w: est.pool_requests(cells, w))
        scenario = plan.scenario
    elif budget_s is not None:
        plan = size_to_budget(scenario, budget_s, estimate,
                              lambda w: est.pool_requests(cells, w)) if sizing \
            else check_only(scenario, budget_s, written)
        scenario = plan.scenario
    final = estimate(scenario) if plan is not None and plan.scale < 1 else written
    if plan is not None:             # what runs: the ETA and a re-plan count only that
        final = final.without({cid for cid, _ in plan.left_out})
    replanner = None
    if plan is not None and plan.minimum_estimate_s is not None:
        from kvmap.bench.budget import knobs
        from kvmap.bench.replan import replanner_of
        every = knobs(written_scenario, lambda w: est.pool_requests(cells, w))
        values = {k: dict(((c.name, c.key), v) for c, v in plan.cuts).get((k.name, k.key),
                                                                          k.written)
                  for k in every}
        replanner = replanner_of(written_scenario, every, values, plan.budget_s, estimate,
                                 final, {c.cell_id for c in scenario.cells()})
    return Preflight(scenario, final, plan, slowdown, settings.wait_policy,
                     f"{cal.machine_class}/{cal.dtype}"
                     f"{'' if cal.same_class else ' (another class)'}: {cal.source}",
                     replanner)
