"""Shared fixtures. Unit tests run a tiny random-weight Llama ("dummy:tiny") in fp32;
tests marked ``slow`` load the real embedded SmolLM2-135M (they run in CI too)."""
from __future__ import annotations

import pytest
import torch

torch.set_num_threads(2)


def make_tiny_llm(**kwargs):
    from kvmap import LLM
    options = dict(model="dummy:tiny", dtype="fp32", kv="fp32", num_blocks=256, block_size=4,
                   max_num_batched_tokens=64, device="cpu")
    options.update(kwargs)
    return LLM(**options)


@pytest.fixture
def tiny_llm():
    return make_tiny_llm()


@pytest.fixture(scope="session")
def real_llm():
    from kvmap import LLM
    return LLM(dtype="bf16", device="cpu")


@pytest.fixture(scope="session")
def real_llm_fp32():
    from kvmap import LLM
    return LLM(dtype="fp32", kv="fp32", device="cpu")


def random_prompts(lengths, vocab=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]
