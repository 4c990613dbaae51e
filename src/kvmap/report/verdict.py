"""The verdict on the map: per deployment, whether each KV configuration is a speed gain,
a capacity gain, slower, no different, or undecided on the hardware the run measured --
one computed sentence each, and only what the evidence decides.

For a workload and a model, the baseline is the cell whose KV codec is the model's
dtype (as the configuration table takes it). For every other configuration:

- *speed*: its output throughput over the baseline's, with an interval
  ``[lo_a / hi_b, hi_a / lo_b]`` from the two cells' throughput intervals
  (:func:`kvmap.report.noise.throughput_ci`): ``faster`` when the interval lies above 1,
  ``slower`` below, ``no difference within +-EQUIVALENCE`` when it lies inside that band,
  else ``undecided`` (with the requests that would narrow it enough, from the interval's
  width shrinking as one over the square root of the sample). A cell of fewer than
  ``MIN_REQUESTS`` requests, or without an interval, decides nothing;
- *capacity*: the sequences it ran on average over the baseline's (the most at once
  where a record lacks the mean), a gain above ``1 + CAPACITY_MARGIN``, counted only
  when both cells ran at least ``MIN_REQUESTS`` requests;
- *why*, from the stored predictions: the resource that takes most of the predicted step
  time (``prediction.bound_share``: the same word as the calibration table's bound
  column), the bytes a decode step reads, and the share of the predicted time the codec's
  own operators take; the ridge clause (each more sequence shares the weights' read) only
  where it is the reason: a speed gain from more sequences on a weight-bound step;
- beside it, the same ratio simulated on the GPU the prediction names, labelled with
  the GPU profile's own words (spec sheet x assumed efficiency).

Records only: the predictions were stored at bench time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvmap.report.noise import throughput_ci
from kvmap.runs.cell_payloads import GpuPrediction, Prediction, Roofline
from kvmap.runs.record import CellRecord

CAPACITY_MARGIN = 0.10
EQUIVALENCE = 0.05               # "no difference" when the interval lies within +-5%
MIN_REQUESTS = 4                 # fewer requests in a cell decide nothing
CODEC_SHARE_NOTED = 0.10
BOUND_WORDS = {"compute": "matrix products (compute-bound)",
               "hbm": "memory reads (weight- and KV-read-bound)",
               "kv_codec": "the KV codec's own operators", "overhead": "per-step overhead",
               "interconnect": "interconnect"}


@dataclass(frozen=True)
class Verdict:
    workload: str
    kv: str
    baseline: str
    kind: str                      # speed gain | capacity gain | capacity gain, slower |
    #                                slower | no difference | undecided
    sentence: str
    measured_ratio: float | None
    measured_ci: tuple[float, float] | None
    predicted_ratio: float | None
    concurrency_ratio: float | None
    gpu: str | None = None
    gpu_ratio: float | None = None
    gpu_label: str | None = None
    speed: str = "undecided"       # faster | slower | no difference | undecided
    would_need: int | None = None  # requests a cell that would decide the speed


def _mb(num_bytes: float) -> str:
    return f"{num_bytes / 1e6:,.0f} MB" if num_bytes >= 1e6 else f"{num_bytes / 1e3:,.0f} kB"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _predicted(p: Prediction | None, gpu: bool = False) -> float | None:
    """The predicted output tokens/s of prediction ``p`` (on the GPU beside with ``gpu``)."""
    metrics = (p.gpu.metrics if p.gpu else None) if gpu and p else p.metrics if p else None
    return metrics.output_tokens_per_s if metrics else None


def _codec_share(p: Prediction | None) -> float | None:
    return p.codec_share() if p else None


def speed_of(ci: tuple[float, float] | None, n: int | None) -> tuple[str, int | None]:
    """``(faster | slower | no difference | undecided, requests that would decide)``."""
    if ci is None or not n or n < MIN_REQUESTS:
        return "undecided", None
    lo, hi = ci
    if lo > 1:
        return "faster", None
    if hi < 1:
        return "slower", None
    if lo >= 1 - EQUIVALENCE and hi <= 1 + EQUIVALENCE:
        return "no difference", None
    # the interval must shrink into the band: its half-width to EQUIVALENCE
    half = max(hi - 1, 1 - lo)
    return "undecided", math.ceil(n * (half / EQUIVALENCE) ** 2)


def classify(speed: str, capacity: float | None) -> str:
    """speed gain | capacity gain | capacity gain, slower | slower | no difference |
    undecided (module docstring)."""
    more = capacity is not None and capacity > 1 + CAPACITY_MARGIN
    if speed == "faster":
        return "speed gain"
    if more:
        return "capacity gain, slower" if speed == "slower" else "capacity gain"
    if speed == "slower":
        return "slower"
    return "no difference" if speed == "no difference" else "undecided"


def reasons(prediction: Prediction | None, base_prediction: Prediction | None,
            running: float | None, base_kv: str, machine: str, kind: str,
            capacity: float | None) -> list[str]:
    """Why, in clauses, from the stored predictions of a configuration and its baseline
    (empty without them); ``running``: the configuration's most sequences at once."""
    roof = base_prediction.roofline if base_prediction else Roofline()
    out = []
    share = (prediction.bound_share if prediction else None) or {}
    bound = max(share, key=lambda k: share[k]) if share else None
    if bound:
        out.append(f"its predicted step time is mostly {BOUND_WORDS.get(bound, bound)} "
                   f"({share[bound]:.0%}) on {machine}")
    if roof.weight_bytes and roof.kv_capacity_bytes:
        out.append(f"a decode step reads {_mb(roof.weight_bytes)} of weights and at most "
                   f"{_mb(roof.kv_capacity_bytes)} of KV")
    ridge = roof.ridge_num_seqs
    if kind == "speed gain" and capacity and capacity > 1 + CAPACITY_MARGIN and ridge \
            and running and running < ridge and bound in (None, "hbm"):
        out.append(f"below {ridge} sequences each more sequence shares the read of the "
                   "weights")
    codec, base_codec = _codec_share(prediction), _codec_share(base_prediction)
    if codec is not None and base_codec is not None and codec - base_codec > CODEC_SHARE_NOTED:
        out.append(f"its codec's own operators take {codec:.0%} of the predicted time "
                   f"({base_codec:.0%} with {base_kv})")
    return out


def _headline(kind: str, kv: str, capacity: float | None, how: str, speed: str,
              would_need: int | None) -> str:
    more = f"{capacity:.1f}x the sequences running {how}" if capacity else ""
    undecided = "its speed is undecided at this power" + (
        f" (about {would_need} requests a cell would decide it)" if would_need else
        " (too few requests, or no interval)")
    return {
        "speed gain": f"{kv} is a speed gain here" + (f" ({more})" if more else ""),
        "capacity gain": f"{kv} is a capacity gain here ({more}); " + (
            f"its speed is no different within +-{EQUIVALENCE:.0%}"
            if speed == "no difference" else undecided),
        "capacity gain, slower": f"{kv} is a capacity gain here at a speed cost ({more})",
        "slower": f"{kv} is slower here and holds no more sequences",
        "no difference": f"{kv} makes no difference here within +-{EQUIVALENCE:.0%} in speed "
                         "and holds no more sequences",
        "undecided": f"{kv} is undecided here: {undecided}",
    }[kind]


def _name(record: CellRecord) -> str:
    """The configuration and, for one load level of several, the level."""
    q, label = record.quantization, record.load_label
    return (f"{q} weights + " if q else "") + record.kv + (f" at {label}" if label else "")


def verdict(record: CellRecord, base: CellRecord, rows: list[dict[str, Any]] | None = None,
            base_rows: list[dict[str, Any]] | None = None) -> Verdict:
    """The verdict of ``record``'s configuration against ``base`` (the same workload)."""
    m, mb = record.workload_metrics, base.workload_metrics
    p, pb = record.cell_prediction, base.cell_prediction      # each record read once
    ratio = _ratio(m.output_tokens_per_s, mb.output_tokens_per_s)
    a, b = throughput_ci(m, rows or []), throughput_ci(mb, base_rows or [])
    ci = (a[0] / b[1], a[1] / b[0]) if a and b and b[0] > 0 else None
    # capacity: sequences running on average when both cells say (a pool that preempts
    # admits many at first and keeps few), else at most
    on_mean = bool(m.concurrency_mean and mb.concurrency_mean)
    n = min(m.num_requests or 0, mb.num_requests or 0)
    capacity = (_ratio(m.concurrency_mean, mb.concurrency_mean) if on_mean else
                _ratio(m.concurrency_max, mb.concurrency_max)) if n >= MIN_REQUESTS else None
    predicted = _ratio(_predicted(p), _predicted(pb))
    speed, would_need = speed_of(ci, n)
    kind = classify(speed, capacity)
    machine_class = record.cell_env.machine_class
    machine = f"this machine ({machine_class})" if machine_class else "this machine"
    why = reasons(p, pb, m.concurrency_max, base.kv, machine, kind, capacity)
    figures = []
    if predicted is not None:
        figures.append(f"predicted {predicted:.2f}x")
    if ratio is not None:
        figures.append(f"measured {ratio:.2f}x" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""))
    sentence = _headline(kind, _name(record), capacity,
                         "on average" if on_mean else "at once", speed,
                         would_need)
    sentence += (": " + ", and ".join(why) if why else "") + \
        ("; " + ", ".join(figures) if figures else "") + "."
    gpu = (p.gpu if p else None) or GpuPrediction()
    gpu_ratio = _ratio(_predicted(p, gpu=True), _predicted(pb, gpu=True))
    return Verdict(workload=record.workload or "", kv=record.kv, baseline=base.kv,
                   kind=kind, sentence=sentence, measured_ratio=ratio, measured_ci=ci,
                   predicted_ratio=predicted, concurrency_ratio=capacity,
                   gpu=gpu.name, gpu_ratio=gpu_ratio, gpu_label=gpu.hardware,
                   speed=speed, would_need=would_need)


def _is_baseline(c: CellRecord) -> bool:
    return c.kv == c.dtype and not c.quantization


def verdicts(cells: list[CellRecord],
             rows_by_cell: dict[str, list[dict[str, Any]]] | None = None
             ) -> dict[str, list[Verdict]]:
    """Workload -> one verdict per non-baseline configuration of each model (cells that
    ran ok; a workload without a baseline cell has none)."""
    rows_by_cell = rows_by_cell or {}
    ok = [c for c in cells if c.kind == "workload" and c.ok]
    out: dict[str, list[Verdict]] = {}
    for c in ok:
        if _is_baseline(c):
            continue
        base = next((b for b in ok if b.workload == c.workload and b.model == c.model
                     and _is_baseline(b) and b.load == c.load), None)
        if base is None:
            continue
        out.setdefault(c.workload or "", []).append(verdict(
            c, base, rows_by_cell.get(c.cell_id), rows_by_cell.get(base.cell_id)))
    return out


def gpu_sentence(v: Verdict) -> str | None:
    """The same configuration on the prediction's GPU, with its label."""
    if v.gpu is None or v.gpu_ratio is None:
        return None
    return f"On {v.gpu_label or v.gpu}: predicted {v.gpu_ratio:.2f}x {v.baseline}'s throughput."
