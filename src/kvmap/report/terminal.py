"""The report in the terminal: the trade-off summary, the recommendation and the
checklist of the recommended configuration (or of every configuration), as rich tables."""
from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from kvmap.config import format_bytes
from kvmap.report.analysis import Analysis
from kvmap.report.configs import ConfigSummary
from kvmap.report.fragmentation import fragmentation_table
from kvmap.report.hybrid_saving import layer_kind_table
from kvmap.report.pareto import pareto_front
from kvmap.report.table import rate_with_ci

_STYLE = {"PASS": "green", "WARN": "yellow", "FAIL": "bold red"}


def tradeoff_table(a: Analysis) -> Table:
    """One row per configuration: the map's four axes, and whether it is on each front."""
    cs = a.configs
    mem_front = set(pareto_front([(c.peak_kv_bytes, c.accuracy_drop_pct if c.accuracy_drop_pct
                                   is not None else (0.0 if c.is_baseline else None))
                                  for c in cs]))
    speed_front = set(pareto_front([(c.tbt_p99_s, c.throughput_tok_s) for c in cs],
                                   minimize_y=False))
    wl = next((c.primary_workload for c in cs if c.primary_workload), "-")
    table = Table(title=f"trade-off map: {a.run.name}", title_justify="left",
                  header_style="bold")
    capacity = any(c.capacity is not None for c in cs)
    for header in ("KV config", "peak KV", "accuracy drop [95%]", f"tok/s ({wl}) [95%]",
                   f"P99 TBT ms ({wl})", *(["SLA capacity"] if capacity else []),
                   "Pareto front"):
        table.add_column(header, justify="left" if header in ("KV config", "Pareto front")
                         else "right")
    for i, c in enumerate(cs):
        fronts = [name for name, s in (("memory/accuracy", mem_front),
                                        ("speed/latency", speed_front)) if i in s]
        name = c.name + (" *" if c.name == a.recommendation.choice else "")
        if c.equal_to:
            name += f" (= {c.equal_to} here)"
        table.add_row(name, "-" if c.peak_kv_bytes is None else format_bytes(c.peak_kv_bytes),
                      _drop(c), rate_with_ci(c.throughput_tok_s, c.throughput_ci),
                      "-" if c.tbt_p99_s is None else f"{c.tbt_p99_s * 1000:.0f}",
                      *([c.capacity.describe() if c.capacity else "-"] if capacity else []),
                      ", ".join(fronts) or "-")
    return table


def _drop(c: ConfigSummary) -> str:
    """The worst task's drop with its interval (``n/a`` for a model with no accuracy)."""
    if c.accuracy_na:
        return "n/a"
    t = c.worst_task
    if t is None:
        return "-"
    ci = (f" [{t.drop_ci[0]:+.2f}, {t.drop_ci[1]:+.2f}]"
          if t.drop_ci and t.drop_ci[0] != t.drop_ci[1] else "")
    return f"{t.drop_pct:.2f}%{ci}"


def recommendation_text(a: Analysis) -> Text:
    rec = a.recommendation
    lines = rec.lines()
    text = Text()
    for i, line in enumerate(lines):
        style = ("bold green" if rec.feasible else "bold red") if i == 0 else ""
        text.append(line + "\n", style=style)
    return text


def deployments_text(a: Analysis) -> Text:
    """Each deployment's SLA and recommendation (empty for a one-workload run)."""
    from kvmap.report.constraints import slo_text
    text = Text()
    for d in a.deployments:
        rec = d.recommendation
        dummy = " (random weights: speed and memory only)" if d.random_weights else ""
        text.append(f"deployment {d.workload}{dummy}, SLA ({d.slo_source}): "
                    f"{slo_text(d.slo) or 'none'}\n", style="bold")
        for i, line in enumerate(rec.lines()):
            style = ("green" if rec.feasible else "red") if i == 0 else ""
            text.append("  " + line + "\n", style=style)
    return text


def checklist_table(a: Analysis, config: str | None = None) -> Table:
    """The checklist of ``config`` (default: the recommended one, else the closest miss)."""
    name = config or a.recommendation.choice or a.recommendation.closest_miss \
        or next(iter(a.checklist))
    table = Table(title=f"pre-launch checklist: {name}", title_justify="left",
                  header_style="bold")
    for header in ("item", "status", "measured", "threshold"):
        table.add_column(header, overflow="fold")
    for item in a.checklist[name]:
        table.add_row(item.item, f"[{_STYLE[item.status]}]{item.status}[/]", item.measured,
                      item.threshold)
    return table


def summary(a: Analysis) -> Group:
    from kvmap.report.capacity import search_lines
    from kvmap.report.power import power_lines
    from kvmap.report.prediction_view import calibration_table, prediction_text
    fragmentation = fragmentation_table(a.run.cells)
    kinds = layer_kind_table(a.run.cells)
    predicted = calibration_table(a.run)
    power = search_lines(a.run.run_dir) + power_lines(a.configs, a.run.metadata)
    return Group(tradeoff_table(a), *([fragmentation] if fragmentation else []),
                 *([kinds] if kinds else []),
                 recommendation_text(a), deployments_text(a), prediction_text(a.run),
                 *([predicted] if predicted else []), checklist_table(a),
                 *([Text("\n".join(power))] if power else []))


def constraint_table(a: Analysis) -> Table:
    """Every configuration against every constraint (measured value, red when missed)."""
    from kvmap.report.constraints import fmt
    rec = a.recommendation
    labels = [k.label for k in next(iter(rec.checks.values()), [])]
    table = Table(title="constraints", title_justify="left", header_style="bold")
    table.add_column("KV config")
    for label in labels:
        table.add_column(label, justify="right")
    table.add_column("all met")
    for name, checks in rec.checks.items():
        ok = all(k.ok for k in checks)
        table.add_row(name + (" *" if name == rec.choice else ""),
                      *[f"[{'green' if k.ok else 'red'}]{fmt(k.name, k.measured)}[/]"
                        for k in checks], "[green]yes[/]" if ok else "[red]no[/]")
    return table
