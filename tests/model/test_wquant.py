"""Weight quantization (``LLM(quantization=...)``): int8 weights give the tokens of a
model that multiplies by the same int8 weights dequantized; every format composes with
every KV codec and selection policy; bad names, shapes and devices are refused before
any weight is converted; resident weight bytes are exact."""
from __future__ import annotations

import pytest
import torch

from kvmap import SamplingParams
from kvmap.model.linear import Int4Linear, Int8Linear, PackedLinear, W8A8Linear
from kvmap.model.wquant import check_quantization, dequantize_int4, int4_groups
from tests.conftest import make_tiny_llm, random_prompts

GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)


@pytest.fixture
def exact_kernels(monkeypatch):
    """The kernels take activations in the compute dtype (fp32 here), whatever the
    machine's profile would choose (``linear.kernel_dtype``, tested in test_hardware.py):
    these tests compare with fp32 products of the dequantized weights, exactly."""
    from kvmap.model import linear
    monkeypatch.setattr(linear, "kernel_dtype", lambda fmt, dtype, device: dtype)


def greedy(llm, prompts):
    return [o.token_ids for o in llm.generate(prompts, GREEDY)]


def test_int8_weights_match_their_dequantized_reference(exact_kernels):
    prompts = random_prompts([9, 30, 17], seed=11)
    llm = make_tiny_llm(quantization="int8")
    ref = make_tiny_llm()
    model = ref.engine.model
    for layer, qlayer in zip(model.layers, llm.engine.model.layers):
        for name, lin in qlayer.items():
            assert isinstance(lin, Int8Linear)
            layer[name] = PackedLinear(lin.dequantized(), lin.bias)
    model.head = PackedLinear(llm.engine.model.head.dequantized())
    assert greedy(llm, prompts) == greedy(ref, prompts)


def test_int8_product_equals_dequantized_product(exact_kernels):
    w = torch.randn(48, 64)
    lin = Int8Linear(w)
    x = torch.randn(5, 64)
    assert torch.allclose(lin(x), x @ lin.dequantized().T, atol=1e-4)
    assert (lin.dequantized() - w).abs().max() <= w.abs().amax(1).max() / 127 / 2 + 1e-6


def test_w8a8_and_int4_products_are_close_to_the_float_product(exact_kernels):
    w, x = torch.randn(64, 64), torch.randn(3, 64)
    exact = x @ w.T
    assert (W8A8Linear(w)(x) - exact).abs().max() < 0.05 * exact.abs().max()
    q, s, z = int4_groups(w)
    assert torch.allclose(Int4Linear(w)(x), x @ dequantize_int4(q, s, z).T, atol=1e-3)
    assert (Int4Linear(w)(x) - exact).abs().max() < 0.2 * exact.abs().max()


FORMAT_ROWS = ["int8", "w8a8", "int4"]          # every weight format (tests/test_family_rows.py)


@pytest.mark.parametrize("quantization", FORMAT_ROWS)
@pytest.mark.parametrize("kv", ["fp32", "int8", "int4", "fp8", "kivi(bits=2)",
                                "snapkv(budget=16)", "h2o(budget=16)",
                                "int8 + streaming_llm(sinks=4, window=12)"])
def test_weight_quantization_composes_with_kv_specs(quantization, kv):
    llm = make_tiny_llm(kv=kv, quantization=quantization)
    outs = llm.generate(random_prompts([40, 7, 25], seed=12), GREEDY)
    assert [len(o.token_ids) for o in outs] == [10, 10, 10]
    llm.engine.check_integrity()


def test_weight_bytes_are_exact():
    plain, q8, q4 = (make_tiny_llm(dtype="bf16", kv="bf16", quantization=q)
                     for q in (None, "int8", "int4"))
    cfg = plain.model_config
    h, F, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
    mats = [(qkv, h), (h, cfg.num_heads * cfg.head_dim), (2 * F, h), (h, F)]
    fixed = V * h * 2 + h * 4                                 # bf16 embedding, fp32 norm
    head_int8 = V * h + V * 2
    assert plain.weight_bytes() == fixed + cfg.num_layers * sum(o * i * 2 for o, i in mats) \
        + (0 if cfg.tie_word_embeddings else V * h * 2)
    smooth = 2 * h * 2               # SmoothQuant's 1/s of q|k|v and gate|up (bf16)
    assert q8.weight_bytes() == fixed + head_int8 + cfg.num_layers * (sum(
        o * i + o * 2 for o, i in mats) + smooth)
    assert q4.weight_bytes() == fixed + head_int8 + cfg.num_layers * sum(
        o * i // 2 + (i // 32) * o * 2 * 2 for o, i in mats)


@pytest.mark.parametrize("quantization", [None, "int8", "w8a8", "int4"])
def test_planner_weight_bytes_are_the_engines(quantization):
    """``perf.weights.engine_weight_bytes`` is the engine's resident weight bytes to the
    byte, and the planner's int4 format uses the engine's group of 32 (so a layer's
    matrices in the planner's int4 are the engine's int4 matrices)."""
    from kvmap.perf import weights as plan_weights
    llm = make_tiny_llm(dtype="bf16", kv="bf16", quantization=quantization)
    cfg = llm.model_config
    assert plan_weights.engine_weight_bytes(cfg, quantization) == llm.weight_bytes()
    assert plan_weights.INT4_GROUP_SIZE == 32
    lin = Int4Linear(torch.randn(96, 128, dtype=torch.bfloat16))
    assert plan_weights.BYTE_RULES["int4"](96, 128) == lin.num_bytes
    with pytest.raises(ValueError, match="'fp4' is not one of"):
        plan_weights.engine_weight_bytes(cfg, "fp4")


@pytest.mark.parametrize("name, device, dims, fragment", [
    ("fp4", "cpu", (), "is not one of None, 'int8', 'w8a8', 'int4'"),
    ("int4", "meta", (), "no kernel on device 'meta'"),
    ("int4", "cpu", (64, 48), "does not divide in_features=48"),
])
def test_bad_quantization_is_named(name, device, dims, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        check_quantization(name, device, dims)


def test_bad_quantization_fails_before_loading():
    with pytest.raises(ValueError, match="quantization='int3'"):
        make_tiny_llm(quantization="int3")
