"""The passkey task on the real embedded model (at ``dtype: auto``): the full cache finds the key, SnapKV
at a 25% budget keeps it (its observation window holds the question), StreamingLLM at
25% loses a key hidden in the middle (neither in its sinks nor in its window)."""
from __future__ import annotations

import pytest

from kvmap.evals.passkey import make_cases, run_passkey

pytestmark = pytest.mark.slow


def llm_with(kv: str):
    from kvmap import LLM
    # one prefill chunk per prompt: SnapKV's observation window is the chunk's last queries
    return LLM(kv=kv, device="cpu", max_num_batched_tokens=2048)


def test_full_cache_finds_the_key(real_llm):
    result = run_passkey(real_llm, [1024], [0.1, 0.9], samples=1, seed=0)
    assert [s["correct"] for s in result["samples"]] == [True, True], result["samples"]
    assert result["accuracy"] == 1.0 and result["grid"][0]["n"] == 1


def test_snapkv_keeps_the_key():
    result = run_passkey(llm_with("snapkv(budget=0.25)"), [1024], [0.5], samples=1, seed=0)
    assert result["samples"][0]["correct"], result["samples"]


def test_streaming_llm_loses_a_key_in_the_middle():
    llm = llm_with("streaming_llm(budget=0.25)")
    case = make_cases(llm.tokenizer, [2048], [0.5], 1, 0)[0]
    budget = llm.engine.policy.budget_tokens(case.num_prompt_tokens)
    sinks = llm.engine.policy.num_sinks
    assert sinks < case.key_position_tokens < case.num_prompt_tokens - (budget - sinks)
    result = run_passkey(llm, [2048], [0.5], samples=1, seed=0)
    assert not result["samples"][0]["correct"], result["samples"]
