"""Prefix read-ahead (``TieredStore.read_ahead``): a waiting request's tier-held prefix
frames are read on a background thread while the engine runs other requests, and its
admission then uses them: same tokens as recomputing, the hidden read time counted."""
from __future__ import annotations

from kvmap import SamplingParams
from tests.conftest import make_tiny_llm, random_prompts

PREFIX, OTHER, FLUSH, TAIL = random_prompts([40, 12, 120, 6], seed=8)
GREEDY = SamplingParams(max_tokens=5, ignore_eos=True)


def test_a_waiting_request_s_prefix_is_read_while_another_runs():
    llm = make_tiny_llm(kv="fp32+tiers(host=1MiB,fetch=always)", num_blocks=36,
                        block_size=4, max_num_seqs=1, max_num_batched_tokens=16)
    engine = llm.engine
    llm.generate([PREFIX], GREEDY)
    llm.generate([FLUSH], GREEDY)          # the pool reuses every block: PREFIX is in host
    running = engine.add_request(OTHER, SamplingParams(max_tokens=12, ignore_eos=True))
    engine.step()
    waiting = engine.add_request(PREFIX + TAIL, GREEDY)   # max_num_seqs=1: it waits
    engine.step()
    store = engine.offload.store.stats
    assert waiting in engine.scheduler.waiting and store.num_read_ahead_blocks > 0
    while engine.has_unfinished():
        engine.step()
    assert running.status.finished
    assert waiting.metrics.num_cached_prompt_tokens == (len(PREFIX) // 4) * 4
    # every block read ahead was used (one the pool still held then was fetched later)
    assert store.num_read_ahead_used == store.num_read_ahead_blocks >= len(PREFIX) // 4 - 2
    assert store.num_promoted_blocks >= store.num_read_ahead_used
    assert 0 < store.tier_fetch_hidden_s <= store.tier_fetch_read_s
    fresh = make_tiny_llm(kv="fp32", enable_prefix_caching=False, block_size=4)
    assert waiting.output_token_ids == fresh.generate([PREFIX + TAIL], GREEDY)[0].token_ids
    assert llm.kv_usage()["tier_store"]["tier_fetch_hidden_s"] == store.tier_fetch_hidden_s
    engine.check_integrity()
    engine.close()
