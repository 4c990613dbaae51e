"""Predict, then verify: the SLA capacity the simulator of this machine expects, before
a search places its first open-loop level (``runs.search``).

Given the saturated run of a configuration (its records: the pool's exact blocks; its rows:
the requests' token counts), the cell predictor (``kvmap.plan.sim.predict``, handed in by
the command: the bench never imports the planner) simulates the same requests arriving
as a seeded Poisson stream at each rate of a geometric grid from ``X1 / 8`` to ``1.5 x
Xmax``; the prediction is the highest rate below the first whose simulated requests miss
a key of the SLA at its percentile (the point estimate: a prediction is where to look,
the probes decide). None without a predictor, or when the simulator cannot run the cell.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

GRID_POINTS = 14
REFINE_STEPS = 4
SEED = 0


def poisson_rows(rows: list[dict], rate: float, seed: int = SEED) -> list[dict]:
    """``rows``' requests (token counts) re-timed as a Poisson stream at ``rate``."""
    gaps = np.random.default_rng(seed).exponential(size=len(rows)) / rate
    times = np.cumsum(gaps) - gaps[0]
    return [{**r, "scheduled_arrival_s": float(t), "conversation_id": None, "turn": 0}
            for r, t in zip(rows, times)]


def predicted_meets(prediction: dict | None) -> bool | None:
    """Whether a cell's prediction meets every SLA key at its percentile (None: unknown)."""
    att = (prediction or {}).get("slo_attainment")
    if not att:
        return None
    return all(k["share"] is not None and k["share"] >= k["quantile"]
               for k in att["keys"].values())


def predict_capacity(predict: Callable | None, cell_at: Callable[[float], object],
                     record: dict, rows: list[dict], x1: float, xmax: float
                     ) -> float | None:
    """The predicted SLA capacity in req/s (module docstring); ``cell_at(rate)`` is the
    probe cell of that rate, ``record`` and ``rows`` the saturated run's."""
    if predict is None or not rows or not x1 or not xmax:
        return None
    lo, hi = x1 / 8, 1.5 * xmax
    rates = [lo * (hi / lo) ** (i / (GRID_POINTS - 1)) for i in range(GRID_POINTS)]
    def meets(rate: float) -> bool | None:
        try:
            return predicted_meets(predict(cell_at(rate), record, poisson_rows(rows, rate)))
        except (ValueError, RuntimeError, KeyError):         # never fails the run
            return None
    best, miss = None, None
    for rate in rates:
        ok = meets(rate)
        if ok is None:
            return None
        if not ok:
            miss = rate
            break
        best = rate
    if best is None:
        return None
    for _ in range(REFINE_STEPS if miss else 0):   # bisect the grid's last step
        mid = math.sqrt(best * miss)
        ok = meets(mid)
        if ok is None:
            break
        best, miss = (mid, miss) if ok else (best, mid)
    return float(f"{best:.3g}")
