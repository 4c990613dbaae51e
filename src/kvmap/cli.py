"""``kvmap`` command line: generate | eval | bench | report | recommend | serve | loadgen |
plan | simulate | specs | hw.

Each subcommand parses its arguments, validates them (a bad value exits with code 2 and
a message naming it) and calls the library; no logic lives here.
"""
from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from kvmap.cli_errors import fail
from kvmap.cli_options import engine_options
from kvmap.config import EngineArgs

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Full-scenario KV-cache evaluation and optimization for LLM inference.")


@app.callback()
def _root() -> None:
    """Full-scenario KV-cache evaluation and optimization for LLM inference."""


@app.command()
@engine_options("model", "dtype", "kv", "kv_memory", "quantization")
def generate(
    prompt: str = typer.Argument(..., help="The prompt text."),
    chat: bool = typer.Option(False, "--chat", help="Wrap the prompt in the chat template."),
    max_tokens: int = typer.Option(64, help="Maximum new tokens"),
    temperature: float = typer.Option(0.0),
    top_p: float = typer.Option(1.0),
    top_k: int = typer.Option(0),
    seed: Optional[int] = typer.Option(None),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    engine: EngineArgs | None = None,            # made by @engine_options
):
    """Generate a completion with the engine."""
    from kvmap import LLM, SamplingParams
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                top_k=top_k, seed=seed)
        llm = LLM(args=engine)
        out = (llm.chat([{"role": "user", "content": prompt}], params) if chat
               else llm.generate([prompt], params))[0]
    except (ValueError, FileNotFoundError) as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps({"text": out.text, "token_ids": out.token_ids,
                               "prompt_token_ids": out.prompt_token_ids,
                               "finish_reason": out.finish_reason,
                               "metrics": out.metrics.to_dict(),
                               "kv_usage": llm.kv_usage()}))
    else:
        typer.echo(out.text)
        m = out.metrics
        n = m.num_output_tokens
        tail = ""
        if n > 1:
            tail = f", {(n - 1) / (m.token_times_s[-1] - m.token_times_s[0]):.1f} tokens/s decode"
        typer.echo(f"[{m.num_prompt_tokens} prompt + {n} output tokens, "
                   f"TTFT {m.ttft_s * 1000:.0f} ms{tail}, finish: {out.finish_reason}]",
                   err=True)


@app.command()
def calibrate(
    out: str = typer.Option(..., "--out", help="File to write (.safetensors or .json)"),
    model: Optional[str] = typer.Option(None, help="Model (default: embedded SmolLM2)"),
    dtype: str = typer.Option("auto", help="auto | fp32 | bf16 | fp16"),
    num_tokens: int = typer.Option(2048, "--tokens", help="Calibration tokens in all"),
    chunk: int = typer.Option(512, help="Tokens per prefill"),
    text_file: Optional[str] = typer.Option(None, help="Calibration text (default: the "
                                                        "built-in corpus)"),
    clip: float = typer.Option(0.0, help="Quantile clipped from each tail"),
):
    """Write static KV ranges for ``scale=static(path=FILE)`` from real K/V."""
    from kvmap import LLM
    from kvmap.engine.calibration import calibrate_model
    from kvmap.workloads.corpus import load_text_file, take_tokens
    if num_tokens < 1 or chunk < 1:
        fail(f"--tokens={num_tokens} and --chunk={chunk} must be positive")
    try:
        text = load_text_file(text_file) if text_file else None
        llm = LLM(model=model, dtype=dtype, kv="auto")
        chunks, start = [], 0
        while sum(len(c) for c in chunks) < num_tokens:
            n = min(chunk, num_tokens - sum(len(c) for c in chunks))
            chunks.append(llm.encode(take_tokens(llm.tokenizer, n, start_paragraph=start,
                                                 text=text)))
            start += 7
        path = calibrate_model(llm, chunks, out, clip=clip)
    except (ValueError, FileNotFoundError) as e:
        fail(str(e))
    typer.echo(f"wrote {path} ({sum(len(c) for c in chunks)} tokens, "
               f"{llm.model_config.num_layers} layers)")


@app.command()
def specs(as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
          options: bool = typer.Option(False, "--options", help="Also list every codec's and "
                                       "policy's options with their defaults (unset = None; "
                                       "the part's docstring explains each).")):
    """List the registered KV spec parts (codecs, policies, tier layouts) and the tier
    backends a tiers(...) part accepts."""
    from kvmap.kv.config import spec_names
    names = spec_names()
    if as_json:
        typer.echo(json.dumps({family: list(members) for family, members in names.items()}))
        return
    for family, members in names.items():
        typer.echo(f"{family}: {', '.join(members)}")
    if options:
        from kvmap.kv.codecs import CODECS
        from kvmap.kv.policies import POLICIES
        for registry in (CODECS, POLICIES):
            for name in sorted(registry):
                defaults = registry[name].defaults
                typer.echo(f"  {name}({', '.join(f'{k}={v}' for k, v in defaults.items())})")


@app.command()
def hw(as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
       refresh: bool = typer.Option(False, "--refresh", help="Measure again (the rates are "
                                    "cached per machine fingerprint)."),
       threads: Optional[int] = typer.Option(None, help="Torch threads the rates are "
                                             "measured with (default: torch's).")):
    """This machine's hardware profile: CPU class and ISA, native bf16, the dtype that
    `auto` picks, and measured matrix, bandwidth and weight-kernel rates."""
    from kvmap.hardware import profile
    if threads is not None and threads < 1:
        fail(f"--threads={threads} must be >= 1")
    try:
        if threads:
            import torch
            torch.set_num_threads(threads)
        summary = profile(refresh=refresh, num_threads=threads).summary()
    except ValueError as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps(summary, indent=1))
        return
    from kvmap.hardware.report import describe
    typer.echo(describe(summary))


def _register_subcommands() -> None:
    """Each feature package adds its own command(s); cli.py only wires them."""
    from kvmap.bench.command import register as register_bench
    from kvmap.evals.command import register as register_eval
    from kvmap.loadgen.command import register as register_loadgen
    from kvmap.plan.command import register as register_plan
    from kvmap.plan.sim.command import register as register_simulate
    from kvmap.plan.sim.predict import bench_predictor
    from kvmap.report.command import bench_tradeoff_map, register as register_report
    from kvmap.server.command import register as register_serve
    from kvmap.tune.command import register as register_tune
    register_bench(app, tradeoff_map=bench_tradeoff_map, predictor=bench_predictor)
    register_eval(app)
    register_loadgen(app)
    register_plan(app)
    register_simulate(app)
    register_report(app)
    register_serve(app)
    register_tune(app)


_register_subcommands()


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
