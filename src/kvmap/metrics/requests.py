"""Serving metrics from raw request timelines, defined as ``vllm bench serve`` defines them.

Pure functions over ``RequestMetrics``-like records (``kvmap.request.RequestMetrics``, its
``to_dict()``, or a ``RequestOutput``); every time is in seconds. ``docs/metrics.md``
defines each number and says where kvmap differs from vLLM.

    timeline of one request (times on one clock, seconds)

    arrival_s   first_scheduled_s   token_times_s[0]  [1]   [2] ...  [n-1]   finished_s
        |<-- queue_s -->|                  |       |     |         |          |
        |<------------- ttft_s ----------->|<itl_0>|<itl1>| ...     |          |
        |<----------------------------------- e2e_s ------------------------->|
        tpot_s = (e2e_s - ttft_s) / (n - 1)      (n = output tokens, only when n > 1)
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

SUMMARY_PERCENTILES = (50, 90, 99)
PER_REQUEST_SLO_KEYS = ("ttft_s", "tpot_s", "tbt_s", "e2e_s")
_METRICS = ("ttft", "tbt", "tpot", "e2e", "queue")
_ALIASES = {"itl": "tbt", "e2el": "e2e"}
_SLO_KEY = re.compile(r"([a-z0-9]+?)(?:_(mean|max|p\d+(?:\.\d+)?))?(?:_s)?")
_DURATION = re.compile(r"([0-9]*\.?[0-9]+)(ms|s)")


def percentile(values: Iterable[float], p: float) -> float | None:
    """The ``p``-th percentile (0..100) by linear interpolation, as ``np.percentile``.

    Returns None for no values."""
    if not isinstance(p, (int, float)) or not 0 <= p <= 100:
        raise ValueError(f"percentile p={p!r} must be in [0, 100]")
    array = np.asarray(list(values), dtype=np.float64)
    return float(np.percentile(array, p)) if array.size else None


def summarize(values: Iterable[float]) -> dict[str, float] | None:
    """``{mean, p50, p90, p99, max}`` of ``values``; None when there are none."""
    array = np.asarray(list(values), dtype=np.float64)
    if not array.size:
        return None
    summary = {"mean": float(array.mean())}
    summary.update({f"p{p}": float(np.percentile(array, p)) for p in SUMMARY_PERCENTILES})
    summary["max"] = float(array.max())
    return summary


@dataclass(frozen=True)
class RequestStats:
    """Derived metrics of one request; None where undefined (see the module diagram)."""

    failed: bool
    arrival_s: float
    finished_s: float | None
    num_prompt_tokens: int
    num_cached_prompt_tokens: int
    num_output_tokens: int
    num_preemptions: int
    ttft_s: float | None
    tpot_s: float | None           # None when num_output_tokens <= 1
    itl_s: tuple[float, ...]       # num_output_tokens - 1 gaps
    e2e_s: float | None
    queue_s: float | None


def _field(record: object, name: str, default: object = None) -> object:
    if isinstance(record, Mapping):
        return record.get(name, default)
    return getattr(record, name, default)


def request_stats(record: object) -> RequestStats:
    """Derive one request's metrics from its raw timestamps.

    The request counts as failed when it has a truthy ``failed`` or a non-None ``error``
    field, no ``finished_s``, or (a ``RequestOutput``) no finish reason or ``"abort"``.
    """
    failed = bool(_field(record, "failed", False)) or _field(record, "error") is not None
    if not isinstance(record, Mapping) and hasattr(record, "finish_reason"):
        failed = failed or record.finish_reason in (None, "abort")
        record = record.metrics
    arrival_s, finished_s = _field(record, "arrival_s"), _field(record, "finished_s")
    if not isinstance(arrival_s, (int, float)):
        raise ValueError(f"request record has arrival_s={arrival_s!r}; a number is needed")
    first_scheduled_s = _field(record, "first_scheduled_s")
    token_times_s = [float(t) for t in _field(record, "token_times_s", None) or ()]
    failed = failed or finished_s is None
    n = len(token_times_s)
    ttft_s = token_times_s[0] - arrival_s if n else None
    e2e_s = None if finished_s is None else finished_s - arrival_s
    tpot_s = (e2e_s - ttft_s) / (n - 1) if n > 1 and e2e_s is not None else None
    return RequestStats(
        failed=failed, arrival_s=arrival_s, finished_s=finished_s,
        num_prompt_tokens=int(_field(record, "num_prompt_tokens", 0) or 0),
        num_cached_prompt_tokens=int(_field(record, "num_cached_prompt_tokens", 0) or 0),
        num_output_tokens=n,
        num_preemptions=int(_field(record, "num_preemptions", 0) or 0),
        ttft_s=ttft_s, tpot_s=tpot_s, e2e_s=e2e_s,
        itl_s=tuple(b - a for a, b in zip(token_times_s, token_times_s[1:])),
        queue_s=None if first_scheduled_s is None else first_scheduled_s - arrival_s)


def meets_slo(stats: RequestStats, slo: Mapping[str, float]) -> bool:
    """Whether one request meets every per-request threshold in ``slo`` (``<=`` passes).

    As in vLLM's ``--goodput``, a request with at most one output token has TPOT 0; a
    request with no token has no TTFT and fails a TTFT threshold; ``tbt_s`` (kvmap's
    addition) bounds the request's worst gap. Aggregate keys (``ttft_p99_s``) are ignored.
    """
    measured = {"ttft_s": stats.ttft_s, "tpot_s": stats.tpot_s or 0.0,
                "tbt_s": max(stats.itl_s, default=0.0), "e2e_s": stats.e2e_s}
    return not stats.failed and all(
        measured[key] is not None and measured[key] <= limit_s
        for key, limit_s in slo.items() if key in PER_REQUEST_SLO_KEYS)


def aggregate(records: Iterable[object], duration_s: float | None = None,
              slo: Mapping[str, float] | None = None) -> dict:
    """Run-level metrics of ``records`` over ``duration_s`` seconds of wall time.

    A record may also be a ready ``RequestStats`` (the HTTP load generator derives its
    own, with output tokens from the server's usage rather than one per chunk).

    ``duration_s=None`` uses the span from the first arrival to the last finish of the
    completed requests. Failed requests count in ``num_failed`` only. Summaries are
    ``summarize`` dicts (None when empty); ``tbt_s`` pools every gap of every request.
    With ``slo`` (as from ``parse_slo``): ``goodput_requests_per_s`` counts requests that
    meet every per-request key, and ``slo_violations`` maps each aggregate key
    (``ttft_p99_s``...) that is missed to its measured value.
    """
    slo = normalize_slo(slo) if slo is not None else None
    stats = [r if isinstance(r, RequestStats) else request_stats(r) for r in records]
    done = [s for s in stats if not s.failed]
    if duration_s is None:
        span_s = (max(s.finished_s for s in done) - min(s.arrival_s for s in done)
                  if done else 0.0)
        duration_s = span_s if span_s > 0 else None
    elif not isinstance(duration_s, (int, float)) or not duration_s > 0:
        raise ValueError(f"duration_s={duration_s!r} must be > 0")
    values = {
        "ttft": [s.ttft_s for s in done if s.ttft_s is not None],
        "tbt": [gap for s in done for gap in s.itl_s],
        "tpot": [s.tpot_s for s in done if s.tpot_s is not None],
        "e2e": [s.e2e_s for s in done],
        "queue": [s.queue_s for s in done if s.queue_s is not None],
    }
    num_prompt = sum(s.num_prompt_tokens for s in done)
    num_output = sum(s.num_output_tokens for s in done)

    def rate(count: int) -> float | None:
        return count / duration_s if duration_s else None

    result = {
        "num_requests": len(stats), "num_completed": len(done),
        "num_failed": len(stats) - len(done), "duration_s": duration_s,
        "num_prompt_tokens": num_prompt, "num_output_tokens": num_output,
        "num_cached_prompt_tokens": sum(s.num_cached_prompt_tokens for s in done),
        "num_preemptions": sum(s.num_preemptions for s in stats),
        "requests_per_s": rate(len(done)), "output_tokens_per_s": rate(num_output),
        "total_tokens_per_s": rate(num_prompt + num_output),
        **{f"{name}_s": summarize(vals) for name, vals in values.items()},
        "goodput_requests_per_s": None, "num_good_requests": None, "slo_violations": None,
    }
    if slo is not None:
        if any(key in PER_REQUEST_SLO_KEYS for key in slo):
            result["num_good_requests"] = sum(meets_slo(s, slo) for s in done)
            result["goodput_requests_per_s"] = rate(result["num_good_requests"])
        result["slo_violations"] = _violations(values, slo)
    return result


def _violations(values: Mapping[str, list[float]], slo: Mapping[str, float]
                ) -> dict[str, float | None]:
    """Aggregate keys of ``slo`` that are missed -> the measured value (None: no data)."""
    missed = {}
    for key, limit_s in slo.items():
        metric, stat = split_slo_key(key)
        if stat is None:
            continue
        vals = values[metric]
        if not vals:
            measured = None
        elif stat == "mean":
            measured = float(np.mean(vals))
        elif stat == "max":
            measured = float(np.max(vals))
        else:
            measured = percentile(vals, float(stat[1:]))
        if measured is None or measured > limit_s:
            missed[key] = measured
    return missed


def split_slo_key(key: str) -> tuple[str, str | None]:
    """``"ttft_p99_s"`` -> ``("ttft", "p99")``; ``"e2el"`` -> ``("e2e", None)``."""
    m = _SLO_KEY.fullmatch(key.strip().lower())
    metric = _ALIASES.get(m.group(1), m.group(1)) if m else None
    if metric not in _METRICS:
        raise ValueError(f"SLO key {key!r}: metric must be one of {_METRICS} (or itl, e2el), "
                         "optionally followed by _mean, _max or _pNN")
    stat = m.group(2)
    if stat is None and metric == "queue":
        raise ValueError(f"SLO key {key!r}: queue has no per-request threshold; use "
                         "queue_mean, queue_max or queue_pNN")
    if stat and stat.startswith("p") and not 0 <= float(stat[1:]) <= 100:
        raise ValueError(f"SLO key {key!r}: percentile must be in [0, 100]")
    return metric, stat


def normalize_slo(slo: Mapping[str, float]) -> dict[str, float]:
    """Validate ``{key: seconds}`` and spell keys canonically (``"itl_p99"`` -> ``"tbt_p99_s"``)."""
    normalized: dict[str, float] = {}
    for key, limit_s in slo.items():
        metric, stat = split_slo_key(str(key))
        name = f"{metric}_{stat}_s" if stat else f"{metric}_s"
        if not isinstance(limit_s, (int, float)) or isinstance(limit_s, bool) \
                or not limit_s > 0 or limit_s == float("inf"):
            raise ValueError(f"SLO {key!r}={limit_s!r} must be a finite number of seconds > 0")
        if name in normalized:
            raise ValueError(f"SLO key {key!r} is given twice (as {name!r})")
        normalized[name] = float(limit_s)
    return normalized


def parse_slo(text: str) -> dict[str, float]:
    """``"ttft_p99=2s,tbt_p99=150ms"`` -> ``{"ttft_p99_s": 2.0, "tbt_p99_s": 0.15}``.

    Items are separated by commas or spaces, ``=`` or ``:`` between key and value, and a
    unit (``s`` or ``ms``) is required. A bare metric (``ttft=500ms``, ``tpot``, ``tbt``,
    ``e2e``) is a per-request threshold used for goodput; ``<metric>_<mean|max|pNN>`` is a
    bound on that statistic of the run. Raises ``ValueError`` naming the bad item.
    """
    items = [item for item in re.split(r"[,\s]+", str(text).strip()) if item]
    if not items:
        raise ValueError(f"SLO {text!r} is empty; expected e.g. 'ttft_p99=2s,tbt_p99=150ms'")
    slo: dict[str, float] = {}
    for item in items:
        key, sep, value = item.replace(":", "=").partition("=")
        m = _DURATION.fullmatch(value.strip().lower())
        if not sep or not key:
            raise ValueError(f"SLO item {item!r} is not KEY=DURATION (e.g. ttft_p99=2s)")
        if not m:
            raise ValueError(f"SLO item {item!r}: {value!r} is not a duration with a unit "
                             "(e.g. 2s, 150ms)")
        seconds = float(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0)
        for name, limit_s in normalize_slo({key: seconds}).items():
            if name in slo:
                raise ValueError(f"SLO item {item!r}: {name!r} is given twice")
            slo[name] = limit_s
    return slo
