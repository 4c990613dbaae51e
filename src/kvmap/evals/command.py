"""The ``kvmap eval`` command: ``register(app)`` adds it to a Typer app.

    kvmap eval --task ppl|passkey|needle|generation|mc --kv SPEC [--kv SPEC ...]
               [--context N ...] [--samples N] [--seed S] [--text-file F] [--data F]
               [--continuation N] [--depth D ...] [--needles K] [--model M] [--dtype D]
               [--kv-memory SIZE] [--threads N] [--json]

One result per ``--kv`` spec, each against the baseline (the model's dtype as the KV
codec, full cache). ``--json`` prints one JSON object ``{"task", "model", "dtype",
"baseline", "results": [{"kv", "metrics"}, ...], "options"}``; otherwise a rich table.
A bad task, spec, file, context or option exits with code 2 and a message naming it,
before any sample runs. Progress lines go to stderr.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, List, Optional

import typer
from rich.console import Console
from rich.table import Table

from kvmap.config import format_bytes
from kvmap.evals import TASKS, EvalOptions, evaluate

_TASK_OPTIONS = {  # option -> the tasks it applies to
    "--data": ("mc",), "--depth": ("passkey", "needle"), "--needles": ("needle",),
    "--text-file": ("ppl", "passkey", "needle", "generation"),
    "--continuation": ("ppl", "generation")}


def _eval_command(make_llm: Callable[[str], Any] | None):
    def eval_(
        task: str = typer.Option(..., help=" | ".join(TASKS)),
        kv: Optional[List[str]] = typer.Option(None, help="KV spec to evaluate (repeatable)."),
        context: Optional[List[int]] = typer.Option(
            None, help="Context tokens (ppl, generation: one; passkey, needle: repeatable "
                       "grid)."),
        samples: Optional[int] = typer.Option(None, help="Samples (per grid cell for "
                                                         "passkey/needle; mc: first N)."),
        seed: int = typer.Option(0, help="Seed for text, needles and the bootstrap."),
        text_file: Optional[str] = typer.Option(None, help="Corpus (text, or JSONL of "
                                                           "{\"text\"}) replacing the "
                                                           "built-in one."),
        data: Optional[str] = typer.Option(None, help="mc: JSONL in HellaSwag or ARC "
                                                      "format."),
        continuation: Optional[int] = typer.Option(
            None, help="ppl: tokens scored after the context (128); generation: tokens "
                       "generated (64)."),
        depth: Optional[List[float]] = typer.Option(None, help="passkey/needle: needle "
                                                               "depth in [0, 1] "
                                                               "(repeatable)."),
        needles: Optional[int] = typer.Option(None, help="needle: needles per prompt (2)."),
        model: Optional[str] = typer.Option(None, help="GGUF path, HF dir, dummy:<shape>; "
                                                       "default: embedded SmolLM2-135M."),
        dtype: str = typer.Option("bf16", help="fp32 | bf16 | fp16 (also the baseline's "
                                               "KV codec)"),
        kv_memory: str = typer.Option("256MiB", help="KV pool byte budget"),
        threads: Optional[int] = typer.Option(None, help="Torch CPU threads (1 is fastest "
                                                         "on a busy machine)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Accuracy of KV configurations against the full-precision full cache."""
        from kvmap.cli_errors import fail
        given = {"--data": data, "--depth": depth, "--needles": needles,
                 "--text-file": text_file, "--continuation": continuation}
        try:
            if task not in TASKS:
                raise ValueError(f"task {task!r} is not one of {', '.join(TASKS)}")
            for option, tasks in _TASK_OPTIONS.items():
                if given[option] is not None and task not in tasks:
                    raise ValueError(f"{option} does not apply to task {task!r} "
                                     f"(only {', '.join(tasks)})")
            text = None
            if text_file is not None:
                from kvmap.workloads.corpus import load_text_file
                text = load_text_file(text_file)
            options = EvalOptions(context_tokens=tuple(context or ()), num_samples=samples,
                                  seed=seed, text=text, data_path=data,
                                  continuation_tokens=continuation,
                                  depths=tuple(depth or ()), num_needles=needles)
            result = evaluate(task, kv or [], options, model=model, dtype=dtype,
                              kv_memory=kv_memory, num_threads=threads, make_llm=make_llm,
                              log=lambda line: typer.echo(f"[eval] {line}", err=True))
        except (ValueError, FileNotFoundError) as e:
            fail(str(e))
        if as_json:
            typer.echo(json.dumps(result))
        else:
            _print_table(result)
    return eval_


_COLUMNS = {  # task -> (header, metric key, format)
    "ppl": [("ppl", "ppl", "{:.3f}"), ("Δppl %", "ppl_delta_pct", "{:+.2f}"),
            ("Δppl % CI", "delta_ppl_pct", "ci"), ("KL mean", "kl_mean", "{:.2e}"),
            ("KL P99", "kl_p99", "{:.2e}"), ("top-1", "top1_agreement", "{:.2%}"),
            ("top-1 (ties)", "top1_agreement_ties", "{:.2%}")],
    "needle": [("accuracy", "accuracy", "{:.2%}"), ("n", "n", "{}"),
               ("Δacc CI", "delta_accuracy", "ci")],
    "generation": [("exact match", "exact_match", "{:.2%}"),
                   ("first div mean", "first_divergence_mean", "{:.1f}"),
                   ("first div P50", "first_divergence_p50", "{:.0f}"),
                   ("token agreement", "token_agreement", "{:.2%}")],
    "mc": [("accuracy", "accuracy", "{:.2%}"), ("acc_norm", "accuracy_norm", "{:.2%}"),
           ("n", "n", "{}"), ("Δacc CI", "delta_accuracy", "ci")],
}
_COLUMNS["passkey"] = _COLUMNS["needle"]


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if fmt == "ci":
        return f"[{value['ci_low']:+.3g}, {value['ci_high']:+.3g}]"
    return fmt.format(value)


def _print_table(result: dict) -> None:
    console = Console()
    if not console.is_terminal:      # piped or captured: rich would assume 80 columns
        console = Console(width=140)
    columns = _COLUMNS[result["task"]]
    table = Table(title=f"{result['task']} on {result['model']} ({result['dtype']}), "
                        f"baseline KV {result['baseline']['kv']}")
    for header in ["KV spec", *(h for h, _, _ in columns), "KV peak"]:
        table.add_column(header, justify="left" if header == "KV spec" else "right")
    for row in result["results"]:
        m = row["metrics"]
        table.add_row(row["kv"], *(_cell(m.get(key), fmt) for _, key, fmt in columns),
                      format_bytes(m["kv_bytes_peak"]))
    console.print(table)
    for row in result["results"]:
        for cell in row["metrics"].get("grid", []):
            console.print(f"{row['kv']}: context {cell['context_tokens']}, depth "
                          f"{cell['depth']:.2f}: {cell['accuracy']:.0%} of {cell['n']}")


def register(app: typer.Typer, make_llm: Callable[[str], Any] | None = None) -> None:
    """Add ``eval`` to ``app``. ``make_llm(spec)`` builds each ``LLM`` (tests pass a tiny
    model); by default ``LLM(--model, --dtype, kv=spec, --kv-memory)``."""
    app.command("eval")(_eval_command(make_llm))
