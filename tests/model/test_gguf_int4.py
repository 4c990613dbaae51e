"""A GGUF's own Q4_0 / Q4_1 blocks loaded into the engine's int4 (``quantization="int4"``)
with no trip through a dense dtype: same codes, scale = d, zero = m + 8 d (the engine's
w = (q - 8) * scale + zero; Q4_0 is m = -8 d). The one rounding is of scale and zero to
the layer's compute dtype: in fp32 the kernel multiplies by exactly the GGUF's weights,
in bf16 within the bf16 rounding of d and m + 8 d."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf import quants

from kvmap import LLM, SamplingParams
from kvmap.model.gguf_loader import open_gguf, read_int4_groups, unpermute_rotary_rows
from kvmap.model.linear import Int4Linear, PackedLinear
from kvmap.model.shapes import get_shape
from kvmap.model.dummy import dummy_weights
from tests.model.test_loaders import gguf_name, write_gguf

TINY = get_shape("tiny")
QTYPES = {"embed_tokens": QT.Q8_0, "q_proj": QT.Q4_0, "k_proj": QT.Q4_1, "v_proj": QT.Q4_1,
          "o_proj": QT.Q4_0, "mlp": QT.Q4_1}


@pytest.fixture
def q4_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("KVMAP_CACHE_DIR", str(tmp_path / "cache"))
    return write_gguf(tmp_path / "q4.gguf", TINY, dummy_weights(TINY, torch.float32, seed=5),
                      QTYPES)


def gguf_dequantized(path) -> dict[str, torch.Tensor]:
    """The GGUF's own dequantization (gguf-py) of each layer matrix, in HF row order."""
    out = {}
    for t in open_gguf(path).tensors:
        if t.tensor_type not in (QT.Q4_0, QT.Q4_1):
            continue
        rows, cols = (int(s) for s in reversed(t.shape))
        w = torch.from_numpy(quants.dequantize(t.data, t.tensor_type).reshape(rows, cols).copy())
        for part, heads in ((".attn_q.", TINY.num_heads), (".attn_k.", TINY.num_kv_heads)):
            if part in t.name:
                w = unpermute_rotary_rows(w, heads)
        out[t.name] = w
    return out


def test_q4_blocks_are_the_ggufs_own_weights(q4_gguf):
    groups = read_int4_groups(q4_gguf, TINY)
    reference = gguf_dequantized(q4_gguf)
    assert len(groups) == len(reference) == 7 * TINY.num_layers
    for hf_name, g in groups.items():
        ref = reference[gguf_name(hf_name)]
        assert g.codes.min() >= 0 and g.codes.max() <= 15
        assert torch.equal(g.dequantized(), ref), hf_name           # exact in fp32
        # bf16: only scale = d and zero = m + 8 d are rounded
        lin = Int4Linear.from_groups(g, torch.bfloat16)
        s_bf, z_bf = lin.scales_zeros[..., 0].t().float(), lin.scales_zeros[..., 1].t().float()
        rep = lambda t: t.repeat_interleave(g.group_size, 1)        # noqa: E731
        w_bf = (g.codes.float() - 8) * rep(s_bf) + rep(z_bf)
        bound = (g.codes.float() - 8).abs() * rep((s_bf - g.scale).abs()) \
            + rep((z_bf - g.zero).abs())
        assert ((w_bf - ref).abs() <= bound + 1e-6).all(), hf_name
        assert (bound <= 2 ** -8 * (8 * rep(g.scale.abs()) + rep(g.zero.abs())) + 1e-6).all()
        x = torch.randn(3, ref.shape[1]).to(torch.bfloat16)
        assert torch.allclose(lin(x).float(), x.float() @ w_bf.T, atol=2e-2, rtol=2e-2)


def test_int4_llm_on_a_gguf_multiplies_by_the_ggufs_weights(q4_gguf):
    """fp32: the model built from the blocks gives the greedy tokens of a dense model
    whose matrices are the GGUF's own dequantized weights (its norms folded in)."""
    llm = LLM(model=str(q4_gguf), dtype="fp32", kv="fp32", quantization="int4",
              num_blocks=64, block_size=4)
    layers = llm.engine.model.layers
    assert all(isinstance(lin, Int4Linear) for layer in layers for lin in layer.values())
    assert layers[0]["qkv"].in_scale is not None and layers[0]["o"].in_scale is None
    ref = LLM(model=str(q4_gguf), dtype="fp32", kv="fp32", num_blocks=64, block_size=4)
    model, weights = ref.engine.model, gguf_dequantized(q4_gguf)
    for i, layer in enumerate(model.layers):
        qlayer = layers[i]
        for name, lin in layer.items():
            parts = {"qkv": ("attn_q", "attn_k", "attn_v"), "o": ("attn_output",),
                     "gate_up": ("ffn_gate", "ffn_up"), "down": ("ffn_down",)}[name]
            w = torch.cat([weights[f"blk.{i}.{p}.weight"] for p in parts])
            if qlayer[name].in_scale is not None:
                w = w * qlayer[name].in_scale.float()
            layer[name] = PackedLinear(w, lin.bias)
    model.head = llm.engine.model.head
    prompts = [np.random.default_rng(s).integers(0, 256, n).tolist()
               for s, n in ((1, 9), (2, 30), (3, 17))]
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    assert [o.token_ids for o in llm.generate(prompts, params)] == \
        [o.token_ids for o in ref.generate(prompts, params)]


def test_planner_counts_the_unfolded_norms(q4_gguf):
    from kvmap.perf.weights import engine_weight_bytes
    llm = LLM(model=str(q4_gguf), dtype="bf16", kv="bf16", quantization="int4",
              num_blocks=64, block_size=4)
    cfg = llm.model_config
    assert engine_weight_bytes(cfg, "int4", 2, int4_from_gguf=True) == llm.weight_bytes()
    assert engine_weight_bytes(cfg, "int4", 2) == llm.weight_bytes() \
        - cfg.num_layers * 2 * cfg.hidden_size * 2


@pytest.mark.slow
def test_embedded_int4_is_built_from_its_q4_1_blocks(real_llm):
    """The embedded SmolLM2 (Q4_1 matrices): every layer from the file's blocks, and its
    next-token choices those of the dense model (the same file dequantized, at the
    machine's ``auto`` dtype) on corpus
    text (measured 95.8% over 24 windows of 512 + 64 tokens, docs/weights.md)."""
    from kvmap.evals.ppl import build_samples
    llm = LLM(quantization="int4", kv_memory="32MiB")
    assert all(layer["qkv"].in_scale is not None for layer in llm.engine.model.layers)
    ids = build_samples(llm.tokenizer, 1, 256, 64, seed=3)[0]
    mine = llm.engine.score(ids, num_context_tokens=256).argmax(-1)
    ref = real_llm.engine.score(ids, num_context_tokens=256).argmax(-1)
    assert (mine == ref).float().mean() >= 0.85
