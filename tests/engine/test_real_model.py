"""The real embedded model (SmolLM2-135M-Instruct, Q4_1 GGUF) against HF transformers
on the same dequantized weights, plus a pinned greedy answer. Marked slow (runs in CI)."""
from __future__ import annotations

import os

import pytest
import torch

from kvmap import SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. Then the dog",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "In 1789, the French Revolution began with the storming of the Bastille, which",
]


@pytest.fixture(scope="module")
def hf_model():
    transformers = pytest.importorskip("transformers")
    from kvmap.model.loader import embedded_model_path
    path = embedded_model_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32,
        quantization_config=transformers.GgufConfig(dequantize=True))
    return model.eval()


def test_pinned_chat_answer(real_llm_fp32):
    out = real_llm_fp32.chat([{"role": "user", "content": "What is the capital of France?"}],
                             SamplingParams(max_tokens=16))[0]
    assert "Paris" in out.text
    assert out.finish_reason == "stop"


def test_logits_match_transformers(real_llm_fp32, hf_model):
    tok = real_llm_fp32.tokenizer
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        ours = real_llm_fp32.engine.score(ids)
        with torch.no_grad():
            ref = hf_model(torch.tensor([ids])).logits[0].float()
        assert (ours - ref).abs().max().item() < 1e-3, prompt


def test_greedy_matches_transformers(real_llm_fp32, hf_model):
    tok = real_llm_fp32.tokenizer
    encoded = [tok.encode(p) for p in PROMPTS]
    outs = real_llm_fp32.generate(encoded, SamplingParams(max_tokens=24, ignore_eos=True))
    for ids, out in zip(encoded, outs):
        t = torch.tensor([ids])
        ref = hf_model.generate(t, attention_mask=torch.ones_like(t), max_new_tokens=24,
                                do_sample=False, eos_token_id=None, pad_token_id=0)
        assert ref[0, len(ids):].tolist() == out.token_ids


def test_auto_dtype_batched_generation_is_coherent(real_llm):
    outs = real_llm.chat([[{"role": "user", "content": q}] for q in
                          ("What is 2 + 2?", "Name a primary color.")],
                         SamplingParams(max_tokens=24))
    assert all(o.text.strip() for o in outs)
    assert real_llm.kv_usage()["num_blocks_used"] == 0


def test_paged_long_prompt_retrieves_passkey_like_unpaged(real_llm_fp32, tmp_path):
    """A 700-token passkey prompt through a pool a third its size, paged through
    host + disk with prefetching: the same greedy answer as the un-paged engine."""
    from kvmap import LLM
    from kvmap.evals.passkey import contains_key, make_cases
    case = make_cases(real_llm_fp32.tokenizer, [700], [0.2], 1, seed=0)[0]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    want = real_llm_fp32.generate([case.prompt], params)[0]
    paged = LLM(dtype="fp32", device="cpu", num_blocks=15, max_num_batched_tokens=128,
                kv=f"fp32+tiers(host=2MiB,disk=256MiB,disk_path={tmp_path},prefetch=window,"
                   "page_blocks=4)")
    got = paged.generate([case.prompt], params)[0]
    paging = paged.kv_usage()["tier_store"]["paging"]
    paged.engine.close()
    assert paging["num_pages_out"] > 0 and paging["num_page_faults"] == 0
    assert got.token_ids == want.token_ids
    assert contains_key(got.text, case.key) == contains_key(want.text, case.key)


# ---- the engine's equivalences on both real models (SmolLM2: full attention; Gemma 3:
# sliding-window and global layers) -----------------------------------------------------
EQUIVALENCE_PROMPTS = ["The capital of France is", "def add(a, b):",
                       "Once upon a time, in a small village,"]
MODELS = {"smollm2": "real_llm_fp32", "gemma3-270m": "gemma_llm_fp32"}


@pytest.fixture(params=list(MODELS))
def real_model(request):
    return request.param, request.getfixturevalue(MODELS[request.param])


def test_batch_equals_alone(real_model):
    _, llm = real_model
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    alone = [llm.generate([p], params)[0].token_ids for p in EQUIVALENCE_PROMPTS]
    together = [o.token_ids for o in llm.generate(EQUIVALENCE_PROMPTS, params)]
    assert together == alone


def test_small_blocks_and_preemption_give_the_same_tokens(real_model):
    """Blocks of 4 tokens in a pool too small for the three requests at once: the
    engine preempts and recomputes, and every request gets the tokens it gets alone in
    a roomy pool of 16-token blocks."""
    from kvmap import LLM
    name, llm = real_model
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    want = [o.token_ids for o in llm.generate(EQUIVALENCE_PROMPTS, params)]
    tight = LLM(model=name, dtype="fp32", kv="fp32", num_blocks=10, block_size=4,
                max_num_batched_tokens=32, device="cpu")
    got = [o.token_ids for o in tight.generate(EQUIVALENCE_PROMPTS, params)]
    assert tight.kv_usage()["num_preemptions"] > 0
    assert got == want
    tight.engine.check_integrity()
    assert tight.kv_usage()["num_blocks_used"] == 0
