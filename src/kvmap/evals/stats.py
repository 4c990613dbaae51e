"""Paired comparisons against the baseline: per-sample deltas and bootstrap intervals.

Every accuracy task runs the same samples (same text, same seed) through the baseline
cache and through each configuration, so sample i of one run pairs with sample i of the
other. The question "is this configuration worse?" is then about the mean of the
per-sample differences ``value[i] - baseline[i]``, and the percentile bootstrap
(Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13) gives its interval:

    deltas d_0 .. d_{n-1}
    resample n indices with replacement, B times  ->  B means of d
    interval = the (1-c)/2 and (1+c)/2 quantiles of those B means

Pure functions over plain sequences; the randomness comes from ``seed`` alone, so the
same inputs always give the same interval. With few samples (n < ~10) the interval is
narrow-biased: read it as a rough guide, not a test.

Pass/fail rates (a task's accuracy, the negative-sample rate) get the Wilson score
interval (Wilson 1927; Brown, Cai & DasGupta 2001 recommend it over the normal
approximation, which collapses to a point at 0% and 100%):

    centre = (k + z^2/2) / (n + z^2)
    half   = z / (n + z^2) * sqrt(k (n - k) / n + z^2 / 4)          z = 1.96 for 95%
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

DEFAULT_NUM_RESAMPLES = 2000
DEFAULT_CONFIDENCE = 0.95


def paired_deltas(values: Sequence[float], baseline_values: Sequence[float]) -> list[float]:
    """``[values[i] - baseline_values[i]]``; ValueError when the lengths differ."""
    if len(values) != len(baseline_values):
        raise ValueError(f"paired samples differ in number: {len(values)} values vs "
                         f"{len(baseline_values)} baseline values")
    return [float(v) - float(b) for v, b in zip(values, baseline_values)]


def bootstrap_mean_ci(values: Sequence[float], *, seed: int = 0,
                      num_resamples: int = DEFAULT_NUM_RESAMPLES,
                      confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float]:
    """Percentile-bootstrap ``(low, high)`` interval of the mean of ``values``.

    One value gives ``(v, v)``; no values raise ValueError. Deterministic in ``seed``.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence!r} must be in (0, 1)")
    if not isinstance(num_resamples, int) or num_resamples < 1:
        raise ValueError(f"num_resamples={num_resamples!r} must be a positive integer")
    array = np.asarray(list(values), dtype=np.float64)
    if array.size == 0:
        raise ValueError("bootstrap_mean_ci needs at least one value")
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, array.size, size=(num_resamples, array.size))  # (B, n)
    means = array[indices].mean(axis=1)                                       # (B,)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def paired_delta(values: Sequence[float], baseline_values: Sequence[float], *,
                 seed: int = 0, num_resamples: int = DEFAULT_NUM_RESAMPLES,
                 confidence: float = DEFAULT_CONFIDENCE) -> dict:
    """Mean of the paired deltas with its bootstrap interval.

    Returns ``{"mean", "ci_low", "ci_high", "confidence", "n"}``; ``mean`` is
    ``mean(values) - mean(baseline_values)`` (the same as the mean of the deltas).
    """
    deltas = paired_deltas(values, baseline_values)
    low, high = bootstrap_mean_ci(deltas, seed=seed, num_resamples=num_resamples,
                                  confidence=confidence)
    return {"mean": float(np.mean(deltas)), "ci_low": low, "ci_high": high,
            "confidence": confidence, "n": len(deltas)}


def wilson_interval(num_successes: int, num_trials: int,
                    z: float = 1.959964) -> list[float]:
    """Wilson score interval ``[low, high]`` of a proportion ``num_successes / num_trials``
    (95% for the default ``z``); ValueError for no trials or a count out of range."""
    k, n = int(num_successes), int(num_trials)
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"wilson_interval({num_successes!r}, {num_trials!r}) needs "
                         f"0 <= successes <= trials and trials >= 1")
    denominator = n + z * z
    centre = (k + z * z / 2) / denominator
    half = z / denominator * math.sqrt(k * (n - k) / n + z * z / 4)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def accuracy_metrics(correct: Sequence[bool]) -> dict:
    """``accuracy`` with its Wilson ``accuracy_ci95``, ``num_samples`` (and ``n``, the
    older name of the same count)."""
    k, n = sum(correct), len(correct)
    return {"accuracy": k / n, "accuracy_ci95": wilson_interval(k, n), "num_samples": n,
            "n": n}


def paired_values(records: Sequence[dict], baseline_records: Sequence[dict], key: str
                  ) -> tuple[list[float], list[float]]:
    """``(values, baseline_values)`` of ``key``, paired by each record's ``sample_id``
    (in the order of ``records``); ValueError when the two runs' ids differ."""
    theirs = {r["sample_id"]: r for r in baseline_records}
    mine_ids = [r["sample_id"] for r in records]
    if sorted(map(str, mine_ids)) != sorted(map(str, theirs)):
        missing = sorted(set(map(str, mine_ids)) ^ set(map(str, theirs)))[:3]
        raise ValueError(f"paired samples differ: {len(records)} vs {len(theirs)} records, "
                         f"ids not in both: {missing}")
    return ([float(r[key]) for r in records],
            [float(theirs[r["sample_id"]][key]) for r in records])


def negative_rate(values: Sequence[float], baseline_values: Sequence[float]
                  ) -> tuple[float, list[float]]:
    """The negative-sample rate of paired pass/fail values: the share of all samples the
    baseline passes (1) and this configuration fails (0), with its Wilson interval.
    An average can hide them: gains elsewhere cancel these losses in the mean."""
    deltas = paired_deltas(values, baseline_values)
    if not deltas:
        raise ValueError("negative_rate needs at least one paired sample")
    k = sum(1 for v, b in zip(values, baseline_values) if b >= 0.5 > v)
    return k / len(deltas), wilson_interval(k, len(deltas))


def ratio_pct(delta: dict) -> dict:
    """A paired delta of log values (e.g. mean NLL, nats) as a relative change in percent.

    Perplexity is ``exp(mean NLL)``, so a delta d of mean NLL is a perplexity ratio of
    ``exp(d)``: returns the same keys with ``mean``, ``ci_low`` and ``ci_high`` mapped
    through ``100 * (exp(x) - 1)`` (monotonic, so the interval maps to an interval).
    """
    out = dict(delta)
    for key in ("mean", "ci_low", "ci_high"):
        out[key] = 100.0 * math.expm1(delta[key])
    return out
