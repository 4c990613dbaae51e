"""Accuracy tasks: each KV configuration against the full-precision full cache.

    evaluate("ppl", ["int8", "kivi(bits=2)"], EvalOptions(context_tokens=(1536,)))
    -> {"task": "ppl", "baseline": {"kv": "bf16", "metrics": {...}},
        "results": [{"kv": "int8", "metrics": {...}}, ...], "options": {...}, ...}

Tasks (one module each; ``docs/evals.md`` says exactly what each measures):
``ppl`` (perplexity, KL, top-1 under teacher forcing), ``passkey`` and ``needle``
(retrieval over a context-length x depth grid), ``generation`` (greedy output
stability), ``mc`` (multiple choice by log-likelihood from a JSONL file).

A ``Task`` prepares its samples once (same text, same seed for every configuration),
runs them through one ``LLM`` at a time, and compares a run with the baseline's: every
result carries the paired per-sample delta with a bootstrap interval (``stats``).
The baseline is the model's own dtype as the KV codec (``bf16`` for a bf16 model) with
no selection policy.
"""
from __future__ import annotations

import gc
import importlib
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from kvmap.evals.stats import paired_delta
from kvmap.kv.config import KVConfig

TASKS = {  # task name -> "module:class", imported when used
    "ppl": "kvmap.evals.ppl:PPLTask",
    "passkey": "kvmap.evals.needle:PasskeyTask",
    "needle": "kvmap.evals.needle:NeedleTask",
    "generation": "kvmap.evals.generation:GenerationTask",
    "mc": "kvmap.evals.mc:MCTask",
}


@dataclass(frozen=True)
class EvalOptions:
    """What a task runs on. Empty / None fields take the task's defaults."""

    context_tokens: tuple[int, ...] = ()     # ppl, generation: one; passkey, needle: a grid
    num_samples: int | None = None           # per task (per grid cell for passkey/needle)
    seed: int = 0
    text: str | None = None                  # corpus text replacing the built-in one
    data_path: str | None = None             # mc: the JSONL file
    continuation_tokens: int | None = None   # ppl: tokens scored; generation: generated
    depths: tuple[float, ...] = ()           # passkey, needle: needle depths in [0, 1]
    num_needles: int | None = None           # needle: needles per prompt

    def __post_init__(self) -> None:
        for n in self.context_tokens:
            if not isinstance(n, int) or n < 1:
                raise ValueError(f"context={n!r} must be a positive number of tokens")
        for name in ("num_samples", "continuation_tokens", "num_needles"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}={value!r} must be a positive integer")
        for d in self.depths:
            if not 0.0 <= d <= 1.0:
                raise ValueError(f"depth={d!r} must be in [0, 1]")


@dataclass
class TaskRun:
    """One configuration's pass over the samples: ``metrics`` (JSON-able), one paired
    value per sample, and whatever the comparison needs (``state``, not reported)."""

    metrics: dict
    per_sample: list[float]
    state: Any = field(default=None, repr=False)


class Task:
    """Base: subclasses set ``name`` and override ``prepare`` and ``run``; ``compare``
    adds the paired delta of ``per_sample`` as ``delta_<paired_metric>``."""

    name: ClassVar[str]
    paired_metric: ClassVar[str] = "accuracy"

    def __init__(self, options: EvalOptions):
        self.options = options

    def max_tokens_needed(self, samples: list | None = None) -> int:
        """The longest sequence (prompt + output tokens) a sample may need: from the
        options alone when ``samples`` is None (0 = not known before ``prepare``)."""
        return 0

    def prepare(self, tokenizer) -> list:
        raise NotImplementedError

    def run(self, llm, samples: list) -> TaskRun:
        raise NotImplementedError

    def compare(self, run: TaskRun, baseline: TaskRun) -> dict:
        delta = paired_delta(run.per_sample, baseline.per_sample, seed=self.options.seed)
        return {**run.metrics, f"delta_{self.paired_metric}": delta}


def get_task(name: str, options: EvalOptions) -> Task:
    """The task called ``name``; ValueError listing the known names otherwise."""
    if name not in TASKS:
        raise ValueError(f"task {name!r} is not one of {', '.join(TASKS)}")
    module, cls = TASKS[name].split(":")
    return getattr(importlib.import_module(module), cls)(options)


def evaluate(task: str, kv_specs: Sequence[str], options: EvalOptions = EvalOptions(), *,
             model: str | None = None, dtype: str = "bf16", kv_memory: str = "256MiB",
             num_threads: int | None = None, make_llm: Callable[[str], Any] | None = None,
             log: Callable[[str], None] = lambda message: None) -> dict:
    """Run ``task`` for the baseline and each of ``kv_specs``; one result per spec, in order.

    Every spec, the task's options and (after the baseline model loads) the context
    against the model's are validated before any sample runs: ValueError names the bad
    value. ``make_llm(spec)`` builds one ``LLM`` (default: ``LLM(model, dtype, kv=spec,
    kv_memory, num_threads)``); one lives at a time. A spec equal to the baseline reuses its run.
    """
    evaluator = get_task(task, options)
    specs = [KVConfig.parse(spec).spec for spec in kv_specs]
    if not specs:
        raise ValueError("no KV spec to evaluate (give --kv at least once)")
    baseline_spec = dtype
    if make_llm is None:
        from kvmap import LLM
        def make_llm(spec: str):
            return LLM(model=model, dtype=dtype, kv=spec, kv_memory=kv_memory,
                       num_threads=num_threads)
    llm = make_llm(baseline_spec)
    model_id = getattr(llm.engine, "model_id", model)
    _check_fits(evaluator, None, llm.model_config.max_position_embeddings, task, options)
    if llm.tokenizer is None:
        raise ValueError(f"model {model_id!r} has no tokenizer; the eval tasks need text")
    samples = evaluator.prepare(llm.tokenizer)
    _check_fits(evaluator, samples, llm.model_config.max_position_embeddings, task, options)
    baseline = _timed(log, task, baseline_spec, lambda: evaluator.run(llm, samples))
    del llm
    results = []
    for spec in specs:
        if spec == baseline_spec:
            run = baseline
        else:
            gc.collect()
            llm = make_llm(spec)
            run = _timed(log, task, spec, lambda: evaluator.run(llm, samples))
            del llm
        results.append({"kv": spec, "metrics": evaluator.compare(run, baseline)})
        if run is not baseline:
            run.state = None                 # e.g. ppl's log-probs: samples x tokens x vocab
    gc.collect()
    return {"task": task, "model": model_id, "dtype": dtype,
            "baseline": {"kv": baseline_spec, "metrics": baseline.metrics},
            "results": results,
            "options": {k: v for k, v in asdict(options).items() if k != "text"}
            | {"text": "built-in corpus" if options.text is None else "user text"}}


def _check_fits(evaluator: Task, samples: list | None, max_tokens: int, task: str,
                options: EvalOptions) -> None:
    need = evaluator.max_tokens_needed(samples)
    if need > max_tokens:
        what = (f"context={list(options.context_tokens)}" if samples is None
                else f"data={options.data_path!r}")
        raise ValueError(f"{what}: task {task!r} needs sequences of {need} tokens; the "
                         f"model's context is {max_tokens} tokens")


def _timed(log: Callable[[str], None], task: str, spec: str, work: Callable[[], TaskRun]
           ) -> TaskRun:
    t0 = time.perf_counter()
    run = work()
    log(f"{task} {spec}: {time.perf_counter() - t0:.1f} s")
    return run


__all__ = ["EvalOptions", "TASKS", "Task", "TaskRun", "evaluate", "get_task"]
