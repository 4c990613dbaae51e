"""``chat_generation``: answers that stop on their own, and how long they get.

Compression can make a model ramble: its answers grow, and the latency a user waits
grows with them while TPOT (time per output token) hides it. Each sample is a chat
request (the model's chat template) asking for a short summary of a passage of corpus
text:

    <|im_start|>user
    Summarize the following text in one sentence.

    <about `context` tokens of corpus text><|im_end|>
    <|im_start|>assistant

decoded greedily with EOS on, up to ``continuation`` tokens (a cap that a sound answer
does not reach), all samples in one continuous batch. Per sample: ``num_output_tokens``,
``finish_reason`` (``stop``: EOS; ``length``: the cap) and ``e2e_s``. Metrics: mean and
P90 output length, the share of answers that stopped on their own, mean and P90 e2e; a
configuration's are also given as ratios to the baseline's (``*_ratio``), with the paired
delta of the output length per sample.
"""
from __future__ import annotations

import time

import numpy as np

from kvmap.evals.base import TASKS, Column, Task, TaskRun
from kvmap.evals.kv_peak import track_peak_kv_bytes
from kvmap.evals.ppl import single_context
from kvmap.evals.stats import wilson_interval
from kvmap.metrics import percentile
from kvmap.request import SamplingParams
from kvmap.workloads.corpus import TextSource

DEFAULT_CONTEXT_TOKENS = 192
DEFAULT_MAX_OUTPUT_TOKENS = 256
DEFAULT_NUM_SAMPLES = 16
INSTRUCTION = "Summarize the following text in one sentence."


def length_metrics(records: list[dict]) -> dict:
    """Mean / P90 of ``num_output_tokens`` and ``e2e_s``, and the natural-stop share."""
    lengths = [r["num_output_tokens"] for r in records]
    e2e = [r["e2e_s"] for r in records if r["e2e_s"] is not None]
    stopped = sum(r["finish_reason"] == "stop" for r in records)
    return {"output_tokens_mean": float(np.mean(lengths)),
            "output_tokens_p90": percentile(lengths, 90),
            "natural_stop_rate": stopped / len(records),
            "natural_stop_rate_ci95": wilson_interval(stopped, len(records)),
            "e2e_s_mean": float(np.mean(e2e)) if e2e else None,
            "e2e_s_p90": percentile(e2e, 90), "num_samples": len(records)}


def ratios(metrics: dict, baseline: dict) -> dict:
    """``<key>_ratio`` = this / baseline for the length and latency figures (None where
    the baseline's is 0 or missing)."""
    out = {}
    for key in ("output_tokens_mean", "output_tokens_p90", "e2e_s_mean", "e2e_s_p90"):
        mine, theirs = metrics.get(key), baseline.get(key)
        out[f"{key}_ratio"] = mine / theirs if mine is not None and theirs else None
    return out


@TASKS.register
class ChatGenerationTask(Task):
    """Output-length inflation of naturally stopping chat answers (module docstring)."""

    name = "chat_generation"
    kind = "generation"
    paired_metric = "num_output_tokens"
    value_key = "num_output_tokens"
    takes = frozenset({"context_tokens", "text", "continuation_tokens"})
    columns = (Column("out tok mean", "output_tokens_mean", "{:.1f}"),
               Column("out tok P90", "output_tokens_p90", "{:.0f}"),
               Column("mean ratio", "output_tokens_mean_ratio", "{:.2f}"),
               Column("P90 ratio", "output_tokens_p90_ratio", "{:.2f}"),
               Column("stopped", "natural_stop_rate", "{:.0%}"),
               Column("e2e ratio", "e2e_s_mean_ratio", "{:.2f}"),
               Column("n", "num_samples", "{}"))

    def __init__(self, options):
        super().__init__(options)
        self.context = single_context(options, DEFAULT_CONTEXT_TOKENS, self.name)
        self.max_output_tokens = options.continuation_tokens or DEFAULT_MAX_OUTPUT_TOKENS
        self.num_samples = options.num_samples or DEFAULT_NUM_SAMPLES

    def max_tokens_needed(self, samples: list | None = None) -> int:
        return self.context + self.max_output_tokens + 32     # + the chat template

    def prepare(self, tokenizer) -> list[str]:
        if not hasattr(tokenizer, "apply_chat_template"):
            raise ValueError("task 'chat_generation' needs a tokenizer with a chat template")
        source = TextSource(tokenizer, np.random.default_rng(self.options.seed),
                            self.options.text)
        return [tokenizer.apply_chat_template(
                    [{"role": "user", "content": f"{INSTRUCTION}\n\n{source.take(self.context)}"}],
                    add_generation_prompt=True)
                for _ in range(self.num_samples)]

    def run(self, llm, samples: list[str]) -> TaskRun:
        t0 = time.perf_counter()
        params = SamplingParams(max_tokens=self.max_output_tokens)
        with track_peak_kv_bytes(llm.engine) as peak:
            outputs = llm.generate(samples, params)
        records = [{"sample_id": f"chat_generation/{self.context}/{i}",
                    "num_output_tokens": len(o.token_ids), "finish_reason": o.finish_reason,
                    "e2e_s": o.metrics.e2e_s, "output": o.text}
                   for i, o in enumerate(outputs)]
        metrics = {**length_metrics(records), "kv_bytes_peak": peak[0],
                   "wall_s": time.perf_counter() - t0}
        return TaskRun(metrics, records)

    def compare(self, run: TaskRun, baseline: TaskRun) -> dict:
        return {**super().compare(run, baseline), **ratios(run.metrics, baseline.metrics)}
