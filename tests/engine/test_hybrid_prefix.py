"""Prefix caching on a hybrid model's per-layer tables (``kvmap.kv.layer_pool``), on the
tiny random-weight ``dummy:tiny-hybrid`` (layers 0 and 2 slide over 8 tokens, layer 1 is
global; block size 4): a hit is usable up to the longest prefix whose last window every
sliding layer still holds (``LayerBlockPool.usable_hit``), and with hits the greedy
tokens are those of an engine without prefix caching."""
from __future__ import annotations

from kvmap import SamplingParams
from kvmap.kv.layer_pool import LayerBlockPool
from tests.conftest import make_tiny_llm, random_prompts

BS = 4


def hybrid(prefix_caching: bool = True, **kwargs):
    return make_tiny_llm(model="dummy:tiny-hybrid", block_size=BS, max_num_batched_tokens=16,
                         enable_prefix_caching=prefix_caching, **kwargs)


def run_alone(llm, prompt, max_tokens=8):
    eng = llm.engine
    req = eng.add_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    while not req.status.finished:
        eng.step()
        eng.check_integrity()
    return req


# ---- the pool ---------------------------------------------------------------------------
def test_a_hit_needs_the_window_of_every_sliding_layer():
    pool = LayerBlockPool(num_blocks=8, block_size=BS, num_layers=3, windows=(8, None, 8))
    groups = pool.allocate(4)
    for j, g in enumerate(groups):
        pool.register_hash(g, bytes([j]))
    pool.release(groups[0], 0)          # layer 0 slid past group 0, layer 2 past 0 and 1
    for g in groups[:2]:
        pool.release(g, 2)
    pool.free(groups)
    pool.check_integrity([])
    # cached groups count as free; their blocks stay (9 of 12 layer blocks)
    assert pool.num_free == 8 and pool.num_used_layer_blocks == 0
    assert pool.num_cached_layer_blocks == 9
    # n = 4: the query at slot 16 sees 9..16: groups 2, 3 -- held in every layer
    assert pool.usable_hit(groups) == 4
    # n = 3: slot 12 sees 5..12: groups 1, 2 -- layer 2 gave group 1 back; n = 2 needs
    # groups 0, 1 (gone); n = 1 needs group 0 (gone in layers 0 and 2)
    assert pool.usable_hit(groups[:3]) == 0
    taken = pool.lookup([bytes([j]) for j in range(4)] + [b"x"])
    assert taken == groups and pool.num_prefix_hits == 4 and pool.num_prefix_queries == 5
    assert pool.num_used_layer_blocks == 9
    pool.check_integrity([taken])
    pool.free(taken)
    pool.allocate(8)                    # evicts every cached group for its blocks
    assert not pool.cached_groups and not pool.hash_to_block
    pool.check_integrity()


# ---- the engine -------------------------------------------------------------------------
def test_next_turn_hits_and_gives_the_uncached_tokens():
    """Turn 2 = turn 1's prompt + its output + new tokens: its prefix's last window is
    still held, so it hits every full block but the last, and generates exactly what an
    engine without prefix caching does."""
    cached, plain = hybrid(), hybrid(prefix_caching=False)
    assert cached.engine.kv.per_layer_tables and cached.engine.scheduler.prefix_salt
    first = random_prompts([30], seed=21)[0]
    turn1 = run_alone(cached, first)
    second = first + turn1.output_token_ids + random_prompts([5], seed=22)[0]
    turn2 = run_alone(cached, second)
    assert turn2.metrics.num_cached_prompt_tokens >= 32
    assert cached.engine.stats().prefix_cache_hits >= 8
    assert turn1.output_token_ids == run_alone(plain, first).output_token_ids
    assert turn2.output_token_ids == run_alone(plain, second).output_token_ids
    assert cached.engine.kv.pool.num_used_layer_blocks == 0


def test_a_prefix_slid_out_of_the_window_is_not_a_hit():
    """A 40-token prompt then another with its first 32 tokens: the first request's
    sliding layers gave blocks 0-7 back, so no prefix length keeps their window: no hit,
    the same tokens."""
    cached, plain = hybrid(), hybrid(prefix_caching=False)
    a, tail = random_prompts([40, 8], seed=23)
    run_alone(cached, a)
    b = a[:32] + tail
    req = run_alone(cached, b)
    assert req.metrics.num_cached_prompt_tokens == 0
    assert req.output_token_ids == run_alone(plain, b).output_token_ids


def test_running_sequences_share_groups_and_keep_their_tokens():
    """Three requests with a common 8-token prefix (one window), the later two added
    after the first prefilled its 9 tokens: they take its live groups 0 and 1
    (refcount 3), whose sliding blocks then stay while they are shared (the first slides
    past group 0 at 11 slots), and every output is the uncached one."""
    cached, plain = hybrid(), hybrid(prefix_caching=False)
    head = random_prompts([8], seed=24)[0]
    prompts = [head + t for t in random_prompts([1, 5, 7], seed=25)]
    eng = cached.engine
    reqs = [eng.add_request(prompts[0], SamplingParams(max_tokens=12, ignore_eos=True))]
    eng.step()                                      # the first prefills its 9 tokens
    reqs += [eng.add_request(p, SamplingParams(max_tokens=12, ignore_eos=True))
             for p in prompts[1:]]
    shared = reqs[0].block_ids[0]
    while eng.has_unfinished():
        eng.step()
        eng.check_integrity()
        if eng.kv.pool.ref_counts[shared] > 1:      # shared: no sliding layer let it go
            assert int((eng.kv.pool.members[shared] >= 0).sum()) == 3
    assert [r.metrics.num_cached_prompt_tokens for r in reqs] == [0, 8, 8]
    want = [o.token_ids for o in plain.generate(prompts, SamplingParams(
        max_tokens=12, ignore_eos=True))]
    assert [r.output_token_ids for r in reqs] == want
    assert eng.kv.pool.num_used_layer_blocks == 0
