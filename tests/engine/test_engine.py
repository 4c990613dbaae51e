"""Engine correctness on a tiny random-weight Llama in fp32: against HF transformers,
paged vs dense, batching, preemption, prefix caching, sampling, stops, bad input."""
from __future__ import annotations

import pytest
import torch

from kvmap import SamplingParams
from tests.conftest import make_tiny_llm, random_prompts

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


def hf_twin(llm):
    """HF LlamaForCausalLM with the same weights as our tiny model (the reference)."""
    transformers = pytest.importorskip("transformers")
    from kvmap.model.dummy import dummy_weights
    cfg = llm.model_config
    hc = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta, rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_word_embeddings)
    model = transformers.LlamaForCausalLM(hc).eval()
    weights = dummy_weights(cfg, torch.float32)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and all("rotary" in m or m == "lm_head.weight" for m in missing)
    return model


def greedy_ids(llm, prompts, **kw):
    return [o.token_ids for o in llm.generate(prompts, SamplingParams(
        max_tokens=kw.get("max_tokens", 12), ignore_eos=True))]


def test_logits_match_hf_transformers():
    llm = make_tiny_llm()
    hf = hf_twin(llm)
    for prompt in random_prompts([7, 33, 70, 150], seed=1):   # 150 > the step budget: chunked
        ours = llm.engine.score(prompt)
        with torch.no_grad():
            ref = hf(torch.tensor([prompt])).logits[0]
        assert ours.shape == ref.shape
        assert (ours - ref).abs().max().item() < 1e-4


def test_greedy_matches_hf_generate():
    llm = make_tiny_llm()
    hf = hf_twin(llm)
    for prompt, ours in zip(random_prompts([5, 40]), greedy_ids(llm, random_prompts([5, 40]))):
        ids = torch.tensor([prompt])
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                          do_sample=False, eos_token_id=None, pad_token_id=-1)
        assert ref[0, len(prompt):].tolist() == ours


def test_paged_attention_equals_dense():
    """Decode through scattered blocks of size 4 equals one dense forward (HF)."""
    llm = make_tiny_llm(block_size=4)
    hf = hf_twin(llm)
    prompt = random_prompts([21], seed=3)[0]
    out = llm.generate([prompt], GREEDY)[0]
    full = prompt + out.token_ids[:-1]
    with torch.no_grad():
        ref_next = hf(torch.tensor([full])).logits[0, len(prompt) - 1:].argmax(-1).tolist()
    assert ref_next == out.token_ids


def test_mixed_batch_equals_alone():
    prompts = random_prompts([3, 17, 40, 9, 26], seed=4)
    alone = [greedy_ids(make_tiny_llm(), [p])[0] for p in prompts]
    together = greedy_ids(make_tiny_llm(max_num_batched_tokens=32), prompts)
    assert together == alone


def test_preemption_gives_same_tokens():
    prompts = random_prompts([30, 25, 33, 28], seed=5)
    roomy = make_tiny_llm(num_blocks=256)
    tight = make_tiny_llm(num_blocks=24, block_size=4, max_num_batched_tokens=16)
    a = greedy_ids(roomy, prompts, max_tokens=20)
    b = greedy_ids(tight, prompts, max_tokens=20)
    assert tight.kv_usage()["num_preemptions"] > 0
    assert a == b
    tight.engine.check_integrity()
    assert tight.kv_usage()["num_blocks_used"] == 0


def test_prefix_cache_hits_give_same_tokens():
    llm = make_tiny_llm()
    prompt = random_prompts([37], seed=6)[0]
    first = llm.generate([prompt], GREEDY)[0]
    second = llm.generate([prompt], GREEDY)[0]
    assert second.metrics.num_cached_prompt_tokens == 36     # 9 full blocks of 4
    assert first.metrics.num_cached_prompt_tokens == 0
    assert first.token_ids == second.token_ids
    usage = llm.kv_usage()
    assert usage["prefix_cache_hits"] == 9


def test_seeded_sampling_is_reproducible_and_batch_independent():
    llm = make_tiny_llm()
    p = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9, top_k=50, seed=7,
                       ignore_eos=True)
    prompts = random_prompts([6, 11], seed=8)
    a = llm.generate(prompts, p)
    b = llm.generate([prompts[1]], p)
    assert a[1].token_ids == b[0].token_ids
    other_seeds = [llm.generate([prompts[1]], SamplingParams(
        max_tokens=10, temperature=1.0, top_p=0.9, top_k=50, seed=s,
        ignore_eos=True))[0].token_ids for s in (8, 9, 10)]
    assert any(ids != b[0].token_ids for ids in other_seeds)   # the seed matters


def test_top_k_one_is_greedy():
    llm = make_tiny_llm()
    prompt = random_prompts([9], seed=9)
    greedy = greedy_ids(llm, prompt)[0]
    sampled = llm.generate(prompt, SamplingParams(max_tokens=12, temperature=0.8, top_k=1,
                                                  seed=1, ignore_eos=True))[0].token_ids
    assert sampled == greedy


def test_stop_token_ids_and_max_tokens():
    llm = make_tiny_llm()
    prompt = random_prompts([9], seed=10)
    ref = greedy_ids(llm, prompt)[0]
    stop_at = ref[4]
    out = llm.generate(prompt, SamplingParams(max_tokens=12, stop_token_ids=(stop_at,),
                                              ignore_eos=True))[0]
    assert out.token_ids == ref[:ref.index(stop_at) + 1]
    assert out.finish_reason == "stop"
    out = llm.generate(prompt, SamplingParams(max_tokens=3, ignore_eos=True))[0]
    assert len(out.token_ids) == 3 and out.finish_reason == "length"
    assert len(out.metrics.token_times_s) == 3 and out.metrics.ttft_s > 0


def test_abort_frees_blocks():
    llm = make_tiny_llm()
    engine = llm.engine
    req = engine.add_request(random_prompts([30])[0], GREEDY)
    engine.step()
    assert engine.kv_usage()["num_blocks_used"] > 0
    assert engine.abort(req.request_id)
    assert engine.kv_usage()["num_blocks_used"] == 0
    assert engine.pop_finished(req.request_id).finish_reason == "abort"
    engine.check_integrity()


def test_request_too_long_for_the_pool_finishes_with_length():
    llm = make_tiny_llm(num_blocks=4, block_size=4)
    out = llm.generate([random_prompts([10])[0]], SamplingParams(max_tokens=30,
                                                                  ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.token_ids) >= 1
    llm.engine.check_integrity()


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(max_tokens=0), "max_tokens=0"),
    (dict(temperature=-1.0), "temperature=-1.0"),
    (dict(temperature=float("nan")), "temperature=nan"),
    (dict(top_p=0.0), "top_p=0.0"),
    (dict(top_p=1.5), "top_p=1.5"),
])
def test_bad_sampling_params(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        SamplingParams(**kwargs)


def test_bad_prompts_rejected_before_work():
    llm = make_tiny_llm()
    with pytest.raises(ValueError, match="empty"):
        llm.generate([[]], GREEDY)
    too_long = [1] * llm.model_config.max_position_embeddings
    with pytest.raises(ValueError, match="context"):
        llm.generate([[1, 2], too_long], GREEDY)
    assert not llm.engine.has_unfinished()         # the valid prompt was not left queued
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[10**6]], GREEDY)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="nope"):
        make_tiny_llm(kv="nope")
    with pytest.raises(ValueError, match="dtype='fp12'"):
        make_tiny_llm(dtype="fp12")
    with pytest.raises(ValueError, match="too small for one block"):
        make_tiny_llm(num_blocks=None, kv_memory="1KiB")
    with pytest.raises((ValueError, FileNotFoundError), match="no/such/model.gguf"):
        make_tiny_llm(model="/no/such/model.gguf")


def test_score_with_context_matches_full_score():
    llm = make_tiny_llm()
    tokens = random_prompts([40], seed=11)[0]
    full = llm.engine.score(tokens)                      # (40, V)
    tail = llm.engine.score(tokens, num_context_tokens=25)  # predicts tokens 25..39
    assert tail.shape == (15, full.shape[1])
    assert (tail - full[24:39]).abs().max().item() < 1e-4
    assert llm.kv_usage()["num_blocks_used"] == 0


@pytest.mark.parametrize("kwargs", [dict(temperature=5e-324), dict(temperature=1.0, top_p=5e-324),
                                    dict(temperature=1e-30, top_p=1e-30, top_k=3)])
def test_extreme_but_valid_sampling_params_sample_the_top_token(kwargs):
    """Tiny temperature / top_p are valid and must act like greedy, not make NaN
    probabilities (the server's fuzz test found both)."""
    from kvmap.engine.sampler import filter_logits
    logits = torch.tensor([1.0, 3.0, 2.0, -1.0])
    probs = torch.softmax(filter_logits(logits, SamplingParams(**kwargs)), dim=-1)
    assert not torch.isnan(probs).any()
    assert probs.argmax().item() == 1 and probs[1].item() == pytest.approx(1.0)


def test_last_prefill_chunk_holds_the_observation_window():
    """Chunked prefill must not leave SnapKV a final chunk shorter than its window W:
    the scheduler stops W tokens before the end instead."""
    from kvmap.request import SamplingParams as SP
    llm = make_tiny_llm(kv="snapkv(budget=8,window=6,kernel=3)+fp32",
                        max_num_batched_tokens=16)
    engine = llm.engine
    req = engine.add_request(random_prompts([34])[0], SP(max_tokens=2, ignore_eos=True))
    chunks = []
    while req.num_computed_tokens < req.num_prompt_tokens:
        before = req.num_computed_tokens
        engine.step()
        chunks.append(req.num_computed_tokens - before)
    assert chunks == [16, 12, 6]        # not [16, 16, 2]


def test_load_counters_see_a_full_pool():
    """Six 24-token requests in a 12-block pool of 4-token blocks: at most two run at a
    time, the others wait, and the engine counts the full-pool steps."""
    from kvmap import LLM, SamplingParams
    llm = LLM("dummy:tiny", kv="bf16", num_blocks=12, block_size=4)
    llm.generate([list(range(3 + i, 23 + i)) for i in range(6)],
                 SamplingParams(max_tokens=4, ignore_eos=True))
    stats = llm.stats()
    assert stats.max_num_running in (1, 2) and stats.max_num_waiting >= 4
    assert stats.num_pool_full_steps > 0 and stats.num_steps > 0
    assert 0 < stats.running_seq_s and stats.to_dict()["max_num_running"] == stats.max_num_running
    assert llm.kv_usage()["num_pool_full_steps"] == stats.num_pool_full_steps
