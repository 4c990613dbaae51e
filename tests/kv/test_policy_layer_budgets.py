"""Per-layer budgets (``layer_budgets=pyramid`` or an explicit list): the split itself,
option errors, and inside the engine (tiny random fp32 Llama, 2 layers): each layer keeps
its own number of tokens, the sequence holds the largest, the empty slots of a smaller
layer are masked out of attention (garbage written there changes nothing), and blocks
go back to the pool.
"""
from __future__ import annotations

import pytest
import torch

from kvmap import SamplingParams
from kvmap.kv.compaction import slots_of
from kvmap.kv.config import KVConfig
from kvmap.kv.policies import POLICIES
from kvmap.kv.policies.layer_budgets import pyramid, split_budget
from tests.conftest import make_tiny_llm, random_prompts


# ---- the split ---------------------------------------------------------------------------
@pytest.mark.parametrize("budget,num_layers", [(100, 30), (7, 4), (256, 2), (1, 3)])
def test_pyramid_decreases_with_the_same_total(budget, num_layers):
    b = pyramid(budget, num_layers)
    assert sum(b) == budget * num_layers
    assert all(x >= y for x, y in zip(b, b[1:]))
    if budget >= 20:
        assert b[0] > budget > b[-1]
        assert abs(b[0] - (2 - 1 / 20) * budget) <= 1 and abs(b[-1] - budget / 20) <= 1


def test_split_budget_forms():
    assert split_budget(None, 10, 3, 100) == [10, 10, 10]
    assert split_budget((4, 0.5), 10, 2, 100) == [4, 50]
    assert split_budget("pyramid", 10, 2, 100, floor=6) == [20, 6]     # floored at 6
    with pytest.raises(ValueError, match="has 2 entries; the model has 3 layers"):
        split_budget((4, 5), 10, 3, 100)


def test_policy_layer_budget_tokens():
    p = KVConfig.parse("h2o(budget=0.25,layer_budgets=0.5/16)").policy
    assert p.layer_budget_tokens(100, 2) == [50, 16]
    assert POLICIES["snapkv"](budget=40, layer_budgets="pyramid").layer_budget_tokens(
        400, 2) == [78, 2]
    assert POLICIES["tova"](budget=8).layer_budget_tokens(100, 3) == [8, 8, 8]


@pytest.mark.parametrize("spec,fragment", [
    ("h2o(layer_budgets=0/4)", "'0' is not a budget"),
    ("knorm(layer_budgets=4/1.5)", "'1.5' is not a budget"),
    ("tova(layer_budgets=x)", "'x' is not a budget"),
    ("window(size=8,layer_budgets=pyramid)", "no option 'layer_budgets'"),
])
def test_bad_layer_budgets_are_refused_by_name(spec, fragment):
    with pytest.raises(ValueError, match=fragment):
        KVConfig.parse(spec)


# ---- in the engine ---------------------------------------------------------------------
BLOCK_SIZE = 4
SPECS = {
    "h2o": "h2o(budget=12,layer_budgets=16/6)",
    "snapkv": "snapkv(budget=12,window=4,kernel=3,layer_budgets=pyramid)",
    "tova": "tova(budget=12,layer_budgets=pyramid)",
    "knorm": "knorm(budget=12,layer_budgets=16/6)",
    "random": "random(budget=12,layer_budgets=6/16)",
}


def start(spec: str, prompt_len: int = 40, max_tokens: int = 12):
    # the shared block table, where holes stay resident and masked (per-layer tables,
    # which free them: tests/kv/test_layer_tables.py)
    spec = spec[:-1] + ",layer_tables=shared)"
    llm = make_tiny_llm(kv=spec + "+fp32", block_size=BLOCK_SIZE, max_num_batched_tokens=16)
    engine = llm.engine
    req = engine.add_request(random_prompts([prompt_len], seed=7)[0],
                             SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return engine, req


@pytest.mark.parametrize("name", sorted(SPECS))
def test_each_layer_keeps_its_own_budget(name):
    engine, req = start(SPECS[name])
    budgets = engine.policy.layer_budget_tokens(req.num_prompt_tokens, 2)
    assert budgets[0] != budgets[1]
    top = max(budgets)
    saw_holes = False
    while engine.has_unfinished():
        engine.step()
        engine.check_integrity()
        if req.status.finished:
            break
        if req.num_computed_tokens >= req.num_prompt_tokens:
            assert req.num_kv_slots <= top + BLOCK_SIZE - 1
            assert engine.kv_usage()["num_blocks_used"] == -(-req.num_kv_slots // BLOCK_SIZE)
        if getattr(req, "kv_holes", None):
            saw_holes = True
            small = budgets.index(min(budgets))
            assert req.kv_holes == {small: (min(budgets), top)}
    assert saw_holes
    assert len(req.output_token_ids) == 12
    assert engine.kv_usage()["num_blocks_used"] == 0


@pytest.mark.parametrize("name", ["h2o", "snapkv"])
def test_holes_are_masked_out_of_attention(name):
    # Two identical runs; in one, the empty slots of the smaller layer get garbage after
    # every step. If attention masks them the two runs produce the same logits.
    runs = [start(SPECS[name], max_tokens=10) for _ in range(2)]
    garbage_written = 0
    while runs[0][0].has_unfinished():
        for i, (engine, req) in enumerate(runs):
            engine.step()
            if i == 1 and not req.status.finished and getattr(req, "kv_holes", None):
                for layer, (first, end) in req.kv_holes.items():
                    slots = slots_of(req.block_ids, end, BLOCK_SIZE)[first:end]
                    H, D = engine.kv.geom.num_kv_heads, engine.kv.geom.head_dim
                    junk = torch.full((len(slots), H, D), 50.0)
                    engine.kv.codec.write(engine.kv.layers[layer], slots, junk, -junk)
                    garbage_written += 1
    assert garbage_written > 0
    (_, a), (_, b) = runs
    assert a.output_token_ids == b.output_token_ids


def test_uniform_list_equals_no_list():
    prompts = random_prompts([30, 14], seed=8)
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    outs = []
    for spec in ("h2o(budget=10)", "h2o(budget=10,layer_budgets=10/10)"):
        llm = make_tiny_llm(kv=spec + "+fp32", block_size=BLOCK_SIZE, max_num_batched_tokens=16)
        outs.append([o.token_ids for o in llm.generate(prompts, params)])
    assert outs[0] == outs[1]


@pytest.mark.parametrize("codec", ["bf16", "int8", "kivi"])
def test_layer_budgets_compose_with_codecs(codec):
    llm = make_tiny_llm(kv=f"{SPECS['h2o']}+{codec}", block_size=BLOCK_SIZE,
                        max_num_batched_tokens=16)
    prompts = random_prompts([40, 13], seed=9)
    outs = llm.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [12, 12]
    llm.engine.check_integrity()
    assert llm.kv_usage()["num_blocks_used"] == 0 and llm.kv_usage()["num_compressions"] > 0
