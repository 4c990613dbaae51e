"""The report's figures, drawn with matplotlib's Agg canvas (no display, no pyplot state)
and returned as PNG bytes encoded in base64, ready for ``<img src="data:image/png;...">``
so that the HTML file opens offline.

Every function takes ``ConfigSummary`` objects (``configs``) and returns a base64 string,
or None when the run holds nothing to draw for that figure.
"""
from __future__ import annotations

import base64
import io
from typing import Any

import matplotlib

matplotlib.use("Agg")
from matplotlib.axes import Axes  # noqa: E402 -- after choosing the backend
from matplotlib.figure import Figure  # noqa: E402 -- after choosing the backend

import numpy as np  # noqa: E402

from kvmap.report.configs import ConfigSummary  # noqa: E402
from kvmap.report.pareto import pareto_front  # noqa: E402
from kvmap.report.slo import gaps  # noqa: E402

MIB = 1024 * 1024
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf"]


def color(index: int) -> str:
    return COLORS[index % len(COLORS)]


def encode(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _scatter_with_front(ax: Axes, configs: list[ConfigSummary], xs: list[float | None],
                        ys: list[float | None], minimize_y: bool, choice: str | None,
                        xcis: list[tuple[float, float] | None] | None = None,
                        ycis: list[tuple[float, float] | None] | None = None) -> None:
    """One labelled point per configuration with its 95% intervals (``xcis``/``ycis``:
    (low, high) or None per point) as error bars, the Pareto front drawn and labelled."""
    points = list(zip(xs, ys))
    xcis, ycis = xcis or [None] * len(xs), ycis or [None] * len(xs)
    for i, (c, x, y) in enumerate(zip(configs, xs, ys)):
        if x is None or y is None:
            continue
        xerr, yerr = _err(x, xcis[i]), _err(y, ycis[i])
        if xerr is not None or yerr is not None:
            ax.errorbar([x], [y], xerr=xerr, yerr=yerr, fmt="none", ecolor=color(i),
                        elinewidth=1, capsize=3, alpha=0.7, zorder=2)
        star = c.name == choice
        ax.scatter([x], [y], s=220 if star else 60, marker="*" if star else "o",
                   color=color(i), zorder=3, edgecolor="black" if star else "none",
                   label=c.name + (" (recommended)" if star else ""))
        ax.annotate(c.name, (x, y), textcoords="offset points", xytext=(6, 6), fontsize=8)
    front = pareto_front(points, minimize_x=True, minimize_y=minimize_y)
    if len(front) >= 1:
        fx = [x for x in (points[i][0] for i in front) if x is not None]   # both set on the front
        fy = [y for y in (points[i][1] for i in front) if y is not None]
        # the boundary of the region the front dominates: each front point's value holds
        # until the next point's x (for both orientations of y)
        ax.step(fx, fy, where="post", color="black",
                linestyle="--", linewidth=1, zorder=2, label="Pareto front")
        ax.annotate("Pareto front", (fx[-1], fy[-1]), textcoords="offset points",
                    xytext=(-10, -14), fontsize=8, ha="right", style="italic")


def _err(value: float, ci: tuple[float, float] | None) -> list[list[float]] | None:
    """A (low, high) interval as matplotlib's [[below], [above]] (None: no interval)."""
    if ci is None or ci[0] is None or ci[1] is None:
        return None
    return [[max(0.0, value - ci[0])], [max(0.0, ci[1] - value)]]


def bound_workload(configs: list[ConfigSummary]) -> str | None:
    """The primary workload when memory binds in it for some configuration: there every
    configuration fills the same pool, so peak bytes hide the saving and the map adds a
    panel of KV per running sequence (what the saving buys: sequences at once)."""
    bound = [c for c in configs if c.memory_binds and c.kv_per_seq_bytes is not None]
    return bound[0].primary_workload if bound else None


def _accuracy_ys(configs: list[ConfigSummary]) -> list[float | None]:
    return [c.accuracy_drop_pct if c.accuracy_drop_pct is not None
            else (0.0 if c.is_baseline and not c.accuracy_na else None) for c in configs]


def _memory_panel(ax: Axes, configs: list[ConfigSummary], xs: list[float | None],
                  choice: str | None, xlabel: str, title: str) -> None:
    ys = _accuracy_ys(configs)
    if any(x is not None and y is not None for x, y in zip(xs, ys)):
        drop_cis = [c.worst_task.drop_ci if c.worst_task else None for c in configs]
        _scatter_with_front(ax, configs, xs, ys, True, choice, ycis=drop_cis)
    else:
        ax.text(0.5, 0.5, "no accuracy task in this run", ha="center",
                transform=ax.transAxes)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("accuracy drop (%; worst task, 95% interval)")
    ax.set_title(title)
    ax.axhline(0, color="grey", linewidth=0.5)


def tradeoff_map(configs: list[ConfigSummary], choice: str | None = None) -> str:
    """Left: accuracy drop against peak resident KV bytes; where memory binds in the
    primary workload, next to it the same against KV per running sequence there; right:
    throughput against P99 time between tokens. Lower-left is better on the memory
    panels, upper-left on the speed panel."""
    bound = bound_workload(configs)
    fig = Figure(figsize=(16 if bound else 11, 4.4))
    axes = fig.subplots(1, 3 if bound else 2)
    xs = [c.peak_kv_bytes / MIB if c.peak_kv_bytes is not None else None for c in configs]
    _memory_panel(axes[0], configs, xs, choice, "peak resident KV (MiB)",
                  "memory vs accuracy (lower-left is better)")
    if bound:
        xs = [c.kv_per_seq_bytes / MIB if c.kv_per_seq_bytes is not None else None
              for c in configs]
        _memory_panel(axes[1], configs, xs, choice,
                      f"peak KV per running sequence (MiB), {bound}",
                      "where memory binds: cost of a sequence")
    right = axes[-1]
    xs = [c.tbt_p99_s * 1000 if c.tbt_p99_s is not None else None for c in configs]
    ys = [c.throughput_tok_s for c in configs]
    if any(x is not None and y is not None for x, y in zip(xs, ys)):
        tbt_cis = [(c.tbt_p99_ci[0] * 1000, c.tbt_p99_ci[1] * 1000) if c.tbt_p99_ci else None
                   for c in configs]
        _scatter_with_front(right, configs, xs, ys, False, choice, tbt_cis,
                            [c.throughput_ci for c in configs])
    else:
        right.text(0.5, 0.5, "no measured workload in this run", ha="center",
                   transform=right.transAxes)
    wl = next((c.primary_workload for c in configs if c.primary_workload), "")
    right.set_xlabel(f"P99 time between tokens (ms), {wl}")
    right.set_ylabel("output tokens/s")
    right.set_title("speed vs tail latency (upper-left is better)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.margins(x=0.25, y=0.15)
    handles, labels = right.get_legend_handles_labels()
    if not labels:
        handles, labels = axes[0].get_legend_handles_labels()
    if labels:                          # nothing measured at all: no legend to draw
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5),
                   fontsize=8, bbox_to_anchor=(0.5, -0.12 if bound else -0.08))
    return encode(fig)


def _cdf(ax: Axes, values: list[float], **kwargs: Any) -> None:
    """Empirical CDF as a staircase that starts at 0 (one value still draws a step)."""
    xs = np.sort(np.asarray(values, dtype=float))
    ys = np.arange(1, len(xs) + 1) / len(xs)
    ax.step(np.concatenate([xs[:1], xs]), np.concatenate([[0.0], ys]), where="post",
            **kwargs)
    ax.set_ylim(0, 1.05)


def latency_cdfs(configs: list[ConfigSummary]) -> str | None:
    """TTFT and TBT CDFs per configuration, one row per workload."""
    workloads = list(dict.fromkeys(w for c in configs for w in c.rows))
    if not workloads:
        return None
    fig = Figure(figsize=(11, 3.2 * len(workloads)))
    axes = np.atleast_2d(fig.subplots(len(workloads), 2, squeeze=False))
    for row, w in enumerate(workloads):
        for col, metric in enumerate(("ttft", "tbt")):
            ax = axes[row][col]
            for i, c in enumerate(configs):
                rows = [r for r in c.rows.get(w, []) if not r.get("failed")]
                values = ([r["ttft_s"] * 1000 for r in rows if r.get("ttft_s") is not None]
                          if metric == "ttft" else [g * 1000 for r in rows for g in gaps(r)])
                if values:
                    _cdf(ax, values, color=color(i), label=c.name)
            ax.set_xlabel(f"{metric.upper()} (ms)")
            ax.set_ylabel("fraction of " + ("requests" if metric == "ttft" else "tokens"))
            ax.set_title(f"{w}: {metric.upper()} CDF")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    return encode(fig)


def position_latency(configs: list[ConfigSummary], num_bins: int = 24) -> str | None:
    """Median time between tokens against the token's position in its sequence (prompt +
    tokens generated so far), all workloads pooled. A rising curve: decode slows as the
    context grows (attention over more KV, or offloaded blocks fetched back)."""
    series = []
    for c in configs:
        pos, gap = [], []
        for rows in c.rows.values():
            for r in rows:
                if r.get("failed"):
                    continue
                start = r.get("num_prompt_tokens") or 0
                for k, g in enumerate(gaps(r)):
                    pos.append(start + k + 1)
                    gap.append(g * 1000)
        series.append((pos, gap))
    everything = [p for pos, _ in series for p in pos]
    if not everything:
        return None
    edges = np.unique(np.linspace(min(everything), max(everything) + 1, num_bins + 1))
    fig = Figure(figsize=(11, 3.6))
    ax = fig.subplots()
    for i, (c, (pos, gap)) in enumerate(zip(configs, series)):
        if not pos:
            continue
        which = np.digitize(pos, edges) - 1
        xs, ys = [], []
        for b in range(len(edges) - 1):
            sel = [g for g, w in zip(gap, which) if w == b]
            if sel:
                xs.append((edges[b] + edges[b + 1]) / 2)
                ys.append(float(np.median(sel)))
        ax.plot(xs, ys, marker="o", markersize=3, color=color(i), label=c.name)
    ax.set_xlabel("position in the sequence (tokens)")
    ax.set_ylabel("median time between tokens (ms)")
    ax.set_title("per-token latency against position (all workloads)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return encode(fig)


def retrieval_heatmaps(configs: list[ConfigSummary], task: str) -> str | None:
    """Accuracy per (context length, depth) of one retrieval task, one panel per config."""
    panels = [(c, c.tasks[task].grid) for c in configs
              if task in c.tasks and c.tasks[task].grid]
    if not panels:
        return None
    lengths = sorted({g["context_tokens"] for _, grid in panels for g in grid})
    depths = sorted({g["depth"] for _, grid in panels for g in grid})
    fig = Figure(figsize=(min(3.2 * len(panels), 14) + 1, 0.5 * len(lengths) + 2.2))
    axes = np.atleast_1d(fig.subplots(1, len(panels), squeeze=False)[0])
    image = None
    for ax, (c, grid) in zip(axes, panels):
        acc = np.full((len(lengths), len(depths)), np.nan)
        for g in grid:
            acc[lengths.index(g["context_tokens"]), depths.index(g["depth"])] = g["accuracy"]
        image = ax.imshow(acc, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(len(depths)), [f"{d:.0%}" for d in depths], fontsize=7)
        ax.set_yticks(range(len(lengths)), [str(n) for n in lengths], fontsize=7)
        for (i, j), v in np.ndenumerate(acc):
            if v == v:
                ax.text(j, i, f"{v:.0%}", ha="center", va="center", fontsize=7)
        ax.set_xlabel("depth")
        ax.set_title(c.name, fontsize=9)
    axes[0].set_ylabel("context (tokens)")
    assert image is not None            # one panel at least
    fig.colorbar(image, ax=list(axes), fraction=0.03, label="accuracy")
    fig.suptitle(f"{task}: accuracy by context length x depth", fontsize=10)
    return encode(fig)


def tier_plots(configs: list[ConfigSummary]) -> str | None:
    """Hit rate and read latency (P50, P99) of each lower tier, per configuration."""
    bars = []   # (config index, label, hit rate, read p50 ms, read p99 ms)
    for i, c in enumerate(configs):
        for w, tiers in c.tiers.items():
            for tier, s in tiers.items():
                p50, p99 = s.read_p50_s, s.read_p99_s
                bars.append((i, f"{c.name}\n{tier} ({w})", s.hit_rate or 0.0,
                             p50 * 1000 if p50 is not None and p50 == p50 else 0.0,
                             p99 * 1000 if p99 is not None and p99 == p99 else 0.0))
    if not bars:
        return None
    fig = Figure(figsize=(11, 3.8))
    left, right = fig.subplots(1, 2)
    x = np.arange(len(bars))
    left.bar(x, [b[2] for b in bars], color=[color(b[0]) for b in bars])
    left.set_xticks(x, [b[1] for b in bars], fontsize=7)
    left.set_ylim(0, 1)
    left.set_ylabel("hit rate")
    left.set_title("tier hit rate")
    right.bar(x - 0.2, [b[3] for b in bars], width=0.4, label="read P50")
    right.bar(x + 0.2, [b[4] for b in bars], width=0.4, label="read P99")
    right.set_xticks(x, [b[1] for b in bars], fontsize=7)
    right.set_ylabel("ms per read")
    right.set_title("tier read latency")
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return encode(fig)


def load_curves(configs: list[ConfigSummary], slo: dict[str, float], workload: str
                ) -> str | None:
    """Output throughput and P99 TTFT / TBT (the SLA's latency keys) against the load
    level of one swept workload, one line per configuration; a failed level is a gap
    (NaN), the SLA limits dotted."""
    curved = [(i, c) for i, c in enumerate(configs) if c.curves.get(workload)]
    if not curved:
        return None
    keys = [k for k in slo if k.split("_")[0] in ("ttft", "tbt", "tpot")] or \
        ["ttft_p99_s", "tbt_p99_s"]
    fig = Figure(figsize=(4 * (1 + len(keys)), 3.6))
    axes = np.atleast_1d(fig.subplots(1, 1 + len(keys)))
    for i, c in curved:
        pts = c.curves[workload]
        x = [p.value for p in pts]
        nan = float("nan")
        axes[0].plot(x, [nan if p.throughput_tok_s is None else p.throughput_tok_s
                         for p in pts], marker="o", color=color(i), label=c.name)
        for ax, key in zip(axes[1:], keys):
            ys = [p.measured.get(key) for p in pts]
            ax.plot(x, [nan if y is None else y * 1000 for y in ys], marker="o",
                    color=color(i))
    axes[0].set_ylabel("output tokens/s")
    for ax, key in zip(axes[1:], keys):
        ax.set_ylabel(key[:-2].replace("_", " ").upper() + " (ms)")
        if key in slo:
            ax.axhline(slo[key] * 1000, color="grey", linestyle=":", label="SLA")
    kind = next((p.kind for _, c in curved for p in c.curves[workload]), "")
    for ax in axes:
        ax.set_xlabel(f"load ({kind or 'level'})")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{workload}: load curves", fontsize=10)
    fig.tight_layout()
    return encode(fig)
