"""A hybrid model (sliding-window and global layers, the gemma3 decoder) through the
engine, on the tiny random-weight shape ``dummy:tiny-hybrid`` (layers 0 and 2 slide over
8 tokens) in fp32: against HF's Gemma3ForCausalLM on the same weights, paged vs dense,
batching, preemption, and the sliding layers' blocks really going back to the pool."""
from __future__ import annotations

import warnings

import pytest
import torch

from kvmap import SamplingParams
from kvmap.kv.spec import layer_resident_blocks, sequence_layer_blocks
from tests.conftest import make_tiny_llm, random_prompts

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)
HYBRID = "dummy:tiny-hybrid"


def hybrid_llm(**kwargs):
    return make_tiny_llm(model=HYBRID, **kwargs)


def hf_twin(llm):
    """HF Gemma3ForCausalLM with the same weights (the reference)."""
    transformers = pytest.importorskip("transformers")
    from kvmap.model.dummy import dummy_weights
    cfg = llm.model_config
    hc = transformers.Gemma3TextConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps, sliding_window=cfg.sliding_window,
        layer_types=["sliding_attention" if w else "full_attention"
                     for w in cfg.layer_windows],
        query_pre_attn_scalar=int(cfg.query_pre_attn_scalar),
        rope_parameters={"full_attention": {"rope_type": "default",
                                            "rope_theta": cfg.rope_theta},
                         "sliding_attention": {"rope_type": "default",
                                               "rope_theta": cfg.rope_local_theta}},
        attn_implementation="eager", pad_token_id=0)
    model = transformers.Gemma3ForCausalLM(hc).eval()
    missing, unexpected = model.load_state_dict(dummy_weights(cfg, torch.float32), strict=False)
    assert not unexpected and all("rotary" in m or m == "lm_head.weight" for m in missing)
    return model


def greedy_ids(llm, prompts, max_tokens=12):
    return [o.token_ids for o in llm.generate(prompts, SamplingParams(
        max_tokens=max_tokens, ignore_eos=True))]


def test_logits_match_hf_across_the_window_and_chunks():
    llm = hybrid_llm()
    hf = hf_twin(llm)
    for prompt in random_prompts([5, 9, 33, 150], seed=1):   # 150 > the step budget
        ours = llm.engine.score(prompt)
        with torch.no_grad():
            ref = hf(torch.tensor([prompt])).logits[0]
        assert (ours - ref).abs().max().item() < 1e-4


def test_greedy_matches_hf_generate_past_the_window():
    llm = hybrid_llm()
    hf = hf_twin(llm)
    prompts = random_prompts([3, 21], seed=2)
    for prompt, ours in zip(prompts, greedy_ids(llm, prompts, max_tokens=16)):
        ids = torch.tensor([prompt])
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16,
                          do_sample=False, eos_token_id=None, pad_token_id=0)
        assert ref[0, len(prompt):].tolist() == ours


@pytest.mark.parametrize("kv", ["fp32", "int8", "fp32+tiers(host=4MiB)"])
def test_paged_equals_dense_and_blocks_follow_the_window(kv):
    """Block size 4, a sequence of 60+ tokens: after every step each sliding layer holds
    exactly the blocks from its first live slot on, the global one all of them
    (``layer_resident_blocks``), the pool stays whole, and the tokens are those of one
    large block in a single chunk. With tiers (blocks kept by prefix hash) the table is
    shared: sliding layers keep their whole context, masked."""
    llm = hybrid_llm(kv=kv, block_size=4, max_num_batched_tokens=16)
    eng = llm.engine
    assert eng.kv.per_layer_tables == ("tiers" not in kv)
    prompt = random_prompts([45], seed=3)[0]
    req = eng.add_request(prompt, SamplingParams(max_tokens=20, ignore_eos=True))
    while not req.status.finished:
        eng.step()
        eng.check_integrity()
        if eng.kv.per_layer_tables and not req.status.finished:
            want = [layer_resident_blocks(req.num_kv_slots, 4, w) for w in eng.geom.windows]
            assert eng.kv.pool.layer_blocks_in_use() == want
            assert eng.kv.usage().resident_bytes == \
                sequence_layer_blocks(req.num_kv_slots, eng.geom) * eng.kv.layer_block_bytes
    dense = hybrid_llm(kv=kv.split("+")[0], block_size=64, max_num_batched_tokens=128)
    assert req.output_token_ids == greedy_ids(dense, [prompt], max_tokens=20)[0]
    assert eng.kv.pool.num_used == 0


def test_usage_reports_each_layer_kind():
    """After a 100-token prompt (block size 4): the global layer holds its 25 blocks,
    each sliding layer the 2 blocks of its 8-token window."""
    llm = hybrid_llm(block_size=4, max_num_batched_tokens=16)
    req = llm.engine.add_request(random_prompts([100], seed=8)[0],
                                 SamplingParams(max_tokens=3, ignore_eos=True))
    while req.num_computed_tokens < 100:
        llm.engine.step()
    kinds = llm.engine.kv.usage().layer_kinds
    per_layer_block = llm.engine.kv.layer_block_bytes
    assert kinds["global"]["resident_bytes"] == 25 * per_layer_block        # 100 / 4
    assert kinds["sliding"]["resident_bytes"] == 2 * 2 * per_layer_block    # 2 layers x 2
    assert kinds["sliding"]["window"] == 8 and kinds["sliding"]["layers"] == [0, 2]


def test_mixed_batch_equals_alone():
    prompts = random_prompts([3, 17, 40, 9, 26], seed=4)
    alone = [greedy_ids(hybrid_llm(), [p])[0] for p in prompts]
    together = greedy_ids(hybrid_llm(max_num_batched_tokens=32), prompts)
    assert together == alone


def test_preemption_gives_same_tokens():
    prompts = random_prompts([30, 25, 33, 28], seed=5)
    roomy = hybrid_llm(num_blocks=256)
    tight = hybrid_llm(num_blocks=12, block_size=4, max_num_batched_tokens=16)
    a = greedy_ids(roomy, prompts, max_tokens=20)
    b = greedy_ids(tight, prompts, max_tokens=20)
    assert tight.kv_usage()["num_preemptions"] > 0
    assert a == b
    tight.engine.check_integrity()
    assert tight.engine.kv.pool.num_used_layer_blocks == 0


def test_policy_leaves_sliding_layers_alone_with_a_warning():
    """A policy whose budget covers the window: the warning names the layers it leaves
    alone; compaction moves each sliding layer's window, which then holds no more than
    a window's blocks (3 of size 4 for 7 tokens + the next one), and the pool stays
    whole through compressions."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        llm = hybrid_llm(kv="streaming_llm(budget=12,sinks=4)", block_size=4,
                         max_num_batched_tokens=16)
    text = " ".join(str(w.message) for w in caught)
    assert "global layers 1 only" in text and "sliding layers 0, 2 alone" in text
    eng = llm.engine
    req = eng.add_request(random_prompts([30], seed=6)[0],
                          SamplingParams(max_tokens=12, ignore_eos=True))
    while not req.status.finished:
        eng.step()
        eng.check_integrity()
        used = eng.kv.pool.layer_blocks_in_use()
        assert used[0] <= 3 and used[2] <= 3
    assert len(req.output_token_ids) == 12
    assert eng.policy_runner.num_compressions > 0
    assert eng.kv.pool.num_used_layer_blocks == 0


def test_layer_budgets_on_a_hybrid_model_is_refused():
    with pytest.raises(ValueError, match="layer_budgets on a model with sliding-window"):
        hybrid_llm(kv="h2o(budget=10,layer_budgets=pyramid)")


@pytest.mark.parametrize("kv", ["fp32", "int8"])
def test_all_global_layout_gives_the_windowed_tokens(kv):
    """``all_global`` keeps the sliding layers' whole history but masks attention to the
    window: the greedy tokens of prompts past the 8-token window are the default
    layout's, in a mixed batch with chunked prefill."""
    prompts = random_prompts([45, 12, 30], seed=11)
    flat = hybrid_llm(kv=f"{kv}+all_global", block_size=4, max_num_batched_tokens=16)
    assert not flat.engine.kv.per_layer_tables
    assert greedy_ids(flat, prompts, max_tokens=16) == \
        greedy_ids(hybrid_llm(kv=kv, block_size=4, max_num_batched_tokens=16), prompts,
                   max_tokens=16)
    flat.engine.check_integrity()
