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

Each record also keeps the ``num_top_logprobs`` (default 5) most likely next tokens at
every position, ``{token string: logprob}`` (``top_logprobs``), so KL and top-1 agreement
against the baseline are computed *over the returned top-k* (``kvmap.evals.topk``, its
definition in the record as ``kl_definition``) -- by ``compare`` here and by the report
from stored records, the same function for a server and for kvmap's own cells.

The log-probabilities come from ``prompt_logprobs(llm, ids, num_top)``: an ``llm`` with a
``prompt_logprobs(ids, num_top)`` method of its own (an endpoint over HTTP,
``kvmap.bench.endpoint_logprobs``) answers itself; a kvmap ``LLM`` is scored in-process,
its top-k strings built as ``kvmap serve`` builds them (first of equal strings wins).
"""
from __future__ import annotations

import math
import time
from typing import NamedTuple

import torch

from kvmap.evals.base import TASKS, Column, Task, TaskRun
from kvmap.evals.kv_peak import track_peak_kv_bytes
from kvmap.evals.ppl import build_samples, ppl_comparison, single_context
from kvmap.evals.topk import (DEFAULT_NUM_TOP_LOGPROBS, KL_DEFINITION, top_entries,
                              top_strings, topk_comparison)

DEFAULT_CONTEXT_TOKENS = 512
DEFAULT_NUM_SAMPLES = 4
DEFINITION = "prompt_logprobs"


class PromptLogprobs(NamedTuple):
    """A prompt's scores: ``logprobs[j-1]`` = log p(t_j | t_<j) and ``top[j-1]`` the
    ``num_top`` most likely next tokens there (``{token string: logprob}``, most likely
    first), j = 1 .. T-1; ``top`` is None when not asked for or not returned."""

    logprobs: list[float]
    top: list[dict] | None = None


def engine_prompt_logprobs(engine, token_ids: list[int], num_top: int = 0,
                           decode=None) -> PromptLogprobs:
    """The prompt's scores in one chunked prefill of ``engine``; the top-k strings are
    built as ``kvmap serve`` builds its ``top_logprobs`` (``evals.topk``), then cut to
    ``num_top`` as an endpoint's answer is."""
    out: list[float] = []
    tops: list[dict] = []
    num_done = [0]

    def reduce(logits: torch.Tensor) -> torch.Tensor:
        # logits (n, V) at positions start .. start+n-1 predict tokens start+1 .. start+n
        start, n = num_done[0], logits.shape[0]
        num_done[0] += n
        targets = token_ids[start + 1:start + 1 + n]
        if targets:
            logp = torch.log_softmax(logits[:len(targets)].float(), dim=-1)
            own = logp[torch.arange(len(targets)), torch.tensor(targets)].tolist()
            out.extend(own)
            if num_top:
                values, ids = logp.topk(num_top, dim=-1)
                for i, v, t, lp in zip(ids.tolist(), values.tolist(), targets, own):
                    tops.append(top_entries(top_strings(list(zip(i, v)), decode, (t, lp)),
                                            num_top))
        return logits.new_empty(0)

    engine.score(list(token_ids), per_chunk=reduce)
    return PromptLogprobs(out, tops if num_top else None)


def prompt_logprobs(llm, token_ids: list[int], num_top: int = 0) -> PromptLogprobs:
    """The prompt's scores (module docstring), with the top ``num_top`` when > 0 and the
    ``llm`` has a tokenizer to name the tokens."""
    own = getattr(llm, "prompt_logprobs", None)
    if own is not None:
        return own(token_ids, num_top)
    decode = getattr(llm.tokenizer, "decode", None)     # none: no strings, so no top-k
    return engine_prompt_logprobs(llm.engine, token_ids, num_top if decode else 0, decode)


@TASKS.register
class PromptPPLTask(Task):
    """Perplexity from prompt log-probabilities, one prefill per sample (docstring)."""

    name = "prompt_ppl"
    kind = "ppl"
    paired_metric = "nll"
    value_key = "nll_mean"
    takes = frozenset({"context_tokens", "text", "num_top_logprobs"})
    columns = (Column("ppl", "ppl", "{:.3f}"), Column("Δppl %", "ppl_delta_pct", "{:+.2f}"),
               Column("Δppl % CI", "delta_ppl_pct", "ci"),
               Column("KL top-k", "kl_topk", "{:.2e}"),
               Column("KL top-k CI", "kl_topk_ci95", "ci"),
               Column("top-1", "top1_topk", "{:.2%}"), Column("n", "num_samples", "{}"))

    def __init__(self, options):
        super().__init__(options)
        self.context = single_context(options, DEFAULT_CONTEXT_TOKENS, self.name)
        self.num_samples = options.num_samples or DEFAULT_NUM_SAMPLES
        self.num_top = options.num_top_logprobs or DEFAULT_NUM_TOP_LOGPROBS

    def max_tokens_needed(self, samples: list | None = None) -> int:
        return self.context + 1          # a server scores the prompt and one output token

    def prepare(self, tokenizer) -> list[list[int]]:
        return build_samples(tokenizer, self.num_samples, self.context, 0,
                             self.options.seed, self.options.text)

    def run(self, llm, samples: list[list[int]]) -> TaskRun:
        t0 = time.perf_counter()
        per_sample, tops = [], []
        with track_peak_kv_bytes(getattr(llm, "engine", None)) as peak:
            for ids in samples:
                lps, top = prompt_logprobs(llm, ids, self.num_top)
                if len(lps) != len(ids) - 1:
                    raise ValueError(f"{len(lps)} prompt log-probabilities for "
                                     f"{len(ids)} tokens (want {len(ids) - 1})")
                per_sample.append([-lp for lp in lps])
                tops.append(top)
        pooled = [x for nll in per_sample for x in nll]
        nll_mean = sum(pooled) / len(pooled)
        metrics = {"ppl": math.exp(nll_mean), "nll_mean": nll_mean,
                   "num_tokens_scored": len(pooled), "num_samples": len(samples),
                   "ppl_definition": DEFINITION, "kv_bytes_peak": peak[0],
                   "num_top_logprobs": self.num_top, "kl_definition": KL_DEFINITION,
                   "wall_s": time.perf_counter() - t0}
        records = [{"sample_id": f"prompt_ppl/{self.context}/{i}",
                    "nll_mean": sum(nll) / len(nll), "num_tokens": len(nll),
                    "top_logprobs": top}
                   for i, (nll, top) in enumerate(zip(per_sample, tops))]
        return TaskRun(metrics, records)

    def compare(self, run: TaskRun, baseline: TaskRun) -> dict:
        topk = topk_comparison(run.per_sample, baseline.per_sample, self.options.seed) or {}
        topk.pop("num_samples", None)
        return {**run.metrics, **ppl_comparison(run, baseline, self.options.seed), **topk}
