"""The default accuracy tasks measure something only if the full-cache bf16 baseline can
do them: on the real embedded model, the default passkey grid (2 lengths x 5 depths x 4
documents = 40 trials) is answered, and the chat prompts' answers stop on their own
well before the cap (docs/evals.md has the measured figures)."""
from __future__ import annotations

import pytest

from kvmap.evals import EvalOptions, get_task
from kvmap.evals.stats import wilson_interval

pytestmark = pytest.mark.slow


def test_full_cache_answers_the_default_passkey_grid(real_llm):
    task = get_task("passkey", EvalOptions())
    samples = task.prepare(real_llm.tokenizer)
    assert len(samples) >= 40
    run = task.run(real_llm, samples)
    wrong = [r for r in run.per_sample if not r["correct"]]
    assert run.metrics["accuracy"] >= 0.95, wrong
    assert run.metrics["accuracy_ci95"] == wilson_interval(40 - len(wrong), 40)
    # the shared documents were served from the prefix cache, not prefilled again
    assert run.metrics["num_cached_prompt_tokens"] > 0.25 * run.metrics["num_prompt_tokens"]


def test_chat_answers_stop_on_their_own(real_llm):
    # the task measures output lengths only if the baseline's answers end on their own
    # more often than not (else the lengths measure the cap): the Wilson interval's lower
    # end above a half, over 32 answers. Greedy decoding turns a rounding difference (bf16
    # vs fp32, fused vs tiled prefill) into other tokens, so the share moves by class: on
    # x86-amx 26/32 at bf16 (fused prefill), 28/32 tiled, 23/32 with fp32 forced
    # (KVMAP_NATIVE_BF16=0); with 8 answers one answer more or less at the cap crossed
    # the old fixed 0.75
    task = get_task("chat_generation", EvalOptions(num_samples=32))
    run = task.run(real_llm, task.prepare(real_llm.tokenizer))
    assert run.metrics["natural_stop_rate_ci95"][0] > 0.5, run.metrics
    assert run.metrics["output_tokens_mean"] < 0.75 * task.max_output_tokens
