"""The interactive figures of ``report.html``: the trade-off map and the load curves,
drawn with plotly and embedded in the page (the bundle once, as the first figure's
script), so the file still opens offline. Hover a point for its configuration and every
figure with its 95% interval; click a legend entry to hide or show a family; a point's
label (and a click on the point) goes to the configuration's row in the tables
(``table.row_id``). The matplotlib PNGs (``plots``) stay for the README and the terminal.
"""
from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvmap.config import format_bytes
from kvmap.report.configs import ConfigSummary
from kvmap.report.noise import parts
from kvmap.report.pareto import pareto_front
from kvmap.report.plots import MIB, bound_workload, color
from kvmap.report.table import row_id

FAMILIES = {"codec": "codec", "policy": "selection policy", "tiers": "offload tier"}
# the one line of script: a click on a point follows its row anchor (plotly's own event)
CLICK_SCRIPT = ("document.getElementById('{plot_id}').on('plotly_click', function (e) {"
                " var id = e.points[0].customdata; if (id) { location.hash = id; } });")


def family(c: ConfigSummary) -> str:
    """``baseline``, ``codec``, ``selection policy``, ``offload tier`` or
    ``combination`` (two or more parts), by the parts of the spec; ``endpoint`` for a
    server measured over HTTP."""
    if c.endpoint is not None:
        return "endpoint"
    p = parts(c.kv)
    kinds = [k for k in FAMILIES if k in p and not (k == "codec" and p[k].name == c.dtype)
             and not (k == "policy" and p[k].name == "full")]
    return "baseline" if not kinds else FAMILIES[kinds[0]] if len(kinds) == 1 else "combination"


def _ci(ci: tuple[float, float] | None, scale: float = 1.0, digits: int = 1) -> str:
    return f" [{ci[0] * scale:.{digits}f}, {ci[1] * scale:.{digits}f}]" if ci else ""


def hover_text(c: ConfigSummary) -> str:
    """Every figure of the configuration with its interval, one per line (HTML)."""
    lines = [f"<b>{c.name}</b> ({family(c)})"]
    if c.peak_kv_bytes is not None:
        lines.append(f"peak KV {format_bytes(c.peak_kv_bytes)}")
    elif c.memory_note:
        lines.append(f"no memory coordinate: {c.memory_note}")
    m = c.primary
    for value, label in ((m.kv_capacity_tokens, "KV capacity"),
                         (m.concurrency_max, "max concurrent")):
        if value is not None:
            lines.append(f"{label} {value:,.0f}")
    if m.weight_bytes is not None:
        lines.append(f"weights {format_bytes(m.weight_bytes)}")
    if c.throughput_tok_s is not None:
        lines.append(f"output {c.throughput_tok_s:.1f} tok/s{_ci(c.throughput_ci)}")
    if c.tbt_p99_s is not None:
        lines.append(f"P99 TBT {c.tbt_p99_s * 1e3:.0f} ms{_ci(c.tbt_p99_ci, 1e3, 0)}")
    if c.ttft_p99_s is not None:
        lines.append(f"P99 TTFT {c.ttft_p99_s * 1e3:.0f} ms")
    if c.capacity is not None:
        lines.append(f"SLA capacity {c.capacity.describe()}")
    if c.accuracy_na:
        lines.append("accuracy n/a (no accuracy cells for this model)")
    for t in c.tasks.values():
        if t.drop_pct is not None:
            neg = (f", negative {t.negative.value:.0%}{_ci(t.negative.ci, 100, 0)}"
                   if t.negative else "")
            lines.append(f"{t.task}: drop {t.drop_pct:+.2f}{_ci(t.drop_ci, 1, 2)}{neg}")
        if t.inflation is not None:
            lines.append(f"{t.task}: output length {t.inflation.mean_pct:+.1f}%")
    if c.equal_to:
        lines.append(f"<i>{' and '.join(c.idle)} never acted: equal to {c.equal_to}</i>")
    return "<br>".join(lines)


def _errors(values: list[float], cis: list[tuple[float, float] | None]
            ) -> dict[str, Any] | None:
    if not any(ci is not None for ci in cis):
        return None
    return dict(type="data", symmetric=False,
                array=[(ci[1] - v) if ci is not None else 0 for v, ci in zip(values, cis)],
                arrayminus=[(v - ci[0]) if ci is not None else 0
                            for v, ci in zip(values, cis)], thickness=1.2)


def _points(fig: go.Figure, configs: list[ConfigSummary], xs: list[float | None],
            ys: list[float | None], xcis: list[tuple[float, float] | None],
            ycis: list[tuple[float, float] | None], choice: str | None, col: int,
            legend: set[str]) -> None:
    """One scatter trace per family (so the legend toggles families, in both panels);
    ``legend``: the families already in the legend (updated)."""
    index = {c.name: i for i, c in enumerate(configs)}
    for fam in dict.fromkeys(family(c) for c in configs):
        sel = [(c, x, y, xc, yc) for c, x, y, xc, yc in zip(configs, xs, ys, xcis, ycis)
               if family(c) == fam and x is not None and y is not None]
        if not sel:
            continue
        cs, x, y, xc, yc = (list(v) for v in zip(*sel))
        fig.add_trace(go.Scatter(
            x=x, y=y, mode="markers+text", name=fam, legendgroup=fam,
            showlegend=fam not in legend,
            text=[f'<a href="#{row_id(c.name)}">{c.name}</a>' for c in cs],
            textposition="top right", customdata=[row_id(c.name) for c in cs],
            hovertext=[hover_text(c) for c in cs], hoverinfo="text", cliponaxis=False,
            error_x=_errors(x, xc), error_y=_errors(y, yc),
            marker=dict(size=[18 if c.name == choice else 10 for c in cs],
                        symbol=["star" if c.name == choice else "circle" for c in cs],
                        color=[color(index[c.name]) for c in cs],
                        line=dict(width=1, color="black"))), row=1, col=col)
        legend.add(fam)


def _front(fig: go.Figure, xs: list[float | None], ys: list[float | None], minimize_y: bool,
           col: int, legend: bool) -> None:
    """The Pareto front as a dashed staircase (each front point holds until the next)."""
    front = pareto_front(list(zip(xs, ys)), minimize_x=True, minimize_y=minimize_y)
    if not front:
        return
    fx, fy = [xs[i] for i in front], [ys[i] for i in front]
    fig.add_trace(go.Scatter(x=fx, y=fy, mode="lines", line=dict(shape="hv", dash="dash",
                                                                   color="black", width=1),
                             name="Pareto front", legendgroup="Pareto front",
                             showlegend=legend, hoverinfo="skip"), row=1, col=col)


def tradeoff_figure(configs: list[ConfigSummary], choice: str | None) -> go.Figure:
    """Left: worst accuracy drop (with its interval) against peak resident KV; where
    memory binds in the primary workload, next to it the same against KV per running
    sequence there (``plots.bound_workload``); right: output throughput against P99 TBT
    on the primary workload, both with intervals."""
    wl = next((c.primary_workload for c in configs if c.primary_workload), "")
    bound = bound_workload(configs)
    # two lines each: three one-line titles run into each other on a 1,400-pixel window
    titles = ["memory vs accuracy<br>(lower-left is better)"]
    titles += [f"where memory binds ({bound}):<br>cost of a sequence"] if bound else []
    titles += [f"speed vs tail latency on {wl}<br>(upper-left is better)"]
    fig = make_subplots(rows=1, cols=len(titles), horizontal_spacing=0.08,
                        subplot_titles=titles)
    worst = [c.worst_task for c in configs]
    ys = [t.drop_pct if t else (0.0 if c.is_baseline and not c.accuracy_na else None)
          for c, t in zip(configs, worst)]
    memory_axes = [([c.peak_kv_bytes for c in configs], "peak resident KV (MiB)")]
    if bound:
        memory_axes.append(([c.kv_per_seq_bytes for c in configs],
                            f"peak KV per running sequence<br>(MiB), {bound}"))
    legend: set[str] = set()
    left = False
    for col, (values, title) in enumerate(memory_axes, start=1):
        xs = [v / MIB if v is not None else None for v in values]
        drawn = any(x is not None and y is not None for x, y in zip(xs, ys))
        _front(fig, xs, ys, True, col, drawn and not left)
        left = left or drawn
        _points(fig, configs, xs, ys, [None] * len(configs),
                [t.drop_ci if t else None for t in worst], choice, col, legend)
        fig.update_xaxes(title_text=title, row=1, col=col)
        fig.update_yaxes(title_text="accuracy drop (worst task; 95% interval)", row=1,
                         col=col)
    col = len(titles)
    xs = [c.tbt_p99_s * 1e3 if c.tbt_p99_s is not None else None for c in configs]
    ys = [c.throughput_tok_s for c in configs]
    xcis = [(c.tbt_p99_ci[0] * 1e3, c.tbt_p99_ci[1] * 1e3) if c.tbt_p99_ci else None
            for c in configs]
    _front(fig, xs, ys, False, col, not left)
    _points(fig, configs, xs, ys, xcis, [c.throughput_ci for c in configs], choice, col,
            legend)
    fig.update_xaxes(title_text="P99 time between tokens (ms)", row=1, col=col)
    fig.update_yaxes(title_text="output tokens/s", row=1, col=col)
    fig.update_layout(height=540, margin=dict(t=80, b=70), legend_title_text="family",
                      template="plotly_white", hoverlabel=dict(align="left"))
    return fig


def _curve_keys(slo: dict[str, float]) -> list[str]:
    keys = [k for k in slo if k.split("_")[0] in ("ttft", "tbt", "tpot")]
    return keys or ["ttft_p99_s", "tbt_p99_s"]


def load_figure(configs: list[ConfigSummary], slo: dict[str, float], workload: str
                ) -> go.Figure | None:
    """Output throughput and each SLA latency key against the load level of one swept
    workload, one line per configuration (a failed level is a gap); dotted lines mark
    the SLA limits."""
    curved = [c for c in configs if c.curves.get(workload)]
    if not curved:
        return None
    keys = _curve_keys(slo)
    fig = make_subplots(rows=1, cols=1 + len(keys), subplot_titles=(
        "output tokens/s", *[k[:-2].replace("_", " ").upper() + " (ms)" for k in keys]))
    index = {c.name: i for i, c in enumerate(configs)}
    shown = set()
    for c in curved:
        pts, fam = c.curves[workload], family(c)
        x = [p.value for p in pts]
        series = [([p.throughput_tok_s for p in pts], [p.throughput_ci for p in pts], 1.0)]
        series += [([p.measured.get(k) for p in pts], [p.measured_ci.get(k) for p in pts],
                    1e3) for k in keys]
        for col, (ys, cis, scale) in enumerate(series, start=1):
            ys = [None if y is None else y * scale for y in ys]
            cis = [None if ci is None else (ci[0] * scale, ci[1] * scale) for ci in cis]
            fig.add_trace(go.Scatter(
                x=x, y=ys, mode="lines+markers", name=c.name, legendgroup=fam,
                legendgrouptitle_text=fam if fam not in shown else None,
                showlegend=col == 1, connectgaps=False,
                customdata=[row_id(c.name)] * len(x),
                error_y=_errors([y or 0 for y in ys], cis),
                hovertext=[f"<b>{c.name}</b> at {p.label}" + ("" if p.ok else ": failed")
                           + (f" ({' and '.join(p.idle)} never acted)" if p.idle else "")
                           for p in pts], hoverinfo="text+y",
                line=dict(color=color(index[c.name]))), row=1, col=col)
            shown.add(fam)
    for col, key in enumerate(keys, start=2):
        if key in slo:
            fig.add_hline(y=slo[key] * 1e3, line_dash="dot", line_color="grey", row=1, col=col)
    kind = next((p.kind for c in curved for p in c.curves[workload]), "")
    fig.update_xaxes(title_text=f"load ({kind or 'level'})")
    fig.update_layout(height=420, margin=dict(t=60, b=50), template="plotly_white",
                      title_text=f"{workload}: load curves", legend=dict(groupclick="toggleitem"))
    return fig


def embed(figures: dict[str, go.Figure | None]) -> dict[str, str]:
    """``{div id: HTML}``; the plotly bundle is inlined with the first figure only."""
    out, first = {}, True
    for div_id, fig in figures.items():
        if fig is None:
            continue
        out[div_id] = fig.to_html(full_html=False, include_plotlyjs=first, div_id=div_id,
                                  post_script=CLICK_SCRIPT,
                                  config={"displaylogo": False, "responsive": True})
        first = False
    return out
