"""Per-sample comparisons of a task cell with the baseline's: accuracy intervals, the
negative-sample rate and output-length inflation.

``details.per_sample`` is a list of dicts with a stable ``sample_id`` (the record
contract, docs/report.md); older runs store one float per sample, paired by position.
Samples are joined by id, so a sample missing from one side is left out of the pair:

    baseline  {s0: right, s1: right, s2: wrong, s3: right}
    config    {s0: right, s1: wrong, s2: right, s3: wrong}
    negative  s1, s3 (baseline right, config wrong)  ->  rate 2/4, Wilson interval

Pure functions over plain dicts; intervals are 95%.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvmap.runs.record import CellRecord
from kvmap.evals.stats import bootstrap_mean_ci, paired_delta

Z95 = 1.959963984540054


def wilson(num_successes: float, num_trials: int, z: float = Z95) -> tuple[float, float] | None:
    """Wilson score interval of a proportion (Wilson, JASA 1927), or None with no trials:

        centre = (p + z^2/2n) / (1 + z^2/n)
        half   = z / (1 + z^2/n) * sqrt(p(1-p)/n + z^2/4n^2)
    """
    if num_trials <= 0:
        return None
    n, p = float(num_trials), num_successes / num_trials
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def per_sample(cell: CellRecord | None) -> list[Any]:
    if not cell:
        return []
    return cell.per_sample


def _value(sample: Any, key: str) -> float | None:
    if isinstance(sample, dict):
        v = sample.get(key)
        return None if v is None else float(v)
    return float(sample) if isinstance(sample, (int, float, bool)) else None


def joined(mine: list[Any], theirs: list[Any], key: str) -> list[tuple[float, float]]:
    """``[(baseline value, this value)]`` of the samples both sides have, joined by
    ``sample_id`` when the samples carry one, else by position (equal lengths only)."""
    if mine and theirs and all(isinstance(s, dict) and "sample_id" in s for s in mine + theirs):
        base = {s["sample_id"]: _value(s, key) for s in theirs}
        pairs = [(base[s["sample_id"]], _value(s, key)) for s in mine if s["sample_id"] in base]
    elif len(mine) == len(theirs):
        pairs = [(_value(b, key), _value(m, key)) for b, m in zip(theirs, mine)]
    else:
        return []
    return [(b, m) for b, m in pairs if b is not None and m is not None]


@dataclass(frozen=True)
class Rate:
    """A share of samples with its 95% interval, out of ``num_samples``."""

    value: float
    ci: tuple[float, float] | None
    num_samples: int


def negative_rate(mine: list[Any], theirs: list[Any]) -> Rate | None:
    """Share of the joined samples the baseline gets right and this one gets wrong."""
    pairs = joined(mine, theirs, "correct")
    if not pairs:
        return None
    k = sum(1 for b, m in pairs if b >= 0.5 and m < 0.5)
    return Rate(k / len(pairs), wilson(k, len(pairs)), len(pairs))


def accuracy_drop(mine: list[Any], theirs: list[Any], seed: int = 0) -> dict[str, Any] | None:
    """Paired drop in points (baseline - this, x100) with its bootstrap interval."""
    pairs = joined(mine, theirs, "correct")
    if not pairs:
        return None
    d = paired_delta([b for b, _ in pairs], [m for _, m in pairs], seed=seed)
    return {"mean": 100.0 * d["mean"], "ci": (100.0 * d["ci_low"], 100.0 * d["ci_high"]),
            "n": len(pairs)}


def ppl_delta_pct(mine: list[Any], theirs: list[Any], seed: int = 0) -> dict[str, Any] | None:
    """Paired relative perplexity change in percent from per-sample ``nll_mean``:
    ``100 * (exp(mean NLL delta) - 1)``, the interval mapped the same way."""
    pairs = joined(mine, theirs, "nll_mean")
    if not pairs:
        return None
    d = paired_delta([m for _, m in pairs], [b for b, _ in pairs], seed=seed)
    return {"mean": 100.0 * math.expm1(d["mean"]),
            "ci": (100.0 * math.expm1(d["ci_low"]), 100.0 * math.expm1(d["ci_high"])),
            "n": len(pairs)}


@dataclass(frozen=True)
class Inflation:
    """Output length of a natural-stopping generation task against the baseline."""

    mean_tokens: float
    base_mean_tokens: float
    p90_tokens: float
    base_p90_tokens: float
    mean_pct: float                       # +12.0: 12% longer on average
    mean_ci: tuple[float, float] | None   # paired bootstrap of the per-sample difference
    e2e_pct: float | None                 # mean end-to-end latency change, percent
    num_samples: int

    @property
    def p90_pct(self) -> float:
        return _pct(self.p90_tokens, self.base_p90_tokens)


def _pct(a: float, b: float) -> float:
    return 100.0 * (a / b - 1) if b else 0.0


def has_lengths(samples: Sequence[Any]) -> bool:
    """Whether these are a natural-stopping generation task's samples (a length and
    why it stopped; a fixed-length task without ``finish_reason`` is not one)."""
    return bool(samples) and all(isinstance(s, dict) and "num_output_tokens" in s
                                 and "finish_reason" in s for s in samples)


def inflation(mine: list[Any], theirs: list[Any], seed: int = 0) -> Inflation | None:
    """Mean and P90 output tokens against the baseline's, on the joined samples; the
    mean's interval is the paired bootstrap of (this - baseline) relative to the
    baseline's mean; ``e2e_pct`` from ``e2e_s`` where both sides have it."""
    pairs = joined(mine, theirs, "num_output_tokens")
    if not pairs:
        return None
    base = np.array([b for b, _ in pairs])
    this = np.array([m for _, m in pairs])
    base_mean = float(base.mean())
    ci = None
    if base_mean > 0:
        lo, hi = bootstrap_mean_ci(list(this - base), seed=seed)
        ci = (100.0 * lo / base_mean, 100.0 * hi / base_mean)
    e2e = joined(mine, theirs, "e2e_s")
    e2e_pct = (_pct(float(np.mean([m for _, m in e2e])), float(np.mean([b for b, _ in e2e])))
               if e2e else None)
    return Inflation(float(this.mean()), base_mean, float(np.percentile(this, 90)),
                     float(np.percentile(base, 90)), _pct(float(this.mean()), base_mean), ci,
                     e2e_pct, len(pairs))
