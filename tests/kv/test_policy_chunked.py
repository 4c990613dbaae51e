"""Chunked compression: a ``chunked`` policy compresses after every prefill chunk, so a long
prompt never holds more than its budget plus one chunk (tiny random fp32 Llama).

Checked after every ``engine.step()`` while a 60-token prompt is prefilled in chunks of
8 tokens (block size 4, budget 12): the blocks in use never exceed those of
``budget + chunk`` slots, a sequence is back to exactly ``budget`` slots after each
chunk once it is over, and ``check_integrity()`` passes. ``snapkv`` is final-only by
and ``tova`` are final-only by default (the whole prompt is resident first) and bounded
with ``chunked=true``.
"""
from __future__ import annotations

import pytest

from kvmap import SamplingParams
from kvmap.kv.config import KVConfig
from tests.conftest import make_tiny_llm, random_prompts

BLOCK_SIZE, CHUNK, BUDGET, PROMPT = 4, 8, 12, 60


CHUNKED = {
    "window": f"window(size={BUDGET})",
    "streaming_llm": f"streaming_llm(sinks=2,budget={BUDGET})",
    "h2o": f"h2o(budget={BUDGET})",
    "tova": f"tova(budget={BUDGET},chunked=true)",
    "knorm": f"knorm(budget={BUDGET})",
    "random": f"random(budget={BUDGET})",
    "snapkv_chunked": f"snapkv(budget={BUDGET},window=4,kernel=3,chunked=true)",
}


def prefill_trace(spec: str, codec: str = "fp32"):
    """Step one request through prefill; returns its slots and the pool's blocks in use
    after every prefill step, and the request after 4 decoded tokens."""
    llm = make_tiny_llm(kv=f"{spec}+{codec}", block_size=BLOCK_SIZE,
                        max_num_batched_tokens=CHUNK)
    engine = llm.engine
    req = engine.add_request(random_prompts([PROMPT], seed=5)[0],
                             SamplingParams(max_tokens=4, ignore_eos=True))
    slots, blocks = [], []
    while engine.has_unfinished():
        prefilling = req.num_computed_tokens < req.num_prompt_tokens
        engine.step()
        engine.check_integrity()
        if prefilling:
            slots.append(req.num_kv_slots)
            blocks.append(engine.kv_usage()["num_blocks_used"])
    return slots, blocks, req, engine


@pytest.mark.parametrize("name", sorted(CHUNKED))
def test_chunked_prefill_peak_is_budget_plus_one_chunk(name):
    slots, blocks, req, engine = prefill_trace(CHUNKED[name])
    assert len(slots) == PROMPT // CHUNK + 1                    # 8 chunks (7 x 8 + 4)
    assert max(blocks) <= -(-(BUDGET + CHUNK) // BLOCK_SIZE)     # never the whole prompt
    assert all(s <= BUDGET for s in slots)                      # compressed after each chunk
    assert slots[-1] == BUDGET
    over_budget_chunks = sum(1 for i in range(len(slots))
                             if min(PROMPT, (i + 1) * CHUNK) > BUDGET)
    assert engine.kv_usage()["num_compressions"] >= over_budget_chunks
    assert len(req.output_token_ids) == 4
    assert engine.kv_usage()["num_blocks_used"] == 0


def test_snapkv_is_final_only_by_default():
    slots, blocks, _, engine = prefill_trace(f"snapkv(budget={BUDGET},window=4,kernel=3)")
    assert slots[:-1] == [min(PROMPT, (i + 1) * CHUNK) for i in range(len(slots) - 1)]
    # sampled after each step: the last chunk is compressed within its step
    assert max(blocks) == (PROMPT - PROMPT % CHUNK) // BLOCK_SIZE   # the prompt, resident
    assert slots[-1] == BUDGET


def test_chunked_false_defers_compression_to_the_end():
    slots, blocks, _, _ = prefill_trace(f"h2o(budget={BUDGET},chunked=false)")
    assert max(blocks) == (PROMPT - PROMPT % CHUNK) // BLOCK_SIZE
    assert slots[-1] == BUDGET


@pytest.mark.parametrize("codec", ["bf16", "int8"])
def test_chunked_compression_composes_with_codecs(codec):
    slots, blocks, req, _ = prefill_trace(CHUNKED["tova"], codec)
    assert max(blocks) <= -(-(BUDGET + CHUNK) // BLOCK_SIZE)
    assert len(req.output_token_ids) == 4


def test_streaming_llm_keeps_sinks_and_the_last_window_through_chunks():
    # layer 0's keys depend only on (token, position): match them against a full run
    from kvmap.kv.compaction import read_sequence
    from tests.kv.test_policies import full_layer0_keys, kept_positions
    llm = make_tiny_llm(kv=CHUNKED["streaming_llm"] + "+fp32", block_size=BLOCK_SIZE,
                        max_num_batched_tokens=CHUNK)
    engine = llm.engine
    prompt = random_prompts([PROMPT], seed=5)[0]
    req = engine.add_request(prompt, SamplingParams(max_tokens=2, ignore_eos=True))
    while req.num_computed_tokens < req.num_prompt_tokens:
        engine.step()
    keys = read_sequence(engine.kv, 0, req.block_ids, req.num_kv_slots)[0]
    pos = kept_positions(keys, full_layer0_keys(prompt))
    expect = [0, 1] + list(range(PROMPT - (BUDGET - 2), PROMPT))
    assert pos.tolist() == [expect] * pos.shape[0]


def test_chunked_option_is_checked():
    with pytest.raises(ValueError, match="chunked=3"):
        KVConfig.parse("h2o(chunked=3)")
    with pytest.raises(ValueError, match="chunked='maybe'"):
        KVConfig.parse("window(size=8,chunked=maybe)")
    assert KVConfig.parse("snapkv(chunked=true)").policy.chunked
    assert not KVConfig.parse("snapkv").policy.chunked
    assert not KVConfig.parse("tova").policy.chunked         # measured: final-only is better
    assert KVConfig.parse("h2o").policy.chunked
