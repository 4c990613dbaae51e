"""Decode attention on codes (``paged_attention`` through ``quant_attention``, the eager
path: the native operator is switched off here, ``test_native_decode.py`` holds it) against
``codec.read`` of the same blocks followed by reference attention in float64.

Bound: in fp32 the paths are the same algebra in another order (relative error below
1e-5); in bf16 the operands and products round at different places, so the error of
the codes path may be at most twice that of attention over the dequantized bf16 blocks
(``fused_reads=False``) plus 2^-8, and below 2% in absolute terms.
"""
from __future__ import annotations

import pytest
import torch

from kvmap.kv.codecs import CODECS
from kvmap.kv.grammar import parse
from kvmap.kv.spec import KVGeometry
from kvmap.model import native_decode
from kvmap.model import quant_attention as qa
from kvmap.model.attention import AttentionMetadata, paged_attention

GEOM = KVGeometry(num_layers=1, num_kv_heads=2, head_dim=64, block_size=8)
HQ = 6
TABLES = [[5, 2, 7], [0, 3], [9, 1, 4]]
LENS = [21, 16, 24]            # tokens after this step's write (the last is the new one)


def _codec(spec: str):
    part = parse(spec)[0]
    return CODECS[part.name](**part.args)


def _attend(codec, dtype, fused: bool, monkeypatch):
    """(output (B, HQ*D), the store after the step) for one decode step of B rows."""
    monkeypatch.setattr(native_decode, "ENABLED", False)
    g = torch.Generator().manual_seed(1)
    H, D, bs = GEOM.num_kv_heads, GEOM.head_dim, GEOM.block_size
    store = codec.allocate(10, GEOM, "cpu", dtype, layer_id=0)
    past = [torch.tensor([t[i // bs] * bs + i % bs for i in range(n - 1)])
            for t, n in zip(TABLES, LENS)]
    for slots in past:
        x = torch.randn(len(slots), H, D, generator=g) * 2
        codec.write(store, slots, x.to(dtype), (x.flip(0) + 0.5).to(dtype))
    new_slots = torch.tensor([t[(n - 1) // bs] * bs + (n - 1) % bs
                              for t, n in zip(TABLES, LENS)])
    B = len(TABLES)
    q = torch.randn(B, HQ, D, generator=g).to(dtype)
    k, v = (torch.randn(B, H, D, generator=g).to(dtype) for _ in range(2))
    meta = AttentionMetadata.build(new_slots, TABLES, LENS, [], bs, "cpu", dtype)
    meta.fused_reads = fused
    return paged_attention(q, k, v, store, codec, meta, H), q, store


def _reference(codec, store, q) -> torch.Tensor:
    """float64 attention over ``codec.read`` of each row's blocks, its first LENS keys."""
    H, D = GEOM.num_kv_heads, GEOM.head_dim
    outs = []
    for b, (table, n) in enumerate(zip(TABLES, LENS)):
        k, v = codec.read(store, torch.tensor(table))
        k = k.reshape(-1, H, D)[:n].double().transpose(0, 1)             # (H, n, D)
        v = v.reshape(-1, H, D)[:n].double().transpose(0, 1)
        qb = q[b].double().view(H, HQ // H, D) * D ** -0.5
        probs = torch.softmax(qb @ k.transpose(1, 2), -1)
        outs.append((probs @ v).reshape(-1))
    return torch.stack(outs)


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("spec", ["int8", "int8(symmetric=false)", "int8(granularity=head)",
                                  "fp8", "int4", "int4(symmetric=true)", "int2"])
def test_codes_attention_matches_read_then_reference(spec, dtype, monkeypatch):
    codec = _codec(spec)
    out, q, store = _attend(codec, dtype, True, monkeypatch)
    ref = _reference(codec, store, q)
    assert out.dtype == dtype and out.shape == ref.shape
    if dtype == torch.float32:
        assert _rel(out, ref) < 1e-5
        return
    dequant, _, _ = _attend(codec, dtype, False, monkeypatch)
    assert _rel(out, ref) <= 2 * _rel(dequant, ref) + 2 ** -8
    assert _rel(out, ref) < 0.02


def test_per_token_map_is_refused_by_the_channel_operand():
    """A per-slot map read from blocks is SlotOperand's; ScaledOperand names it."""
    codec = _codec("int8")
    store = codec.allocate(4, GEOM, "cpu", torch.float32, layer_id=0)
    read = codec.read_scaled(store, torch.tensor([0, 1]))[0]
    with pytest.raises(ValueError, match="per-token map"):
        qa.ScaledOperand(read, 1, GEOM.num_kv_heads, torch.float32)
