"""What the time budget cut, and the power each figure reached.

A run sized to a budget (``kvmap bench --budget``; ``bench.budget``) stores its plan in
run.json (``preflight.budget``): what it cut from what was written, to which minimum,
and what it left out and why. The figures it measured carry intervals -- throughput and
P99 TBT (a bootstrap over requests), the SLA capacity (a search's bracket or the
interpolation's interval), each accuracy task's drop against the baseline (paired) --
whose widths are the power the run reached.

Two configurations *cannot be told apart at this power* on a figure when their
intervals overlap. Per figure, the configurations are read in order of their value and
each neighbouring pair whose intervals overlap is named: a ranking between them is not
a measured one. An accuracy drop whose interval holds 0 cannot be told from the
baseline's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvmap.report.configs import ConfigSummary
from kvmap.runs.left_out import left_out_lines
from kvmap.runs.run_metadata import RunMetadata


@dataclass(frozen=True)
class Figure:
    config: str
    figure: str                       # "throughput tok/s", "P99 TBT s", ...
    value: float
    interval: tuple[float, float] | None
    num_samples: int | None = None

    @property
    def width(self) -> float | None:
        return None if self.interval is None else self.interval[1] - self.interval[0]


def figures(configs: list[ConfigSummary]) -> list[Figure]:
    """Every figure with an interval (or the lack of one) of every configuration."""
    out = []
    for c in configs:
        n = len(c.rows.get(c.primary_workload or "") or []) or None
        if c.throughput_tok_s is not None:
            out.append(Figure(c.name, "throughput tok/s", c.throughput_tok_s,
                              c.throughput_ci, n))
        if c.tbt_p99_s is not None:
            out.append(Figure(c.name, "P99 TBT s", c.tbt_p99_s, c.tbt_p99_ci, n))
        if c.capacity is not None and c.capacity.value is not None:
            unit = "req/s" if c.capacity.kind == "poisson" else "concurrent"
            out.append(Figure(c.name, f"SLA capacity {unit}", c.capacity.value,
                              c.capacity.ci))
        for name, t in c.tasks.items():
            if t.drop_pct is not None and not c.is_baseline:
                out.append(Figure(c.name, f"{name} drop %", t.drop_pct, t.drop_ci,
                                  t.num_samples))
    return out


def _overlap(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]


def indistinguishable(configs: list[ConfigSummary]) -> list[tuple[str, str, str]]:
    """``(figure, a, b)`` for neighbours in value order whose intervals overlap."""
    by_figure: dict[str, list[Figure]] = {}
    for f in figures(configs):
        if f.interval is not None and f.width:
            by_figure.setdefault(f.figure, []).append(f)
    out = []
    for figure, fs in by_figure.items():
        fs = sorted(fs, key=lambda f: f.value)
        out += [(figure, a.config, b.config) for a, b in zip(fs, fs[1:])
                if _overlap(a.interval, b.interval)]
    return out


def _min(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f}"


def budget_lines(metadata: dict[str, Any]) -> list[str]:
    """What the budget cut and left out (none: the run was not sized)."""
    plan = RunMetadata.read(metadata).budget_plan
    if not plan:
        return replan_lines(metadata)
    out = [f"time budget {_min(plan.budget_s)} min: estimate {_min(plan.estimate_s)} min "
           f"(as written {_min(plan.written_estimate_s)})"]
    for cut in plan.cuts:
        out.append(f"  cut {cut['name'].split('#')[0]} {cut['key']}: {cut['written']} -> "
                   f"{cut['value']} (minimum {cut['minimum']}: {cut['why_minimum']})")
    out += left_out_lines((left["cell_id"], left["reason"])
                          for left in plan.left_out)
    if len(out) == 1:
        out.append("  nothing cut: the run as written fits")
    return out + replan_lines(metadata)


def replan_lines(metadata: dict[str, Any]) -> list[str]:
    """The re-plans after the first cells (run.json ``replan``, ``bench.replan``): how far
    off the estimate was and what the run cut from the cells that had not run yet."""
    replan = RunMetadata.read(metadata).replan
    if not replan:
        return []
    out = [f"  actual / estimate over {replan.cells_timed} cells: {replan.ratio or 0:.2f}"]
    for r in replan.replans:
        cuts = "; ".join(f"{c['name'].split('#')[0]} {c['key']} {c['before']} -> {c['after']}"
                         for c in r["cuts"]) or "nothing cut"
        out.append(f"  re-plan after {r['after_cells']} cells (actual / estimate "
                   f"{r['ratio']:.2f}): projected {r['projected_s'] / 60:.1f} min -> "
                   f"{r['planned_s'] / 60:.1f} min; the cells not yet run: {cuts}")
    return out


def power_lines(configs: list[ConfigSummary], metadata: dict[str, Any] | None = None) -> list[str]:
    """The budget's cuts, each figure's interval width, and the pairs not told apart."""
    out = budget_lines(metadata or {})
    fs = [(f, f.interval) for f in figures(configs) if f.interval is not None]
    if fs:
        out.append("power (interval widths, 95%):")
        for f, (low, high) in fs:
            n = f" (n={f.num_samples})" if f.num_samples else ""
            if f.num_samples is not None and f.num_samples < 2:
                out.append(f"  {f.config}: {f.figure} {f.value:.3g}: one sample, no interval")
                continue
            out.append(f"  {f.config}: {f.figure} {f.value:.3g} [{low:.3g}, "
                       f"{high:.3g}] width {f.width:.3g}{n}")
    pairs = indistinguishable(configs)
    if pairs:
        out.append("cannot be told apart at this power (overlapping intervals):")
        out += [f"  {figure}: {a} ~ {b}" for figure, a, b in pairs]
    same = [f"{c.name} ({name})" for c in configs for name, t in c.tasks.items()
            if t.distinguishable is False and not c.is_baseline]
    if same:
        out.append("accuracy not told from the baseline's: " + ", ".join(same))
    return out
