"""What a configuration is held to: the SLA, an accuracy budget and a KV memory budget
(``Constraints``), each checked against one configuration's figures (``check`` ->
``ConstraintCheck``: measured, limit, pass), and how those figures read (``fmt``,
``slo_text``). The recommender (``recommend.py``) picks among the configurations that
pass every check."""
from __future__ import annotations

from dataclasses import dataclass, field

from kvmap.config import format_bytes
from kvmap.report.configs import ConfigSummary


GOODPUT_FAIL_BELOW = 0.50      # goodput under half the throughput: the checklist's FAIL


@dataclass(frozen=True)
class Constraints:
    """The SLA (normalized keys -> seconds), the accuracy budget in percent (see
    ``configs``: perplexity rise or accuracy points lost, per task) and a KV byte budget."""

    slo: dict[str, float] = field(default_factory=dict)
    max_accuracy_drop_pct: float | None = None
    kv_budget_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.max_accuracy_drop_pct is not None and not self.max_accuracy_drop_pct >= 0:
            raise ValueError(f"max_accuracy_drop_pct={self.max_accuracy_drop_pct!r} must "
                             "be >= 0")
        if self.kv_budget_bytes is not None and not self.kv_budget_bytes > 0:
            raise ValueError(f"kv_budget_bytes={self.kv_budget_bytes!r} must be > 0")


@dataclass(frozen=True)
class ConstraintCheck:
    name: str                 # "ttft_p99_s", "accuracy_drop", "kv_budget"
    label: str                # human form: "TTFT P99 <= 2 s"
    measured: float | None
    limit: float
    ok: bool

    @property
    def shortfall(self) -> float:
        """How far past the limit, relative to it (0 when met, inf when not measured)."""
        if self.measured is None:
            return float("inf")
        if self.ok:
            return 0.0
        return (self.measured - self.limit) / self.limit if self.limit else self.measured

    def describe(self) -> str:
        return f"{self.label}: {fmt(self.name, self.measured)} (limit {fmt(self.name, self.limit)})"


def fmt(name: str, value: float | None) -> str:
    """A measured or limit value in its unit."""
    if value is None:
        return "not measured"
    if name == "kv_budget" or name == "peak_kv_bytes":
        return format_bytes(value)
    if name == "accuracy_drop":
        return f"{value:.2f}%"
    if name == "throughput_tok_s":
        return f"{value:.1f} tok/s"
    if name == "goodput_miss":
        return f"{value:.0%}"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _slo_label(key: str) -> str:
    parts = key[:-2].split("_")                       # "ttft_p99_s" -> ["ttft", "p99"]
    metric = parts[0].upper()
    stat = parts[1].upper() if len(parts) > 1 else "P99 of requests"
    return f"{metric} {stat}"


def slo_text(slo: dict[str, float]) -> str:
    """``{"ttft_p99_s": 10.0}`` -> ``"TTFT P99 <= 10.00 s"`` (empty for no SLA)."""
    return ", ".join(f"{_slo_label(k)} <= {fmt(k, v)}" for k, v in slo.items())


def check(config: ConfigSummary, constraints: Constraints,
          dropped: set[str] | frozenset[str] = frozenset()) -> list[ConstraintCheck]:
    """Every constraint against one configuration (``dropped``: names not checked; a run
    ranked by SLA capacity drops ``goodput_miss``: its headline level is the saturated
    one, past the capacity by design, and the capacity itself is the SLA's answer)."""
    out = []
    for key, limit in constraints.slo.items():
        measured = config.measure(key)
        out.append(ConstraintCheck(key, f"{_slo_label(key)} <= {fmt(key, limit)}", measured,
                                   limit, measured is not None and measured <= limit))
    if constraints.slo and config.goodput_tok_s is not None and config.throughput_tok_s \
            and "goodput_miss" not in dropped:
        # its own goodput check (the checklist's): a configuration whose output mostly
        # misses the SLA on its primary workload is never the recommendation
        miss = 1 - config.goodput_tok_s / config.throughput_tok_s
        out.append(ConstraintCheck("goodput_miss", "output outside the SLA <= "
                                   f"{1 - GOODPUT_FAIL_BELOW:.0%}", miss,
                                   1 - GOODPUT_FAIL_BELOW, miss <= 1 - GOODPUT_FAIL_BELOW))
    if constraints.max_accuracy_drop_pct is not None and "accuracy_drop" not in dropped:
        limit = constraints.max_accuracy_drop_pct
        measured = 0.0 if config.is_baseline and config.accuracy_drop_pct is None \
            else config.accuracy_drop_pct
        out.append(ConstraintCheck("accuracy_drop", f"accuracy drop <= {limit:g}%", measured,
                                   limit, measured is not None and measured <= limit))
    if constraints.kv_budget_bytes is not None:
        limit = constraints.kv_budget_bytes
        out.append(ConstraintCheck("kv_budget", f"peak KV <= {format_bytes(limit)}",
                                   config.peak_kv_bytes, limit,
                                   config.peak_kv_bytes is not None
                                   and config.peak_kv_bytes <= limit))
    return out
