"""The decode step's shortcuts keep the values they replace: rotary tables cast once,
residual adds in place (never into the weights), no logits gather for all-decode batches."""
from __future__ import annotations

import torch

from kvmap import SamplingParams
from tests.conftest import make_tiny_llm, random_prompts


def test_rotary_tables_cast_once_equal_rows_cast_each_step():
    model = make_tiny_llm().engine.model
    rotary = model.rotary
    positions = torch.tensor([0, 5, 3, 17, 5])
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.bfloat16):
        cos, sin = rotary.tables(positions, dtype)
        assert cos.shape == sin.shape == (5, 1, model.config.head_dim)
        assert cos.dtype == sin.dtype == dtype
        assert torch.equal(cos[:, 0], rotary.cos[positions].to(dtype))
        assert torch.equal(sin[:, 0], rotary.sin_signed[positions].to(dtype))


def test_in_place_residual_never_writes_into_the_weights():
    # fp32: ``.float()`` of an fp32 tensor is the tensor itself, so the residual must be
    # a fresh copy of the embedding rows, not a view of the embedding
    llm = make_tiny_llm()
    embed = llm.engine.model.embed.clone()
    first = [o.token_ids for o in llm.generate(random_prompts([7, 3]),
                                               SamplingParams(max_tokens=6, ignore_eos=True))]
    assert torch.equal(llm.engine.model.embed, embed)
    again = [o.token_ids for o in llm.generate(random_prompts([7, 3]),
                                               SamplingParams(max_tokens=6, ignore_eos=True))]
    assert again == first


def test_all_decode_step_logits_equal_the_gathered_rows():
    llm = make_tiny_llm()
    engine = llm.engine
    reqs = [engine.add_request(p, SamplingParams(max_tokens=4, ignore_eos=True))
            for p in random_prompts([5, 9, 2])]
    engine.step()                                    # the prefills
    items = [(r, 1) for r in reqs]
    out = engine.runner.run(items)
    assert out.sampled == reqs and out.logits.shape[0] == 3
    model = engine.model
    expected = model.logits(out.hidden[torch.arange(3)])
    assert torch.equal(out.logits, expected)
