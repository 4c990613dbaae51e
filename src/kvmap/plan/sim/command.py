"""The ``kvmap simulate`` command: ``register(app)`` adds it to a Typer app.

    kvmap simulate SCENARIO.yaml [--json]
    kvmap simulate builtin:int8-batch          (or just the name; --list shows them)

One row per configuration (the scenario's variants): throughput, TTFT / TBT percentiles,
batch, KV residency, tier hit rates and where the step time went. ``--json`` prints one
JSON object with every result in full. A bad scenario exits with code 2 and a message
naming the file and the key.
"""
from __future__ import annotations

import json
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from kvmap.cli_errors import fail
from kvmap.config import format_bytes
from kvmap.plan.sim.blocks import SimulationError
from kvmap.plan.sim.results import SimResult
from kvmap.plan.sim.scenario import ScenarioError, builtin_names, load_sim_scenario


def simulate_command(
    scenario: Optional[str] = typer.Argument(None, help="Scenario YAML file, or a built-in "
                                                        "name (builtin:NAME)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    list_builtin: bool = typer.Option(False, "--list", help="List the built-in scenarios."),
) -> None:
    """Discrete-event simulation of a serving system at scale (see docs/planning.md)."""
    from kvmap.plan.sim import simulate
    if list_builtin or scenario is None:
        typer.echo("\n".join(builtin_names()))
        return
    try:
        loaded = load_sim_scenario(scenario)
        results = [simulate(config) for config in loaded.configs]
    except (ScenarioError, SimulationError, ValueError) as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps({"scenario": loaded.name, "source": loaded.source,
                               "description": loaded.description,
                               "results": [r.to_dict() for r in results]}))
        return
    print_results(loaded.name, loaded.description, results)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:,.1f}"


def _pct(summary: dict | None, key: str) -> float | None:
    return None if summary is None else summary[key]


def _timeline(result: SimResult) -> str:
    runs: list[str] = []
    for segment in result.timeline:
        if not runs or runs[-1] != segment["bound"]:
            runs.append(segment["bound"])
    return " -> ".join(runs)


def print_results(name: str, description: str, results: list[SimResult]) -> None:
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    console.print(f"[bold]{name}[/]" + (f": {description.strip()}" if description else ""))
    table = Table(caption="times in ms; batch: mean / max running requests; bound: share of "
                          "step time by bottleneck")
    for header in ("config", "done/rej", "out tok/s", "TTFT p50", "TTFT p99", "TBT p50",
                   "TBT p99", "batch", "KV/seq HBM", "hit rates", "bound"):
        table.add_column(header, justify="left" if header in ("config", "bound", "hit rates")
                         else "right")
    for r in results:
        m = r.metrics
        hits = [f"hbm {r.kv['hbm_hit_rate']:.0%}"] if r.kv["hbm_hit_rate"] is not None else []
        hits += [f"{n} {t['hit_rate']:.0%}" for n, t in r.tiers.items()
                 if t["hit_rate"] is not None]
        bound = ", ".join(f"{k} {v:.0%}" for k, v in
                          sorted(r.bound_share.items(), key=lambda kv: -kv[1])[:3])
        rate = m["output_tokens_per_s"]
        table.add_row(
            r.name, f"{r.num_finished}/{r.num_rejected}", "-" if rate is None else f"{rate:,.0f}",
            _ms(_pct(m["ttft_s"], "p50")), _ms(_pct(m["ttft_s"], "p99")),
            _ms(_pct(m["tbt_s"], "p50")), _ms(_pct(m["tbt_s"], "p99")),
            f"{r.kv['mean_running']:.1f} / {r.kv['max_running']}",
            format_bytes(r.kv["peak_hbm_kv_bytes_per_seq"]), ", ".join(hits) or "-", bound)
    console.print(table)
    for label in dict.fromkeys(r.config.get("hardware_label") for r in results):
        if label:
            console.print(f"hardware {label}")
    for r in results:
        console.print(f"{r.name}: bottleneck over time: {_timeline(r)}")
        for name, t in r.tiers.items():
            console.print(
                f"  tier {name} ({t['link']}): written {format_bytes(t['bytes_in'])}, read "
                f"{format_bytes(t['bytes_read'])}, streamed {format_bytes(t['bytes_streamed'])}, "
                f"resident {format_bytes(t['resident_bytes'])}, link busy {t['link_busy_s']:.2f} s, "
                f"steps waited {t['stall_s']:.2f} s")
        for why in r.rejections:
            console.print(f"  rejected {why}")


def register(app: typer.Typer) -> None:
    """Add ``simulate`` to ``app``."""
    app.command("simulate")(simulate_command)
