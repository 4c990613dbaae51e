"""The re-plan after the first cells: once a run knows how far off its estimate is, it
re-sizes what remains so that it lands inside its budget (``Replanner``).

After every cell the runner reports the cells done; their actual wall time over their
estimate is the run's ratio ``r``. The remaining cells at their present sizes are projected
at ``r x`` their estimate (a search's probes, which the re-plan does not size, at their
estimate: a search holds itself to the budget as it runs, ``bench.search_budget``); with ``reserve_s`` kept for what follows the last cell (the report), the run
is on course when

    elapsed + r x (remaining cells + the searches) + reserve  <=  budget.

When it is not, the knobs of the budget (``bench.budget``: requests per load level,
accuracy samples) are bisected again, for the remaining cells only, to the largest scale
``s`` (of their *written* values, never above their present ones) whose projection fits;
the minimum is taken, and the overrun said, when even it does not. The cells already run
keep their sizes: a configuration run after the re-plan is compared on fewer requests or
samples (the same seed, so a prefix of the samples the earlier ones had), and the run
record's ``replan`` says so, with every re-plan's ratio, projection and cuts.

A re-plan happens only after ``MIN_DONE_FRACTION`` of the estimate has run (one short
cell's ratio says little), and it changes only the cells the runner has not handed to its
backend yet: a backend that takes its cells one at a time (``local``) sees the new sizes,
one that submitted them all at once (``ray``) does not.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvmap.bench.budget import Knob, apply
from kvmap.bench.cellspec import CellSpec, Scenario

MIN_DONE_FRACTION = 0.05          # of the run's estimate, run before the first re-plan
STEPS = 16                        # bisection steps of the scale


@dataclass(frozen=True)
class Replan:
    """One re-plan: when, how far off the estimate was, and what it cut."""

    after_cells: int
    elapsed_s: float
    ratio: float                  # actual / estimate of the cells done
    projected_s: float            # elapsed + the rest at the ratio + reserve, before
    planned_s: float              # the same after the re-plan
    budget_s: float
    scale: float                  # of the knobs' written values
    cuts: tuple[tuple[str, str, int, int], ...] = ()   # (name, key, before, after)

    def line(self) -> str:
        cut = "; ".join(f"{n} {k} {a} -> {b}" for n, k, a, b in self.cuts) or "nothing cut"
        over = "" if self.planned_s <= self.budget_s else \
            f"; still over by {self.planned_s / self.budget_s - 1:.0%} at the minimum"
        return (f"re-plan after {self.after_cells} cells: actual/estimate {self.ratio:.2f}, "
                f"projected {self.projected_s:.0f} s of {self.budget_s:.0f} s -> "
                f"{self.planned_s:.0f} s ({cut}{over})")

    def to_dict(self) -> dict:
        return {"after_cells": self.after_cells, "elapsed_s": round(self.elapsed_s, 1),
                "ratio": round(self.ratio, 3), "projected_s": round(self.projected_s, 1),
                "planned_s": round(self.planned_s, 1), "budget_s": self.budget_s,
                "scale": round(self.scale, 4),
                "cuts": [{"name": n, "key": k, "before": a, "after": b}
                         for n, k, a, b in self.cuts]}


@dataclass
class Replanner:
    """Re-sizes a run's remaining cells (module docstring).

    ``scenario``: the scenario as written (the knobs' written values); ``values``: each
    knob's present value (the preflight's sizing); ``estimate(scenario)`` -> a
    ``RunEstimate`` of the whole scenario; ``extra_s``: the estimate of what runs after
    the cells and is not sized here (a search's probes as estimated); ``reserve_s``:
    kept for what follows (the report); ``spent_before_s``: what the run spent before its
    first cell (the CLI, the preflight), set by the caller when the cells start."""

    scenario: Scenario
    knobs: list[Knob]
    values: dict[Knob, int]
    budget_s: float
    estimate: Callable[[Scenario], object]
    extra_s: float = 0.0
    reserve_s: float = 0.0
    total_estimate_s: float = 0.0
    spent_before_s: float = 0.0
    done: list[tuple[float, float]] = field(default_factory=list)   # (estimate, actual)
    history: list[Replan] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        est = sum(e for e, _ in self.done)
        return sum(a for _, a in self.done) / est if est > 0 else 1.0

    @property
    def scale(self) -> float:
        """The knobs' scale now (1.0: as the preflight sized them)."""
        return self.history[-1].scale if self.history else 1.0

    def sized_scenario(self) -> Scenario:
        """The scenario at the present sizes: what a search run after the cells should
        read its requests per probe from (``runs.search`` sizes itself from its
        workload's ``num_requests``, a knob of this re-plan)."""
        return apply(self.scenario, self.values)

    def started(self, spent_before_s: float) -> Replanner:
        """This replanner, told what the run spent before its first cell."""
        self.spent_before_s = spent_before_s
        return self

    def cell_done(self, estimate_s: float | None, actual_s: float) -> None:
        if estimate_s is not None and estimate_s > 0:
            self.done.append((estimate_s, actual_s))

    def _cells_at(self, values: dict[Knob, int]) -> tuple[list[CellSpec], object]:
        sized = apply(self.scenario, values)
        return sized.cells(), self.estimate(sized)

    def after(self, elapsed_s: float, remaining: list[int]) -> tuple[Replan | None, dict]:
        """A re-plan when the run is off course (module docstring), else None (``elapsed_s``:
        since the first cell began); with it the
        remaining cells re-sized, ``{index in scenario.cells(): (new cell, its estimate)}``
        for each index in ``remaining``."""
        done_s = sum(e for e, _ in self.done)
        elapsed_s += self.spent_before_s
        if not remaining or done_s < MIN_DONE_FRACTION * self.total_estimate_s:
            return None, {}
        r = self.ratio

        def planned(values: dict[Knob, int]) -> tuple[float, list, object]:
            cells, est = self._cells_at(values)
            rest = sum(est.of(cells[i].cell_id).seconds for i in remaining
                       if est.of(cells[i].cell_id) is not None)
            return elapsed_s + r * (rest + self.extra_s) + self.reserve_s, cells, est

        projected, _, _ = planned(self.values)
        if projected <= self.budget_s:
            return None, {}

        def at(scale: float) -> dict[Knob, int]:
            return {k: min(self.values.get(k, k.written), k.at(scale)) for k in self.knobs}

        lo, hi = 0.0, self.scale
        if planned(at(0.0))[0] <= self.budget_s:
            for _ in range(STEPS):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if planned(at(mid))[0] <= self.budget_s else (lo, mid)
        values = at(lo)
        if values == self.values and self.history:
            return None, {}                  # said before: nothing more can be cut
        after_s, cells, est = planned(values)
        cuts = tuple((k.name, k.key, self.values.get(k, k.written), v)
                     for k, v in values.items() if v < self.values.get(k, k.written))
        plan = Replan(len(self.done), elapsed_s, r, projected, after_s, self.budget_s, lo,
                      cuts)
        self.values = values
        self.history.append(plan)
        return plan, {i: (cells[i], est.of(cells[i].cell_id)) for i in remaining}

    def to_dict(self) -> dict:
        return {"ratio": round(self.ratio, 3), "cells_timed": len(self.done),
                "replans": [p.to_dict() for p in self.history]}


def replanner_of(scenario: Scenario, knobs: list[Knob], values: dict[Knob, int],
                 budget_s: float, estimate: Callable[[Scenario], object],
                 run_estimate, cell_ids: set[str]) -> Replanner:
    """A ``Replanner`` for a run whose preflight estimate is ``run_estimate`` and whose
    cells are ``cell_ids``: the searches' probes (estimated, not among the cells) are its
    ``extra_s``, half the run's own cost (the report's share) its ``reserve_s``."""
    extra = sum(c.seconds for c in run_estimate.cells if c.cell_id not in cell_ids)
    return Replanner(scenario, knobs, dict(values), budget_s, estimate, extra_s=extra,
                     reserve_s=run_estimate.run_s / 2,
                     total_estimate_s=run_estimate.seconds)
