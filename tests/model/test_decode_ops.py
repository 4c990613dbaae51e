"""Operators one decode step launches with every registered KV codec, at both compute
dtypes, on the tiny random model (2 layers), counted as the pre-launch checklist counts
them (``kvmap.bench.probes.decode_ops``: outermost ``aten::`` calls of a step).

The checklist's target is <= 1.2x the compute dtype's own cache. What a codec adds is
per layer (its encode in ``codec.write`` and its read in decode attention), so the ratio
grows with the layer count: on the tiny model int8 is 1.63x, on SmolLM2's 30 layers
2.29x. The quantized reads *are* the fused ones at both dtypes (codes with folded scales,
``quant_attention.FoldedKV``; the row read, ``DecodedKV``); in eager mode they launch
more operators than dequantizing through ``codec.read`` (int8: 327 against 289 a step),
and are chosen for their bytes, not their operator count (docs/hardware.md). The
caps below are the counts at this commit: a change that adds operators to a codec's
path fails here and must say why; one that removes some lowers its cap.
"""
from __future__ import annotations

import pytest

from kvmap import LLM
from kvmap.bench.probes import decode_ops
from kvmap.kv.codecs import CODECS

PLAIN = ("fp32", "bf16", "fp16")
# operators a codec adds per layer and decode step (encode + read), counted at this commit
ADDED_OPS_PER_LAYER_CAP = {"int8": 63, "fp8": 66, "int4": 118, "int2": 132, "kivi": 323}


def _ops_per_step(dtype: str, kv: str) -> tuple[float, int]:
    llm = LLM(model="dummy:tiny", dtype=dtype, kv=kv, num_blocks=256, block_size=4,
              max_num_batched_tokens=64, device="cpu")
    return decode_ops(llm)["num_ops_per_step"], llm.engine.model.config.num_layers


def test_every_registered_codec_has_a_cap():
    assert set(CODECS) == set(PLAIN) | set(ADDED_OPS_PER_LAYER_CAP)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_operators_per_decode_step_for_every_codec(dtype):
    base, num_layers = _ops_per_step(dtype, dtype)
    added = {}
    for kv in CODECS:
        ops, _ = _ops_per_step(dtype, kv)
        added[kv] = (ops - base) / num_layers
    for kv in PLAIN:                 # an unquantized cache of any dtype: a plain copy
        assert added[kv] == 0, (kv, added)
    for kv, cap in ADDED_OPS_PER_LAYER_CAP.items():
        assert 0 < added[kv] <= cap, (kv, added[kv], cap)
