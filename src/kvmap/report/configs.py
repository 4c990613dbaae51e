"""One ``ConfigSummary`` per KV configuration: the figures the map, the recommender and
the checklist compare, gathered from the configuration's cell records and request rows.

Definitions (``docs/report.md`` explains them for readers):

- ``peak_kv_bytes``: the largest ``peak_kv_resident_bytes`` of the configuration's cells
  (what must be provisioned for the worst job of the scenario);
- the *primary workload* is the scenario's workload with the most requests (the first on
  a tie); ``throughput_tok_s``, ``tbt_p99_s``... are its figures;
- ``accuracy_drop_pct`` is the worst drop over the accuracy tasks, each in percent: for
  ``ppl`` the relative rise in perplexity against the full cache (as the task stores it),
  for tasks with an ``accuracy`` the fall in percentage points against the baseline
  configuration's cell on the same samples (baseline: the model's dtype as the KV codec);
  a workload whose requests carry needle questions (``needle_accuracy``) counts as one
  more accuracy task, ``"<workload> (needle)"``, paired request by request;
- ``slo_measured``: for each SLA key, the worst value over the configuration's workloads
  (``measure_slo``); a bare key (``ttft``) is read at the 99th percentile of requests.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from kvmap.bench.summary import cell_metric
from kvmap.evals.stats import paired_delta

_SLO_KEY = re.compile(r"(ttft|tbt|tpot|e2e|queue)(?:_(mean|max|p\d+(?:\.\d+)?))?_s")
BARE_KEY_PERCENTILE = 99.0


@dataclass
class TaskResult:
    """One accuracy task of one configuration."""

    task: str
    kind: str                          # "ppl", "accuracy" or "other"
    value: float | None = None         # perplexity, or accuracy in [0, 1]
    drop_pct: float | None = None      # see the module docstring; None: not comparable
    drop_ci: tuple[float, float] | None = None
    grid: list[dict] = field(default_factory=list)   # retrieval: context x depth cells
    failed: bool = False


@dataclass
class ConfigSummary:
    """A KV configuration's figures; every field may be None where the run lacks it."""

    name: str
    kv: str = ""
    model: str = ""
    is_baseline: bool = False
    num_cells: int = 0
    num_failed: int = 0
    kv_bytes_per_token: float | None = None
    peak_kv_bytes: float | None = None
    primary_workload: str | None = None
    throughput_tok_s: float | None = None
    goodput_tok_s: float | None = None
    ttft_p99_s: float | None = None
    tbt_p50_s: float | None = None
    tbt_p99_s: float | None = None
    accuracy_drop_pct: float | None = None
    tasks: dict[str, TaskResult] = field(default_factory=dict)
    slo_measured: dict[str, float | None] = field(default_factory=dict)
    workloads: dict[str, dict] = field(default_factory=dict)     # name -> cell metrics
    rows: dict[str, list[dict]] = field(default_factory=dict)    # name -> request rows
    probes: dict = field(default_factory=dict)                   # bench.probes results
    tiers: dict[str, dict] = field(default_factory=dict)         # workload -> tier -> stats

    def measure(self, key: str) -> float | None:
        """One normalized SLA key: from ``slo_measured`` when there, else from the rows."""
        if key not in self.slo_measured:
            self.slo_measured[key] = measure_slo(self.rows, {key: 0.0})[key]
        return self.slo_measured[key]


# ---- SLA keys read from request rows ------------------------------------------------------

def split_key(key: str) -> tuple[str, str | None]:
    """``"ttft_p99_s"`` -> ``("ttft", "p99")``, ``"tpot_s"`` -> ``("tpot", None)``."""
    m = _SLO_KEY.fullmatch(key)
    if not m:
        raise ValueError(f"SLO key {key!r} is not normalized (e.g. 'ttft_p99_s'); "
                         "parse it with kvmap.metrics.parse_slo")
    return m.group(1), m.group(2)


def gaps(row: dict) -> list[float]:
    times = row.get("token_times_s") or []
    return [b - a for a, b in zip(times, times[1:])]


def _reduce(values: list[float], stat: str) -> float | None:
    if not values:
        return None
    if stat == "mean":
        return float(np.mean(values))
    if stat == "max":
        return float(np.max(values))
    return float(np.percentile(values, float(stat[1:])))


def _per_request(row: dict, metric: str) -> float | None:
    """One request's value of a bare key (as ``meets_slo``: TBT is its worst gap, TPOT of
    a one-token request is 0)."""
    if metric == "tbt":
        return max(gaps(row), default=0.0)
    if metric == "tpot":
        return row.get("tpot_s") or 0.0
    return row.get(f"{metric}_s")


def measure_key(rows: Iterable[dict], key: str) -> float | None:
    """The measured value of one normalized SLA key over ``rows`` (failed rows left out;
    TBT statistics pool every gap of every request)."""
    metric, stat = split_key(key)
    done = [r for r in rows if not r.get("failed")]
    if stat is None:
        values = [v for v in (_per_request(r, metric) for r in done) if v is not None]
        return _reduce(values, f"p{BARE_KEY_PERCENTILE:g}")
    if metric == "tbt":
        values = [g for r in done for g in gaps(r)]
    else:
        values = [r.get(f"{metric}_s") for r in done]
        values = [v for v in values if v is not None]
    return _reduce(values, stat)


def measure_slo(rows_by_workload: dict[str, list[dict]], slo: dict[str, float]
                ) -> dict[str, float | None]:
    """Key -> worst value over the workloads (None when no workload measured it)."""
    out: dict[str, float | None] = {}
    for key in slo:
        values = [measure_key(rows, key) for rows in rows_by_workload.values()]
        values = [v for v in values if v is not None]
        out[key] = max(values) if values else None
    return out


def is_good(row: dict, slo: dict[str, float]) -> bool:
    """Whether one request meets every SLA key read for that request alone (a ``_pNN``
    key bounds that percentile of its own gaps; queue keys bound its queueing time)."""
    if row.get("failed"):
        return False
    for key, limit_s in slo.items():
        metric, stat = split_key(key)
        if metric == "tbt" and stat is not None:
            value = _reduce(gaps(row), stat) or 0.0
        else:
            value = _per_request(row, metric)
        if value is None or value > limit_s:
            return False
    return True


# ---- building the summaries ---------------------------------------------------------------

def primary_workload(cells: list[dict]) -> str | None:
    """The workload with the most requests (first in scenario order on a tie)."""
    sizes: dict[str, int] = {}
    for c in cells:
        if c.get("workload"):
            n = cell_metric(c, "num_requests") or 0
            sizes[c["workload"]] = max(sizes.get(c["workload"], 0), n)
    return max(sizes, key=lambda w: sizes[w]) if sizes else None


def _task_result(cell: dict, baseline: dict | None) -> TaskResult:
    name, m = cell["task"], cell.get("metrics") or {}
    if cell["status"] != "ok":
        return TaskResult(name, "other", failed=True)
    if m.get("ppl") is not None:
        ci = m.get("delta_ppl_pct")
        return TaskResult(name, "ppl", m["ppl"], m.get("ppl_delta_pct"),
                          (ci["ci_low"], ci["ci_high"]) if isinstance(ci, dict) else None)
    if m.get("accuracy") is not None:
        result = TaskResult(name, "accuracy", m["accuracy"], grid=list(m.get("grid") or []))
        if baseline is not None and baseline["status"] == "ok":
            if baseline is cell:
                result.drop_pct, result.drop_ci = 0.0, (0.0, 0.0)
                return result
            # per_sample: records with "correct" (the record contract), or older plain values
            mine, theirs = ([s["correct"] if isinstance(s, dict) else s
                             for s in (c.get("details") or {}).get("per_sample") or []]
                            for c in (cell, baseline))
            if mine and theirs and len(mine) == len(theirs):
                d = paired_delta(theirs, mine)      # baseline - this: a drop is positive
                result.drop_pct = 100.0 * d["mean"]
                result.drop_ci = (100.0 * d["ci_low"], 100.0 * d["ci_high"])
            elif cell_metric(baseline, "accuracy") is not None:
                result.drop_pct = 100.0 * (cell_metric(baseline, "accuracy") - m["accuracy"])
        return result
    return TaskResult(name, "other")


def _needle_result(cell: dict, baseline: dict | None, rows: list[dict],
                   baseline_rows: list[dict]) -> TaskResult:
    """A workload with needle questions (``needle_accuracy``): an accuracy task whose
    samples are its requests, paired with the baseline's by request id; its grid is
    prompt length x needle depth."""
    name = f"{cell['workload']} (needle)"
    result = TaskResult(name, "accuracy", cell_metric(cell, "needle_accuracy"))
    judged = [r for r in rows if r.get("correct") is not None]
    cells: dict[tuple[int, float], list[bool]] = {}
    for r in judged:
        key = (int(r.get("num_prompt_tokens") or 0), round(float(r.get("needle_depth") or 0), 2))
        cells.setdefault(key, []).append(bool(r["correct"]))
    result.grid = [{"context_tokens": n, "depth": d, "accuracy": sum(v) / len(v), "n": len(v)}
                   for (n, d), v in sorted(cells.items())]
    if baseline is None:
        return result
    if baseline is cell:
        result.drop_pct, result.drop_ci = 0.0, (0.0, 0.0)
        return result
    theirs = {r["request_id"]: r["correct"] for r in baseline_rows
              if r.get("correct") is not None}
    pairs = [(float(theirs[r["request_id"]]), float(r["correct"])) for r in judged
             if r["request_id"] in theirs]
    if pairs:
        d = paired_delta([b for b, _ in pairs], [m for _, m in pairs])
        result.drop_pct = 100.0 * d["mean"]
        result.drop_ci = (100.0 * d["ci_low"], 100.0 * d["ci_high"])
    return result


def summarize(cells: list[dict], rows_by_cell: dict[str, list[dict]],
              slo: dict[str, float] | None = None) -> list[ConfigSummary]:
    """One summary per (model, kv), in scenario order."""
    slo = slo or {}
    primary = primary_workload(cells)
    groups: dict[tuple[str, str], list[dict]] = {}
    for c in cells:
        groups.setdefault((c["model"], c["kv"]), []).append(c)
    several_models = len({m for m, _ in groups}) > 1
    base_workloads = {(m, c["workload"]): c for (m, kv), cs in groups.items() for c in cs
                      if c.get("workload") and c["status"] == "ok" and kv == c.get("dtype")}
    baselines = {(m, c["task"]): c for (m, kv), cs in groups.items() for c in cs
                 if c.get("task") and kv == c.get("dtype")}
    out = []
    for (model, kv), group in groups.items():
        ok = [c for c in group if c["status"] == "ok"]
        s = ConfigSummary(name=f"{model}: {kv}" if several_models else kv, kv=kv,
                          model=model, is_baseline=kv == group[0].get("dtype"),
                          num_cells=len(group), num_failed=len(group) - len(ok),
                          primary_workload=primary)
        s.kv_bytes_per_token = next((cell_metric(c, "kv_bytes_per_token") for c in ok
                                     if cell_metric(c, "kv_bytes_per_token")), None)
        peaks = [cell_metric(c, "peak_kv_resident_bytes") for c in ok]
        peaks = [p for p in peaks if isinstance(p, (int, float))]
        s.peak_kv_bytes = max(peaks) if peaks else None
        for c in ok:
            if c.get("workload"):
                s.workloads[c["workload"]] = c["metrics"]
                s.rows[c["workload"]] = rows_by_cell.get(c["cell_id"], [])
                if c["metrics"].get("tiers"):
                    s.tiers[c["workload"]] = c["metrics"]["tiers"]
                if c["metrics"].get("probes") and not s.probes:
                    s.probes = c["metrics"]["probes"]
        for c in group:
            if c.get("task"):
                s.tasks[c["task"]] = _task_result(c, baselines.get((model, c["task"])))
            elif c["status"] == "ok" and cell_metric(c, "needle_accuracy") is not None:
                base = base_workloads.get((model, c["workload"]))
                s.tasks[f"{c['workload']} (needle)"] = _needle_result(
                    c, base, rows_by_cell.get(c["cell_id"], []),
                    rows_by_cell.get(base["cell_id"], []) if base else [])
        drops = [t.drop_pct for t in s.tasks.values() if t.drop_pct is not None]
        s.accuracy_drop_pct = max(drops) if drops else None
        main = s.workloads.get(primary) if primary else None
        if main:
            s.throughput_tok_s = main.get("output_tokens_per_s")
            s.ttft_p99_s = (main.get("ttft_s") or {}).get("p99")
            s.tbt_p50_s = (main.get("tbt_s") or {}).get("p50")
            s.tbt_p99_s = (main.get("tbt_s") or {}).get("p99")
            rows, duration = s.rows.get(primary, []), main.get("duration_s")
            if rows and duration:
                good = sum(r.get("num_output_tokens") or 0 for r in rows if is_good(r, slo))
                s.goodput_tok_s = good / duration
        s.slo_measured = measure_slo(s.rows, slo)
        out.append(s)
    return out
