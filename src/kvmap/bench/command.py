"""The ``kvmap bench`` command: ``register(app, tradeoff_map)`` adds it to a Typer app.

    kvmap bench [SCENARIO.yaml] [--out DIR] [--quick] [--json] [--retry-failed]
                [--backend local|ray] [--address ADDR] [--budget 40m] [--no-sizing]
                [--dry-run] [--predict GPU|cpu|none]

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

The trade-off map is the report's: the CLI hands it in (``register(app, tradeoff_map=
kvmap.report.command.bench_tradeoff_map)``), so the bench imports nothing of the
report, which sits above it.

Each workload cell's record carries the simulator's prediction of it on this machine's
hardware profile (``kvmap.plan.sim.predict``, handed to the runner here: the bench's
machinery imports nothing of ``plan``), with the same configuration on ``--predict``'s
GPU beside it (spec sheet).
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional, Protocol

import typer
from rich.console import Console

from kvmap.cli_errors import fail


class TradeoffMap(Protocol):
    """A stored run's trade-off map, as the report draws it."""

    report_path: Path
    recommendation: dict          # the recommendation for the scenario's SLA, as JSON

    def summary(self): ...        # what the terminal prints (a rich renderable)


# (run directory, console for errors) -> its map, or None after saying why it failed
MapMaker = Callable[[Path, Console], Optional[TradeoffMap]]
# --predict's choice -> the runner's cell predictor (``kvmap.plan.sim.predict``)
PredictorMaker = Callable[[str], Callable]
_tradeoff_map: MapMaker | None = None      # set by register()
_make_predictor: PredictorMaker | None = None


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
    predict: str = typer.Option("h100-80gb", "--predict", envvar="KVMAP_BENCH_PREDICT",
                                help="Store the simulator's prediction of each workload cell "
                                "beside it, and of the same cell on this catalogued GPU (spec "
                                "sheet); 'cpu': no GPU; 'none': no prediction."),
) -> None:
    """Run a scenario: every model x KV config x workload/task cell, each in its own process."""
    t_command = time.perf_counter()
    from kvmap.bench.runner import default_run_dir, run_scenario
    from kvmap.bench.scenario import load_scenario
    from rich.markup import escape

    from kvmap.kv.redact import redact_spec
    err = Console(stderr=True)
    try:
        parsed = load_scenario(scenario, quick=quick)
    except ValueError as e:
        fail(redact_spec(str(e)))
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
                              estimate=plan.estimate, searches=True, left_out=left_out,
                              predict=_predictor(predict), replan=_started(plan, t_command))
        from kvmap.runs.store import RunStore
        RunStore(result.run_dir).update_metadata(preflight=plan.to_dict())
    except ValueError as e:
        fail(redact_spec(str(e)))
    except KeyboardInterrupt:
        err.print(escape(f"\ninterrupted; resume with: kvmap bench "
                  f"{scenario or ''}{' --quick' if quick else ''} --out {run_dir}"
                  f"{' --budget ' + budget if budget else ''}"
                  f"{' --no-sizing' if no_sizing else ''}"
                  f"{' --backend ' + backend if backend != 'local' else ''}"
                  f"{' --address ' + address if address else ''}"))
        raise typer.Exit(code=130) from None
    tradeoff = _tradeoff_map(result.run_dir, err) if _tradeoff_map is not None else None
    _print_result(result, tradeoff, as_json, parsed.name)
    if result.num_failed or tradeoff is None:
        raise typer.Exit(code=1)


def _print_result(result, tradeoff: TradeoffMap | None, as_json: bool, name: str) -> None:
    """The run's JSON (``--json``), or its summary table and trade-off map in the terminal."""
    from kvmap.bench.summary import cell_rows, summary_table
    report_path = tradeoff.report_path if tradeoff is not None else None
    if as_json:
        typer.echo(json.dumps({"run_dir": str(result.run_dir),
                               "report": str(report_path) if report_path else None,
                               "recommendation": tradeoff.recommendation
                               if tradeoff else None,
                               "cells": cell_rows(result.cells)}, default=str))
        return
    out_console = Console()
    if not out_console.is_terminal:          # a log file or CI: do not wrap at 80
        out_console = Console(width=200)
    out_console.print(summary_table(result.cells, title=f"kvmap bench: {name}"))
    if tradeoff is not None:
        out_console.print(tradeoff.summary())
    typer.echo(f"run directory: {result.run_dir}  ({result.num_ran} cells run, "
               f"{result.num_skipped} resumed, {result.num_failed} failed, "
               f"{result.duration_s:.0f} s)")
    if report_path is not None:
        typer.echo(f"trade-off map: {report_path}")


def _started(plan, t_command: float):
    """The preflight's re-planner (None without a budget), told what the command spent
    before the first cell (``bench.replan``)."""
    if plan.replanner is None:
        return None
    return plan.replanner.started(time.perf_counter() - t_command)


def _predictor(choice: str):
    """The simulator's cell predictor for ``--predict``, from the one the CLI handed in
    (``plan`` sits above ``bench``); None for 'none' or when none was handed in.
    ValueError for a GPU the catalogue does not know."""
    if choice.lower() == "none" or _make_predictor is None:
        return None
    return _make_predictor(choice)


def _preflight(parsed, budget: str | None, no_sizing: bool, warm: bool, out: Path | None,
               err: Console):
    """The estimate and the budget's plan (``bench.preflight``), printed; exit 2 for a bad
    ``--budget`` or one below the minimum. Resuming ``out``, the stored plan's sizes are
    kept (a new proxy would size the scenario anew and the run would not resume)."""
    from rich.markup import escape

    from kvmap.bench.preflight import preflight
    from kvmap.kv.redact import redact_spec
    from kvmap.runs.store import RunStore
    stored = None
    if out is not None and RunStore(out).run_json.is_file():
        stored = (RunStore(out).metadata().get("preflight") or {}).get("budget")
    try:
        plan = preflight(parsed, budget, sizing=not no_sizing, warm=warm, stored=stored)
    except ValueError as e:         # a bad --budget, or a budget below the minimum
        fail(redact_spec(str(e)))
    for line in plan.lines():
        err.print(escape(redact_spec(line)))
    return plan


def register(app: typer.Typer, tradeoff_map: MapMaker,
             predictor: PredictorMaker | None = None) -> None:
    """Add ``kvmap bench``; its run ends in ``tradeoff_map`` of the run directory, and
    ``predictor(--predict)`` predicts each workload cell (None: no predictions)."""
    global _tradeoff_map, _make_predictor
    _tradeoff_map, _make_predictor = tradeoff_map, predictor
    app.command("bench")(bench)
