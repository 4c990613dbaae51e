"""The ``kvmap bench`` command: ``register(app)`` adds it to a Typer app.

    kvmap bench [SCENARIO.yaml] [--out DIR] [--quick] [--json] [--retry-failed]
                [--backend local|ray] [--address ADDR] [--budget 40m] [--no-sizing]
                [--dry-run]

Before the first cell it prints its estimate, per family of cells and in all, on this
machine as it runs now, and sizes the scenario to its time budget (``bench.preflight``;
the built-in default scenario's budget is 40 min, --quick's 3 min): what it cut, or a
refusal (exit 2) when even the minimum does not fit. ``--dry-run`` prints only that.

The run ends in its trade-off map: ``<run dir>/report.html`` and, in the terminal, the
summary, the recommendation for the scenario's SLA and its checklist (``kvmap report``).
No SCENARIO: the built-in default scenario (``--quick``: the built-in quick one). With
SCENARIO, ``--quick`` shrinks its workloads. ``--out`` names the run directory; giving
the directory of an interrupted run of the same scenario resumes it. A bad scenario exits
with code 2 before any cell runs, listing every problem; a run with failed cells exits 1
after storing and printing everything; Ctrl-C exits 130 and says how to resume.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console


def bench(
    scenario: Optional[Path] = typer.Argument(
        None, help="Scenario YAML; default: the built-in default scenario."),
    out: Optional[Path] = typer.Option(
        None, "--out", help="Run directory (default: runs/<scenario>-<time>); an "
                            "unfinished run of the same scenario there is resumed."),
    quick: bool = typer.Option(False, "--quick", help="A two-minute version: the built-in "
                               "quick scenario, or SCENARIO with small workloads."),
    as_json: bool = typer.Option(False, "--json", help="Print the run directory and one "
                                 "row per cell with its metrics, as one JSON object."),
    retry_failed: bool = typer.Option(False, "--retry-failed",
                                      help="When resuming, run failed cells again."),
    backend: str = typer.Option("local", "--backend", help="Where cells run: local (one "
                                "process at a time, here) or ray (Ray tasks; needs "
                                "Ray, the optional 'ray' extra of kvmap)."),
    address: Optional[str] = typer.Option(None, "--address", help="With --backend ray: "
                                          "an existing Ray cluster (default: start Ray "
                                          "on this machine)."),
    budget: Optional[str] = typer.Option(None, "--budget", help="Wall-time budget (40m, "
                                         "90s, 1h30m): requests, samples and search probes "
                                         "are sized to fit it on this machine. Default: "
                                         "40m for the built-in scenario, 3m with --quick, "
                                         "none for a scenario file."),
    no_sizing: bool = typer.Option(False, "--no-sizing", help="Run the scenario as "
                                   "written; only say whether it fits --budget."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the estimate (and what "
                                 "the budget cuts) and stop before any cell."),
) -> None:
    """Run a scenario: every model x KV config x workload/task cell, each in its own process."""
    from kvmap.bench.runner import default_run_dir, run_scenario
    from kvmap.bench.scenario import load_scenario
    from rich.markup import escape

    from kvmap.kv.redact import redact_spec
    err = Console(stderr=True)
    try:
        parsed = load_scenario(scenario, quick=quick)
    except ValueError as e:
        typer.echo(f"error: {redact_spec(str(e))}", err=True)
        raise typer.Exit(code=2) from None
    for note in parsed.notes:
        err.print(f"note: {escape(redact_spec(note))}")
    plan = _preflight(parsed, budget, no_sizing, backend == "local" and not address, out,
                      err)
    if dry_run:
        return
    parsed = plan.scenario
    run_dir = out or default_run_dir(parsed)
    left_out = {cid for cid, _ in (plan.plan.left_out if plan.plan else ())}
    cells = [c for c in parsed.cells() if c.cell_id not in left_out]
    err.print(f"scenario {escape(repr(parsed.name))}: {len(cells)} cells "
              f"({len(parsed.models)} model(s), {len(parsed.all_kv())} KV configs, "
              f"{len(parsed.workloads)} workload levels, {len(parsed.tasks)} tasks) "
              f"-> {escape(str(run_dir))}")
    try:
        result = run_scenario(parsed, run_dir, console=err, backend=backend,
                              address=address, retry_failed=retry_failed, cells=cells,
                              estimate=plan.estimate, searches=True)
        from kvmap.bench.store import RunStore
        RunStore(result.run_dir).update_metadata(preflight=plan.to_dict())
    except ValueError as e:
        typer.echo(f"error: {redact_spec(str(e))}", err=True)
        raise typer.Exit(code=2) from None
    except KeyboardInterrupt:
        err.print(escape(f"\ninterrupted; resume with: kvmap bench "
                  f"{scenario or ''}{' --quick' if quick else ''} --out {run_dir}"
                  f"{' --budget ' + budget if budget else ''}{' --no-sizing' if no_sizing else ''}"
                  f"{' --backend ' + backend if backend != 'local' else ''}"
                  f"{' --address ' + address if address else ''}"))
        raise typer.Exit(code=130) from None
    analysis, report_path = _tradeoff_map(result.run_dir, err)
    _print_result(result, analysis, report_path, as_json, parsed.name)
    if result.num_failed or analysis is None:
        raise typer.Exit(code=1)


def _print_result(result, analysis, report_path, as_json: bool, name: str) -> None:
    """The run's JSON (``--json``), or its summary table and trade-off map in the terminal."""
    from kvmap.bench.summary import cell_rows, summary_table
    if as_json:
        typer.echo(json.dumps({"run_dir": str(result.run_dir),
                               "report": str(report_path) if report_path else None,
                               "recommendation": analysis.recommendation.to_dict()
                               if analysis else None,
                               "cells": cell_rows(result.cells)}, default=str))
        return
    out_console = Console()
    if not out_console.is_terminal:          # a log file or CI: do not wrap at 80
        out_console = Console(width=200)
    out_console.print(summary_table(result.cells, title=f"kvmap bench: {name}"))
    if analysis is not None:
        from kvmap.report.terminal import summary
        out_console.print(summary(analysis))
    typer.echo(f"run directory: {result.run_dir}  ({result.num_ran} cells run, "
               f"{result.num_skipped} resumed, {result.num_failed} failed, "
               f"{result.duration_s:.0f} s)")
    if report_path is not None:
        typer.echo(f"trade-off map: {report_path}")


def _preflight(parsed, budget: str | None, no_sizing: bool, warm: bool, out: Path | None,
               err: Console):
    """The estimate and the budget's plan (``bench.preflight``), printed; exit 2 for a bad
    ``--budget`` or one below the minimum. Resuming ``out``, the stored plan's sizes are
    kept (a new proxy would size the scenario anew and the run would not resume)."""
    from rich.markup import escape

    from kvmap.bench.preflight import preflight
    from kvmap.kv.redact import redact_spec
    stored = None
    if out is not None and (out / "run.json").is_file():
        stored = (json.loads((out / "run.json").read_text()).get("preflight") or {}).get("budget")
    try:
        plan = preflight(parsed, budget, sizing=not no_sizing, warm=warm, stored=stored)
    except ValueError as e:         # a bad --budget, or a budget below the minimum
        typer.echo(f"error: {redact_spec(str(e))}", err=True)
        raise typer.Exit(code=2) from None
    for line in plan.lines():
        err.print(escape(redact_spec(line)))
    return plan


def _tradeoff_map(run_dir: Path, err: Console):
    """The run's trade-off map (``kvmap report`` with the scenario's SLA): the analysis and
    the path of ``report.html``, or ``(None, None)`` after saying why it failed."""
    from kvmap.report.analysis import analyze
    from kvmap.report.html import write_report
    from kvmap.report.loader import load_run
    try:
        analysis = analyze(load_run(run_dir))
        return analysis, write_report(analysis)
    except Exception as e:  # noqa: BLE001 -- the run is stored; say so and exit 1
        err.print(escape(redact_spec(f"error: the trade-off map failed ({type(e).__name__}: "
                                     f"{e}); the run is stored, retry with: kvmap report "
                                     f"{run_dir}")))
        return None, None


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
