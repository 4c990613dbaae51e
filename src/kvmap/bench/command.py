"""The ``kvmap bench`` command: ``register(app)`` adds it to a Typer app.

    kvmap bench [SCENARIO.yaml] [--out DIR] [--quick] [--json] [--retry-failed]
                [--backend local|ray] [--address ADDR] [--predict GPU|cpu|none]

The run ends in its trade-off map: ``<run dir>/report.html`` and, in the terminal, the
summary, the recommendation for the scenario's SLA and its checklist (``kvmap report``).
No SCENARIO: the built-in default scenario (``--quick``: the built-in quick one). With
SCENARIO, ``--quick`` shrinks its workloads. ``--out`` names the run directory; giving
the directory of an interrupted run of the same scenario resumes it. A bad scenario exits
with code 2 before any cell runs, listing every problem; a run with failed cells exits 1
after storing and printing everything; Ctrl-C exits 130 and says how to resume.

Each workload cell's record carries the simulator's prediction of it on this machine's
hardware profile (``kvmap.plan.sim.predict``, handed to the runner here: the bench's
machinery imports nothing of ``plan``), with the same configuration on ``--predict``'s
GPU beside it (spec sheet).
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
    predict: str = typer.Option("h100-80gb", "--predict", envvar="KVMAP_BENCH_PREDICT",
                                help="Store the simulator's prediction of each workload cell "
                                "beside it, and of the same cell on this catalogued GPU (spec "
                                "sheet); 'cpu': no GPU; 'none': no prediction."),
) -> None:
    """Run a scenario: every model x KV config x workload/task cell, each in its own process."""
    from kvmap.bench.runner import default_run_dir, run_scenario
    from kvmap.bench.scenario import load_scenario
    from kvmap.bench.summary import cell_rows, summary_table

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
    run_dir = out or default_run_dir(parsed)
    cells = parsed.cells()
    err.print(f"scenario {escape(repr(parsed.name))}: {len(cells)} cells "
              f"({len(parsed.models)} model(s), {len(parsed.all_kv())} KV configs, "
              f"{len(parsed.workloads)} workload levels, {len(parsed.tasks)} tasks) "
              f"-> {escape(str(run_dir))}")
    try:
        result = run_scenario(parsed, run_dir, console=err, backend=backend,
                              address=address, retry_failed=retry_failed,
                              predict=_predictor(predict))
    except ValueError as e:
        typer.echo(f"error: {redact_spec(str(e))}", err=True)
        raise typer.Exit(code=2) from None
    except KeyboardInterrupt:
        err.print(escape(f"\ninterrupted; resume with: kvmap bench "
                  f"{scenario or ''}{' --quick' if quick else ''} --out {run_dir}"
                  f"{' --backend ' + backend if backend != 'local' else ''}"
                  f"{' --address ' + address if address else ''}"))
        raise typer.Exit(code=130) from None
    analysis, report_path = _tradeoff_map(result.run_dir, err)
    if as_json:
        typer.echo(json.dumps({"run_dir": str(result.run_dir),
                               "report": str(report_path) if report_path else None,
                               "recommendation": analysis.recommendation.to_dict()
                               if analysis else None,
                               "cells": cell_rows(result.cells)}, default=str))
    else:
        out_console = Console()
        if not out_console.is_terminal:          # a log file or CI: do not wrap at 80
            out_console = Console(width=200)
        out_console.print(summary_table(result.cells, title=f"kvmap bench: {parsed.name}"))
        if analysis is not None:
            from kvmap.report.terminal import summary
            out_console.print(summary(analysis))
        typer.echo(f"run directory: {result.run_dir}  ({result.num_ran} cells run, "
                   f"{result.num_skipped} resumed, {result.num_failed} failed, "
                   f"{result.duration_s:.0f} s)")
        if report_path is not None:
            typer.echo(f"trade-off map: {report_path}")
    if result.num_failed or analysis is None:
        raise typer.Exit(code=1)


def _predictor(choice: str):
    """The simulator's cell predictor for ``--predict`` (``plan`` sits above ``bench``:
    the command, not the runner, brings it in). ValueError for a GPU the catalogue does
    not know."""
    from kvmap.plan.catalogue import get_gpu
    from kvmap.plan.sim.predict import CellPredictor
    if choice.lower() == "none":
        return None
    return CellPredictor(gpu=None if choice.lower() == "cpu" else get_gpu(choice).name)


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
