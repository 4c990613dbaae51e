"""The metrics of a task cell, typed per kind (``CellRecord.task_kind``): ``PplMetrics``
(perplexity against the full cache), ``AccuracyMetrics`` (a share of samples right:
passkey, needle, mc, qa), ``GenerationMetrics`` (natural stopping: output lengths), and
``TaskMetrics`` for any other kind -- each with the pool and memory figures every task
cell writes. ``task_metrics(record)`` picks the type by the record's kind; keys a type
does not name stay in ``extra`` (``runs.payload.view``). ``docs/evals.md`` defines them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

from kvmap.runs.payload import view


def interval(value: Any) -> tuple[float, float] | None:
    """An interval as a task writes it -- ``[lo, hi]`` or ``{"ci_low", "ci_high"}`` --
    as a pair; None where it is absent or open."""
    if isinstance(value, dict) and value.get("ci_low") is not None \
            and value.get("ci_high") is not None:
        return float(value["ci_low"]), float(value["ci_high"])
    if isinstance(value, (list, tuple)) and len(value) == 2 and None not in value:
        return float(value[0]), float(value[1])
    return None


@dataclass(frozen=True)
class TaskMetrics:
    """What every task cell writes beside its headline: the pool, the memory, the time."""

    num_samples: int | None = None
    baseline_kv: str | None = None
    peak_kv_resident_bytes: float | None = None
    kv_bytes_peak: float | None = None
    kv_bytes_per_token: float | None = None
    kv_bytes_per_block: int | None = None
    kv_block_size: int | None = None
    kv_capacity_bytes: int | None = None
    kv_capacity_tokens: int | None = None
    kv_budget_tokens_bf16: int | None = None
    num_kv_blocks: int | None = None
    weight_bytes: int | None = None
    peak_rss_bytes: int | None = None
    device_peak_bytes: int | None = None
    model_load_s: float | None = None
    wall_s: float | None = None
    endpoint: dict[str, Any] | None = None
    kv_memory_note: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PplMetrics(TaskMetrics):
    """Perplexity, its change against the full cache (``ppl_delta_rel``: a fraction, with
    its interval), and the token-level agreement with the baseline's distribution."""

    ppl: float | None = None
    nll_mean: float | None = None
    num_tokens_scored: int | None = None
    ppl_definition: str | None = None
    ppl_baseline: float | None = None
    ppl_delta_pct: float | None = None
    delta_ppl_pct: Any = None              # an interval: [lo, hi] or {ci_low, ci_high}
    delta_nll: Any = None
    ppl_delta_rel: float | None = None
    ppl_delta_rel_ci95: Any = None         # an interval, either form (``interval``)
    kl_mean: float | None = None
    kl_p99: float | None = None
    top1_agreement: float | None = None
    top1_agreement_ties: float | None = None
    baseline_tie_rate: float | None = None


@dataclass(frozen=True)
class AccuracyMetrics(TaskMetrics):
    """A share of samples answered right, with its interval and per-cell grid (retrieval:
    context length x depth), and the negative-sample rate where the task measures it."""

    accuracy: float | None = None
    accuracy_ci95: Any = None              # an interval, either form
    n: int | None = None
    grid: list[dict[str, Any]] | None = None
    num_prompt_tokens: int | None = None
    num_cached_prompt_tokens: int | None = None
    negative_rate: float | None = None
    negative_rate_ci95: Any = None


@dataclass(frozen=True)
class GenerationMetrics(TaskMetrics):
    """A natural-stopping generation: output lengths and how often it stopped itself."""

    output_tokens_mean: float | None = None
    output_tokens_p90: float | None = None
    natural_stop_rate: float | None = None
    natural_stop_rate_ci95: Any = None
    e2e_s_mean: float | None = None
    e2e_s_p90: float | None = None


AnyTaskMetrics = Union[PplMetrics, AccuracyMetrics, GenerationMetrics, TaskMetrics]
KINDS: dict[str, type[TaskMetrics]] = {"ppl": PplMetrics, "accuracy": AccuracyMetrics,
                                       "generation": GenerationMetrics}


def task_metrics(record: Any) -> AnyTaskMetrics:
    """The metrics of task cell ``record`` (a ``CellRecord``) as its kind's type."""
    cls = KINDS.get(record.task_kind or "", TaskMetrics)
    return view(cls, record.metrics, f"metrics of task cell {record.cell_id!r}")
