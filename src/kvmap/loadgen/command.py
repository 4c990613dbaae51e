"""The ``kvmap loadgen`` command: ``register(app)`` adds it to a Typer app.

    kvmap loadgen --url URL [--model NAME] [--api completions|chat]
                  [--workload PRESET | --trace FILE] [--prompt-tokens N] [--output-tokens N]
                  [--rate R[,R...] [--burstiness B] | --concurrency N[,N...] | --steps R@S,...]
                  [--num-requests N] [--duration S] [--slo SPEC] [--out DIR] [--json]

Bad arguments exit with code 2 (``error: ...``) before anything is sent; a server that
cannot be reached exits 1; so does a run in which some level completed no request.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from kvmap.cli_errors import fail


def _levels(rate: Optional[str], concurrency: Optional[str], steps: Optional[str],
            burstiness: float, spec) -> tuple:
    from kvmap.loadgen.schedule import Level, parse_levels, parse_steps
    if sum(x is not None for x in (rate, concurrency, steps)) > 1:
        raise ValueError("give only one of --rate, --concurrency and --steps")
    if rate is not None:
        return tuple(Level(rate_per_s=r, burstiness=burstiness)
                     for r in parse_levels(rate, "rate"))
    if concurrency is not None:
        return tuple(Level(concurrency=c) for c in parse_levels(concurrency, "concurrency"))
    if steps is not None:
        return (Level(phases=parse_steps(steps)),)
    if spec.concurrency is not None:             # the preset's own closed loop
        return (Level(concurrency=spec.concurrency),)
    return (Level(),)                            # the preset's or trace's own arrivals


def loadgen(
    url: str = typer.Option(..., "--url", help="Server root, e.g. http://127.0.0.1:8000"),
    model: Optional[str] = typer.Option(None, "--model", help="Model name to request "
                                        "(default: the first one /v1/models lists)."),
    api: str = typer.Option("completions", "--api", help="completions | chat"),
    workload: Optional[str] = typer.Option(None, "--workload", help="Workload preset: "
                                           "throughput, long-context, multi-turn, mixed "
                                           "(default: throughput)."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="JSONL trace to replay "
                                         "(its own times unless --rate is given)."),
    rate: Optional[str] = typer.Option(None, "--rate", help="Open loop: mean requests/s, "
                                       "or a list '1,2,4' (one level each; 'inf' = all "
                                       "at once)."),
    concurrency: Optional[str] = typer.Option(None, "--concurrency", help="Closed loop: "
                                              "requests in flight, or a list '1,4,16'."),
    steps: Optional[str] = typer.Option(None, "--steps", help="Step load, one continuous "
                                        "run: RATE@DURATION,... e.g. '1@20s,6@20s,1@20s'."),
    burstiness: float = typer.Option(1.0, "--burstiness", help="Gamma shape of the gaps "
                                     "(1 = Poisson, <1 burstier), as vLLM's."),
    num_requests: Optional[int] = typer.Option(None, "--num-requests", help="Requests per "
                                               "level (default: the workload's, or "
                                               "rate x duration)."),
    duration: Optional[float] = typer.Option(None, "--duration", help="Seconds per level: "
                                             "no send after it; in-flight requests get "
                                             "--drain-timeout more."),
    drain_timeout: float = typer.Option(30.0, "--drain-timeout", help="Seconds after "
                                        "--duration before in-flight requests are "
                                        "cancelled."),
    request_timeout: float = typer.Option(300.0, "--request-timeout",
                                          help="Seconds one request may take in all."),
    prompt_tokens: Optional[int] = typer.Option(None, "--prompt-tokens",
                                                help="Mean prompt length (tokens)."),
    output_tokens: Optional[int] = typer.Option(None, "--output-tokens",
                                                help="Mean output length (max_tokens)."),
    tokenizer: str = typer.Option("smollm2", "--tokenizer", help="Counts prompt lengths: "
                                  "smollm2 | bytes | HF dir | .gguf"),
    slo: Optional[str] = typer.Option(None, "--slo", help="e.g. 'ttft=500ms,tpot=50ms' "
                                      "(goodput) and/or 'ttft_p99=2s' (run bounds)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory (default: "
                                       "runs/loadgen-<time>)."),
    label: Optional[str] = typer.Option(None, "--label", help="KV configuration name for "
                                        "the run store (default: the server's, else "
                                        "'remote')."),
    no_stream: bool = typer.Option(False, "--no-stream", help="Non-streaming requests "
                                   "(E2E only)."),
    no_usage: bool = typer.Option(False, "--no-usage", help="Do not ask for the usage "
                                  "chunk (count output tokens by chunks)."),
    no_ignore_eos: bool = typer.Option(False, "--no-ignore-eos", help="Do not send vLLM's "
                                       "ignore_eos extra."),
    warmup: int = typer.Option(1, "--warmup", help="Requests sent (one at a time, not "
                               "recorded) before the first level."),
    seed: int = typer.Option(0, "--seed"),
    as_json: bool = typer.Option(False, "--json", help="Print the run directory and one "
                                 "record per cell as one JSON object."),
) -> None:
    """Measure an OpenAI-compatible server under load: TTFT, TBT, TPOT, E2E, goodput."""
    options = dict(locals())                  # exactly the command's options, by name
    endpoint, scenario_kw, tok = _prepare(options)
    _execute(endpoint, model, scenario_kw, tok, out, as_json)


def _prepare(o: dict) -> tuple:
    """Validate the options before anything is sent (exit 2 on a bad one); -> the
    endpoint, the scenario's fields and the prompt tokenizer."""
    from kvmap.metrics import parse_slo
    from kvmap.loadgen import prompts
    from kvmap.loadgen.client import Endpoint
    from kvmap.loadgen.scenario import LoadgenScenario
    trace, workload, api = o["trace"], o["workload"], o["api"]
    try:
        if trace is not None and workload is not None:
            raise ValueError("give --workload or --trace, not both")
        spec = prompts.workload_spec(workload, str(trace) if trace else None, seed=o["seed"],
                                     prompt_tokens=o["prompt_tokens"],
                                     output_tokens=o["output_tokens"])
        levels = _levels(o["rate"], o["concurrency"], o["steps"], o["burstiness"], spec)
        if not o["drain_timeout"] > 0:
            raise ValueError(f"--drain-timeout={o['drain_timeout']!r} must be > 0 seconds")
        endpoint = Endpoint(o["url"], o["model"] or "", api=api, stream=not o["no_stream"],
                            include_usage=not o["no_usage"],
                            ignore_eos=not o["no_ignore_eos"],
                            request_timeout_s=o["request_timeout"],
                            api_key=os.environ.get("OPENAI_API_KEY"))
        scenario_kw = dict(levels=levels, workload=None if trace else (workload or
                                                                        "throughput"),
                           trace=str(trace) if trace else None, api=api,
                           stream=not o["no_stream"], num_requests=o["num_requests"],
                           duration_s=o["duration"], drain_timeout_s=o["drain_timeout"],
                           request_timeout_s=o["request_timeout"],
                           prompt_tokens=o["prompt_tokens"], output_tokens=o["output_tokens"],
                           tokenizer=o["tokenizer"],
                           slo=parse_slo(o["slo"]) if o["slo"] else None, seed=o["seed"],
                           label=o["label"], num_warmup=o["warmup"])
        LoadgenScenario(url=o["url"], model=o["model"] or "?", **scenario_kw)   # validate early
        tok = prompts.load_tokenizer(o["tokenizer"])
        prompts.build(spec, tok, None)           # a workload that cannot be built: exit 2
    except ValueError as e:
        fail(str(e))
    return endpoint, scenario_kw, tok


def _execute(endpoint, model, scenario_kw: dict, tok, out, as_json: bool) -> None:
    """Run the levels, print the per-cell lines and the summary; exit 1 if a cell failed."""
    from kvmap.loadgen.summary import summary_table
    from kvmap.loadgen.sweep import default_run_dir

    err = Console(stderr=True)
    run_dir = out or default_run_dir()

    def on_cell(record) -> None:
        m, p = record.metrics, record.params
        ttft = (m.get("ttft_s") or {}).get("mean")
        err.print(f"[{'green' if record.ok else 'red'}]"
                  f"{p['level']}"
                  f"{'' if p.get('phase') is None else ' phase ' + str(p['phase'])}"
                  f"[/]: {m['num_completed']} ok, {m['num_failed']} failed, "
                  f"{(m.get('requests_per_s') or 0):.2f} req/s, TTFT mean "
                  f"{'-' if ttft is None else f'{ttft * 1000:.1f} ms'}")

    try:
        result = asyncio.run(_run(endpoint, model, scenario_kw, tok, run_dir, on_cell, err))
    except _Unreachable as e:
        fail(str(e), code=1)
    except ValueError as e:
        fail(str(e))
    except KeyboardInterrupt:
        err.print(f"\ninterrupted; finished levels are in {run_dir}")
        raise typer.Exit(code=130) from None
    if as_json:
        typer.echo(json.dumps({"run_dir": str(result.run_dir),
                               "cells": [c.to_dict() for c in result.cells]}, default=str))
    else:
        console = Console() if sys.stdout.isatty() else Console(width=220)
        console.print(summary_table(result.cells))
        typer.echo(f"run directory: {result.run_dir}  ({result.num_ran} cells run, "
                   f"{result.num_skipped} already stored)")
    if any(not c.ok for c in result.cells):
        raise typer.Exit(code=1)


class _Unreachable(Exception):
    pass


async def _run(endpoint, model, scenario_kw, tokenizer, run_dir, on_cell, err):
    """Ask the server for its models, then run the sweep."""
    from dataclasses import replace

    import aiohttp

    from kvmap.loadgen.scenario import LoadgenScenario
    from kvmap.loadgen.server_metrics import served_models
    from kvmap.loadgen.sweep import run_sweep
    try:
        async with aiohttp.ClientSession() as session:
            models = await served_models(session, endpoint.root)
    except aiohttp.ClientConnectorError as e:
        raise _Unreachable(f"cannot reach {endpoint.root}: {e}") from None
    if model is None:
        if not models:
            raise ValueError(f"{endpoint.root}/v1/models lists no model; give --model")
        model = str(models[0].get("id"))
        err.print(f"model: {model} (from /v1/models)")
    elif models and model not in [m.get("id") for m in models]:
        err.print(f"note: /v1/models does not list {model!r} "
                  f"(it lists {[m.get('id') for m in models]})")
    scenario = LoadgenScenario(url=endpoint.root, model=model, **scenario_kw)
    endpoint = replace(endpoint, model=model)
    err.print(f"loadgen: {len(scenario.levels)} level(s) against {endpoint.url} "
              f"-> {run_dir}")
    return await run_sweep(scenario, endpoint, tokenizer, run_dir, models=models,
                           on_cell=on_cell, command=list(sys.argv))


def register(app: typer.Typer) -> None:
    app.command("loadgen")(loadgen)
