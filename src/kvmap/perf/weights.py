"""Bytes of a model's weights in each serving format, scales included.

Only the decoder's linear layers (q, k, v, o, gate, up, down and every expert's MLP) are
quantized; embeddings, the LM head, norms, biases and an MoE router stay bf16, as in
vLLM's fp8 / int8 / AWQ / GPTQ checkpoints. Per linear weight of ``out x in``:

    fp32   4 * out * in                          (a CPU without native bf16 computes in
                                                 fp32: every tensor is fp32 there)
    bf16   2 * out * in
    fp8    1 * out * in + 4                      one fp32 scale per tensor (vLLM fp8)
    int8   1 * out * in + 2 * out                one fp16 scale per output channel (W8A16)
    w8a8   as int8 (activations are quantized on the fly, nothing stored)
    int4   out * in / 2 + out * G * 4            G = ceil(in / 32) groups per row, each with
                                                 a bf16 scale and a bf16 zero (the engine's
                                                 int4, ``model/wquant.py``; GGUF Q4_1 also
                                                 has blocks of 32 with a scale and a min)

:func:`engine_weight_bytes` is what kvmap's own engine holds for ``LLM(quantization=...)``
(``LlamaModel.weight_bytes``), to the byte: there the norms are folded into the
matrices (one fp32 final norm stays), the output head is int8 per channel under every
quantized format, w8a8 keeps fp32 weight scales and its down matrix in W8A16, and
int8 and w8a8 keep SmoothQuant's 1 / s of q|k|v and gate|up.
"""
from __future__ import annotations

import math

from kvmap.model.shapes import weight_shapes

BF16_BYTES = 2
INT4_GROUP_SIZE = 32           # the engine's group (model/wquant.py)


def _bf16(out_features: int, in_features: int) -> float:
    return BF16_BYTES * out_features * in_features


def _fp8(out_features: int, in_features: int) -> float:
    return out_features * in_features + 4


def _int8(out_features: int, in_features: int) -> float:
    return out_features * in_features + 2 * out_features


def _int4(out_features: int, in_features: int) -> float:
    num_groups = math.ceil(in_features / INT4_GROUP_SIZE)
    return out_features * in_features / 2 + out_features * num_groups * 2 * BF16_BYTES


def _mxfp4(out_features: int, in_features: int) -> float:
    # OCP microscaling: 4-bit e2m1 values, one e8m0 scale byte per 32 (GPT-OSS's experts)
    return out_features * in_features / 2 + out_features * math.ceil(in_features / 32)


def _fp32(out_features: int, in_features: int) -> float:
    return 4 * out_features * in_features


# a serving format -> bytes of one linear weight of (out, in), scales included
BYTE_RULES = {"fp32": _fp32, "bf16": _bf16, "fp8": _fp8, "int8": _int8, "w8a8": _int8,
              "int4": _int4, "mxfp4": _mxfp4}


def _is_quantized_linear(name: str, shape: tuple[int, ...]) -> bool:
    return name.startswith("model.layers.") and name.endswith("_proj.weight") and len(shape) == 2


def num_params(model) -> int:
    """Every parameter, all experts counted (embeddings once when tied)."""
    if model.linear_params is not None:
        return model.linear_params + model.other_params
    total = sum(math.prod(s) for s in weight_shapes(model.config).values())
    return total + _extra_expert_params(model)


def _extra_expert_params(model) -> int:
    """Parameters of the experts beyond the first, plus the router, over all layers."""
    if model.num_experts == 1:
        return 0
    c = model.config
    per_layer = (model.num_experts - 1) * 3 * c.hidden_size * c.intermediate_size
    return c.num_layers * (per_layer + c.hidden_size * model.num_experts)


def weight_bytes(model, fmt: str = "bf16") -> int:
    """Bytes of all weights in format ``fmt`` (``fp32 | bf16 | fp8 | int8 | w8a8 | int4 |
    mxfp4``), rounded up. A model of :mod:`kvmap.plan.hf_families` is counted from its
    parameter totals, its matrices at the format's bytes per weight for rows of
    ``hidden_size`` inputs."""
    key = fmt.strip().lower()
    if key not in BYTE_RULES:
        raise ValueError(f"weights={fmt!r} is not one of {', '.join(BYTE_RULES)}")
    linear = BYTE_RULES[key]
    other_bytes = 4 if key == "fp32" else BF16_BYTES     # embeddings, norms, head, router
    c = model.config
    if model.linear_params is not None:     # a family counted from its own config: its
        h = c.hidden_size                   # matrices at the format's bytes per weight
        return math.ceil(model.linear_params * linear(1, h) / h
                         + other_bytes * model.other_params)
    total = 0.0
    for name, shape in weight_shapes(c).items():
        if _is_quantized_linear(name, shape):
            # An MoE layer holds num_experts copies of each MLP matrix.
            copies = model.num_experts if ".mlp." in name else 1
            total += copies * linear(*shape)
        else:
            total += other_bytes * math.prod(shape)
    router_params = c.num_layers * c.hidden_size * model.num_experts if model.num_experts > 1 else 0
    return math.ceil(total + other_bytes * router_params)


# ``LLM(quantization=...)`` (``kvmap.model.wquant.WEIGHT_FORMATS``, None: dense) -> bytes
# of one (out, in) matrix as the engine holds it, with ``compute_bytes`` a value (a test
# holds that every registered format has a rule)
ENGINE_RULES = {None: lambda o, i, cb: o * i * cb,
                "int8": lambda o, i, cb: o * i + o * cb,
                "w8a8": lambda o, i, cb: o * i + o * 4,
                "int4": lambda o, i, cb: o * i // 2 + (i // INT4_GROUP_SIZE) * o * 2 * cb}


def streamed_weight_bytes(config, quantization: str | None = None,
                          compute_bytes: int = BF16_BYTES) -> int:
    """Bytes a decode step reads: the engine's weights (``engine_weight_bytes``) less an
    embedding that is only looked up (one not shared with the output head)."""
    looked_up = config.vocab_size * config.hidden_size * compute_bytes
    shared = config.tie_word_embeddings and not quantization
    return engine_weight_bytes(config, quantization, compute_bytes) - (0 if shared else looked_up)


def engine_weight_bytes(config, quantization: str | None = None,
                        compute_bytes: int = BF16_BYTES, int4_from_gguf: bool = False) -> int:
    """Bytes of the weights kvmap's engine holds for ``LLM(quantization=...)`` with a
    compute dtype of ``compute_bytes`` a value: equal to ``LlamaModel.weight_bytes``.
    The four matrices of a layer in the format, the embedding in the compute dtype, one
    fp32 final norm, the head int8 per channel (scale in the compute dtype) when
    quantized, else shared with a tied embedding; int8 and w8a8 as ``model/smoothquant.py``
    runs them (the smoothing 1 / s of q|k|v and gate|up; w8a8's down in W8A16). ``int4_from_gguf``: int4 matrices
    read from a GGUF's Q4 blocks keep each layer's two RMSNorm weights (compute dtype)
    beside them, unfolded."""
    per_format = {q: (lambda o, i, rule=rule: rule(o, i, compute_bytes))
                  for q, rule in ENGINE_RULES.items()}
    if quantization not in per_format:
        raise ValueError(f"quantization={quantization!r} is not one of "
                         f"{', '.join(map(repr, per_format))}")
    c = config
    h, d, V = c.hidden_size, c.head_dim, c.vocab_size
    qkv = (c.num_heads + 2 * c.num_kv_heads) * d
    mats = [(qkv, h), (h, c.num_heads * d), (2 * c.intermediate_size, h),
            (h, c.intermediate_size)]
    layer = sum(per_format[quantization](o, i) for o, i in mats)
    if quantization == "w8a8":     # down is W8A16; q|k|v, gate|up keep 1/s (fp32, in,)
        o, i = mats[3]
        layer += per_format["int8"](o, i) - per_format["w8a8"](o, i) + 2 * h * 4
    elif quantization == "int8":   # q|k|v, gate|up keep 1/s (compute dtype, in,)
        layer += 2 * h * compute_bytes
    layer += qkv * compute_bytes if c.attention_bias else 0
    layer += 2 * h * compute_bytes if int4_from_gguf and quantization == "int4" else 0
    if quantization:
        head = V * h + V * compute_bytes
    else:
        head = 0 if c.tie_word_embeddings else V * h * compute_bytes
    return V * h * compute_bytes + h * 4 + head + c.num_layers * layer
