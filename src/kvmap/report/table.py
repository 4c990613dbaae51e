"""The every-metric table: one row per configuration and workload, each latency with its
95% interval from ``intervals.bootstrap_ci`` (requests resampled), each accuracy drop with
the paired bootstrap interval the evals stored. Throughput is one measurement of one
run and carries no interval. Cells are display strings; ``LATENCY_COLUMNS`` names them.
"""
from __future__ import annotations

from kvmap.config import format_bytes
from kvmap.report.configs import ConfigSummary, gaps
from kvmap.report.intervals import bootstrap_ci

LATENCY_COLUMNS = (("TTFT P50", "ttft", "p50"), ("TTFT P99", "ttft", "p99"),
                   ("TBT P50", "tbt", "p50"), ("TBT P99", "tbt", "p99"),
                   ("TPOT mean", "tpot", "mean"), ("E2E P99", "e2e", "p99"))


def _groups(rows: list[dict], metric: str) -> list[list[float]]:
    done = [r for r in rows if not r.get("failed")]
    if metric == "tbt":
        return [gaps(r) for r in done]
    return [[r[f"{metric}_s"]] for r in done if r.get(f"{metric}_s") is not None]


def ms_with_ci(ci: dict | None) -> str:
    if ci is None:
        return "-"
    v, lo, hi = (ci[k] * 1000 for k in ("value", "ci_low", "ci_high"))
    return f"{v:.0f} [{lo:.0f}, {hi:.0f}]" if hi - lo >= 1 else f"{v:.1f} [{lo:.1f}, {hi:.1f}]"


def metric_rows(configs: list[ConfigSummary], seed: int = 0) -> tuple[list[str], list[list[str]]]:
    """``(headers, rows)`` of the table."""
    tasks = list(dict.fromkeys(t for c in configs for t in c.tasks))
    headers = ["config", "workload", "output tok/s", "goodput tok/s",
               *[f"{name} (ms)" for name, _, _ in LATENCY_COLUMNS],
               "peak KV", "KV B/token", *[f"{t} (drop %)" for t in tasks]]
    out = []
    for c in configs:
        workloads = list(c.rows) or [None]
        for w in workloads:
            m = c.workloads.get(w) or {}
            rows = c.rows.get(w, [])
            tps = m.get("output_tokens_per_s")
            row = [c.name, w or "-", "-" if tps is None else f"{tps:.1f}",
                   f"{c.goodput_tok_s:.1f}" if w == c.primary_workload
                   and c.goodput_tok_s is not None else "-"]
            row += [ms_with_ci(bootstrap_ci(_groups(rows, metric), stat, seed=seed))
                    for _, metric, stat in LATENCY_COLUMNS]
            row += ["-" if c.peak_kv_bytes is None else format_bytes(c.peak_kv_bytes),
                    "-" if c.kv_bytes_per_token is None else f"{c.kv_bytes_per_token:,.0f}"]
            for t in tasks:
                r = c.tasks.get(t)
                if r is None:
                    row.append("")
                elif r.failed:
                    row.append("failed")
                else:
                    value = (f"ppl {r.value:.2f}" if r.kind == "ppl" else
                             f"acc {r.value:.0%}" if r.kind == "accuracy" else "")
                    drop = "" if r.drop_pct is None else f"; {r.drop_pct:+.2f}"
                    ci = (f" [{r.drop_ci[0]:+.2f}, {r.drop_ci[1]:+.2f}]"
                          if r.drop_ci is not None else "")
                    row.append(value + drop + ci)
            out.append(row)
    return headers, out
