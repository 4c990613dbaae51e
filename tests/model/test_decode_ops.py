"""Operators one decode step launches with every registered KV codec, at both compute
dtypes, on random weights of the embedded model's shape cut to 2 layers (head size 64,
so every codec's rows fit the native decode's lanes), counted as the pre-launch
checklist counts them (``kvmap.bench.probes.decode_ops``: outermost ``aten::`` and ``kvmap::`` calls of a
step).

The checklist's target is <= 1.2x the compute dtype's own cache. What a codec adds is
per layer (its encode in ``codec.write`` and its read in decode attention), so the ratio
grows with the layer count. A paired integer codec (int8 / int4 / int2 with per-slot
ranges, ``kvmap.kv.codecs.paired``) encodes and writes K and V in one native operator
(``kvmap.kv.codecs.native``) and reads both in one stacked gather; without a compiler
(or ``KVMAP_NATIVE=0``) the same stacked encode runs eager; fp8 with per-slot or per-call
ranges (any granularity but channel) writes natively too. Decode attention of every
plain and stacked codec is one native operator too (``kvmap.model.native_decode``), so
a codec adds only what its write adds; eager, the gathers and products return. Both are
counted: the caps
below are the counts at this commit, native and eager; a change that adds operators to
a codec's path fails here and must say why, one that removes some lowers its cap.
"""
from __future__ import annotations

import pytest

from kvmap import LLM
from kvmap.bench.probes import decode_ops
from kvmap.kv.codecs import CODECS, native
from kvmap.model import native_decode

PLAIN = ("fp32", "bf16", "fp16")
# operators a codec adds per layer and decode step (encode + read), the larger of the
# fp32 and bf16 counts at this commit; a paired integer codec launches fewer than the plain
# cache (the write is one operator where the plain cache runs a cast and a copy per tensor)
ADDED_OPS_PER_LAYER_CAP = {
    "native": {"int8": -5, "int4": -5, "int2": -5, "fp8": -5, "kivi": 366},
    "eager": {"int8": 26, "int4": 61, "int2": 71, "fp8": 27, "kivi": 335},
}
OPS_TARGET = 1.2
MODEL = "dummy:smollm2-135m?layers=2&vocab=256"
MEETS_TARGET_NATIVE = ("int8", "int4", "int2", "fp8")   # on this 2-layer model


def _ops_per_step(dtype: str, kv: str) -> tuple[float, int]:
    llm = LLM(model=MODEL, dtype=dtype, kv=kv, num_blocks=256, block_size=4,
              max_num_batched_tokens=64, device="cpu")
    return decode_ops(llm)["num_ops_per_step"], llm.engine.model.config.num_layers


def test_every_registered_codec_has_a_cap():
    for caps in ADDED_OPS_PER_LAYER_CAP.values():
        assert set(CODECS) == set(PLAIN) | set(caps)


@pytest.mark.parametrize("mode", ["native", "eager"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_operators_per_decode_step_for_every_codec(dtype, mode, monkeypatch):
    if mode == "native" and native.ops() is None:
        pytest.skip(f"the native encode does not build here: {native.LIBRARY.broken}")
    monkeypatch.setattr(native, "ENABLED", mode == "native")
    monkeypatch.setattr(native_decode, "ENABLED", mode == "native")
    base, num_layers = _ops_per_step(dtype, dtype)
    added, ratio = {}, {}
    for kv in CODECS:
        ops, _ = _ops_per_step(dtype, kv)
        added[kv], ratio[kv] = (ops - base) / num_layers, ops / base
    for kv in PLAIN:                 # an unquantized cache of any dtype: a plain copy
        assert added[kv] == 0, (kv, added)
    for kv, cap in ADDED_OPS_PER_LAYER_CAP[mode].items():
        assert added[kv] <= cap, (kv, added[kv], cap)
    if mode == "native":
        for kv in MEETS_TARGET_NATIVE:
            assert ratio[kv] <= OPS_TARGET, (kv, ratio[kv])
