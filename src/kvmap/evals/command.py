"""The ``kvmap eval`` command: ``register(app)`` adds it to a Typer app.

    kvmap eval --task NAME --kv SPEC [--kv SPEC ...]      (NAME: a task in evals.TASKS)
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

from kvmap.cli_options import engine_options
from kvmap.config import EngineArgs, format_bytes
from kvmap.evals import TASKS, Column, EvalOptions, evaluate

_OPTION_FIELDS = {  # task-specific option -> the EvalOptions field a task must take
    "--data": "data_path", "--depth": "depths", "--needles": "num_needles",
    "--text-file": "text", "--continuation": "continuation_tokens"}


def _eval_command(make_llm: Callable[[str], Any] | None):
    @engine_options("model", "dtype", "kv_memory", "quantization", "num_threads",
                    flags={"num_threads": "--threads"})
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
                                                      "format; qa: JSONL of {context, "
                                                      "question, answers}."),
        continuation: Optional[int] = typer.Option(
            None, help="ppl: tokens scored after the context (128); generation: tokens "
                       "generated (64)."),
        depth: Optional[List[float]] = typer.Option(None, help="passkey/needle: needle "
                                                               "depth in [0, 1] "
                                                               "(repeatable)."),
        needles: Optional[int] = typer.Option(None, help="needle: needles per prompt (2)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
        engine: EngineArgs | None = None,        # made by @engine_options
    ) -> None:
        """Accuracy of KV configurations against the full-precision full cache (the
        baseline: --dtype as the KV codec, dense weights; --quantization applies to every
        --kv run)."""
        from kvmap.cli_errors import fail
        given = {"--data": data, "--depth": depth, "--needles": needles,
                 "--text-file": text_file, "--continuation": continuation}
        try:
            if task not in TASKS:
                raise ValueError(f"task {task!r} is not one of {', '.join(TASKS)}")
            for option, field_name in _OPTION_FIELDS.items():
                if given[option] is not None and field_name not in TASKS.get(task).takes:
                    tasks = [n for n, cls in TASKS.items() if field_name in cls.takes]
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
            result = evaluate(task, kv or [], options, engine=engine, make_llm=make_llm,
                              log=lambda line: typer.echo(f"[eval] {line}", err=True))
        except (ValueError, FileNotFoundError) as e:
            fail(str(e))
        if as_json:
            typer.echo(json.dumps(result))
        else:
            _print_table(result)
    return eval_


_SKIPPED = {"kv_bytes_peak", "wall_s"}       # shown apart (KV peak) or not at all


def columns_of(task: str, metrics: dict) -> list[Column]:
    """The task's own ``columns``; for a task that declares none, one column per number
    in its metrics and one per interval dict (``delta_*``)."""
    declared = TASKS.get(task).columns if task in TASKS else ()
    if declared:
        return list(declared)
    out = []
    for key, value in metrics.items():
        if key in _SKIPPED or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            out.append(Column(key, key, "{:.4g}"))
        elif isinstance(value, dict) and {"ci_low", "ci_high"} <= set(value):
            out.append(Column(key, key, "ci"))
    return out


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if fmt == "ci":
        low, high = (value["ci_low"], value["ci_high"]) if isinstance(value, dict) else value
        return f"[{low:+.3g}, {high:+.3g}]"
    return fmt.format(value)


def _print_table(result: dict) -> None:
    console = Console()
    if not console.is_terminal:      # piped or captured: rich would assume 80 columns
        console = Console(width=140)
    columns = columns_of(result["task"], result["results"][0]["metrics"]
                         if result["results"] else {})
    table = Table(title=f"{result['task']} on {result['model']} ({result['dtype']}), "
                        f"baseline KV {result['baseline']['kv']}")
    for header in ["KV spec", *(h for h, _, _ in columns), "KV peak"]:
        table.add_column(header, justify="left" if header == "KV spec" else "right")
    for row in result["results"]:
        m = row["metrics"]
        table.add_row(row["kv"], *(_cell(m.get(key), fmt) for _, key, fmt in columns),
                      "-" if m.get("kv_bytes_peak") is None
                      else format_bytes(m["kv_bytes_peak"]))
    console.print(table)
    for row in result["results"]:
        for cell in row["metrics"].get("grid", []):
            console.print(f"{row['kv']}: context {cell['context_tokens']}, depth "
                          f"{cell['depth']:.2f}: {cell['accuracy']:.0%} of {cell['n']}")


def register(app: typer.Typer, make_llm: Callable[[str], Any] | None = None) -> None:
    """Add ``eval`` to ``app``. ``make_llm(spec)`` builds each ``LLM`` (tests pass a tiny
    model); by default ``LLM`` of the command's engine options with ``kv=spec``."""
    app.command("eval")(_eval_command(make_llm))
