"""What a cell computes, counted in tokens before it runs: ``Work``.

The estimator (``estimate.py``) turns ``Work`` into seconds with the machine's rates. The
counts come from the scenario alone -- the workload's lengths, arrival and pool, a task's
samples -- never from a run:

- a workload: N requests of mean prompt P and mean output O. The batch B that decodes at
  once is the smallest of the load (``closed:C``; an open loop's rate x a request's time,
  Little's law), ``max_num_seqs`` and what the pool holds at the configuration's bytes per
  token (``scenario_checks.pool_tokens``; a selection policy keeps ``budget`` of a
  prompt). Then ``N x P`` prompt tokens are prefilled, ``N x O`` tokens decoded in
  ``N x O / B`` steps, each decoded token reading ``P_kept + O/2`` cached tokens. An open
  loop lasts at least its schedule (``N / rate``). Preemptions' recomputed prefill and an
  early EOS are not counted.
- a task: per task name (``TASK_WORK``): ppl prefills each sample's context and decodes its
  continuation one token at a time, twice when the cell also runs the baseline for the
  comparison; passkey / needle prefill every trial's document and decode a short answer,
  batched; chat_generation decodes up to its output cap. An unknown task counts as
  ``num_samples`` prompts of 1,024 tokens and 16 output tokens (a guess, said in the estimate's note).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvmap.bench.cellspec import CellSpec
from kvmap.registry import Registry

UNKNOWN_TASK_PROMPT_TOKENS = 1024
UNKNOWN_TASK_OUTPUT_TOKENS = 16


@dataclass(frozen=True)
class Work:
    """Token counts of one cell (module docstring); ``passes``: model loads in the cell."""

    prefill_tokens: float = 0.0
    prefill_pairs: float = 0.0        # sum over prefilled tokens of the tokens before them
    decode_steps: float = 0.0
    decode_tokens: float = 0.0
    decode_pairs: float = 0.0         # sum over decoded tokens of the cached tokens read
    passes: int = 1
    floor_s: float = 0.0              # an open loop's schedule: the cell lasts at least this
    num_requests: int = 0
    note: str = ""

    def __add__(self, other: Work) -> Work:
        return Work(*(getattr(self, f) + getattr(other, f) for f in
                      ("prefill_tokens", "prefill_pairs", "decode_steps", "decode_tokens",
                       "decode_pairs")), passes=max(self.passes, other.passes),
                    floor_s=max(self.floor_s, other.floor_s),
                    num_requests=self.num_requests + other.num_requests,
                    note="; ".join(n for n in (self.note, other.note) if n))


def batch_work(num_requests: float, prompt_tokens: float, output_tokens: float,
               batch: float, kept_prompt_tokens: float | None = None) -> Work:
    """``num_requests`` requests of ``prompt_tokens`` + ``output_tokens``, ``batch`` at a
    time (module docstring)."""
    kept = prompt_tokens if kept_prompt_tokens is None else kept_prompt_tokens
    n, batch = float(num_requests), max(1.0, float(batch))
    return Work(prefill_tokens=n * prompt_tokens,
                prefill_pairs=n * prompt_tokens * prompt_tokens / 2,
                decode_steps=n * output_tokens / batch if output_tokens else 0.0,
                decode_tokens=n * output_tokens,
                decode_pairs=n * output_tokens * (kept + output_tokens / 2),
                num_requests=int(num_requests))


def kept_fraction(kv: str, dtype: str | None) -> float:
    """The share of a prompt a selection policy keeps (1.0 without one)."""
    from kvmap.kv.config import KVConfig
    policy = KVConfig.parse(kv, dtype).policy
    budget = (getattr(policy, "options", None) or {}).get("budget") if policy else None
    return float(budget) if isinstance(budget, (int, float)) and 0 < budget <= 1 else 1.0


@dataclass(frozen=True)
class Pool:
    """What the cell's pool holds: tokens at its configuration, and its sequence cap."""

    tokens: int
    max_num_seqs: int

    def batch(self, load: float, per_request_tokens: float) -> float:
        """Sequences decoding at once under ``load`` in flight (at least one)."""
        fits = self.tokens / max(1.0, per_request_tokens)
        return max(1.0, min(load, float(self.max_num_seqs), fits))


def workload_work(cell: CellSpec, pool: Pool, request_s: Callable[[Work], float]) -> Work:
    """The ``Work`` of a workload cell; ``request_s(work)`` is the estimator's time for
    one request alone (an open loop's batch is its rate x that time)."""
    spec = cell.workload.spec(cell.seed)
    turns = spec.num_turns if spec.kind in ("multi-turn", "mixed") else 1
    if spec.kind == "trace":
        from kvmap.workloads.trace import load_trace
        entries = load_trace(spec.trace_path)
        entries = entries[:spec.num_requests] if spec.num_requests else entries
        n = max(1, len(entries))
        prompt = sum(e.prompt_tokens or 0 for e in entries) / n
        output = sum(e.max_tokens or 0 for e in entries) / n
        span = max((e.arrival_s or 0.0 for e in entries), default=0.0)
    else:
        n = spec.num_requests * turns
        prompt, output = spec.prompt_len.mean_tokens, spec.output_len.mean_tokens
        span = 0.0
    # an endpoint's cell: its server's cache is not a KV spec of kvmap's
    kept = prompt * (1.0 if cell.endpoint is not None
                     else kept_fraction(cell.kv, cell.model.dtype))
    alone = request_s(batch_work(1, prompt, output, 1, kept))
    arrival, floor_s = spec.arrival, span
    if arrival is None:                                   # a trace's own times
        load = n * alone / span if span > 0 else float(n)
    elif hasattr(arrival, "concurrency"):
        load = float(arrival.concurrency)
    else:
        rate = float(arrival.rate_per_s)
        load = float(n) if rate == float("inf") else rate * alone
        floor_s = 0.0 if rate == float("inf") else n / rate
    batch = pool.batch(min(load, n), kept + output)
    work = batch_work(n, prompt, output, batch, kept)
    return Work(**{**work.__dict__, "floor_s": floor_s + (alone if floor_s else 0.0),
                   "num_requests": int(n)})


# ---- tasks ---------------------------------------------------------------------------------

TaskWork = Callable[[object, CellSpec, Pool], Work]
TASK_WORK: Registry[TaskWork] = Registry("task cost")


def compares_in_cell(cell: CellSpec) -> bool:
    """Whether a task cell also runs the baseline (its comparison needs the baseline's own
    outputs: ``TaskRun.state``) -- every configuration but the baseline itself."""
    return cell.kv != cell.model.dtype or cell.model.quantization is not None


@TASK_WORK.register("ppl")
def _ppl(task, cell: CellSpec, pool: Pool) -> Work:
    work = batch_work(task.num_samples, task.context, task.continuation, 1)
    return Work(**{**work.__dict__, "passes": 2 if compares_in_cell(cell) else 1})


@TASK_WORK.register("passkey")
def _passkey(task, cell: CellSpec, pool: Pool) -> Work:
    from kvmap.evals.retrieval import ANSWER_TOKENS
    work = Work()
    per_context = len(task.depths) * task.num_samples
    for context in task.contexts:
        work = work + batch_work(per_context, context, ANSWER_TOKENS,
                                 pool.batch(per_context, context + ANSWER_TOKENS))
    return work


TASK_WORK.register("needle")(_passkey)


@TASK_WORK.register("chat_generation")
def _chat(task, cell: CellSpec, pool: Pool) -> Work:
    prompt = task.context + 32                           # + the chat template
    return batch_work(task.num_samples, prompt, task.max_output_tokens,
                      pool.batch(task.num_samples, prompt + task.max_output_tokens))


def task_work(cell: CellSpec, pool: Pool) -> Work:
    """The ``Work`` of a task cell (``TASK_WORK``, else the unknown-task guess)."""
    from kvmap.bench.tasks import eval_options, is_eval_task
    entry = cell.task
    if is_eval_task(entry.task):
        from kvmap.evals import get_task
        task = get_task(entry.task, eval_options(entry.params, cell.seed))
        if entry.task in TASK_WORK:
            return TASK_WORK[entry.task](task, cell, pool)
        samples = getattr(task, "num_samples", None) or 8
    else:
        samples = int(entry.params.get("num_samples", 8) or 8)
    work = batch_work(samples, UNKNOWN_TASK_PROMPT_TOKENS, UNKNOWN_TASK_OUTPUT_TOKENS, 1)
    return Work(**{**work.__dict__, "note": f"task {entry.task!r}: not costed per token, "
                   f"taken as {samples} prompts of {UNKNOWN_TASK_PROMPT_TOKENS} tokens"})
