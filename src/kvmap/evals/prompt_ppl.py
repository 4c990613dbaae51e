"""``prompt_ppl``: perplexity of natural text from its *prompt* log-probabilities -- every
token scored in one prefill through the KV configuration (``ppl_definition:
prompt_logprobs``), what any OpenAI-compatible server can return (``echo`` +
``logprobs``), so a server and kvmap's own engine are compared like with like.

    sample i:  [ t_0  t_1 ... t_{T-1} ]   one teacher-forced prefill (chunked by the step
                    ^    ^        ^       budget, each chunk reading its context back from
                  log p(t_j | t_<j), j = 1 .. T-1   the cache, quantized or not)

    ppl = exp(mean NLL over every scored position of every sample)

``ppl`` (``ppl_definition: continuation``) is a different figure: it prefills a context
and scores only the continuation decoded one step at a time behind a compressed cache,
where a selection policy acts; here no policy acts (as in ``Engine.score`` without a
context). The paired per-sample value is the sample's mean NLL (``nll_mean``); the delta
against the baseline cell is computed from the records (``ppl_delta_rel`` with its CI).

The log-probabilities come from ``prompt_logprobs(llm, ids)``: an ``llm`` with a
``prompt_logprobs(ids)`` method of its own (an endpoint over HTTP,
``kvmap.bench.endpoint_tasks``) answers itself; a kvmap ``LLM`` is scored in-process.
"""
from __future__ import annotations

import math
import time

import torch

from kvmap.evals.base import TASKS, Column, Task, TaskRun
from kvmap.evals.kv_peak import track_peak_kv_bytes
from kvmap.evals.ppl import build_samples, ppl_comparison, single_context

DEFAULT_CONTEXT_TOKENS = 512
DEFAULT_NUM_SAMPLES = 4
DEFINITION = "prompt_logprobs"


def engine_prompt_logprobs(engine, token_ids: list[int]) -> list[float]:
    """log p(t_j | t_<j) for j = 1 .. T-1, in one chunked prefill of ``engine``."""
    out: list[float] = []
    num_done = [0]

    def reduce(logits: torch.Tensor) -> torch.Tensor:
        # logits (n, V) at positions start .. start+n-1 predict tokens start+1 .. start+n
        start, n = num_done[0], logits.shape[0]
        num_done[0] += n
        targets = token_ids[start + 1:start + 1 + n]
        if targets:
            logp = torch.log_softmax(logits[:len(targets)].float(), dim=-1)
            out.extend(logp[torch.arange(len(targets)), torch.tensor(targets)].tolist())
        return logits.new_empty(0)

    engine.score(list(token_ids), per_chunk=reduce)
    return out


def prompt_logprobs(llm, token_ids: list[int]) -> list[float]:
    """The ``T - 1`` prompt log-probabilities of ``token_ids`` (module docstring)."""
    own = getattr(llm, "prompt_logprobs", None)
    if own is not None:
        return list(own(token_ids))
    return engine_prompt_logprobs(llm.engine, token_ids)


@TASKS.register
class PromptPPLTask(Task):
    """Perplexity from prompt log-probabilities, one prefill per sample (docstring)."""

    name = "prompt_ppl"
    paired_metric = "nll"
    value_key = "nll_mean"
    takes = frozenset({"context_tokens", "text"})
    columns = (Column("ppl", "ppl", "{:.3f}"), Column("Δppl %", "ppl_delta_pct", "{:+.2f}"),
               Column("Δppl % CI", "delta_ppl_pct", "ci"), Column("n", "num_samples", "{}"))

    def __init__(self, options):
        super().__init__(options)
        self.context = single_context(options, DEFAULT_CONTEXT_TOKENS, self.name)
        self.num_samples = options.num_samples or DEFAULT_NUM_SAMPLES

    def max_tokens_needed(self, samples: list | None = None) -> int:
        return self.context + 1          # a server scores the prompt and one output token

    def prepare(self, tokenizer) -> list[list[int]]:
        return build_samples(tokenizer, self.num_samples, self.context, 0,
                             self.options.seed, self.options.text)

    def run(self, llm, samples: list[list[int]]) -> TaskRun:
        t0 = time.perf_counter()
        per_sample = []
        with track_peak_kv_bytes(getattr(llm, "engine", None)) as peak:
            for ids in samples:
                lps = prompt_logprobs(llm, ids)
                if len(lps) != len(ids) - 1:
                    raise ValueError(f"{len(lps)} prompt log-probabilities for "
                                     f"{len(ids)} tokens (want {len(ids) - 1})")
                per_sample.append([-lp for lp in lps])
        pooled = [x for nll in per_sample for x in nll]
        nll_mean = sum(pooled) / len(pooled)
        metrics = {"ppl": math.exp(nll_mean), "nll_mean": nll_mean,
                   "num_tokens_scored": len(pooled), "num_samples": len(samples),
                   "ppl_definition": DEFINITION, "kv_bytes_peak": peak[0],
                   "wall_s": time.perf_counter() - t0}
        records = [{"sample_id": f"prompt_ppl/{self.context}/{i}",
                    "nll_mean": sum(nll) / len(nll), "num_tokens": len(nll)}
                   for i, nll in enumerate(per_sample)]
        return TaskRun(metrics, records)

    def compare(self, run: TaskRun, baseline: TaskRun) -> dict:
        return {**run.metrics, **ppl_comparison(run, baseline, self.options.seed)}
