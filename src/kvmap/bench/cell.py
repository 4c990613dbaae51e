"""One cell of a scenario -- a model and a KV configuration on one workload or one task --
run in its own process so that its peak memory is its own.

    python -m kvmap.bench.cell CELL.json RESULT.json

reads a ``CellSpec`` (``kvmap.bench.scenario``), runs it, and writes
``{"record": {...}, "rows": [...]}`` to RESULT.json (atomically). ``record`` is the
self-describing cell record (``RECORD_SCHEMA``; ``docs/bench.md`` lists every field),
``rows`` the per-request rows of a workload cell. A failure inside the cell is not a
crash: the record says ``"status": "failed"`` with the error and its traceback, and the
process exits 0. Progress goes to stdout as ``PROGRESS_PREFIX {"fraction": f}`` lines.

Workloads are driven here, not by ``LLM.generate``, so that arrivals are honoured:

- closed loop (``arrival: closed:N``): keep N requests in flight; a request's arrival is
  the moment it is sent;
- open loop (``poisson:R``, ``gamma:R:B``, a trace's own times): a request is added once
  its scheduled time has come and its ``arrival_s`` is that scheduled time (run start +
  offset), so waiting behind a long engine step counts in its TTFT;
- multi-turn: turn k is sent only after turn k-1 of its conversation finished.

Accuracy tasks: a name from ``kvmap.evals.TASKS`` (``ppl``, ``passkey``, ``needle``, ...)
runs through the evals ``Task`` API; anything else is ``module:function`` with the
contract ``function(llm, **params) -> dict`` of JSON-able metrics (``module`` may be a
``.py`` file, resolved against the scenario's folder).
"""
from __future__ import annotations

import gc
import importlib
import inspect
import json
import os
import re
import resource
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from kvmap.bench.scenario import CellSpec

RECORD_SCHEMA = "kvmap.bench.cell/1"
PROGRESS_PREFIX = "@@kvmap-progress"
EVAL_PARAMS = ("context_tokens", "num_samples", "continuation_tokens", "depths",
               "num_needles", "data_path", "corpus")
_NUMBER = re.compile(r"\d+")


class TaskUnavailable(ValueError):
    """A known task whose implementation cannot be imported (yet)."""


# ---- tasks ---------------------------------------------------------------------------

def eval_task_names() -> tuple[str, ...]:
    try:
        from kvmap.evals import TASKS
    except ImportError:
        return ("ppl", "passkey")
    return tuple(TASKS)


def is_eval_task(task: str) -> bool:
    return ":" not in task


def _import(module: str):
    """A module by dotted name, or a ``.py`` file by path."""
    if not module.endswith(".py"):
        return importlib.import_module(module)
    import importlib.util
    path = Path(module)
    if not path.is_file():
        raise ImportError(f"no file {module!r}")
    name = f"kvmap_user_task_{abs(hash(str(path.resolve())))}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def resolve_task(task: str) -> Callable | str:
    """A ``module:function`` callable, or the name of an evals task (checked importable).

    ``ValueError`` for an unknown name or a reference that does not import;
    ``TaskUnavailable`` for a known evals task whose module is missing.
    """
    if not isinstance(task, str) or not task:
        raise ValueError(f"task {task!r} must be a task name or 'module:function'")
    if not is_eval_task(task):
        module_name, _, attr = task.rpartition(":")
        try:
            fn = getattr(_import(module_name), attr)
        except (ImportError, AttributeError, OSError) as e:
            raise ValueError(f"task {task!r} does not import: {e}") from None
        if not callable(fn):
            raise ValueError(f"task {task!r} is not callable")
        return fn
    try:
        from kvmap.evals import TASKS
    except ImportError as e:
        raise TaskUnavailable(f"the accuracy tasks (kvmap.evals) do not import: {e}") from None
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(TASKS)}, or "
                         "'module:function'")
    module_name, _, cls = TASKS[task].partition(":")
    try:
        getattr(importlib.import_module(module_name), cls)
    except (ImportError, AttributeError) as e:
        raise TaskUnavailable(f"task {task!r} is not available yet: {e}") from None
    return task


def eval_options(params: dict, seed: int):
    """``EvalOptions`` from scenario task params (lists become tuples, ``corpus`` -> text)."""
    from kvmap.evals import EvalOptions
    from kvmap.workloads.corpus import load_text_file
    unknown = sorted(set(params) - set(EVAL_PARAMS))
    if unknown:
        raise ValueError(f"params: unknown parameter {unknown[0]!r}; valid: "
                         f"{', '.join(EVAL_PARAMS)}")
    kwargs = dict(params)
    for key in ("context_tokens", "depths"):
        if key in kwargs:
            value = kwargs[key]
            kwargs[key] = tuple(value) if isinstance(value, list) else (value,)
    if "data_path" in kwargs and not Path(kwargs["data_path"]).is_file():
        raise ValueError(f"params.data_path: data file {kwargs['data_path']!r} does not exist")
    if "corpus" in kwargs:
        kwargs["text"] = load_text_file(kwargs.pop("corpus"))
    return EvalOptions(**kwargs, seed=seed)


def check_task_params(task: str, fn: Callable | str, params: dict, seed: int = 0) -> None:
    """Refuse parameters the task does not take, before any cell runs."""
    if isinstance(fn, str):
        from kvmap.evals import get_task
        get_task(fn, eval_options(params, seed))
        return
    try:
        inspect.signature(fn).bind(None, **params)
    except TypeError as e:
        raise ValueError(f"params: task {task!r} does not take {sorted(params)}: {e}") from None


def task_tokens_needed(task: str, params: dict, seed: int = 0) -> int | None:
    """The longest sequence an evals task needs (None when not known in advance)."""
    if not is_eval_task(task):
        return None
    from kvmap.evals import get_task
    return get_task(task, eval_options(params, seed)).max_tokens_needed() or None


# ---- the engine ----------------------------------------------------------------------

def make_llm(cell: CellSpec, kv: str):
    from kvmap import LLM
    e = cell.engine
    return LLM(model=None if cell.model.name.lower() == "smollm2" else cell.model.name,
               dtype=cell.model.dtype, kv=kv, kv_memory=e.kv_memory, block_size=e.block_size,
               max_num_seqs=e.max_num_seqs, max_num_batched_tokens=e.max_num_batched_tokens,
               enable_prefix_caching=e.enable_prefix_caching, num_threads=e.num_threads,
               device=e.device, seed=cell.seed)


class ByteTokenizer:
    """For models without a tokenizer (``dummy:*``): one token per UTF-8 byte, mod vocab."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [b % self.vocab_size for b in text.encode("utf-8")]

    def decode(self, ids) -> str:
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")


def peak_rss_bytes() -> int:
    """Peak resident set of this process (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def kv_info(llm) -> dict:
    kv = llm.engine.kv
    return {"kv_bytes_per_token": kv.bytes_per_block / kv.block_size,
            "kv_bytes_per_block": kv.bytes_per_block,
            "kv_capacity_bytes": kv.bytes_per_block * kv.pool.num_blocks,
            "num_kv_blocks": kv.pool.num_blocks}


@dataclass
class LoopStats:
    """What the workload loop saw, sampled around every engine step."""

    start_s: float = 0.0
    duration_s: float = 0.0
    max_num_running_seqs: int = 0
    peak_tier_bytes: dict = field(default_factory=dict)
    num_steps: int = 0

    def sample(self, engine) -> None:
        self.max_num_running_seqs = max(self.max_num_running_seqs,
                                        len(engine.scheduler.running))
        for tier, usage in (engine.kv.usage().tiers or {}).items():
            resident = usage.get("resident_bytes", 0) if isinstance(usage, dict) else 0
            self.peak_tier_bytes[tier] = max(self.peak_tier_bytes.get(tier, 0), resident)


def drive(engine, requests: list, prompt_ids: list[list[int]], concurrency: int | None,
          on_finish: Callable[[int], None] | None = None) -> tuple[dict, dict, LoopStats]:
    """Send ``requests`` (``WorkloadRequest``s, in send order) through ``engine``.

    ``concurrency=None`` is an open loop on the requests' ``arrival_s`` offsets. Returns
    ``(outputs, errors, stats)``: ``RequestOutput`` by request id, the error text of
    requests the engine refused, and loop statistics. Mutates ``engine`` (its requests are
    all finished and popped on return).
    """
    from kvmap.request import SamplingParams
    stats = LoopStats()
    open_loop = concurrency is None
    order = list(range(len(requests)))
    if open_loop:
        order.sort(key=lambda i: requests[i].arrival_s or 0.0)
    pending, in_flight = order, set()
    position = {r.request_id: i for i, r in enumerate(requests)}
    outputs, errors = {}, {}
    finished_turn: dict[str, int] = {}           # conversation -> last finished turn
    finished_at: dict[str, float] = {}           # conversation -> when it finished
    t0 = stats.start_s = time.perf_counter()

    def ready(r) -> bool:
        return not r.turn or finished_turn.get(r.conversation_id, -1) >= r.turn - 1

    def done(r, when: float) -> None:
        if r.conversation_id is not None:
            finished_turn[r.conversation_id] = r.turn
            finished_at[r.conversation_id] = when
        if on_finish is not None:
            on_finish(len(outputs) + len(errors))

    while pending or in_flight:
        now, i, next_due = time.perf_counter(), 0, None
        while i < len(pending) and (open_loop or len(in_flight) < concurrency):
            r = requests[pending[i]]
            due = t0 + (r.arrival_s or 0.0) if open_loop else now
            if due > now:
                next_due = due
                break                            # sorted by arrival: none later is due
            if not ready(r):
                i += 1
                continue
            pending.pop(i)
            arrival = max(due, finished_at.get(r.conversation_id, due)) if r.turn else due
            params = SamplingParams(max_tokens=r.max_tokens, ignore_eos=r.ignore_eos)
            try:
                engine.add_request(prompt_ids[position[r.request_id]], params,
                                   request_id=r.request_id, arrival_s=arrival)
            except ValueError as e:
                errors[r.request_id] = str(e)
                done(r, time.perf_counter())
                continue
            in_flight.add(r.request_id)
        if not in_flight:
            if pending and next_due is None:
                raise RuntimeError(f"{len(pending)} requests wait for earlier turns that "
                                   "were never sent")
            if next_due is not None:
                time.sleep(max(0.0, next_due - time.perf_counter()))
            continue
        stats.sample(engine)
        for req in engine.step():
            if req.status.finished and req.request_id in in_flight:
                in_flight.discard(req.request_id)
                outputs[req.request_id] = engine.pop_finished(req.request_id)
                done(requests[position[req.request_id]],
                     req.metrics.finished_s or time.perf_counter())
        stats.num_steps += 1
        stats.sample(engine)
    stats.duration_s = time.perf_counter() - t0
    return outputs, errors, stats


def request_rows(cell: CellSpec, requests: list, outputs: dict, errors: dict,
                 t0: float) -> list[dict]:
    """One row per request, times in seconds from the workload's start (``t0``)."""
    from kvmap.metrics import request_stats

    def rel(t):
        return None if t is None else t - t0

    rows = []
    for r in requests:
        row = {"cell_id": cell.cell_id, "model": cell.model.name, "kv": cell.kv,
               "workload": cell.workload.name, "request_id": r.request_id,
               "conversation_id": r.conversation_id, "turn": r.turn,
               "scheduled_arrival_s": r.arrival_s, "expected": r.expected,
               "needle_depth": r.needle_depth, "max_tokens": r.max_tokens}
        out = outputs.get(r.request_id)
        if out is None:
            rows.append({**row, "failed": True, "error": errors.get(r.request_id, "not run"),
                         "finish_reason": None, "token_times_s": []})
            continue
        m, s = out.metrics, request_stats(out)
        correct = None
        if r.expected is not None:
            number = _NUMBER.search(out.text)
            correct = number is not None and number.group() == r.expected
        rows.append({**row, "failed": s.failed, "error": None,
                     "finish_reason": out.finish_reason, "arrival_s": rel(m.arrival_s),
                     "first_scheduled_s": rel(m.first_scheduled_s),
                     "finished_s": rel(m.finished_s),
                     "token_times_s": [t - t0 for t in m.token_times_s],
                     "num_prompt_tokens": m.num_prompt_tokens,
                     "num_cached_prompt_tokens": m.num_cached_prompt_tokens,
                     "num_output_tokens": m.num_output_tokens,
                     "num_preemptions": m.num_preemptions,
                     "ttft_s": s.ttft_s, "tpot_s": s.tpot_s, "e2e_s": s.e2e_s,
                     "queue_s": s.queue_s, "tbt_max_s": max(s.itl_s, default=None),
                     "output_text": out.text, "correct": correct})
    return rows


def _tier_metrics(usage: dict) -> dict:
    """Hit rate and IO of the lower tiers, from the counters the engine reports per tier
    (``num_hits``, ``num_misses``, ``bytes_read``, ``bytes_written``, ``io_s``); None
    where the engine reports none."""
    tiers = usage.get("tiers") or {}
    totals = {k: sum(t.get(k, 0) for t in tiers.values() if isinstance(t, dict))
              for k in ("num_hits", "num_misses", "bytes_read", "bytes_written", "io_s")}
    lookups = totals["num_hits"] + totals["num_misses"]
    has_io = any(isinstance(t, dict) and ("bytes_read" in t or "bytes_written" in t)
                 for t in tiers.values())
    return {"tier_hit_rate": totals["num_hits"] / lookups if lookups else None,
            "io_bytes": totals["bytes_read"] + totals["bytes_written"] if has_io else None,
            "io_latency_s": totals["io_s"] if has_io else None,
            "tiers": tiers}


def run_workload(cell: CellSpec, progress: Callable[[float], None]) -> tuple[dict, list]:
    from kvmap.metrics import aggregate
    from kvmap.evals.ppl import track_peak_kv_bytes
    from kvmap.workloads import build_requests
    t_load = time.perf_counter()
    llm = make_llm(cell, cell.kv)
    load_s = time.perf_counter() - t_load
    tokenizer = llm.tokenizer or ByteTokenizer(llm.model_config.vocab_size)
    spec = cell.workload.spec(cell.seed)
    requests = build_requests(spec, tokenizer)
    prompt_ids = [tokenizer.encode(r.prompt) if llm.tokenizer is None else llm.encode(r.prompt)
                  for r in requests]
    total = len(requests)
    from kvmap.bench.timeseries import TimeSeriesSampler
    with track_peak_kv_bytes(llm.engine) as peak, TimeSeriesSampler(llm.engine) as ts:
        outputs, errors, stats = drive(llm.engine, requests, prompt_ids, spec.concurrency,
                                       lambda n: progress(n / total))
    rows = request_rows(cell, requests, outputs, errors, stats.start_s)
    metrics = aggregate(rows, stats.duration_s, cell.slo)
    usage = llm.kv_usage()
    queries = usage.get("prefix_cache_queries") or 0
    judged = [r["correct"] for r in rows if r.get("correct") is not None]
    metrics.update(
        peak_kv_resident_bytes=peak[0],
        peak_kv_resident_bytes_per_tier={"device": peak[0], **stats.peak_tier_bytes},
        **kv_info(llm),
        max_num_running_seqs=stats.max_num_running_seqs,
        num_engine_steps=stats.num_steps,
        num_preemptions_engine=usage.get("num_preemptions"),
        prefix_cache_queries=queries, prefix_cache_hits=usage.get("prefix_cache_hits"),
        prefix_cache_hit_rate=(usage.get("prefix_cache_hits") or 0) / queries
        if queries else None,
        num_compressions=usage.get("num_compressions"),
        num_evicted_tokens=usage.get("num_evicted_tokens"),
        needle_accuracy=sum(judged) / len(judged) if judged else None,
        model_load_s=load_s,
        **_tier_metrics(usage), **ts.summary(), timeseries=ts.columns())
    # For the checklist (kvmap.bench.probes): output stability across batch compositions
    # and operator launches per decode step; after the workload, so they time nothing.
    from kvmap.bench.probes import run_probes
    metrics["probes"] = run_probes(llm, cell.seed)
    return metrics, rows


def run_task(cell: CellSpec, progress: Callable[[float], None]) -> tuple[dict, dict]:
    """``(metrics, details)`` of an accuracy-task cell."""
    from kvmap.evals.ppl import track_peak_kv_bytes
    task = cell.task
    fn = resolve_task(task.task)
    t_load = time.perf_counter()
    llm = make_llm(cell, cell.kv)
    load_s = time.perf_counter() - t_load
    info = kv_info(llm)
    if not isinstance(fn, str):
        with track_peak_kv_bytes(llm.engine) as peak:
            result = fn(llm, **task.params)
        if not isinstance(result, dict):
            raise TypeError(f"task {task.task!r} returned {type(result).__name__}, not a dict")
        return {**result, "peak_kv_resident_bytes": peak[0], **info,
                "model_load_s": load_s}, {}
    from kvmap.evals import Task, get_task
    evaluator = get_task(fn, eval_options(task.params, cell.seed))
    if llm.tokenizer is None:
        raise ValueError(f"model {cell.model.name!r} has no tokenizer; task {fn!r} needs text")
    samples = evaluator.prepare(llm.tokenizer)
    run = evaluator.run(llm, samples)
    progress(0.5)
    baseline_kv = cell.model.dtype
    needs_state = type(evaluator).compare is not Task.compare and run.state is not None
    if needs_state and cell.kv != baseline_kv:
        # The comparison needs the baseline's own outputs (e.g. logits for KL): run it
        # here, after freeing this configuration's engine.
        del llm
        gc.collect()
        baseline = evaluator.run(make_llm(cell, baseline_kv), samples)
        metrics = evaluator.compare(run, baseline)
    elif needs_state:
        metrics = evaluator.compare(run, run)
    else:
        metrics = dict(run.metrics)   # the paired delta vs the baseline cell: from the store
    metrics = {**metrics, "peak_kv_resident_bytes": run.metrics.get("kv_bytes_peak"), **info,
               "model_load_s": load_s, "baseline_kv": baseline_kv}
    return metrics, {"per_sample": run.per_sample}


# ---- the record ----------------------------------------------------------------------

def _jsonable(value):
    """Numbers, strings, lists and dicts only (tensors and numpy scalars converted)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def _load_avg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _num_threads() -> int | None:
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


def run_cell(cell: CellSpec, progress: Callable[[float], None] = lambda f: None
             ) -> tuple[dict, list[dict]]:
    """Run one cell in this process: ``(record, rows)``; never raises for a cell error."""
    record = {"schema": RECORD_SCHEMA, "cell_id": cell.cell_id, "kind": cell.kind,
              "model": cell.model.name, "dtype": cell.model.dtype, "kv": cell.kv,
              "workload": cell.workload.name if cell.workload else None,
              "task": cell.task.name if cell.task else None,
              "params": (cell.workload.options if cell.workload else cell.task.params),
              "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "status": "ok", "error": None, "warnings": [], "metrics": {}, "details": {}}
    rows: list[dict] = []
    t0 = time.perf_counter()
    load_start = _load_avg()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if cell.workload is not None:
                metrics, rows = run_workload(cell, progress)
            else:
                metrics, details = run_task(cell, progress)
                record["details"] = details
            record["metrics"] = metrics
        except Exception as e:  # noqa: BLE001 -- a failed cell is a result, not a crash
            record["status"] = "failed"
            record["error"] = f"{type(e).__name__}: {e}"
            record["traceback"] = traceback.format_exc(limit=8)
            rows = []
    record["warnings"] = list(dict.fromkeys(
        f"{w.category.__name__}: {w.message}" for w in caught))[:20]
    record["duration_s"] = time.perf_counter() - t0
    record["metrics"]["peak_rss_bytes"] = peak_rss_bytes()
    # How busy the machine was: timings from a shared, loaded machine are not comparable.
    record["env"] = {"num_threads": _num_threads(), "load_avg_1m_start": load_start,
                     "load_avg_1m_end": _load_avg(), "num_cpus": os.cpu_count(),
                     "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
    return _jsonable(record), _jsonable(rows)


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
