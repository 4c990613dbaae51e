"""SLA keys read from request rows: ``measure_key(rows, "tbt_p99_s")`` and friends.

A bare key (``ttft_s``) is read at the 99th percentile of requests (one value per
request; TBT is a request's worst gap); a ``_pNN``/``_mean``/``_max`` key is that
statistic of the pooled values (TBT pools every gap of every request). Failed rows are
left out.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from kvmap.metrics import split_slo_key

BARE_KEY_PERCENTILE = 99.0


def split_key(key: str) -> tuple[str, str | None]:
    """``"ttft_p99_s"`` -> ``("ttft", "p99")``, ``"tpot_s"`` -> ``("tpot", None)``: a
    normalized key (``kvmap.metrics.normalize_slo``), split by the metrics' own rule."""
    try:
        metric, stat = split_slo_key(key)
    except ValueError:
        metric = None
    if metric is None or key != key.strip().lower() or not key.endswith("_s") \
            or key.startswith(("itl", "e2el")):
        raise ValueError(f"SLO key {key!r} is not normalized (e.g. 'ttft_p99_s'); "
                         "parse it with kvmap.metrics.parse_slo")
    return metric, stat


def gaps(row: dict[str, Any]) -> list[float]:
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


def _per_request(row: dict[str, Any], metric: str) -> float | None:
    """One request's value of a bare key (as ``meets_slo``: TBT is its worst gap, TPOT of
    a one-token request is 0)."""
    if metric == "tbt":
        return max(gaps(row), default=0.0)
    if metric == "tpot":
        return row.get("tpot_s") or 0.0
    return row.get(f"{metric}_s")


def measure_key(rows: Iterable[dict[str, Any]], key: str) -> float | None:
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
        values = [v for v in (r.get(f"{metric}_s") for r in done) if v is not None]
    return _reduce(values, stat)


def measure_slo(rows_by_workload: dict[str, list[dict[str, Any]]], slo: dict[str, float]
                ) -> dict[str, float | None]:
    """Key -> worst value over the workloads (None when no workload measured it)."""
    out: dict[str, float | None] = {}
    for key in slo:
        measured = [measure_key(rows, key) for rows in rows_by_workload.values()]
        values = [v for v in measured if v is not None]
        out[key] = max(values) if values else None
    return out


def is_good(row: dict[str, Any], slo: dict[str, float]) -> bool:
    """Whether one request meets every SLA key read for that request alone (a ``_pNN``
    key bounds that percentile of its own gaps; queue keys bound its queueing time)."""
    if row.get("failed"):
        return False
    for key, limit_s in slo.items():
        metric, stat = split_key(key)
        if metric == "tbt" and stat is not None:
            value: float | None = _reduce(gaps(row), stat) or 0.0
        else:
            value = _per_request(row, metric)
        if value is None or value > limit_s:
            return False
    return True


def request_groups(rows: list[dict[str, Any]], metric: str) -> list[list[float]]:
    """One group of values per completed request (its gaps for ``tbt``), for the
    request-level bootstrap of ``intervals.bootstrap_ci``."""
    done = [r for r in rows if not r.get("failed")]
    if metric == "tbt":
        return [gaps(r) for r in done]
    return [[r[f"{metric}_s"]] for r in done if r.get(f"{metric}_s") is not None]
