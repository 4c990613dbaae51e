"""One cell of a scenario -- a model and a KV configuration on one workload load level or
one task -- run in its own process so that its peak memory is its own.

    python -m kvmap.bench.cell CELL.json RESULT.json

reads a ``CellSpec`` (``kvmap.bench.cellspec``), runs it, and writes
``{"record": {...}, "rows": [...]}`` to RESULT.json (atomically). ``record`` is the
``CellRecord`` (``kvmap.runs.record``; ``docs/bench.md`` lists every field), ``rows`` the
per-request rows of a workload cell. A failure inside the cell is not a crash: the
record says ``"status": "failed"`` with the error and its traceback, and the process
exits 0. Progress goes to stdout as ``PROGRESS_PREFIX {"fraction": f}`` lines.

Workloads are driven by ``kvmap.bench.drive`` (arrivals honoured); accuracy tasks run
through the evals ``Task`` API or a ``module:function`` (``kvmap.bench.tasks``).
"""
from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from kvmap.bench.cell_process import PROGRESS_PREFIX
from kvmap.bench.cellspec import CellSpec
from kvmap.bench.endpoint_spec import EndpointUnavailable
from kvmap.hardware.process import load_avg, machine_env, peak_rss_bytes
from kvmap.jsonable import jsonable
from kvmap.runs.record import CellRecord

__all__ = ["main", "run_cell"]


def make_llm(cell: CellSpec, kv: str | None = None):
    from kvmap import LLM
    return LLM(args=cell.engine_args(kv))


def kv_info(llm, cell: CellSpec) -> dict:
    from kvmap.config import parse_kv_memory
    kv = llm.engine.kv
    _, budget_tokens = parse_kv_memory(cell.engine.kv_memory) \
        if cell.engine.num_blocks is None else (None, None)
    return {"kv_bytes_per_token": kv.bytes_per_block / kv.block_size,
            "kv_bytes_per_block": kv.bytes_per_block, "kv_block_size": kv.block_size,
            "kv_capacity_bytes": kv.bytes_per_block * kv.pool.num_blocks,
            "kv_capacity_tokens": kv.pool.num_blocks * kv.block_size,
            "kv_budget_tokens_bf16": budget_tokens,
            "num_kv_blocks": kv.pool.num_blocks,
            "weight_bytes": llm.engine.model.weight_bytes}


def run_workload(cell: CellSpec, progress: Callable[[float], None]) -> tuple[dict, list]:
    from kvmap.bench.drive import drive
    from kvmap.bench.workload_metrics import (load_metrics, prefix_metrics, request_rows,
                                              throughput_windows, tier_metrics)
    from kvmap.bench.timeseries import TimeSeriesSampler
    from kvmap.model.byte_tokenizer import ByteTokenizer
    from kvmap.evals.kv_peak import track_peak_kv_bytes
    from kvmap.kv.layer_kinds import LayerKindPeak
    from kvmap.metrics import aggregate
    from kvmap.workloads import build_requests
    t_load = time.perf_counter()
    llm = make_llm(cell)
    load_s = time.perf_counter() - t_load
    tokenizer = llm.tokenizer or ByteTokenizer.for_model(llm.model_config)
    spec = cell.workload.spec(cell.seed)
    requests = build_requests(spec, tokenizer)
    prompt_ids = [tokenizer.encode(r.prompt) if llm.tokenizer is None else llm.encode(r.prompt)
                  for r in requests]
    total = len(requests)
    watch = None
    if ((cell.workload.load or {}).get("search") or {}).get("role") in ("level", "bisect"):
        from kvmap.bench.saturation import SaturationWatch
        watch = SaturationWatch(total)       # a search's open-loop level may stop early
    with track_peak_kv_bytes(llm.engine) as peak, TimeSeriesSampler(llm.engine) as ts, \
            LayerKindPeak(llm.engine.kv) as kinds:
        outputs, errors, loop = drive(llm.engine, requests, prompt_ids, spec.concurrency,
                                      lambda n: progress(n / total), watch=watch)
    stats = llm.stats()
    rows = request_rows(cell, requests, outputs, errors, loop.start_s)
    metrics = aggregate(rows, loop.duration_s, cell.slo)
    judged = [r["correct"] for r in rows if r.get("correct") is not None]
    metrics.update(
        peak_kv_resident_bytes=peak[0],
        peak_kv_resident_bytes_per_tier={"device": peak[0], **loop.peak_tier_bytes},
        peak_kv_resident_bytes_by_kind=kinds.by_kind or None,
        **kv_info(llm, cell), **load_metrics(stats, loop.duration_s),
        output_throughput_windows_tok_s=throughput_windows(rows, loop.duration_s),
        **prefix_metrics(stats),
        needle_accuracy=sum(judged) / len(judged) if judged else None,
        model_load_s=load_s, **tier_metrics(stats), **ts.summary(),
        timeseries=ts.columns())
    if cell.slo:                 # the SLA capacity search reads its levels by this
        from kvmap.runs.search import slo_attainment
        target = ((cell.workload.search if cell.workload else None) or {}).get("attainment")
        metrics["slo_attainment"] = slo_attainment(rows, cell.slo, target or 0.99)
    if watch is not None and watch.stop:
        metrics["stopped_early"] = watch.summary()
    # For the checklist (kvmap.bench.probes): output stability across batch compositions
    # and operator launches per decode step; after the workload, so they time nothing.
    if cell.run_probes:          # once per configuration (CellSpec.run_probes)
        from kvmap.bench.probes import run_probes
        metrics["probes"] = run_probes(llm, cell.seed)
    return metrics, rows


def run_task(cell: CellSpec, progress: Callable[[float], None]) -> tuple[dict, dict]:
    """``(metrics, details)`` of an accuracy-task cell."""
    from kvmap.bench.tasks import eval_options, resolve_task
    from kvmap.evals.kv_peak import track_peak_kv_bytes
    task = cell.task
    fn = resolve_task(task.task)
    t_load = time.perf_counter()
    llm = make_llm(cell)
    load_s = time.perf_counter() - t_load
    info = kv_info(llm, cell)
    if not isinstance(fn, str):
        with track_peak_kv_bytes(llm.engine) as peak:
            result = fn(llm, **task.params)
        if not isinstance(result, dict):
            raise TypeError(f"task {task.task!r} returned {type(result).__name__}, not a dict")
        return {**result, "peak_kv_resident_bytes": peak[0], **info,
                "model_load_s": load_s}, {}
    from kvmap.evals import get_task
    evaluator = get_task(fn, eval_options(task.params, cell.seed))
    if llm.tokenizer is None:
        raise ValueError(f"model {cell.model.name!r} has no tokenizer; task {fn!r} needs text")
    samples = evaluator.prepare(llm.tokenizer)
    run = evaluator.run(llm, samples)
    progress(0.5)
    baseline_kv = cell.model.dtype
    if run.state is None:
        # the paired delta vs the baseline cell is computed from the store
        metrics = dict(run.metrics)
    elif cell.kv == baseline_kv and cell.model.quantization is None:
        metrics = evaluator.compare(run, run)
    else:
        # The comparison needs the baseline's own outputs (``TaskRun.state``, e.g. the
        # log-probs for KL) -- unquantized weights, the dtype as KV codec: run it here,
        # after freeing this configuration's engine.
        del llm
        gc.collect()
        dense = replace(cell, model=replace(cell.model, quantization=None))
        metrics = evaluator.compare(run, evaluator.run(make_llm(dense, baseline_kv), samples))
    metrics = {**metrics, "peak_kv_resident_bytes": run.metrics.get("kv_bytes_peak"), **info,
               "model_load_s": load_s, "baseline_kv": baseline_kv}
    return metrics, {"per_sample": run.per_sample}


def run_cell(cell: CellSpec, progress: Callable[[float], None] = lambda f: None
             ) -> tuple[dict, list[dict]]:
    """Run one cell in this process: ``(record, rows)``; never raises for a cell error."""
    record = CellRecord.of_cell(cell)
    rows: list[dict] = []
    t0 = time.perf_counter()
    load_start = load_avg()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if cell.endpoint is not None and cell.workload is not None:   # over HTTP
                from kvmap.bench.endpoint_workload import run_endpoint_workload
                record.metrics, rows = run_endpoint_workload(cell, progress)
            elif cell.endpoint is not None:
                from kvmap.bench.endpoint_tasks import run_endpoint_task
                record.metrics, record.details = run_endpoint_task(cell, progress)
            elif cell.workload is not None:
                record.metrics, rows = run_workload(cell, progress)
            else:
                record.metrics, record.details = run_task(cell, progress)
        except EndpointUnavailable as e:       # e.g. a task needs log-probs it lacks
            record.status, record.error = "unavailable", str(e)
        except Exception as e:  # noqa: BLE001 -- a failed cell is a result, not a crash
            record.fail(f"{type(e).__name__}: {e}", traceback.format_exc(limit=8))
            rows = []
    if cell.task is not None:
        from kvmap.bench.tasks import task_kind
        try:
            record.task_kind = task_kind(cell.task.task, record.metrics, record.details)
        except ValueError:      # a task that does not resolve: the cell failed on it
            pass
    record.warnings = list(dict.fromkeys(
        f"{w.category.__name__}: {w.message}" for w in caught))[:20]
    warning = tier_error_warning(record.metrics)
    if warning:
        record.warnings.insert(0, warning)
    record.duration_s = time.perf_counter() - t0
    record.metrics["peak_rss_bytes"] = peak_rss_bytes()
    record.metrics["device_peak_bytes"] = device_peak_bytes()
    record.env = machine_env(load_start)
    return record.to_dict(), jsonable(rows)


def device_peak_bytes() -> int | None:
    """``torch.cuda.max_memory_allocated`` of this process (a cell runs in its own), or
    None when CUDA was never initialised here (a CPU cell)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.max_memory_allocated())


def tier_error_warning(metrics: dict) -> str | None:
    """The record warning that names a cell's tier faults by tier and kind (None when
    there were none): a run with a dead Redis must not read as a clean run."""
    kinds = {f"{name}:{kind}": n for name, t in (metrics.get("tiers") or {}).items()
             for kind, n in (t.get("errors") or {}).items() if n}
    if not kinds:
        return None
    return (f"TierErrors: {sum(kinds.values())} tier errors ("
            + ", ".join(f"{k}={n}" for k, n in sorted(kinds.items())) + ")")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m kvmap.bench.cell CELL.json RESULT.json", file=sys.stderr)
        return 2
    cell = CellSpec.from_dict(json.loads(Path(argv[0]).read_text()))

    def progress(fraction: float) -> None:
        print(f"{PROGRESS_PREFIX} {json.dumps({'fraction': fraction})}", flush=True)

    record, rows = run_cell(cell, progress)
    out = Path(argv[1])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"record": record, "rows": rows}))
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
