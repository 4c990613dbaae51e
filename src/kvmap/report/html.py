"""``report.html``: the whole report in one self-contained file (Jinja2 template
``templates/report.html.j2``): the interactive map and load curves are plotly figures
whose bundle is inlined once (``interactive``), every other figure a base64 PNG inside
the page; no external file, so it opens offline in any browser and can be mailed as is.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jinja2

from kvmap.report import hybrid_saving, interactive, plots
from kvmap.report.analysis import Analysis
from kvmap.report.fragmentation import HEADERS as FRAGMENTATION_HEADERS
from kvmap.report.fragmentation import formatted, fragmentation_rows
from kvmap.report.intervals import METHOD
from kvmap.report.constraints import fmt, slo_text
from kvmap.report.prediction_view import prediction_context
from kvmap.report.table import metric_rows, slug
from kvmap.report.timeseries import timeseries_figures

REPORT_NAME = "report.html"


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("kvmap.report", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]), trim_blocks=True,
        lstrip_blocks=True, undefined=jinja2.StrictUndefined)


def _checklist_matrix(a: Analysis) -> tuple[list[str], list[dict[str, Any]]]:
    """Items (rows, in first-seen order) x configurations (columns)."""
    names = list(a.checklist)
    items: dict[str, dict[str, Any]] = {}
    for name, checks in a.checklist.items():
        for item in checks:
            row = items.setdefault(item.item, {"item": item.item, "cells": {}})
            row["cells"][name] = item
    return names, list(items.values())


def context(a: Analysis) -> dict[str, Any]:
    """Everything the template shows (figures drawn here)."""
    rec = a.recommendation
    meta = a.run.meta
    retrieval = list(dict.fromkeys(t for c in a.configs for t, r in c.tasks.items()
                                   if r.grid))
    headers, rows = metric_rows(a.configs, seed=meta.seed or 0)
    names, checklist_rows = _checklist_matrix(a)
    env = a.run.cells[0].cell_env
    figures = {
        "tradeoff": plots.tradeoff_map(a.configs, rec.choice),
        "cdfs": plots.latency_cdfs(a.configs),
        "position": plots.position_latency(a.configs),
        "tiers": plots.tier_plots(a.configs),
        "timeseries": timeseries_figures(a.run.run_dir, a.run.cells),
        "heatmaps": [(slug(t), plots.retrieval_heatmaps(a.configs, t)) for t in retrieval],
    }
    swept = list(dict.fromkeys(w for c in a.configs for w in c.curves))
    interactive_figures = {"map-interactive": interactive.tradeoff_figure(a.configs,
                                                                          rec.choice)}
    interactive_figures.update({f"load-{slug(w)}": interactive.load_figure(
        a.configs, a.slo_of(w), w) for w in swept})
    figures["loadcurves"] = [(slug(w), plots.load_curves(a.configs, a.slo_of(w), w))
                             for w in swept]
    constraints = [check.label for check in next(iter(rec.checks.values()), [])]
    return {
        "title": f"kvmap trade-off map: {a.run.name}",
        "run": {"name": a.run.name, "dir": str(a.run.run_dir),
                "description": a.run.scenario.get("description") or "",
                "created_at": meta.created_at, "git": meta.git or {},
                "machine": meta.machine or {}, "versions": meta.versions or {},
                "command": " ".join(meta.command or []),
                "num_cells": len(a.run.cells),
                "failed": [c for c in a.run.cells if c.status != "ok"],
                "load": [c.cell_env.load_avg_1m_end for c in a.run.cells],
                "num_threads": env.num_threads},
        "recommendation": rec, "recommendation_lines": rec.lines(),
        "constraints": constraints, "objective": rec.objective,
        "configs": a.configs, "fmt": fmt, "figures": figures,
        "interactive": interactive.embed(interactive_figures),
        "capacities": [(c.name, c.capacity.describe()) for c in a.configs if c.capacity],
        "checklist_configs": names, "checklist_rows": checklist_rows,
        "table_headers": headers, "table_rows": rows, "ci_method": METHOD,
        "fragmentation_headers": FRAGMENTATION_HEADERS,
        "fragmentation_rows": [formatted(r) for r in fragmentation_rows(a.run.cells)],
        "layer_kind_headers": hybrid_saving.HEADERS,
        "layer_kind_rows": [hybrid_saving.formatted(r)
                            for r in hybrid_saving.layer_kind_rows(a.run.cells)],
        "budget": fmt("kv_budget", a.budget_bytes) if a.budget_bytes else None,
        "deployments": [{"workload": d.workload, "slug": slug(d.workload),
                         "slo_source": d.slo_source, "slo_text": slo_text(d.slo),
                         "random_weights": d.random_weights,
                         "feasible": d.recommendation.feasible,
                         "lines": d.recommendation.lines()} for d in a.deployments],
        "tune": _tune_path(a.run.run_dir),
        **prediction_context(a.run),
    }


def _tune_path(run_dir: Path) -> dict[str, Any] | None:
    """The search path a ``kvmap tune`` run stored (``tune.json``); None for a bench run."""
    path = Path(run_dir) / "tune.json"
    return json.loads(path.read_text()) if path.is_file() else None


def render(a: Analysis) -> str:
    return _environment().get_template("report.html.j2").render(**context(a))


def write_report(a: Analysis, path: str | Path | None = None) -> Path:
    """Write the report (default ``<run_dir>/report.html``) atomically; returns its path."""
    out = Path(path) if path is not None else a.run.run_dir / REPORT_NAME
    tmp = out.with_suffix(".tmp")
    tmp.write_text(render(a), encoding="utf-8")
    os.replace(tmp, out)
    return out
