"""Metric definitions (TTFT, TBT, TPOT, E2E, percentiles, goodput, SLOs): the floor that
evals, bench, server, loadgen, plan and report all import downward. It imports nothing
from kvmap."""
from __future__ import annotations

from kvmap.metrics.requests import (
    PER_REQUEST_SLO_KEYS, SUMMARY_PERCENTILES, RequestStats, aggregate, meets_slo,
    normalize_slo, parse_slo, percentile, request_stats, split_slo_key, summarize)

__all__ = ["PER_REQUEST_SLO_KEYS", "SUMMARY_PERCENTILES", "RequestStats", "aggregate",
           "meets_slo", "normalize_slo", "parse_slo", "percentile", "request_stats",
           "split_slo_key", "summarize"]
