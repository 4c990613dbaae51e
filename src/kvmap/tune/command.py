"""The ``kvmap tune`` command: ``register(app)`` adds it to a Typer app.

    kvmap tune [--model smollm2] [--workload NAME[,key=value...]] [--space FILE.yaml]
               [--slo ttft_p99=2s] [--max-accuracy-drop 2%] [--objective memory]
               [--max-cells 12] [--max-minutes 20] [--task ppl] [--screen-samples 2]
               [--num-samples 8] [--kv-memory 128MiB] --out runs/tune-x [--json]

Searches the space (``kvmap.tune.space``; default: bf16/int8/int4 x full cache and
streaming_llm at four budgets) with successive cells into an ordinary run directory
(``kvmap report RUN`` draws it) plus ``tune.json`` / ``tune.md``: the path the search took.
Prints the path, the recommendation and how many cells it took. Exit 2 on a bad input
(before any cell runs), 1 when no configuration met the constraints.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from kvmap.cli_errors import fail

DEFAULT_SPACE = {"codecs": ["bf16", "int8", "int4"],
                 "policies": [{"name": "streaming_llm", "budgets": [0.125, 0.25, 0.5, 0.75]}]}


def tune(
    out: Path = typer.Option(..., "--out", help="Run directory (a tune there is resumed)."),
    model: str = typer.Option("smollm2", "--model", help="Model name or path."),
    workload: Optional[str] = typer.Option(
        None, "--workload", help="NAME[,key=value...], e.g. throughput,num_requests=16,"
        "prompt_len=128,output_len=16,arrival=closed:16 (default: that one)."),
    space: Optional[Path] = typer.Option(None, "--space", help="Space YAML (codecs, "
                                         "policies with budgets, tiers, max_num_seqs)."),
    slo: Optional[str] = typer.Option(None, "--slo", help="SLA, e.g. ttft_p99=2s."),
    max_accuracy_drop: str = typer.Option("1%", "--max-accuracy-drop", help="Largest "
                                          "accuracy drop, as in kvmap report (e.g. 2%)."),
    objective: str = typer.Option("memory", "--objective",
                                  help="memory | throughput | latency"),
    max_cells: int = typer.Option(12, "--max-cells", help="Most cells to run."),
    max_minutes: Optional[float] = typer.Option(None, "--max-minutes",
                                                help="Start no cell after this long."),
    task: str = typer.Option("ppl", "--task", help="The accuracy task."),
    screen_samples: int = typer.Option(2, "--screen-samples",
                                       help="Samples of the early-rejection screen."),
    num_samples: int = typer.Option(8, "--num-samples", help="Samples of the full task."),
    kv_memory: str = typer.Option("128MiB", "--kv-memory", help="KV pool of the engine."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Search KV configurations with successive cells for the best one under an SLA."""
    from kvmap.kv.redact import redact_spec
    from kvmap.metrics import parse_slo
    from kvmap.report.command import parse_percent
    from kvmap.report.constraints import Constraints
    from kvmap.tune.path import path_table
    from kvmap.tune.run import run_tune
    from kvmap.tune.setup import DEFAULT_WORKLOAD, TuneSetup, parse_workload
    from kvmap.tune.space import load_space, space_from_dict
    err = Console(stderr=True)
    try:
        setup = TuneSetup(model=model, workload=parse_workload(workload) if workload
                          else dict(DEFAULT_WORKLOAD), task=task,
                          screen_samples=screen_samples, num_samples=num_samples,
                          engine={"kv_memory": kv_memory}, slo=slo)
        constraints = Constraints(slo=parse_slo(slo) if slo else {},
                                  max_accuracy_drop_pct=parse_percent(max_accuracy_drop))
        chosen = load_space(space) if space else space_from_dict(DEFAULT_SPACE, "default")
        result = run_tune(setup, chosen, constraints, objective, out, max_cells=max_cells,
                          max_minutes=max_minutes, console=err)
    except ValueError as e:
        fail(redact_spec(str(e)))
    rec = result.recommendation
    if as_json:
        typer.echo(json.dumps({"run_dir": str(out), "num_cells": result.num_cells,
                               "steps": len(result.steps), "stopped": result.stopped,
                               "recommendation": rec.to_dict()}, default=str))
    else:
        console = Console() if Console().is_terminal else Console(width=200)
        console.print(path_table(result.steps))
        for line in rec.lines():
            console.print(line, markup=False)
        if result.stopped:
            console.print(f"stopped early: {result.stopped}", markup=False)
        typer.echo(f"{result.num_cells} cells in {len(result.steps)} steps; run directory: "
                   f"{out} (kvmap report {out}; path: {out / 'tune.json'})")
    if not rec.feasible:
        raise typer.Exit(code=1)


def register(app: typer.Typer) -> None:
    app.command("tune")(tune)
