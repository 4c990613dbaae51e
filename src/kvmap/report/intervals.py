"""Confidence intervals of latency statistics, by a percentile bootstrap over requests.

A request is the unit that is sampled: its values (one TTFT, or all of its token gaps)
stay together when resampling, so a long request's many gaps are not treated as
independent draws (a cluster bootstrap):

    requests r_0 .. r_{n-1}, each with values v(r)
    B times: draw n requests with replacement, pool their values, take the statistic
    interval = the (1-c)/2 and (1+c)/2 quantiles of those B statistics

Pure and deterministic in ``seed``. With few requests (n < ~10) the interval is narrow
and rough; with one request it has zero width.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

DEFAULT_NUM_RESAMPLES = 1000
DEFAULT_CONFIDENCE = 0.95
METHOD = (f"percentile bootstrap over requests ({DEFAULT_NUM_RESAMPLES} resamples, "
          f"{DEFAULT_CONFIDENCE:.0%})")


def statistic(name: str) -> Callable[[np.ndarray], float]:
    """``"mean"``, ``"max"`` or ``"pNN"`` as a function of a 1-D array."""
    if name == "mean":
        return lambda a: float(a.mean())
    if name == "max":
        return lambda a: float(a.max())
    if name.startswith("p"):
        q = float(name[1:])
        if not 0 <= q <= 100:
            raise ValueError(f"statistic {name!r}: percentile must be in [0, 100]")
        return lambda a: float(np.percentile(a, q))
    raise ValueError(f"statistic {name!r} is not mean, max or pNN")


def bootstrap_ci(groups: Sequence[Sequence[float]], stat: str, *, seed: int = 0,
                 num_resamples: int = DEFAULT_NUM_RESAMPLES,
                 confidence: float = DEFAULT_CONFIDENCE) -> dict[str, float] | None:
    """``{"value", "ci_low", "ci_high"}`` of ``stat`` over the pooled values of ``groups``
    (one group per request), or None when there are no values.

    A resample is a count per request (how often it was drawn); the pooled sample is then
    every value repeated by its request's count, so each statistic is computed from the
    sorted values and cumulative counts without building the pooled arrays:

        sorted values  v_0 <= v_1 <= ... (owner: the request each came from)
        weights        w_j = count[owner_j];  cum_j = w_0 + ... + w_j
        rank k of the pooled sample  =  v_j  for the first j with cum_j > k
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence!r} must be in (0, 1)")
    arrays = [np.asarray(g, dtype=np.float64) for g in groups if len(g)]
    if not arrays:
        return None
    value = statistic(stat)(np.concatenate(arrays))
    n = len(arrays)
    pooled = np.concatenate(arrays)
    owner = np.concatenate([np.full(len(a), i) for i, a in enumerate(arrays)])
    order = np.argsort(pooled, kind="stable")
    v, owner = pooled[order], owner[order]                     # (V,)
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=num_resamples)   # (B, n)
    draws = np.empty(num_resamples)
    chunk = max(1, 4_000_000 // max(len(v), 1))
    for start in range(0, num_resamples, chunk):
        w = counts[start:start + chunk][:, owner]                # (b, V)
        draws[start:start + chunk] = _weighted(v, w, stat)
    tail = (1 - confidence) / 2
    low, high = np.quantile(draws, [tail, 1 - tail])
    return {"value": value, "ci_low": float(low), "ci_high": float(high)}


def _weighted(v: np.ndarray, w: np.ndarray, stat: str) -> np.ndarray:
    """``stat`` of each row's pooled sample: sorted values ``v`` (V,) repeated ``w`` (b, V)
    times; percentiles interpolate linearly between ranks, as ``np.percentile``."""
    total = w.sum(axis=1)                                        # (b,)
    out: np.ndarray
    if stat == "mean":
        out = (w * v).sum(axis=1) / total
        return out
    if stat == "max":
        out = np.where(w > 0, v, -np.inf).max(axis=1)
        return out
    q = float(stat[1:]) / 100.0
    cum = np.cumsum(w, axis=1)                                   # (b, V)
    pos = q * (total - 1)
    lo_rank = np.floor(pos)
    hi_rank = np.minimum(lo_rank + 1, total - 1)
    lo = v[(cum > lo_rank[:, None]).argmax(axis=1)]
    hi = v[(cum > hi_rank[:, None]).argmax(axis=1)]
    out = lo + (hi - lo) * (pos - lo_rank)
    return out
