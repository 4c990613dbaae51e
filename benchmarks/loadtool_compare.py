"""The figures of ``kvmap loadgen`` and of an independent load tool (aiperf) on one level,
side by side, and whether they agree. Pure functions over plain dicts, so the comparison
is tested on a saved export of the tool without the tool installed
(``tests/bench/test_peers.py``).

The two tools do not define every figure alike, so each row pairs like with like and
says which definition it uses (aiperf's own words are in its metrics reference):

=================  ==========================================  ===========================
figure             kvmap loadgen (vLLM's definitions)           aiperf 0.13
=================  ==========================================  ===========================
TTFT               request sent -> first content chunk          request start -> first
                                                                non-empty response
TBT (ITL) P50/P99  every gap between successive content         ``inter_chunk_latency``:
                   chunks of every request, pooled (the first   the same gaps, a list per
                   token is not a gap)                          request; pooled here
TPOT P50/P99       per request (E2E - TTFT) / (n - 1)           ``inter_token_latency``:
                                                                per request (latency -
                                                                TTFT) / (OSL - 1)
output tok/s       usage tokens / (first send -> last end)      output tokens / benchmark
                                                                duration
=================  ==========================================  ===========================

aiperf calls its per-request mean "inter-token latency" -- it is kvmap's TPOT, and its
P99 is a P99 over requests, not over gaps: that is why the tool's ITL is compared with
loadgen's TPOT and the pooled chunk gaps (recomputed from the tool's per-request export)
with loadgen's TBT.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np

TOLERANCE = 0.10
# (row name, loadgen's key, the tool's key, what the pair means)
PAIRS = (
    ("TTFT P50", "ttft_p50_s", "ttft_p50_s", "send -> first content chunk, both"),
    ("TTFT P99", "ttft_p99_s", "ttft_p99_s", "send -> first content chunk, both"),
    ("TBT P50", "tbt_p50_s", "chunk_gap_p50_s", "every chunk gap pooled, both"),
    ("TBT P99", "tbt_p99_s", "chunk_gap_p99_s", "every chunk gap pooled, both"),
    ("TPOT P50", "tpot_p50_s", "itl_p50_s", "per-request mean gap (aiperf's 'ITL')"),
    ("TPOT P99", "tpot_p99_s", "itl_p99_s", "per-request mean gap (aiperf's 'ITL')"),
    ("output tok/s", "output_tokens_per_s", "output_tokens_per_s",
     "output tokens / run duration"),
)


def _pct(values: list[float], q: float) -> float | None:
    """numpy's linear percentile (kvmap's ``summarize`` and aiperf both use it)."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else None


def loadgen_figures(metrics: dict) -> dict:
    """The compared figures of a ``load_metrics`` dict (seconds; tokens/s)."""
    def get(name: str, p: str):
        return (metrics.get(name) or {}).get(p)
    return {"ttft_p50_s": get("ttft_s", "p50"), "ttft_p99_s": get("ttft_s", "p99"),
            "tbt_p50_s": get("tbt_s", "p50"), "tbt_p99_s": get("tbt_s", "p99"),
            "tpot_p50_s": get("tpot_s", "p50"), "tpot_p99_s": get("tpot_s", "p99"),
            "output_tokens_per_s": metrics.get("output_tokens_per_s"),
            "num_completed": metrics.get("num_completed"),
            "num_failed": metrics.get("num_failed"),
            "num_output_tokens": metrics.get("num_output_tokens")}


def _value_s(metric: dict | None) -> float | list | None:
    """A metric of aiperf's per-request record (``{"value": v, "unit": "ms"}``) in seconds."""
    if not metric:
        return None
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}.get(metric.get("unit"), 1.0)
    value = metric["value"]
    return [v * scale for v in value] if isinstance(value, list) else value * scale


def read_records(path: Path) -> list[dict]:
    """aiperf's per-request export (``profile_export.jsonl``): one JSON object a line."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tool_figures(records: list[dict], summary: dict) -> dict:
    """The compared figures of one aiperf run: percentiles recomputed from its
    per-request ``records`` of the profiling phase (the warm-up request is exported
    too, ``metadata.benchmark_phase``; ``metrics`` of each line: ``time_to_first_token``,
    ``inter_token_latency``, ``inter_chunk_latency`` as a list, ``output_token_count``)
    -- the chunk gaps pooled over requests as loadgen pools them -- and its own
    ``summary`` (``profile_export_aiperf.json``) for the throughput and, as reported,
    the TTFT and ITL percentiles."""
    measured = [r for r in records
                if (r.get("metadata") or {}).get("benchmark_phase", "profiling") == "profiling"]
    ok = [r["metrics"] for r in measured if not r.get("error") and r.get("metrics")]
    ttft = [_value_s(m.get("time_to_first_token")) for m in ok]
    itl = [_value_s(m.get("inter_token_latency")) for m in ok]
    gaps = [g for m in ok for g in (_value_s(m.get("inter_chunk_latency")) or [])]
    ttft, itl = [v for v in ttft if v is not None], [v for v in itl if v is not None]
    return {"ttft_p50_s": _pct(ttft, 50), "ttft_p99_s": _pct(ttft, 99),
            "itl_p50_s": _pct(itl, 50), "itl_p99_s": _pct(itl, 99),
            "chunk_gap_p50_s": _pct(gaps, 50), "chunk_gap_p99_s": _pct(gaps, 99),
            "output_tokens_per_s": summary_value(summary, "output_token_throughput", "avg"),
            "reported": {"ttft_p50_s": summary_value(summary, "time_to_first_token", "p50"),
                         "ttft_p99_s": summary_value(summary, "time_to_first_token", "p99"),
                         "itl_p50_s": summary_value(summary, "inter_token_latency", "p50"),
                         "itl_p99_s": summary_value(summary, "inter_token_latency", "p99"),
                         "chunk_gap_p50_s": summary_value(summary, "inter_chunk_latency",
                                                          "p50"),
                         "chunk_gap_p99_s": summary_value(summary, "inter_chunk_latency",
                                                          "p99")},
            "num_completed": len(ok), "num_failed": len(measured) - len(ok),
            "num_output_tokens": sum(_value_s(m.get("output_token_count")) or 0 for m in ok)}


def summary_value(summary: dict, metric: str, stat: str) -> float | None:
    """``stat`` of ``metric`` in aiperf's aggregate export, in seconds for times (its
    entries are ``{"unit": "ms", "avg": ..., "p50": ..., ...}``; throughputs as they
    are); None when absent."""
    entry = summary.get(metric)
    if not isinstance(entry, dict) or entry.get(stat) is None:
        return None
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3}.get(entry.get("unit"), 1.0)
    return entry[stat] * scale


def compare(loadgen: dict, tool: dict, tolerance: float = TOLERANCE) -> list[dict]:
    """One row per ``PAIRS`` entry: both values, tool / loadgen, and whether that ratio
    is within ``tolerance`` of 1 (None when either value is missing)."""
    rows = []
    for name, mine, theirs, meaning in PAIRS:
        a, b = loadgen.get(mine), tool.get(theirs)
        ratio = b / a if a and b is not None else None
        rows.append({"figure": name, "loadgen": a, "tool": b, "ratio": ratio,
                     "within": None if ratio is None else abs(ratio - 1.0) <= tolerance,
                     "definition": meaning})
    return rows


def median_ratio(rounds: list[list[dict]], figure: str) -> float | None:
    """The median over rounds of one row's ratio (a round: ``compare``'s rows)."""
    values = [r["ratio"] for rows in rounds for r in rows
              if r["figure"] == figure and r["ratio"] is not None]
    return statistics.median(values) if values else None
