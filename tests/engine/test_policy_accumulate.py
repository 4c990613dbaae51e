"""H2O-style accumulation (``PolicyRunner``): per request, the attention each slot has
received, all layers in one (layers, H, slots) tensor, accumulated for a batch of
decode rows in one stack per step.

Invariant: each query head's softmax sums to 1, so a KV head's accumulated row sums to
G (query heads per KV head) times the queries seen: prompt tokens plus decode steps.
A row attributed to the wrong request would carry another length's mass (masked keys
get 0, slicing cuts real ones), so requests of different lengths catch it.
"""
from __future__ import annotations

import pytest
import torch

from kvmap import SamplingParams
from tests.conftest import make_tiny_llm, random_prompts


def test_accumulated_attention_sums_to_queries_seen_per_request():
    llm = make_tiny_llm(kv="h2o(budget=4096)+fp32", block_size=4, max_num_batched_tokens=64)
    engine = llm.engine
    lengths, new_tokens = (23, 9, 14), (7, 5, 3)      # row 0 the longest
    reqs = [engine.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True))
            for p, n in zip(random_prompts(list(lengths), seed=4), new_tokens)]
    seen = {}
    while engine.has_unfinished():
        engine.step()
        for r in reqs:
            if r.policy_acc is not None and not r.status.finished:
                seen[r.request_id] = (r.policy_acc.clone(), r.num_kv_slots,
                                      r.num_computed_tokens)
    assert len(seen) == len(reqs)
    for r in reqs:
        acc, slots, computed = seen[r.request_id]
        num_layers, num_kv_heads = acc.shape[:2]
        assert acc.shape[2] == slots
        group = acc.sum(-1) / computed                     # (layers, H): G everywhere
        assert torch.allclose(group, group[0, 0].round().expand_as(group), atol=1e-4)
        assert group[0, 0].round() >= 1
        assert (acc >= 0).all()


@pytest.mark.parametrize("spec", ["h2o(budget=8)", "tova(budget=8)"])
def test_compressed_requests_keep_one_accumulator_per_layer(spec):
    """After compressions (budget 8, one block of decode growth) the accumulator stays
    (layers, H, slots) and the run completes with every block returned."""
    llm = make_tiny_llm(kv=spec + "+fp32", block_size=4, max_num_batched_tokens=64)
    engine = llm.engine
    reqs = [engine.add_request(p, SamplingParams(max_tokens=12, ignore_eos=True))
            for p in random_prompts([17, 30], seed=5)]
    while engine.has_unfinished():
        engine.step()
        engine.check_integrity()
        for r in reqs:
            if r.policy_acc is not None and not r.status.finished:
                assert r.policy_acc.dim() == 3 and r.policy_acc.shape[2] == r.num_kv_slots
    assert engine.policy_runner.num_compressions >= 2
    assert all(len(r.output_token_ids) == 12 for r in reqs)
