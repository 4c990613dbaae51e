"""``generation``: greedy generations through a KV configuration compared with the
full-cache generations from the same prompts -- the output-stability check.

Each sample is ``context`` tokens of corpus text; both runs decode ``continuation``
tokens greedily with EOS ignored (so every output has the same length), all samples in
one continuous batch. Per sample:

    baseline  a b c d e f g h
    config    a b c x y z w v        first divergence position = 3 (0-based);
                                     exact match = 0; positions agreeing = 3/8

``exact_match`` is the fraction of samples whose outputs are identical; a sample that
never diverges counts its full length as its first divergence position. Once two greedy
outputs differ they follow different prefixes, so agreement after the first divergence
is not meaningful and ``token_agreement`` counts only matches up to it.

Each record keeps its ``output_ids``, so a run whose baseline ran apart (an endpoint
measured over HTTP) is compared from the stored records (``record_agreement``), the same
function as in-process.
"""
from __future__ import annotations

import time

import numpy as np

from kvmap.evals.base import TASKS, Column, Task, TaskRun
from kvmap.evals.kv_peak import track_peak_kv_bytes
from kvmap.evals.ppl import single_context
from kvmap.evals.stats import paired_delta
from kvmap.request import SamplingParams
from kvmap.workloads.corpus import TextSource, encode_text

DEFAULT_CONTEXT_TOKENS = 256
DEFAULT_NEW_TOKENS = 64
DEFAULT_NUM_SAMPLES = 8


def first_divergence(output_ids: list[int], baseline_ids: list[int]) -> int:
    """Index of the first position where the two differ; ``min`` of the lengths when one
    is a prefix of the other (equal outputs give their length)."""
    for i, (a, b) in enumerate(zip(output_ids, baseline_ids)):
        if a != b:
            return i
    return min(len(output_ids), len(baseline_ids))


@TASKS.register
class GenerationTask(Task):
    """Greedy output stability against the baseline (module docstring)."""

    name = "generation"
    kind = "other"
    paired_metric = "exact_match"
    takes = frozenset({"context_tokens", "text", "continuation_tokens"})
    needs_baseline_state = True            # compares the baseline's token ids
    compares_records = True                # ... which its records keep (output_ids)
    columns = (Column("exact match", "exact_match", "{:.2%}"),
               Column("first div mean", "first_divergence_mean", "{:.1f}"),
               Column("first div P50", "first_divergence_p50", "{:.0f}"),
               Column("token agreement", "token_agreement", "{:.2%}"))

    def __init__(self, options):
        super().__init__(options)
        self.context = single_context(options, DEFAULT_CONTEXT_TOKENS, self.name)
        self.new_tokens = options.continuation_tokens or DEFAULT_NEW_TOKENS
        self.num_samples = options.num_samples or DEFAULT_NUM_SAMPLES

    def max_tokens_needed(self, samples: list | None = None) -> int:
        return self.context + self.new_tokens

    def prepare(self, tokenizer) -> list[list[int]]:
        source = TextSource(tokenizer, np.random.default_rng(self.options.seed),
                            self.options.text)
        prompts = []
        for _ in range(self.num_samples):
            ids = encode_text(tokenizer, source.take(self.context + 16))[:self.context]
            prompts.append(ids)
        return prompts

    def run(self, llm, samples: list[list[int]]) -> TaskRun:
        t0 = time.perf_counter()
        params = SamplingParams(max_tokens=self.new_tokens, ignore_eos=True)
        with track_peak_kv_bytes(llm.engine) as peak:
            outputs = llm.generate(samples, params)
        metrics = {"kv_bytes_peak": peak[0], "wall_s": time.perf_counter() - t0,
                   "num_new_tokens": self.new_tokens, "n": len(samples),
                   "num_samples": len(samples)}
        records = [{"sample_id": f"generation/{self.context}/{i}",
                    "num_output_tokens": len(o.token_ids), "output_ids": list(o.token_ids),
                    "e2e_s": o.metrics.e2e_s}
                   for i, o in enumerate(outputs)]
        return TaskRun(metrics, records, state=[list(o.token_ids) for o in outputs])

    def compare(self, run: TaskRun, baseline: TaskRun) -> dict:
        return {**run.metrics, **agreement(run.state, baseline.state, self.options.seed)}


def agreement(outputs: list[list[int]], baseline_outputs: list[list[int]],
              seed: int = 0) -> dict:
    """Exact match, first divergence and token agreement of ``outputs`` against
    ``baseline_outputs`` (token ids, sample by sample; module docstring)."""
    positions = [first_divergence(o, b) for o, b in zip(outputs, baseline_outputs)]
    lengths = [len(b) for b in baseline_outputs]
    exact = [float(p == n and len(o) == n) for p, n, o in zip(positions, lengths, outputs)]
    return {"exact_match": float(np.mean(exact)),
            "first_divergence_mean": float(np.mean(positions)),
            "first_divergence_p50": float(np.median(positions)),
            "first_divergence": positions,
            "token_agreement": sum(positions) / max(1, sum(lengths)),
            "delta_exact_match": paired_delta(exact, [1.0] * len(exact), seed=seed)}


def record_agreement(records: list[dict], baseline_records: list[dict],
                     seed: int = 0) -> dict | None:
    """``agreement`` of two runs' stored records (``output_ids``, joined by
    ``sample_id``), as the report computes it for a cell whose baseline ran apart (an
    endpoint's); None when no sample has output ids on both sides."""
    theirs = {r.get("sample_id"): r.get("output_ids") for r in baseline_records
              if isinstance(r, dict)}
    pairs = [(r["output_ids"], theirs[r.get("sample_id")]) for r in records
             if isinstance(r, dict) and isinstance(r.get("output_ids"), list)
             and isinstance(theirs.get(r.get("sample_id")), list)]
    if not pairs:
        return None
    return {**agreement([o for o, _ in pairs], [b for _, b in pairs], seed),
            "num_samples": len(pairs)}
