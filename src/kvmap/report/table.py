"""The every-metric table: one row per configuration, workload and load level, each
figure with its 95% interval -- latencies from ``intervals.bootstrap_ci`` (requests
resampled), output throughput from the cell's per-window rates (``noise``), accuracy
with its Wilson interval, drops with their paired interval, the negative-sample rate
beside each average and the output-length inflation; a cell in which the
configuration's tier or policy never acted says it equals its base there. Cells are display strings;
``LATENCY_COLUMNS`` names the latency ones. A model whose accuracy cells are absent
(dummy weights) shows ``n/a``; a figure the record lacks shows ``-`` (not measured).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kvmap.config import format_bytes
from kvmap.report.configs import ConfigSummary
from kvmap.report.endpoints import agreement_text, topk_text
from kvmap.report.intervals import bootstrap_ci
from kvmap.report.noise import idle_parts, throughput_ci, without
from kvmap.report.slo import request_groups
from kvmap.report.tasks import TaskResult
from kvmap.runs.workload_metrics import WorkloadMetrics

LATENCY_COLUMNS = (("TTFT P50", "ttft", "p50"), ("TTFT P99", "ttft", "p99"),
                   ("TBT P50", "tbt", "p50"), ("TBT P99", "tbt", "p99"),
                   ("TPOT mean", "tpot", "mean"), ("E2E P99", "e2e", "p99"))


def slug(text: str) -> str:
    """``"long-context (needle)"`` -> ``"long-context-needle"`` (an HTML id)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def row_id(config: str) -> str:
    """The anchor of a configuration's first row (the map's points link to it)."""
    return "cfg-" + slug(config)


@dataclass(frozen=True)
class TableRow:
    id: str | None              # anchor of the configuration's first row
    config: str
    cells: list[str]


def ms_with_ci(ci: dict[str, float] | None) -> str:
    if ci is None:
        return "-"
    v, lo, hi = (ci[k] * 1000 for k in ("value", "ci_low", "ci_high"))
    return f"{v:.0f} [{lo:.0f}, {hi:.0f}]" if hi - lo >= 1 else f"{v:.1f} [{lo:.1f}, {hi:.1f}]"


def rate_with_ci(value: float | None, ci: tuple[float, float] | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" + (f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "")


def pct_with_ci(value: float, ci: tuple[float, float] | None, digits: int = 0) -> str:
    ci_text = (f" [{100 * ci[0]:.{digits}f}, {100 * ci[1]:.{digits}f}]" if ci else "")
    return f"{100 * value:.{digits}f}%{ci_text}"


def task_cell(r: TaskResult | None, na: bool) -> str:
    if r is None:
        return "n/a" if na else ""
    if r.failed:
        return "failed"
    parts = []
    if r.kind == "ppl":
        parts.append(f"ppl {r.value:.2f}")
    elif r.kind == "accuracy" and r.value is not None:
        parts.append("acc " + pct_with_ci(r.value, r.value_ci)
                     + (f" (n={r.num_samples})" if r.num_samples else ""))
    if r.drop_pct is not None:
        ci = f" [{r.drop_ci[0]:+.2f}, {r.drop_ci[1]:+.2f}]" if r.drop_ci else ""
        same = "; not separable from the baseline" if r.distinguishable is False else ""
        parts.append(f"drop {r.drop_pct:+.2f}{ci}{same}")
    if r.negative is not None:
        parts.append("negative " + pct_with_ci(r.negative.value, r.negative.ci))
    if r.topk is not None:
        parts.append(topk_text(r.topk))
    if r.agreement is not None:
        parts.append(agreement_text(r.agreement))
    if r.inflation is not None:
        i = r.inflation
        ci = f" [{i.mean_ci[0]:+.1f}, {i.mean_ci[1]:+.1f}]" if i.mean_ci else ""
        e2e = f", E2E {i.e2e_pct:+.1f}%" if i.e2e_pct is not None else ""
        parts.append(f"length mean {i.mean_tokens:.1f} ({i.mean_pct:+.1f}%{ci}), "
                     f"P90 {i.p90_tokens:.0f} ({i.p90_pct:+.1f}%){e2e}")
    return "; ".join(parts)


def _number(value: float | None, fmt: str = "{:,.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _workload_cells(c: ConfigSummary, w: str | None, m: WorkloadMetrics | None,
                    rows: list[dict[str, Any]], seed: int) -> list[str]:
    if m is None:                                   # a failed load level: the gap
        return ["failed"] + ["-"] * (len(LATENCY_COLUMNS) + 6)
    primary_top = w == c.primary_workload and w is not None and m is c.workloads.get(w)
    out = [rate_with_ci(m.output_tokens_per_s, throughput_ci(m, rows)),
           f"{c.goodput_tok_s:.1f}" if primary_top and c.goodput_tok_s is not None else "-"]
    out += [ms_with_ci(bootstrap_ci(request_groups(rows, metric), stat, seed=seed))
            for _, metric, stat in LATENCY_COLUMNS]
    conc = (f"{_number(m.concurrency_max)} / {_number(m.concurrency_mean, '{:.1f}')}"
            if m.concurrency_max is not None else "not measured")
    peak = m.peak_kv_resident_bytes
    out += [conc, _number(m.num_pool_full_steps),
            "-" if peak is None else format_bytes(peak), _number(m.kv_capacity_tokens),
            "-" if m.weight_bytes is None else format_bytes(m.weight_bytes)]
    return out


def metric_rows(configs: list[ConfigSummary], seed: int = 0) -> tuple[list[str], list[TableRow]]:
    """``(headers, rows)`` of the table."""
    tasks = list(dict.fromkeys(t for c in configs for t in c.tasks))
    headers = ["config", "workload", "load", "output tok/s [95%]", "goodput tok/s",
               *[f"{name} (ms)" for name, _, _ in LATENCY_COLUMNS],
               "concurrent max / mean", "pool-full steps", "peak KV (cell)",
               "KV capacity (tokens)", "weights", "never acted", "KV B/token", "SLA capacity",
               *tasks]
    out = []
    for c in configs:
        entries: list[tuple[str | None, str | None, WorkloadMetrics | None,
                            list[dict[str, Any]]]] = []
        names: list[str | None] = list(c.rows) or [None]
        for w in names:
            if w in c.levels:
                entries += [(w, label, m, rows) for label, m, rows in c.levels[w]]
            else:
                entries.append((w, None, c.workloads.get(w) if w else WorkloadMetrics(),
                                c.rows.get(w, []) if w is not None else []))
        for k, (w, level, m, rows) in enumerate(entries):
            idle = idle_parts(c.kv, m) if m else []
            acted = (f"{' and '.join(idle)} never acted: = {without(c.kv, idle, c.dtype)} "
                     "here" if idle else "-")
            cells = [w or "-", level or "-", *_workload_cells(c, w, m, rows, seed),
                     acted,
                     _number(c.kv_bytes_per_token),
                     c.capacity.describe() if c.capacity and k == 0 else "-"]
            cells += [task_cell(c.tasks.get(t), c.accuracy_na) for t in tasks]
            out.append(TableRow(row_id(c.name) if k == 0 else None, c.name, cells))
    return headers, out
