"""The codec x policy x weight-format matrix on CUDA (marker ``gpu``; skipped without a
device): every tensor a step builds must live on the model's device, and a greedy run
on CUDA must give the tokens of the same configuration on the CPU (fp32, tiny model)."""
from __future__ import annotations

import pytest
import torch

from kvmap import SamplingParams
from tests.conftest import make_tiny_llm, random_prompts

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

KV = ["fp32", "bf16", "int8", "int4", "fp8", "kivi(bits=2)", "h2o(budget=16)",
      "snapkv(budget=16)", "tova(budget=16)", "int8 + streaming_llm(sinks=4, window=12)"]
GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)


@pytest.mark.parametrize("quantization", [None, "int8", "w8a8"])
@pytest.mark.parametrize("kv", KV)
def test_cuda_runs_the_matrix_like_the_cpu(kv, quantization):
    prompts = random_prompts([40, 9, 25], seed=21)
    cuda = make_tiny_llm(kv=kv, device="cuda", quantization=quantization)
    outs = cuda.generate(prompts, GREEDY)
    assert [len(o.token_ids) for o in outs] == [8, 8, 8]
    cuda.engine.check_integrity()
    if quantization is None and kv == "fp32":
        cpu = make_tiny_llm(kv=kv, device="cpu")
        assert [o.token_ids for o in cpu.generate(prompts, GREEDY)] == \
            [o.token_ids for o in outs]


@pytest.mark.parametrize("kv", ["fp32", "int8", "h2o(budget=16)", "snapkv(budget=16)"])
def test_cuda_scoring_as_the_evals_run_it(kv):
    """Teacher-forced scoring, the path of the ppl / KL / top-1 evals (``Engine.score``),
    with and without a context a policy compresses, matches the CPU."""
    ids = random_prompts([60], seed=22)[0]
    for num_context in (None, 40):
        got = make_tiny_llm(kv=kv, device="cuda").engine.score(ids, num_context)
        want = make_tiny_llm(kv=kv, device="cpu").engine.score(ids, num_context)
        assert got.device.type == "cuda"
        assert torch.allclose(got.cpu(), want, atol=1e-3)
