"""Load-run cells as a table: one row per level (or step phase), read from cell records.

Reads records only; computes nothing that is not stored.
"""
from __future__ import annotations

from rich.table import Table

COLUMNS = ("level", "kv", "ok/fail", "req/s", "out tok/s", "TTFT mean/p99 ms",
           "server TTFT ms", "TBT p50/p99 ms", "TPOT ms", "E2E p50/p99 ms", "goodput/s",
           "failures")


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _pair(summary: dict | None, a: str, b: str) -> str:
    if not summary:
        return "-"
    return f"{_ms(summary.get(a))}/{_ms(summary.get(b))}"


def _num(value, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def summary_rows(records: list) -> list[dict]:
    """One dict of strings per cell (``CellRecord``s), keyed by ``COLUMNS``."""
    rows = []
    for r in records:
        m, p = r.metrics, r.params
        level = p.get("level", "?")
        if p.get("phase") is not None:
            level = f"phase {p['phase']} @ {p['rate_per_s']:g}/s"
        server = m.get("server") or {}
        failures = m.get("failures_by_kind") or {}
        rows.append({
            "level": level, "kv": str(r.kv),
            "ok/fail": f"{m.get('num_completed', 0)}/{m.get('num_failed', 0)}",
            "req/s": _num(m.get("requests_per_s")),
            "out tok/s": _num(m.get("output_tokens_per_s"), ".1f"),
            "TTFT mean/p99 ms": _pair(m.get("ttft_s"), "mean", "p99"),
            "server TTFT ms": _ms(server.get("ttft_mean_s")),
            "TBT p50/p99 ms": _pair(m.get("tbt_s"), "p50", "p99"),
            "TPOT ms": _ms((m.get("tpot_s") or {}).get("mean")),
            "E2E p50/p99 ms": _pair(m.get("e2e_s"), "p50", "p99"),
            "goodput/s": _num(m.get("goodput_requests_per_s")),
            "failures": ", ".join(f"{k}={v}" for k, v in failures.items()) or "-",
        })
    return rows


def summary_table(records: list, title: str = "kvmap loadgen") -> Table:
    table = Table(title=title)
    for column in COLUMNS:
        table.add_column(column, justify="left" if column in ("level", "kv", "failures")
                         else "right")
    for row in summary_rows(records):
        table.add_row(*(row[c] for c in COLUMNS))
    return table
