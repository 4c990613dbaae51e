"""``ppl``: teacher-forced decoding of natural text through a KV configuration, against
the full-precision full cache on the same text.

Each sample is ``context`` tokens of corpus text followed by ``continuation`` more:

    sample i:  [ t_0 ... t_{c-1} | t_c ... t_{c+n-1} ]
                 prefilled once     fed one decode step at a time; position c+j yields
                 (a policy          logits predicting t_{c+j}; the codec quantizes every
                 compresses them)   token written, the policy keeps acting

(``Engine.score(ids, num_context_tokens=c)``.) Only the ``n`` continuation positions are
scored, so what is measured is decoding with a long, compressed or quantized cache
behind it. Against the baseline run on the same samples, per continuation position:

    NLL   = -log q(t)                     ppl = exp(mean NLL over all positions)
    KL    = sum_v p(v) (log p(v) - log q(v))    p: baseline, q: this configuration (nats)
    top-1 = argmax p == argmax q
    top-1 (ties) = argmax q is one of the maxima of p: a bf16 baseline has exactly tied top
                   logits at a few percent of positions, where any change flips argmax p

``kl_mean`` and ``kl_p99`` pool every scored position of every sample. The paired
per-sample quantity is the sample's mean NLL (each record's ``nll_mean``); its delta is
reported in nats, as a perplexity change in percent (``stats.ratio_pct``) and as a
fraction (``ppl_delta_rel`` with ``ppl_delta_rel_ci95``).
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch

from kvmap.evals.base import TASKS, Column, Task, TaskRun
from kvmap.evals.kv_peak import track_peak_kv_bytes
from kvmap.evals.stats import paired_delta, paired_values, ratio_pct
from kvmap.metrics import percentile
from kvmap.workloads.corpus import TextSource, encode_text

DEFAULT_CONTEXT_TOKENS = 1024
DEFAULT_CONTINUATION_TOKENS = 128
DEFAULT_NUM_SAMPLES = 8


# ---- math: pure functions over logits ----------------------------------------------
def log_probs(logits: torch.Tensor) -> torch.Tensor:
    """(T, V) logits -> (T, V) fp32 log-probabilities."""
    return torch.log_softmax(logits.float(), dim=-1)


def token_nll(logp: torch.Tensor, target_ids: list[int] | torch.Tensor) -> torch.Tensor:
    """(T,) negative log-likelihood in nats of ``target_ids`` (T,) under ``logp`` (T, V)."""
    targets = torch.as_tensor(target_ids, dtype=torch.long, device=logp.device).view(-1, 1)
    if targets.shape[0] != logp.shape[0]:
        raise ValueError(f"{targets.shape[0]} targets for {logp.shape[0]} positions")
    return -logp.gather(1, targets).squeeze(1)


def kl_divergence(ref_logp: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """(T,) KL(p_ref || q) in nats per position; both arguments (T, V) log-probabilities."""
    if ref_logp.shape != logp.shape:
        raise ValueError(f"log-prob shapes differ: {tuple(ref_logp.shape)} vs "
                         f"{tuple(logp.shape)}")
    # p = 0 terms are 0; clamp keeps exp(-inf) * (-inf - x) from becoming nan.
    return (ref_logp.exp() * (ref_logp - logp).nan_to_num(posinf=0.0, neginf=0.0)
            ).sum(-1).clamp_min(0.0)


def top1_agreement(ref_logp: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """(T,) bool: the two distributions put their maximum on the same token."""
    return ref_logp.argmax(-1) == logp.argmax(-1)


def top1_agreement_with_ties(ref_logp: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """(T,) bool: this distribution's maximum is on one of the baseline's (tied) maxima."""
    pick = logp.argmax(-1, keepdim=True)
    return ref_logp.gather(-1, pick).squeeze(-1) == ref_logp.amax(-1)


def tied_top1(ref_logp: torch.Tensor) -> torch.Tensor:
    """(T,) bool: the baseline's maximum is shared by two or more tokens."""
    return (ref_logp == ref_logp.amax(-1, keepdim=True)).sum(-1) > 1


def perplexity(nll: torch.Tensor | list[float]) -> float:
    """exp(mean NLL); NLL in nats."""
    values = torch.as_tensor(nll, dtype=torch.float64)
    if values.numel() == 0:
        raise ValueError("perplexity of no tokens")
    return float(values.mean().exp())


# ---- the task ------------------------------------------------------------------------
def single_context(options, default: int, task: str) -> int:
    """The one ``--context`` a task takes (``default`` when none); ValueError for several."""
    if len(options.context_tokens) > 1:
        raise ValueError(f"context={list(options.context_tokens)}: task {task!r} takes one "
                         f"context length")
    return options.context_tokens[0] if options.context_tokens else default


def build_samples(tokenizer, num_samples: int, num_context_tokens: int,
                  num_continuation_tokens: int, seed: int, text: str | None = None
                  ) -> list[list[int]]:
    """``num_samples`` token-id lists of exactly ``context + continuation`` tokens, each
    from its own start paragraph of the corpus (``text`` replaces the built-in one)."""
    source = TextSource(tokenizer, np.random.default_rng(seed), text)
    num_tokens = num_context_tokens + num_continuation_tokens
    samples = []
    for _ in range(num_samples):
        ids = encode_text(tokenizer, source.take(num_tokens + 16))[:num_tokens]
        if len(ids) < num_tokens:
            raise ValueError(f"corpus gave {len(ids)} tokens for a {num_tokens}-token sample")
        samples.append(ids)
    return samples


@TASKS.register
class PPLTask(Task):
    """Perplexity, KL and top-1 agreement of teacher-forced decoding (module docstring)."""

    name = "ppl"
    kind = "ppl"
    paired_metric = "nll"
    value_key = "nll_mean"
    takes = frozenset({"context_tokens", "text", "continuation_tokens"})
    needs_baseline_state = True            # the KL reads the baseline's log-probabilities
    columns = (Column("ppl", "ppl", "{:.3f}"), Column("Δppl %", "ppl_delta_pct", "{:+.2f}"),
               Column("Δppl % CI", "delta_ppl_pct", "ci"), Column("KL mean", "kl_mean", "{:.2e}"),
               Column("KL P99", "kl_p99", "{:.2e}"), Column("top-1", "top1_agreement", "{:.2%}"),
               Column("top-1 (ties)", "top1_agreement_ties", "{:.2%}"),
               Column("n", "num_samples", "{}"))

    def __init__(self, options):
        super().__init__(options)
        self.context = single_context(options, DEFAULT_CONTEXT_TOKENS, self.name)
        self.continuation = options.continuation_tokens or DEFAULT_CONTINUATION_TOKENS
        self.num_samples = options.num_samples or DEFAULT_NUM_SAMPLES

    def max_tokens_needed(self, samples: list | None = None) -> int:
        return self.context + self.continuation

    def prepare(self, tokenizer) -> list[list[int]]:
        return build_samples(tokenizer, self.num_samples, self.context, self.continuation,
                             self.options.seed, self.options.text)

    def run(self, llm, samples: list[list[int]]) -> TaskRun:
        c = self.context
        t0 = time.perf_counter()
        sample_logp, sample_nll = [], []
        with track_peak_kv_bytes(llm.engine) as peak:
            for ids in samples:
                logp = log_probs(llm.engine.score(ids, num_context_tokens=c))   # (n, V)
                sample_logp.append(logp)
                sample_nll.append(token_nll(logp, ids[c:]))
        nll = torch.cat(sample_nll)
        # means in float64, as perplexity(): the paired delta of per-sample means then
        # equals the pooled perplexity ratio to rounding even when the two differ little
        metrics = {"ppl": perplexity(nll), "nll_mean": float(nll.double().mean()),
                   "num_tokens_scored": int(nll.numel()), "num_samples": len(samples),
                   "ppl_definition": "continuation",        # prompt_ppl: prompt_logprobs
                   "kv_bytes_peak": peak[0], "wall_s": time.perf_counter() - t0}
        records = [{"sample_id": f"ppl/{c}+{self.continuation}/{i}",
                    "nll_mean": float(x.double().mean()), "num_tokens": int(x.numel())}
                   for i, x in enumerate(sample_nll)]
        return TaskRun(metrics, records, state=sample_logp)

    def compare(self, run: TaskRun, baseline: TaskRun) -> dict:
        ref, logp = baseline.state, run.state
        kl = torch.cat([kl_divergence(r, q) for r, q in zip(ref, logp)])
        agree = torch.cat([top1_agreement(r, q) for r, q in zip(ref, logp)])
        agree_ties = torch.cat([top1_agreement_with_ties(r, q) for r, q in zip(ref, logp)])
        ties = torch.cat([tied_top1(r) for r in ref])
        return {**run.metrics, **ppl_comparison(run, baseline, self.options.seed),
                "kl_mean": float(kl.mean()), "kl_p99": percentile(kl.tolist(), 99),
                "top1_agreement": float(agree.float().mean()),
                "top1_agreement_ties": float(agree_ties.float().mean()),
                "baseline_tie_rate": float(ties.float().mean())}


def ppl_comparison(run: TaskRun, baseline: TaskRun, seed: int) -> dict:
    """The perplexity change against ``baseline``, paired sample by sample on the
    records' ``nll_mean``: in percent and as the contract's ``ppl_delta_rel`` + CI."""
    mine, theirs = paired_values(run.per_sample, baseline.per_sample, "nll_mean")
    delta = paired_delta(mine, theirs, seed=seed)
    return {"ppl_baseline": baseline.metrics["ppl"],
            "ppl_delta_pct": 100.0 * (run.metrics["ppl"] / baseline.metrics["ppl"] - 1),
            "delta_nll": delta, "delta_ppl_pct": ratio_pct(delta),
            "ppl_delta_rel": math.expm1(delta["mean"]),
            "ppl_delta_rel_ci95": [math.expm1(delta["ci_low"]), math.expm1(delta["ci_high"])]}
