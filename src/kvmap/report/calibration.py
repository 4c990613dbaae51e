"""Predicted beside measured: how well the simulator foresaw each workload cell of a run.

A bench run stores, in each workload cell's record, the simulator's prediction of that
cell on the run's own hardware profile (``prediction``, written at bench time by
``kvmap.plan.sim.predict``; the report only reads it). Per cell: predicted and measured
output throughput, TTFT P50, TBT P50 (the decode step) and the most sequences running
at once, and the error of each (``predicted / measured - 1``). Over the run, on output
throughput (as BLIS reports its calibration):

    MAPE = mean |predicted - measured| / measured
    r    = Pearson's correlation of predicted and measured

The budget estimate and the simulator stand on one calibration record of the machine's
class and dtype (``kvmap.perf.calibration``; the prediction names it, ``calibration``):
the same MAPE is taken of the estimate's cell seconds against each cell's wall time
(``estimate``: ``estimate_s``, ``actual_s``, every cell kind), and the report prints
the two on one line under the record's name (``prediction_view.fit_text``).

A cell whose throughput error exceeds ``TOLERANCE`` is *missed*, and the part of the
step the model got wrong is named where the record can tell:

1. the memory model, when the concurrency differs by more than ``CONCURRENCY_TOLERANCE``
   (the pool held another number of sequences than predicted), or the preemptions do
   (at least ``MIN_PREEMPTIONS`` on one side and twice the other's: sequences evicted
   and recomputed that the model did not see, or the reverse); with as many preemptions
   as predicted and a throughput over-predicted, the cost of a preemption (the model
   charges only its recomputed prefill);
2. else the decode step (TBT) or the prefill and queueing (TTFT), whichever error is
   larger and beyond the tolerance, with the resource the simulated step was bound by;
3. else neither step time alone: the mix of the two.

A cell measured while the machine's load average was above ``LOADED`` says so: its
measured speed is the load's as much as the configuration's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvmap.runs.record import as_dicts

TOLERANCE = 0.20
CONCURRENCY_TOLERANCE = 0.10
MIN_PREEMPTIONS = 5
LOADED = 2.5
COMPARED = (("output_tokens_per_s", "throughput"), ("ttft_p50_s", "TTFT P50"),
            ("tbt_p50_s", "TBT P50"), ("concurrency_max", "sequences at once"))


@dataclass(frozen=True)
class CellCalibration:
    """One workload cell: predicted and measured figures and their errors."""

    cell_id: str
    workload: str
    kv: str
    measured: dict[str, float | None]
    predicted: dict[str, float | None]
    errors: dict[str, float | None]
    bound: str | None = None              # the simulated step's main resource
    miss: str | None = None               # what the model got wrong (None: within tolerance)
    load: float | None = None             # the machine's load average at the cell's end
    hardware: str | None = None

    @property
    def throughput_error(self) -> float | None:
        return self.errors.get("output_tokens_per_s")


@dataclass(frozen=True)
class Calibration:
    """The run's cells with a prediction, and the fit over them."""

    cells: list[CellCalibration] = field(default_factory=list)
    mape: float | None = None
    pearson_r: float | None = None
    tolerance: float = TOLERANCE
    skipped: dict[str, str] = field(default_factory=dict)   # cell id -> why not predicted
    estimate_mape: float | None = None    # the budget estimate's cell seconds vs wall time
    num_estimated: int = 0
    record: str | None = None             # the calibration record both stand on

    @property
    def missed(self) -> list[CellCalibration]:
        return [c for c in self.cells if c.miss is not None]


def measured_of(metrics: dict) -> dict[str, float | None]:
    """The compared figures of a cell's measured ``metrics``."""
    def stat(key: str, name: str):
        value = metrics.get(key)
        return value.get(name) if isinstance(value, dict) else None
    return {"output_tokens_per_s": metrics.get("output_tokens_per_s"),
            "ttft_p50_s": stat("ttft_s", "p50"), "tbt_p50_s": stat("tbt_s", "p50"),
            "concurrency_max": metrics.get("concurrency_max"),
            "num_preemptions": metrics.get("num_preemptions_engine")}


def error(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None or not measured > 0:
        return None
    return predicted / measured - 1


def pearson_r(xs: list[float], ys: list[float]) -> float | None:
    """Pearson's correlation; None for fewer than two points or no spread."""
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx <= 0 or syy <= 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def mape(pairs: list[tuple[float, float]]) -> float | None:
    """Mean absolute percentage error of (predicted, measured) pairs, as a fraction."""
    usable = [(p, m) for p, m in pairs if m > 0]
    return sum(abs(p - m) / m for p, m in usable) / len(usable) if usable else None


def diagnose(errors: dict, measured: dict, predicted: dict, bound: str | None,
             tolerance: float = TOLERANCE) -> str | None:
    """The part of the step the model got wrong (the module docstring), or None when the
    throughput is within ``tolerance``."""
    e = errors.get("output_tokens_per_s")
    if e is None or abs(e) <= tolerance:
        return None
    ec = errors.get("concurrency_max")
    if ec is not None and abs(ec) > CONCURRENCY_TOLERANCE:
        return (f"the memory model: {predicted['concurrency_max']} sequences at once "
                f"predicted, {measured['concurrency_max']} measured")
    pm, pp = measured.get("num_preemptions"), predicted.get("num_preemptions")
    if pm is not None and pp is not None and max(pm, pp) >= MIN_PREEMPTIONS \
            and max(pm, pp) >= 2 * min(pm, pp):
        return (f"the memory model: {pp} preemptions predicted, {pm} measured (sequences "
                f"evicted and their prefill recomputed)")
    if pm is not None and pm >= MIN_PREEMPTIONS and e > 0:
        return (f"the cost of a preemption: {pm} measured, {pp} predicted, and the model "
                f"charges only their recomputed prefill")
    steps = {k: errors.get(k) for k in ("tbt_p50_s", "ttft_p50_s")
             if errors.get(k) is not None and abs(errors[k]) > tolerance}
    if not steps:
        return "the mix of prefill and decode (neither step time alone is off by more " \
               f"than {tolerance:.0%})"
    key = max(steps, key=lambda k: abs(steps[k]))
    where = f"; the simulated step is bound by {bound}" if bound else ""
    part = "the decode step (TBT P50)" if key == "tbt_p50_s" else \
        "the prefill and queueing (TTFT P50)"
    return (f"{part}: {predicted[key] * 1e3:.1f} ms predicted, {measured[key] * 1e3:.1f} ms "
            f"measured ({steps[key]:+.0%}){where}")


def calibrate_cell(record: dict, tolerance: float = TOLERANCE) -> CellCalibration | None:
    """The cell's calibration, or None when its record holds no usable prediction."""
    if not isinstance(record, dict):
        record = record.to_dict()
    prediction = record.get("prediction") or {}
    predicted = prediction.get("metrics")
    if record.get("status") != "ok" or not isinstance(predicted, dict):
        return None
    measured = measured_of(record.get("metrics") or {})
    errors = {k: error(predicted.get(k), measured.get(k)) for k, _ in COMPARED}
    share = prediction.get("bound_share") or {}
    bound = max(share, key=share.get) if share else None
    env = record.get("env") or {}
    return CellCalibration(
        cell_id=record["cell_id"], workload=record.get("workload") or "", kv=record["kv"],
        measured=measured, predicted={k: predicted.get(k) for k in measured},
        errors=errors, bound=bound, miss=diagnose(errors, measured, predicted, bound, tolerance),
        load=env.get("load_avg_1m_end"), hardware=prediction.get("hardware"))


def calibration(cells: list, tolerance: float = TOLERANCE) -> Calibration:
    """Every workload cell of a run with a prediction, and MAPE and r over them."""
    out, skipped = [], {}
    records = as_dicts(cells)
    for record in records:
        if record.get("kind") != "workload" or record.get("status") != "ok":
            continue
        cal = calibrate_cell(record, tolerance)
        if cal is None:
            prediction = record.get("prediction") or {}
            skipped[record["cell_id"]] = (prediction.get("skipped") or prediction.get("error")
                                          or "no prediction in the record")
            continue
        out.append(cal)
    pairs = [(c.predicted["output_tokens_per_s"], c.measured["output_tokens_per_s"])
             for c in out if c.throughput_error is not None]
    timed = estimate_pairs(records)
    source = next((r["prediction"]["calibration"] for r in records
                   if (r.get("prediction") or {}).get("calibration")), None)
    return Calibration(cells=out, mape=mape(pairs),
                       pearson_r=pearson_r([p for p, _ in pairs], [m for _, m in pairs]),
                       tolerance=tolerance, skipped=skipped, estimate_mape=mape(timed),
                       num_estimated=len(timed), record=source)


def estimate_pairs(records: list[dict]) -> list[tuple[float, float]]:
    """(estimated, actual) seconds of every cell the budget estimate timed."""
    out = []
    for r in records:
        est = r.get("estimate") or {}
        if r.get("status") == "ok" and est.get("estimate_s") and est.get("actual_s"):
            out.append((float(est["estimate_s"]), float(est["actual_s"])))
    return out
