"""The ``kvmap plan`` command: ``register(app)`` adds it to a Typer app.

    kvmap plan --model llama-3-70b --gpu h100-80gb --num-gpus 4 --context 32768 \
               --kv bf16 --kv int8 [--concurrency 8] [--weights fp8] [--json]

One row per ``--kv`` spec (default: bf16, fp8, int8, int4). ``--json`` prints one JSON
object; otherwise a rich table. A bad model, GPU, spec or number exits with code 2 and a
message naming the bad value.
"""
from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from kvmap.cli_errors import fail
from kvmap.config import format_bytes, parse_size
from kvmap.plan import capacity
from kvmap.plan.catalogue import get_gpu, get_model
from kvmap.plan.planner import CapacityPlan, plan_capacity

DEFAULT_KV_SPECS = ("bf16", "fp8", "int8", "int4")


def plan(
    model: str = typer.Option(..., help="Catalogued model name (e.g. llama-3-70b) or a "
                                        "Hugging Face config.json / model directory."),
    gpu: str = typer.Option(..., help="a100-40gb | a100-80gb | h100-80gb | h200 | l40s | rtx4090"),
    num_gpus: int = typer.Option(1, help="GPUs, tensor-parallel."),
    context: Optional[int] = typer.Option(None, help="Tokens per sequence; default: the "
                                                     "model's max_position_embeddings."),
    concurrency: int = typer.Option(1, help="Sequences at once, for the longest context."),
    kv: Optional[List[str]] = typer.Option(None, help="KV spec (repeatable); default: "
                                                      + ", ".join(DEFAULT_KV_SPECS)),
    weights: str = typer.Option("bf16", help="bf16 | fp8 | int8 | int4 | mxfp4 "
                                             "(int4: group 32; mxfp4: GPT-OSS's)"),
    block_size: int = typer.Option(16, help="Tokens per KV block."),
    gpu_memory_utilization: float = typer.Option(capacity.GPU_MEMORY_UTILIZATION,
                                                 help="Share of GPU memory to use, as vLLM."),
    reserve: str = typer.Option("2GiB", help="Per-GPU reserve for activations, CUDA graphs, "
                                             "NCCL."),
    all_global: bool = typer.Option(False, "--all-global", help="Add a row per spec with "
                                    "every sliding / chunked layer counted as global (the "
                                    "layout a hybrid model's saving is measured against)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Analytical KV capacity: bytes per token and sequence, sequences that fit, longest context."""
    try:
        plan_model, plan_gpu = get_model(model), get_gpu(gpu)
        reserve_bytes = parse_size(reserve, "reserve")
        plans = [plan_capacity(plan_model, plan_gpu, spec, context_tokens=context,
                               concurrency=concurrency, num_gpus=num_gpus, weights=weights,
                               block_size=block_size,
                               gpu_memory_utilization=gpu_memory_utilization,
                               reserve_bytes_per_gpu=reserve_bytes)
                 for spec in (kv or DEFAULT_KV_SPECS)]
        if all_global:
            plans += [replace(plan_capacity(
                plan_model.all_global(), plan_gpu, p.kv_spec, context_tokens=context,
                concurrency=concurrency, num_gpus=num_gpus, weights=weights,
                block_size=block_size, gpu_memory_utilization=gpu_memory_utilization,
                reserve_bytes_per_gpu=reserve_bytes), kv_spec=f"{p.kv_spec} (all-global)")
                for p in plans]
    except ValueError as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps({"model": plan_model.name, "gpu": plan_gpu.to_dict(),
                               "num_gpus": num_gpus, "weights_format": plans[0].weights_format,
                               "gpu_memory_utilization": gpu_memory_utilization,
                               "reserve_bytes_per_gpu": reserve_bytes,
                               "plans": [p.to_dict() for p in plans]}))
        return
    _print_table(plans, plan_gpu.description, gpu_memory_utilization, reserve_bytes)


def _print_table(plans: list[CapacityPlan], gpu_description: str, utilization: float,
                 reserve_bytes: int) -> None:
    p = plans[0]
    console = Console()
    if not console.is_terminal:      # piped or captured: rich would assume 80 columns
        console = Console(width=120)
    console.print(f"[bold]{p.model}[/] on {p.num_gpus} x {gpu_description} "
                  f"({format_bytes(p.memory_bytes_per_gpu)} each), block {p.block_size} tokens")
    console.print(f"weights {p.weights_format}: {format_bytes(p.weight_bytes)} "
                  f"({format_bytes(p.weight_bytes_per_gpu)} per GPU); KV room per GPU "
                  f"{format_bytes(max(0, p.usable_kv_bytes_per_gpu))} = memory x {utilization}"
                  f" - weights - {format_bytes(reserve_bytes)} reserve")
    n = p.concurrency
    table = Table(title=f"context {p.context_tokens} tokens, concurrency {n}", caption=(
        "seqs: sequences of the context that fit; step: memory-bound decode step time"))
    for header in ("KV spec", "bytes/token", "KV/seq", "resident", "seqs",
                   f"max ctx @{n}", f"step @{n}", "step @seqs"):
        table.add_column(header, justify="left" if header == "KV spec" else "right")
    for q in plans:
        limit = q.usable_max_context_tokens
        bounded = q.max_context_tokens is None or q.max_context_tokens > limit
        table.add_row(
            q.kv_spec, _bytes_per_token(q.kv_bytes_per_token), format_bytes(q.kv_bytes_per_seq),
            f"{q.resident_tokens_per_seq:,}", f"{q.max_concurrent_seqs:,}",
            f"{limit:,} (model)" if bounded else f"{limit:,}",
            _ms(q.decode_step_s), _ms(q.decode_step_s_at_max_seqs))
    console.print(table)
    _print_kinds(console, plans)
    for note in dict.fromkeys(note for q in plans for note in q.notes):
        console.print(f"note: {note}")


def _print_kinds(console: Console, plans: list[CapacityPlan]) -> None:
    """Per layer kind and KV spec: layers, bytes per token, bytes of one sequence at the
    context, read per decode step, and what the codec, a policy and tiers do there."""
    table = Table(title=f"per layer kind at {plans[0].context_tokens:,} tokens")
    for header in ("KV spec", "kind", "layers", "window", "bytes/token", "KV/seq",
                   "read/step"):
        table.add_column(header, justify="left" if header in ("KV spec", "kind") else "right")
    for q in plans:
        for name, k in (q.layer_kinds or {}).items():
            table.add_row(q.kv_spec, name, str(k["num_layers"]),
                          "-" if k["window"] is None else f"{k['window']:,}",
                          _bytes_per_token(k["bytes_per_token"]),
                          format_bytes(k["kv_bytes_per_seq"]),
                          format_bytes(k["decode_read_bytes_per_seq"]))
    console.print(table)
    for name, k in (plans[0].layer_kinds or {}).items():
        console.print(f"{name}: codec {k['codec']}; policy {k['policy']}; tiers {k['tiers']}")


def _bytes_per_token(num_bytes: float) -> str:
    return f"{num_bytes:,.0f}" if num_bytes == int(num_bytes) else f"{num_bytes:,.2f}"


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1e3:.1f} ms"


def register(app: typer.Typer) -> None:
    """Add ``plan`` to ``app``."""
    app.command("plan")(plan)
