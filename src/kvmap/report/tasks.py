"""One accuracy task of one configuration against the baseline's cell of the same task:
its value with a 95% interval, the drop with its paired interval, the negative-sample
rate and, for a natural-stopping generation task, the output-length inflation.

Where the record carries the task's own interval (``accuracy_ci95``,
``ppl_delta_rel_ci95``, ``negative_rate_ci95``) it is used; otherwise the interval is
computed here from ``details.per_sample`` (Wilson for a share of samples, the paired
bootstrap of ``kvmap.evals.stats`` for a difference).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvmap.evals.stats import paired_delta
from kvmap.report import samples as S
from kvmap.report.endpoints import output_agreement, topk_figures
from kvmap.runs.record import CellRecord
from kvmap.runs.task_metrics import AccuracyMetrics, PplMetrics, interval


@dataclass
class TaskResult:
    """One accuracy task of one configuration."""

    task: str
    kind: str                          # "ppl", "accuracy", "generation" or "other"
    value: float | None = None         # perplexity, or accuracy in [0, 1]
    drop_pct: float | None = None      # perplexity rise %, or accuracy points lost
    drop_ci: tuple[float, float] | None = None
    grid: list[dict[str, Any]] = field(default_factory=list)  # retrieval: context x depth cells
    failed: bool = False
    value_ci: tuple[float, float] | None = None      # accuracy: Wilson (or the task's)
    num_samples: int | None = None
    negative: S.Rate | None = None
    inflation: S.Inflation | None = None
    topk: dict[str, Any] | None = None       # prompt_ppl: KL / top-1 over the returned top-k
    agreement: dict[str, Any] | None = None  # generation: exact match ... with the baseline outputs

    @property
    def distinguishable(self) -> bool | None:
        """Whether the drop's interval excludes 0 (None without an interval)."""
        if self.drop_ci is None or self.drop_ci[0] == self.drop_ci[1]:
            return None
        return not self.drop_ci[0] <= 0.0 <= self.drop_ci[1]


def _ppl(result: TaskResult, m: PplMetrics, mine: list[Any], theirs: list[Any],
         seed: int) -> None:
    if m.ppl_delta_rel is not None:                 # the contract's key: a fraction
        ci = interval(m.ppl_delta_rel_ci95)
        result.drop_pct = 100.0 * m.ppl_delta_rel
        result.drop_ci = (100.0 * ci[0], 100.0 * ci[1]) if ci else None
    elif m.ppl_delta_pct is not None:
        result.drop_pct, result.drop_ci = m.ppl_delta_pct, interval(m.delta_ppl_pct)
    if result.drop_ci is None and theirs:
        d = S.ppl_delta_pct(mine, theirs, seed)
        if d is not None:
            result.drop_ci = d["ci"]
            if result.drop_pct is None:
                result.drop_pct = d["mean"]


def _accuracy(result: TaskResult, cell: CellRecord, m: AccuracyMetrics,
              baseline: CellRecord | None, seed: int) -> None:
    mine = S.per_sample(cell)
    n = m.num_samples or m.n or len(mine) or None
    result.num_samples = n
    result.value_ci = interval(m.accuracy_ci95) or (
        S.wilson(round(m.accuracy * n), n) if n and m.accuracy is not None else None)
    if m.negative_rate is not None:
        result.negative = S.Rate(m.negative_rate, interval(m.negative_rate_ci95), n or 0)
    if baseline is None or baseline.status != "ok":
        return
    if baseline is cell:
        result.drop_pct, result.drop_ci = 0.0, (0.0, 0.0)
        return
    theirs = S.per_sample(baseline)
    d = S.accuracy_drop(mine, theirs, seed)
    base_accuracy = baseline.metric("accuracy")
    if d is not None:
        result.drop_pct, result.drop_ci = d["mean"], d["ci"]
    elif base_accuracy is not None and m.accuracy is not None:
        result.drop_pct = 100.0 * (base_accuracy - m.accuracy)
    if result.negative is None:
        result.negative = S.negative_rate(mine, theirs)


def task_result(cell: CellRecord, baseline: CellRecord | None, seed: int = 0) -> TaskResult:
    """The task of ``cell`` against ``baseline``'s cell of the same task, judged by the
    kind the record carries (``CellRecord.task_kind``)."""
    name, kind = cell.task or "", cell.task_kind or "other"
    if not cell.ok:
        return TaskResult(name, "other", failed=True)
    # only a headline kind's metrics are read (another kind is judged by its samples)
    m = cell.task_metrics if kind in ("ppl", "accuracy") else None
    mine = S.per_sample(cell)
    theirs = S.per_sample(baseline) if baseline is not None and baseline is not cell \
        and baseline.ok else []
    if isinstance(m, PplMetrics):
        result = TaskResult(name, "ppl", m.ppl, num_samples=len(mine) or None)
        if baseline is cell:
            result.drop_pct, result.drop_ci = 0.0, (0.0, 0.0)
        else:
            _ppl(result, m, mine, theirs, seed)
            result.topk = topk_figures(cell, baseline, seed)
    elif isinstance(m, AccuracyMetrics):
        result = TaskResult(name, "accuracy", m.accuracy, grid=list(m.grid or []))
        _accuracy(result, cell, m, baseline, seed)
    else:             # "generation" (natural stopping) is judged by length, below
        result = TaskResult(name, kind, num_samples=len(mine) or None)
    if S.has_lengths(mine) and S.has_lengths(theirs):
        result.inflation = S.inflation(mine, theirs, seed)
    result.agreement = output_agreement(cell, baseline, seed)
    return result


def needle_result(cell: CellRecord, baseline: CellRecord | None, rows: list[dict[str, Any]],
                  baseline_rows: list[dict[str, Any]]) -> TaskResult:
    """A workload with needle questions (``needle_accuracy``): an accuracy task whose
    samples are its requests, paired with the baseline's by request id; its grid is
    prompt length x needle depth."""
    name = f"{cell.workload} (needle)"
    result = TaskResult(name, "accuracy", cell.metric("needle_accuracy"))
    judged = [r for r in rows if r.get("correct") is not None]
    cells: dict[tuple[int, float], list[bool]] = {}
    for r in judged:
        key = (int(r.get("num_prompt_tokens") or 0), round(float(r.get("needle_depth") or 0), 2))
        cells.setdefault(key, []).append(bool(r["correct"]))
    result.grid = [{"context_tokens": n, "depth": d, "accuracy": sum(v) / len(v), "n": len(v)}
                   for (n, d), v in sorted(cells.items())]
    result.num_samples = len(judged) or None
    if judged:
        result.value_ci = S.wilson(sum(bool(r["correct"]) for r in judged), len(judged))
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
        k = sum(1 for b, m in pairs if b >= 0.5 and m < 0.5)
        result.negative = S.Rate(k / len(pairs), S.wilson(k, len(pairs)), len(pairs))
    return result
