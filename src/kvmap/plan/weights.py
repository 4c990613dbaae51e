"""Bytes of a model's weights in each serving format, scales included.

Only the decoder's linear layers (q, k, v, o, gate, up, down and every expert's MLP) are
quantized; embeddings, the LM head, norms, biases and an MoE router stay bf16, as in
vLLM's fp8 / int8 / AWQ / GPTQ checkpoints. Per linear weight of ``out x in``:

    bf16   2 * out * in
    fp8    1 * out * in + 4                      one fp32 scale per tensor (vLLM fp8)
    int8   1 * out * in + 2 * out                one fp16 scale per output channel (W8A16)
    w8a8   as int8 (activations are quantized on the fly, nothing stored)
    int4   out * in / 2 + out * G * (2 + 1/2)    G = ceil(in / 128) groups per row, each with
                                                 an fp16 scale and a 4-bit zero point
                                                 (AWQ / GPTQ, group size 128)
"""
from __future__ import annotations

import math

from kvmap.model.shapes import weight_shapes
from kvmap.plan.catalogue import PlanModel

BF16_BYTES = 2
INT4_GROUP_SIZE = 128


def _bf16(out_features: int, in_features: int) -> float:
    return BF16_BYTES * out_features * in_features


def _fp8(out_features: int, in_features: int) -> float:
    return out_features * in_features + 4


def _int8(out_features: int, in_features: int) -> float:
    return out_features * in_features + 2 * out_features


def _int4(out_features: int, in_features: int) -> float:
    num_groups = math.ceil(in_features / INT4_GROUP_SIZE)
    return out_features * in_features / 2 + out_features * num_groups * 2.5


WEIGHT_FORMATS = {"bf16": _bf16, "fp8": _fp8, "int8": _int8, "w8a8": _int8, "int4": _int4}


def _is_quantized_linear(name: str, shape: tuple[int, ...]) -> bool:
    return name.startswith("model.layers.") and name.endswith("_proj.weight") and len(shape) == 2


def num_params(model: PlanModel) -> int:
    """Every parameter, all experts counted (embeddings once when tied)."""
    total = sum(math.prod(s) for s in weight_shapes(model.config).values())
    return total + _extra_expert_params(model)


def _extra_expert_params(model: PlanModel) -> int:
    """Parameters of the experts beyond the first, plus the router, over all layers."""
    if model.num_experts == 1:
        return 0
    c = model.config
    per_layer = (model.num_experts - 1) * 3 * c.hidden_size * c.intermediate_size
    return c.num_layers * (per_layer + c.hidden_size * model.num_experts)


def weight_bytes(model: PlanModel, fmt: str = "bf16") -> int:
    """Bytes of all weights in format ``fmt`` (``bf16 | fp8 | int8 | w8a8 | int4``), rounded up."""
    key = fmt.strip().lower()
    if key not in WEIGHT_FORMATS:
        raise ValueError(f"weights={fmt!r} is not one of {', '.join(WEIGHT_FORMATS)}")
    linear = WEIGHT_FORMATS[key]
    c = model.config
    total = 0.0
    for name, shape in weight_shapes(c).items():
        if _is_quantized_linear(name, shape):
            # An MoE layer holds num_experts copies of each MLP matrix.
            copies = model.num_experts if ".mlp." in name else 1
            total += copies * linear(*shape)
        else:
            total += BF16_BYTES * math.prod(shape)
    router_params = c.num_layers * c.hidden_size * model.num_experts if model.num_experts > 1 else 0
    return math.ceil(total + BF16_BYTES * router_params)
