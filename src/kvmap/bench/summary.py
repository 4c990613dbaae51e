"""The trade-off map in table form: one row per KV configuration, read from cell records.

Columns: KV bytes per token, peak resident KV and peak process RSS (worst cell), then
per workload its output tokens/s, TTFT and TBT (P50/P99, ms) and, for needle workloads,
the share answered right; per task its headline (perplexity and its change against the
baseline for ``ppl``, accuracy for retrieval tasks). A failed cell shows ``failed``.

Reads records only (``RunStore(run_dir).cells()``, ``CellRecord``s); computes nothing
that is not there.
"""
from __future__ import annotations

from rich.table import Table

from kvmap.runs.record import CellRecord
from kvmap.config import format_bytes


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def _pair_ms(summary) -> str:
    if not isinstance(summary, dict):
        return "-"
    return f"{_ms(summary.get('p50'))}/{_ms(summary.get('p99'))}"


def task_headline(record: CellRecord) -> str:
    """The one number a task cell is judged by (its ``task_kind``), as text."""
    metrics = record.metrics
    if record.task_kind == "ppl" and metrics.get("ppl") is not None:
        delta = metrics.get("ppl_delta_pct")
        tail = f" ({delta:+.1f}%)" if isinstance(delta, (int, float)) else ""
        return f"{metrics['ppl']:.2f}{tail}"
    if record.task_kind == "accuracy" and metrics.get("accuracy") is not None:
        n = metrics.get("n")
        return f"{metrics['accuracy']:.0%}" + (f" of {n}" if n else "")
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) \
                and not key.endswith(("_bytes", "_s")) and not key.startswith("kv_"):
            return f"{key}={value:.4g}"
    return "ok"


def _jobs(records: list[CellRecord], field: str) -> list[str]:
    return list(dict.fromkeys(getattr(r, field) for r in records if getattr(r, field)))


def summary_rows(records: list[CellRecord]) -> list[dict]:
    """One dict per (model, kv), columns as in the table (strings), in scenario order."""
    workloads, tasks = _jobs(records, "workload"), _jobs(records, "task")
    groups: dict[tuple[str, str], list[CellRecord]] = {}
    for r in records:
        groups.setdefault((r.model, r.kv), []).append(r)
    rows = []
    for (model, kv), cells in groups.items():
        ok = [c for c in cells if c.ok]
        per_token = next((c.metric("kv_bytes_per_token") for c in ok
                          if c.metric("kv_bytes_per_token")), None)
        peaks_kv = [c.metric("peak_kv_resident_bytes") for c in ok]
        peaks_rss = [c.metric("peak_rss_bytes") for c in cells]
        row = {"model": model, "kv": kv,
               "kv_bytes_per_token": "-" if per_token is None else f"{per_token:,.0f}",
               "peak_kv": _max_bytes(peaks_kv), "peak_rss": _max_bytes(peaks_rss)}
        for w in workloads:
            cell = next((c for c in cells if c.workload == w), None)
            if cell is None:
                row.update({f"{w}|tok/s": "", f"{w}|ttft": "", f"{w}|tbt": ""})
                continue
            if not cell.ok:
                row.update({f"{w}|tok/s": "failed", f"{w}|ttft": "", f"{w}|tbt": ""})
                continue
            tps = cell.metric("output_tokens_per_s")
            row[f"{w}|tok/s"] = "-" if tps is None else f"{tps:.1f}"
            row[f"{w}|ttft"] = _pair_ms(cell.metric("ttft_s"))
            row[f"{w}|tbt"] = _pair_ms(cell.metric("tbt_s"))
            if cell.metric("needle_accuracy") is not None:
                row[f"{w}|needle"] = f"{cell.metric('needle_accuracy'):.0%}"
        for t in tasks:
            cell = next((c for c in cells if c.task == t), None)
            row[t] = ("" if cell is None else "failed" if not cell.ok
                      else task_headline(cell))
        failed = sum(not c.ok for c in cells)
        row["status"] = "ok" if not failed else f"{failed} failed"
        rows.append(row)
    return rows


def _max_bytes(values) -> str:
    values = [v for v in values if isinstance(v, (int, float))]
    return format_bytes(max(values)) if values else "-"


def summary_table(records: list[CellRecord], title: str = "kvmap bench") -> Table:
    """A rich table of ``summary_rows``; a model column only when there are several."""
    rows = summary_rows(records)
    table = Table(title=title, header_style="bold", title_justify="left")
    keys = ["kv", "kv_bytes_per_token", "peak_kv", "peak_rss"]
    headers = ["KV config", "KV B/token", "peak KV", "peak RSS"]
    if len({r["model"] for r in rows}) > 1:
        keys, headers = ["model", *keys], ["model", *headers]
    for w in _jobs(records, "workload"):
        keys += [f"{w}|tok/s", f"{w}|ttft", f"{w}|tbt"]
        headers += [f"{w}\nout tok/s", f"{w}\nTTFT p50/p99 ms", f"{w}\nTBT p50/p99 ms"]
        if any(f"{w}|needle" in r for r in rows):
            keys.append(f"{w}|needle")
            headers.append(f"{w}\nneedle")
    for t in _jobs(records, "task"):
        keys.append(t)
        headers.append(t)
    keys.append("status")
    headers.append("status")
    for key, header in zip(keys, headers):
        table.add_column(header, justify="left" if key in ("kv", "model", "status")
                         else "right", overflow="fold")
    for row in rows:
        table.add_row(*[_style(row.get(k, "")) for k in keys])
    return table


def _style(text: str) -> str:
    return f"[red]{text}[/]" if "failed" in text else text


def cell_rows(records: list[CellRecord]) -> list[dict]:
    """``--json``: one row per cell with its metrics (the record less its traceback)."""
    keep = ("cell_id", "model", "dtype", "kv", "kind", "workload", "task", "status",
            "error", "warnings", "duration_s", "env", "metrics")
    return [{k: getattr(r, k) for k in keep} for r in records]
