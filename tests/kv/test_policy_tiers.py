"""Selection policies with tiers and prefix caching (tiny random fp32 Llama): every
policy x codec x {hard, soft eviction} over ``tiers(host=...)``.

- Copy on write: a request that shares its prefix blocks with another is compressed
  without touching them; both produce the tokens they produce alone.
- Soft eviction (``evict_to=host``): the prompt blocks compaction drops are kept in the
  host tier under their prefix hash, so a later request (a later turn) that shares the
  prefix fetches them back; its first token is computed over the whole prefix and its
  logits equal the full cache's. Hard eviction recomputes that prefix.
- Hard eviction keeps a finished compacted sequence under a key of the tokens it
  summarizes (``kvmap.kv.compacted``): the next turn continues from it, from the pool or,
  once the pool has reused its blocks, from the tiers; without either it is recomputed.
- Impossible combinations are refused at parse time, naming them.
"""
from __future__ import annotations

import re

import pytest
import torch

from kvmap import SamplingParams
from kvmap.kv.config import KVConfig
from tests.conftest import make_tiny_llm, random_prompts
from tests.kv.test_policies import SELECTIVE, spec_of

BS = 4
TIERS = "tiers(host=1MiB,fetch=always)"
PROMPT, QUESTION = random_prompts([30, 10], seed=21)
GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)


def final_only_spec(policy: str, soft: bool, budget=8) -> str:
    """``spec_of`` compressing once the prompt is done (``chunked=false``, which soft
    eviction needs), with ``evict_to=host`` if ``soft``."""
    extra = [] if policy in ("snapkv", "tova") else ["chunked=false"]
    extra += ["evict_to=host"] if soft else []
    spec = spec_of(policy, budget)
    return spec[:-1] + "".join("," + e for e in extra) + ")"


def policy_llm(spec: str, **kwargs):
    options = dict(block_size=BS, max_num_batched_tokens=16)
    options.update(kwargs)
    return make_tiny_llm(kv=spec, **options)


def first_logits(llm, token_ids: list[int]) -> torch.Tensor:
    """Logits (V,) of the token after ``token_ids``, computed as a prompt (with the
    prefix cache and the tiers) before any compression of it."""
    logits = llm.engine.score(token_ids + [0], num_context_tokens=len(token_ids))
    return logits[0]


# ---- copy on write -----------------------------------------------------------------------
def block_bytes(kv, block_ids):
    return [t.clone() for layer in kv.layers for b in block_ids
            for _, t in layer.block_to_bytes(b)]


@pytest.mark.parametrize("policy", SELECTIVE)
def test_a_shared_prefix_is_compressed_without_touching_the_other_holder(policy):
    # a budget above the first chunk: chunked policies compress after the second one,
    # by when the other request holds the first chunk's blocks too
    shared = PROMPT[:16]
    spec = spec_of(policy, 20) + "+fp32"
    alone = policy_llm(spec, enable_prefix_caching=False).generate([PROMPT], GREEDY)[0]
    llm = policy_llm(spec)
    engine = llm.engine
    first = engine.add_request(PROMPT, GREEDY)
    engine.step()                          # its first chunk (the shared 16 tokens) is cached
    shared_ids = list(first.block_ids[:len(shared) // BS])
    before = block_bytes(engine.kv, shared_ids)
    second = engine.add_request(shared + QUESTION, GREEDY)
    num_checked = 0
    while engine.has_unfinished():
        engine.step()
        engine.check_integrity()           # refcounts equal the live block tables
        if first.evicted and not second.evicted and not second.status.finished:
            # the first compressed while the second still reads the shared blocks
            assert second.block_ids[:len(shared_ids)] == shared_ids
            assert not set(shared_ids) & set(first.block_ids)
            after = block_bytes(engine.kv, shared_ids)
            assert all(torch.equal(a, b) for a, b in zip(before, after))
            num_checked += 1
    assert second.metrics.num_cached_prompt_tokens == len(shared)
    assert num_checked > 0
    assert first.output_token_ids == alone.token_ids
    assert llm.kv_usage()["num_compressions"] >= 2
    assert llm.kv_usage()["num_blocks_used"] == 0


# ---- the matrix: policy x codec x hard/soft over tiers --------------------------------------
@pytest.mark.parametrize("soft", [False, True], ids=["hard", "soft"])
@pytest.mark.parametrize("codec", ["fp32", "int8", "kivi"])
@pytest.mark.parametrize("policy", SELECTIVE)
def test_policy_codec_tiers_matrix(policy, codec, soft):
    """Turn 1 compresses; turn 2 (turn 1's prompt + answer + a question) fetches the
    prompt's blocks back from the host with soft eviction, recomputes them with hard."""
    spec = (final_only_spec(policy, True) if soft else spec_of(policy, 8)) + f"+{codec}+{TIERS}"
    llm = policy_llm(spec)
    turn1 = llm.generate([PROMPT], GREEDY)[0]
    turn2_prompt = PROMPT + turn1.token_ids + QUESTION
    turn2 = llm.generate([turn2_prompt], GREEDY)[0]
    usage = llm.kv_usage()
    assert usage["num_compressions"] >= 2 and len(turn2.token_ids) == GREEDY.max_tokens
    cached = turn2.metrics.num_cached_prompt_tokens
    store = usage["tier_store"]
    if soft:
        # every full prompt block computed before the first compression (7 of 30 tokens)
        assert cached == (len(PROMPT) // BS) * BS
        assert store["num_promoted_blocks"] > 0 and store["num_soft_evicted_blocks"] > 0
    else:
        # turn 1's compacted state: every token it computed (the last one sampled is not)
        assert cached == len(PROMPT) + len(turn1.token_ids) - 1
        assert store["num_soft_evicted_blocks"] == 0
        assert llm.engine.scheduler.compacted.num_taken == 1
    assert usage["num_blocks_used"] == 0
    llm.engine.check_integrity()
    llm.engine.close()


@pytest.mark.parametrize("codec", ["fp32", "int8"])
@pytest.mark.parametrize("soft", [False, True], ids=["hard", "soft"])
@pytest.mark.parametrize("policy", SELECTIVE)
def test_a_later_request_sees_the_full_prefix_again(policy, soft, codec):
    """After turn 1 was compressed, the first token of a request that extends its prompt
    is computed over the whole prefix -- fetched back (soft) or recomputed (hard) --
    so its logits equal those of the full cache of the same codec."""
    spec = final_only_spec(policy, soft) + f"+{codec}+{TIERS}"
    llm = policy_llm(spec)
    llm.generate([PROMPT], GREEDY)
    assert llm.kv_usage()["num_compressions"] >= 1
    later = PROMPT + QUESTION
    got = first_logits(llm, later)
    full = policy_llm(codec, enable_prefix_caching=False)
    want = first_logits(full, later)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    promoted = llm.kv_usage()["tier_store"]["num_promoted_blocks"]
    assert (promoted > 0) == soft
    llm.engine.close()


@pytest.mark.parametrize("window", [4, 16])     # 16: the next message is shorter
@pytest.mark.parametrize("tiers", [True, False], ids=["tiers", "no-tiers"])
def test_the_next_turn_continues_from_the_compacted_state(tiers, window):
    spec = f"snapkv(budget=8,window={window},kernel=3)+fp32" + (f"+{TIERS}" if tiers else "")
    llm = policy_llm(spec, num_blocks=24)
    engine = llm.engine
    turn1 = llm.generate([PROMPT], GREEDY)[0]
    num_state_tokens = len(PROMPT) + len(turn1.token_ids) - 1
    turn2_prompt = PROMPT + turn1.token_ids + QUESTION
    before = engine.num_prefill_tokens
    turn2 = llm.generate([turn2_prompt], GREEDY)[0]
    assert turn2.metrics.num_cached_prompt_tokens == num_state_tokens
    assert engine.num_prefill_tokens - before == len(turn2_prompt) - num_state_tokens
    # other traffic reuses every pool block: turn 2's state survives only in the tiers
    llm.generate(random_prompts([80], seed=5), GREEDY)
    turn3_prompt = turn2_prompt + turn2.token_ids + QUESTION
    turn3 = llm.generate([turn3_prompt], GREEDY)[0]
    num_state_tokens = len(turn2_prompt) + len(turn2.token_ids) - 1
    assert turn3.metrics.num_cached_prompt_tokens == (num_state_tokens if tiers else 0)
    if tiers:
        assert llm.kv_usage()["tier_store"]["num_promoted_blocks"] > 0
    else:                                  # recomputed: what a fresh engine computes
        assert turn3.token_ids == policy_llm(spec, enable_prefix_caching=False).generate(
            [turn3_prompt], GREEDY)[0].token_ids
    engine.check_integrity()
    assert llm.kv_usage()["num_blocks_used"] == 0
    engine.close()


def test_soft_eviction_to_a_lower_level(tmp_path):
    spec = (f"snapkv(budget=8,window=4,kernel=3,evict_to=disk)+fp32+tiers(host=1MiB,"
            f"disk=1MiB,disk_path={tmp_path},fetch=always)")
    llm = policy_llm(spec)
    llm.generate([PROMPT], GREEDY)
    usage = llm.kv_usage()
    assert usage["tiers"]["disk"]["num_blocks"] == len(PROMPT) // BS
    assert usage["tiers"]["host"]["num_blocks"] == 0
    turn2 = llm.generate([PROMPT + QUESTION], GREEDY)[0]
    assert turn2.metrics.num_cached_prompt_tokens == (len(PROMPT) // BS) * BS
    llm.engine.close()


# ---- what is refused --------------------------------------------------------------------------
@pytest.mark.parametrize("spec,fragment", [
    ("snapkv(evict_to=host)", "snapkv(evict_to=host) names no tier level of the spec (it has no tiers"),
    ("snapkv(evict_to=disk)+tiers(host=1MiB)", "names no tier level of the spec (its tiers are host)"),
    ("h2o(evict_to=host)+tiers(host=1MiB)", "chunked=true (the default of h2o)"),
    ("tova(chunked=true,evict_to=host)+tiers(host=1MiB)", "tova(evict_to=host): chunked=true rewrites"),
    ("snapkv(evict_to=3)+tiers(host=1MiB)", "evict_to=3) must name a tier level"),
])
def test_impossible_soft_eviction_is_refused_at_parse_time(spec, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)):
        KVConfig.parse(spec)


def test_a_policy_runs_with_tiers_but_does_not_page():
    """A policy compacts resident blocks only: a prompt larger than the pool is refused,
    naming the policy, instead of being paged."""
    llm = policy_llm(f"snapkv(budget=8,window=4,kernel=3)+fp32+{TIERS}", num_blocks=6)
    with pytest.raises(ValueError, match=r"a selection policy \(snapkv"):
        llm.generate([PROMPT], GREEDY)
    llm.engine.close()
