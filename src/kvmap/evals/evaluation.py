"""Running an eval task for the baseline and each KV configuration (``evaluate``)."""
from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Any

from kvmap.config import EngineArgs
from kvmap.evals.base import EvalOptions, Task, TaskRun, get_task
from kvmap.kv.config import KVConfig


def evaluate(task: str, kv_specs: Sequence[str], options: EvalOptions = EvalOptions(), *,
             engine: EngineArgs = EngineArgs(),
             make_llm: Callable[[str], Any] | None = None,
             log: Callable[[str], None] = lambda message: None) -> dict:
    """Run ``task`` for the baseline and each of ``kv_specs``; one result per spec, in order.

    Every spec, the task's options and (after the baseline model loads) the context
    against the model's are validated before any sample runs: ValueError names the bad
    value. ``engine``: the settings every ``LLM`` runs with (its ``kv`` is each spec's);
    ``make_llm(spec)`` builds one ``LLM`` instead (tests); one lives at a time. A spec
    equal to the baseline reuses its run. ``engine.quantization``
    (``kvmap.model.wquant``): every spec runs on weights in that format, compared with
    the baseline on dense weights (so a bf16 spec measures the weights alone).
    """
    from kvmap.hardware import resolve_dtype
    evaluator = get_task(task, options)
    model, quantization = engine.model, engine.quantization
    dtype = resolve_dtype(engine.dtype, "cpu")      # "auto": this machine's exact dtype
    specs = [dtype if s.strip() == "auto" else KVConfig.parse(s, dtype).spec
             for s in kv_specs]
    if not specs:
        raise ValueError("no KV spec to evaluate (give --kv at least once)")
    baseline_spec = dtype
    if quantization is not None:
        from kvmap.model.wquant import check_quantization
        check_quantization(quantization, "cpu")
        if make_llm is not None:
            raise ValueError("quantization and a custom make_llm cannot be combined")
    if make_llm is None:
        from kvmap import LLM
        def make_llm(spec: str, quantization: str | None = None):
            return LLM(args=replace(engine, dtype=dtype, kv=spec, quantization=quantization))
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
        if spec == baseline_spec and quantization is None:
            run = baseline
        else:
            gc.collect()
            llm = make_llm(spec, quantization) if quantization else make_llm(spec)
            run = _timed(log, task, spec, lambda: evaluator.run(llm, samples))
            del llm
        results.append({"kv": spec, "metrics": evaluator.compare(run, baseline),
                        "per_sample": run.per_sample})
        if run is not baseline:
            run.state = None                 # e.g. ppl's log-probs: samples x tokens x vocab
    gc.collect()
    return {"task": task, "model": model_id, "dtype": dtype, "quantization": quantization,
            "baseline": {"kv": baseline_spec, "metrics": baseline.metrics,
                         "per_sample": baseline.per_sample},
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
