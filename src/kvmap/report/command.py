"""``kvmap report`` and ``kvmap recommend``: ``register(app)`` adds both to a Typer app.

    kvmap report RUN_DIR [--out FILE] [--slo ...] [--max-accuracy-drop 1%]
                 [--kv-budget 256MiB] [--objective throughput|memory|latency]
    kvmap recommend RUN_DIR [--slo ttft_p99=2s,tbt_p99=150ms] [--max-accuracy-drop 1%]
                 [--kv-budget 256MiB] [--objective throughput|memory|latency] [--json]

Both read the run directory of a ``kvmap bench`` run and nothing else. Without ``--slo``
the scenario's own SLA is used, and a workload that gives its own SLA is held to it (a
run of several workloads gets one recommendation per workload, ``deployments``; the
headline is the primary workload's); ``--slo`` holds every workload to one SLA. Without
``--max-accuracy-drop``, 1%. ``report`` writes
``RUN_DIR/report.html`` (or ``--out``) and prints the trade-off summary, the
recommendation and the checklist. ``recommend`` prints the answer and every
configuration's constraint checks; it exits 1 when no configuration meets the
constraints (so a script can gate on it) and 2 on a bad argument.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.console import Console

from kvmap.cli_errors import fail

if TYPE_CHECKING:
    from rich.console import Group

    from kvmap.report.analysis import Analysis


def parse_percent(text: str) -> float:
    """``"1%"``, ``"0.5%"`` or ``"1"`` -> percent as a float; ValueError otherwise."""
    raw = str(text).strip()
    number = raw[:-1].strip() if raw.endswith("%") else raw
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"--max-accuracy-drop={text!r} is not a percentage "
                         "(e.g. 1% or 0.5%)") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"--max-accuracy-drop={text!r} must be a finite percentage >= 0")
    return value


def _analysis(run_dir: Path, slo: str | None, max_drop: str | None, kv_budget: str | None,
              objective: str) -> Analysis:
    from kvmap.metrics import parse_slo
    from kvmap.config import parse_size
    from kvmap.report.analysis import DEFAULT_MAX_ACCURACY_DROP_PCT, analyze
    from kvmap.report.loader import load_run
    from kvmap.report.constraints import Constraints
    from kvmap.report.recommend import check_objective
    try:
        check_objective(objective)
        run = load_run(run_dir)
        constraints = Constraints(
            slo=parse_slo(slo) if slo is not None else run.slo,
            max_accuracy_drop_pct=(parse_percent(max_drop) if max_drop is not None
                                   else DEFAULT_MAX_ACCURACY_DROP_PCT),
            kv_budget_bytes=parse_size(kv_budget, "--kv-budget") if kv_budget else None)
        if constraints.kv_budget_bytes == 0:
            raise ValueError(f"--kv-budget={kv_budget!r} must be more than 0 bytes")
        return analyze(run, constraints, objective, per_workload_slo=slo is None)
    except ValueError as e:
        fail(str(e))


@dataclass(frozen=True)
class BenchMap:
    """The trade-off map that ends a ``kvmap bench`` run (``kvmap report`` with the
    scenario's SLA): what ``kvmap.bench.command`` prints and exits by."""

    analysis: Analysis
    report_path: Path

    @property
    def recommendation(self) -> dict[str, Any]:
        return self.analysis.recommendation.to_dict()

    def summary(self) -> Group:
        from kvmap.report.terminal import summary
        return summary(self.analysis)


def bench_tradeoff_map(run_dir: Path, err: Console) -> BenchMap | None:
    """The map of the run just stored in ``run_dir``, or None after saying on ``err`` why
    it failed (the run is stored either way)."""
    from rich.markup import escape

    from kvmap.kv.redact import redact_spec
    from kvmap.report.analysis import analyze
    from kvmap.report.html import write_report
    from kvmap.report.loader import load_run
    try:
        analysis = analyze(load_run(run_dir))
        return BenchMap(analysis, write_report(analysis))
    except Exception as e:  # noqa: BLE001 -- the run is stored; say so and exit 1
        err.print(escape(redact_spec(f"error: the trade-off map failed ({type(e).__name__}: "
                                     f"{e}); the run is stored, retry with: kvmap report "
                                     f"{run_dir}")))
        return None


def _console() -> Console:
    console = Console()
    return console if console.is_terminal else Console(width=200)


_SLO = typer.Option(None, "--slo", help="SLA, e.g. ttft_p99=2s,tbt_p99=150ms (default: "
                    "the scenario's).")
_DROP = typer.Option(None, "--max-accuracy-drop", help="Largest accuracy drop per task, "
                     "e.g. 1% (perplexity rise, or accuracy points lost); default 1%.")
_BUDGET = typer.Option(None, "--kv-budget", help="Peak resident KV bytes allowed, e.g. "
                       "256MiB.")
_OBJECTIVE = typer.Option("throughput", "--objective", help="throughput | memory | latency")


def report(
    run_dir: Path = typer.Argument(..., help="A `kvmap bench` run directory."),
    out: Optional[Path] = typer.Option(None, "--out", help="HTML file to write (default: "
                                       "RUN_DIR/report.html)."),
    slo: Optional[str] = _SLO, max_accuracy_drop: Optional[str] = _DROP,
    kv_budget: Optional[str] = _BUDGET, objective: str = _OBJECTIVE,
) -> None:
    """Write the trade-off map (a self-contained report.html) and print its summary."""
    from kvmap.report.html import write_report
    from kvmap.report.terminal import summary
    analysis = _analysis(run_dir, slo, max_accuracy_drop, kv_budget, objective)
    path = write_report(analysis, out)
    _console().print(summary(analysis))
    typer.echo(f"report: {path}")


def recommend(
    run_dir: Path = typer.Argument(..., help="A `kvmap bench` run directory."),
    slo: Optional[str] = _SLO, max_accuracy_drop: Optional[str] = _DROP,
    kv_budget: Optional[str] = _BUDGET, objective: str = _OBJECTIVE,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Pick the sweet spot among the measured KV configurations for an SLA."""
    from kvmap.report.terminal import (checklist_table, constraint_table, deployments_text,
                                       recommendation_text)
    analysis = _analysis(run_dir, slo, max_accuracy_drop, kv_budget, objective)
    rec = analysis.recommendation
    if as_json:
        name = rec.choice or rec.closest_miss
        typer.echo(json.dumps({**rec.to_dict(), "run_dir": str(run_dir),
                               "checklist": {n: [i.to_dict() for i in items]
                                             for n, items in analysis.checklist.items()},
                               "checklist_for": name,
                               "deployments": [{"workload": d.workload, "slo": d.slo,
                                                "slo_source": d.slo_source,
                                                "random_weights": d.random_weights,
                                                **d.recommendation.to_dict()}
                                               for d in analysis.deployments]},
                              default=str))
    else:
        console = _console()
        console.print(recommendation_text(analysis))
        console.print(deployments_text(analysis))
        console.print(constraint_table(analysis))
        console.print(checklist_table(analysis))
    if not rec.feasible:
        raise typer.Exit(code=1)


def register(app: typer.Typer) -> None:
    app.command("report")(report)
    app.command("recommend")(recommend)
