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

from kvmap.runs.cell_payloads import PredictedMetrics
from kvmap.runs.record import CellRecord
from kvmap.runs.workload_metrics import WorkloadMetrics

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
        return self.errors["output_tokens_per_s"]


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


def measured_of(metrics: WorkloadMetrics) -> dict[str, float | None]:
    """The compared figures of a cell's measured ``metrics``."""
    return {"output_tokens_per_s": metrics.output_tokens_per_s,
            "ttft_p50_s": metrics.summary("ttft_s").p50,
            "tbt_p50_s": metrics.summary("tbt_s").p50,
            "concurrency_max": metrics.concurrency_max,
            "num_preemptions": metrics.num_preemptions_engine}


def predicted_of(metrics: PredictedMetrics) -> dict[str, float | None]:
    """The same figures as the simulator predicted them."""
    return {"output_tokens_per_s": metrics.output_tokens_per_s,
            "ttft_p50_s": metrics.ttft_p50_s, "tbt_p50_s": metrics.tbt_p50_s,
            "concurrency_max": metrics.concurrency_max,
            "num_preemptions": metrics.num_preemptions}


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


Figures = dict[str, float | None]


def diagnose(errors: Figures, measured: Figures, predicted: Figures, bound: str | None,
             tolerance: float = TOLERANCE) -> str | None:
    """The part of the step the model got wrong (the module docstring), or None when the
    throughput is within ``tolerance``."""
    e = errors["output_tokens_per_s"]
    if e is None or abs(e) <= tolerance:
        return None
    ec = errors["concurrency_max"]
    if ec is not None and abs(ec) > CONCURRENCY_TOLERANCE:
        return (f"the memory model: {predicted['concurrency_max']} sequences at once "
                f"predicted, {measured['concurrency_max']} measured")
    pm, pp = measured["num_preemptions"], predicted["num_preemptions"]
    if pm is not None and pp is not None and max(pm, pp) >= MIN_PREEMPTIONS \
            and max(pm, pp) >= 2 * min(pm, pp):
        return (f"the memory model: {pp} preemptions predicted, {pm} measured (sequences "
                f"evicted and their prefill recomputed)")
    if pm is not None and pm >= MIN_PREEMPTIONS and e > 0:
        return (f"the cost of a preemption: {pm} measured, {pp} predicted, and the model "
                f"charges only their recomputed prefill")
    steps = {k: v for k in ("tbt_p50_s", "ttft_p50_s")
             if (v := errors[k]) is not None and abs(v) > tolerance}
    if not steps:
        return "the mix of prefill and decode (neither step time alone is off by more " \
               f"than {tolerance:.0%})"
    key = max(steps, key=lambda k: abs(steps[k]))
    where = f"; the simulated step is bound by {bound}" if bound else ""
    part = "the decode step (TBT P50)" if key == "tbt_p50_s" else \
        "the prefill and queueing (TTFT P50)"
    return (f"{part}: {_ms(predicted[key])} predicted, {_ms(measured[key])} "
            f"measured ({steps[key]:+.0%}){where}")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def calibrate_cell(record: CellRecord, tolerance: float = TOLERANCE) -> CellCalibration | None:
    """The cell's calibration, or None when its record holds no usable prediction."""
    prediction = record.cell_prediction
    if not record.ok or prediction is None or prediction.metrics is None:
        return None
    measured = measured_of(record.workload_metrics)
    predicted = predicted_of(prediction.metrics)
    errors = {k: error(predicted[k], measured[k]) for k, _ in COMPARED}
    share = prediction.bound_share or {}
    bound = max(share, key=lambda k: share[k]) if share else None
    return CellCalibration(
        cell_id=record.cell_id, workload=record.workload or "", kv=record.kv,
        measured=measured, predicted=predicted, errors=errors, bound=bound,
        miss=diagnose(errors, measured, predicted, bound, tolerance),
        load=record.cell_env.load_avg_1m_end, hardware=prediction.hardware)


def calibration(cells: list[CellRecord], tolerance: float = TOLERANCE) -> Calibration:
    """Every workload cell of a run with a prediction, and MAPE and r over them."""
    out, skipped = [], {}
    for record in cells:
        if record.kind != "workload" or not record.ok:
            continue
        cal = calibrate_cell(record, tolerance)
        if cal is None:
            prediction = record.cell_prediction
            skipped[record.cell_id] = ((prediction.why_not if prediction else None)
                                       or "no prediction in the record")
            continue
        out.append(cal)
    pairs = [(p, m) for c in out
             if (p := c.predicted["output_tokens_per_s"]) is not None
             and (m := c.measured["output_tokens_per_s"]) is not None
             and c.throughput_error is not None]
    timed = estimate_pairs(cells)
    source = next((pred.calibration for r in cells
                   if (pred := r.cell_prediction) is not None and pred.calibration), None)
    return Calibration(cells=out, mape=mape(pairs),
                       pearson_r=pearson_r([p for p, _ in pairs], [m for _, m in pairs]),
                       tolerance=tolerance, skipped=skipped, estimate_mape=mape(timed),
                       num_estimated=len(timed), record=source)


def estimate_pairs(records: list[CellRecord]) -> list[tuple[float, float]]:
    """(estimated, actual) seconds of every cell the budget estimate timed."""
    out = []
    for r in records:
        est = r.cell_estimate
        if r.ok and est.estimate_s and est.actual_s:
            out.append((float(est.estimate_s), float(est.actual_s)))
    return out
