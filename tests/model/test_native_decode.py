"""The native decode attention (``kvmap.model.native_decode``) against its stated
arithmetic: fp32 attention over ``codec.read``'s values (what the cache holds, in the
compute dtype), here computed in float64 one row at a time.

Bound: the kernel's only roundings are fp32 sums and exps (relative error ~1e-6) and
the one cast of the output to the compute dtype, so every output value is within
2^-8 of the reference relative to the row's largest value at bf16 (half an ulp is
2^-9 of the value itself) and within 1e-5 at fp32. The eager path (bf16 scores and
probabilities) is looser; its own bound is ``test_quant_attention.py``'s.
"""
from __future__ import annotations

import os

import pytest
import torch

from kvmap.kv.codecs import CODECS
from kvmap.kv.grammar import parse
from kvmap.kv.spec import KVGeometry
from kvmap.model import native_decode
from kvmap.model.attention import AttentionMetadata, paged_attention

GEOM = KVGeometry(num_layers=1, num_kv_heads=2, head_dim=64, block_size=8)
HQ = 6
TABLES = [[5, 2, 7], [0, 3], [9, 1, 4]]
LENS = [21, 16, 24]            # tokens after this step's write (the last is the new one)
NATIVE_SPECS = ["bf16", "fp32", "fp16", "int8", "int8(symmetric=false)", "int8(granularity=group)",
                "int8(granularity=head)",
                "fp8", "fp8(format=e5m2)", "int4", "int4(symmetric=true)", "int2"]

pytestmark = pytest.mark.skipif(native_decode.ops() is None,
                                reason=f"the native decode does not build here: "
                                       f"{native_decode.LIBRARY.broken}")


def _codec(spec: str):
    part = parse(spec)[0]
    return CODECS[part.name](**part.args)


def _step(codec, dtype, window=None, tables=TABLES, lens=LENS):
    """One decode step of B rows: (output (B, HQ*D), q, the store after the step, meta)."""
    g = torch.Generator().manual_seed(1)
    H, D, bs = GEOM.num_kv_heads, GEOM.head_dim, GEOM.block_size
    store = codec.allocate(10, GEOM, "cpu", dtype, layer_id=0)
    for t, n in zip(tables, lens):
        slots = torch.tensor([t[i // bs] * bs + i % bs for i in range(n - 1)])
        x = torch.randn(len(slots), H, D, generator=g) * 2
        codec.write(store, slots, x.to(dtype), (x.flip(0) + 0.5).to(dtype))
    new_slots = torch.tensor([t[(n - 1) // bs] * bs + (n - 1) % bs for t, n in zip(tables, lens)])
    q = torch.randn(len(tables), HQ, D, generator=g).to(dtype)
    k, v = (torch.randn(len(tables), H, D, generator=g).to(dtype) for _ in range(2))
    meta = AttentionMetadata.build(new_slots, tables, lens, [], bs, "cpu", dtype, window)
    return paged_attention(q, k, v, store, codec, meta, H), q, store


def _reference(codec, store, q, window=None, tables=TABLES, lens=LENS) -> torch.Tensor:
    """float64 attention of each row over ``codec.read`` of its blocks: keys n-W .. n-1."""
    H, D = GEOM.num_kv_heads, GEOM.head_dim
    outs = []
    for b, (table, n) in enumerate(zip(tables, lens)):
        lo = 0 if window is None else max(0, n - window)
        k, v = codec.read(store, torch.tensor(table))
        k = k.reshape(-1, H, D)[lo:n].double().transpose(0, 1)             # (H, n, D)
        v = v.reshape(-1, H, D)[lo:n].double().transpose(0, 1)
        qs = (q[b] * D ** -0.5).to(q.dtype)        # the pre-scaled query, as attention has it
        probs = torch.softmax(qs.double().view(H, HQ // H, D) @ k.transpose(1, 2), -1)
        outs.append((probs @ v).reshape(-1))
    return torch.stack(outs)


def _within_bound(out: torch.Tensor, ref: torch.Tensor, dtype) -> None:
    tol = 1e-5 if dtype == torch.float32 else 2 ** -8
    err = (out.double() - ref).abs().amax(-1) / ref.abs().amax(-1)
    assert err.max().item() < tol, err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("spec", NATIVE_SPECS)
def test_native_decode_equals_fp32_attention_over_the_read(spec, dtype, monkeypatch):
    calls = []
    real = native_decode.decode
    monkeypatch.setattr(native_decode, "decode",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    codec = _codec(spec)
    out, q, store = _step(codec, dtype)
    assert calls and native_decode._form(store, codec, dtype) is not None
    assert out.dtype == dtype
    _within_bound(out, _reference(codec, store, q), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("spec", ["bf16", "int4"])
def test_a_sliding_layer_reads_only_its_window(spec, dtype):
    out, q, store = _step(_codec(spec), dtype, window=10)
    _within_bound(out, _reference(_codec(spec), store, q, window=10), dtype)
    assert (out.double() - _reference(_codec(spec), store, q)).abs().max() > 1e-3


@pytest.mark.parametrize("spec", ["bf16", "int8", "int4"])
def test_native_and_eager_give_close_outputs(spec, monkeypatch):
    """The eager path's bf16 roundings are the only difference: both near the reference."""
    native, q, store = _step(_codec(spec), torch.bfloat16)
    monkeypatch.setattr(native_decode, "ENABLED", False)
    eager, _, _ = _step(_codec(spec), torch.bfloat16)
    assert not torch.equal(native, eager)          # the paths did differ
    assert ((native.float() - eager.float()).norm() / eager.float().norm()) < 0.02


def test_forms_left_to_eager():
    """Codecs and stores the kernel does not read natively run eager (form None), and so
    do rows that do not split into its lanes (a 16-value head of int4 codes: 8 bytes)."""
    for spec, dtype in [("int8(granularity=channel)", torch.float32),
                        ("kivi", torch.float32), ("int8(scale=ema)", torch.float32)]:
        codec = _codec(spec)
        store = codec.allocate(4, GEOM, "cpu", dtype, layer_id=0)
        assert native_decode._form(store, codec, dtype) is None, spec
    small = KVGeometry(num_layers=1, num_kv_heads=2, head_dim=16, block_size=8)
    codec = _codec("int4")
    form = native_decode._form(codec.allocate(4, small, "cpu", torch.float32, 0), codec,
                               torch.float32)
    assert form is not None and not native_decode._lanes_fit(form, 16)
    assert native_decode._lanes_fit(("plain",), 16)


def test_a_row_longer_than_its_table_is_refused():
    codec = _codec("bf16")
    store = codec.allocate(10, GEOM, "cpu", torch.bfloat16, layer_id=0)
    q = torch.zeros(1, HQ, GEOM.head_dim, dtype=torch.bfloat16)
    out = torch.empty(1, HQ * GEOM.head_dim, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="row 0 has 17 keys, its table 16 slots"):
        native_decode.decode(q, store, codec, torch.tensor([[1, 2]]), torch.tensor([17]),
                             None, out)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: no team to see")
def test_the_operators_run_on_torchs_whole_team():
    """at::parallel_for is a header template: a library built without OpenMP runs it on the
    caller alone, silently (the decode attention ran serially so until 2026-12-06). The
    test sets the team itself (a pytest-xdist worker runs with one thread)."""
    n = torch.get_num_threads()
    try:
        for size in (2, 1):
            torch.set_num_threads(size)
            assert native_decode.ops().team_size() == size
    finally:
        torch.set_num_threads(n)
