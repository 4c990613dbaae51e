"""Decode attention of one layer as one native operator over the paged pool: each
(sequence, KV head) walks its block table, reads every visible key's row straight from
the pool -- plain K/V, or integer / fp8 codes decoded with their per-slot ranges -- and
computes scores, softmax and the weighted sum of values in fp32.

Why: the eager decode step gathers the batch's rows heads first (``index_select``),
dequantizes them (a quantized cache), then runs two small batched products, a mask and
a softmax; at batch 1 that is ~15 operators a layer, each a few microseconds of
dispatch and a bf16 ``bmm`` of a few thousand values costing ~30 us in oneDNN. Here
the whole of it is one operator, and a quantized cache's decode is the arithmetic of
its row read inside the loop, so a smaller code costs fewer bytes and no extra pass.

Arithmetic, stated so that tests can hold it (``tests/model/test_native_decode.py``):
every key and value row is decoded exactly as ``codec.read`` returns it in the compute
dtype (plain rows as stored; codes by ``quant.dequantize``'s fp32 steps -- code * step +
shift, step = r / amplitude, shift = step * -offset + z -- then rounded to the compute
dtype), the pre-scaled query is widened to fp32, and scores, softmax and the weighted
sum run in fp32 over the keys in order; the output is rounded once to the compute dtype.
The reference is therefore fp32 attention over ``codec.read``'s values; sums are taken
in 16 fixed lanes (the order does not depend on the instruction set).

Scope: decode rows without holes, paged-out fronts or attention statistics (a policy's
scores), plain codecs (any storage dtype: read as the compute dtype has it), and
stacked per-slot codecs (``kv.codecs.paired``: int8 / int4 / int2 / fp8 with
scale=max, any granularity but channel). Everything else, and
``AttentionMetadata.fused_reads=False``, runs the eager path.

Built on first use with the system's C++ compiler for the instruction set torch
dispatches to here (``torch.backends.cpu.get_cpu_capability``), cached under
``~/.cache/torch_extensions`` by that name; ``KVMAP_NATIVE=0`` or a failed build keeps
the eager path (a warning says why, once).
"""
from __future__ import annotations

import torch

from kvmap.kv.codecs import Codec, LayerStore
from kvmap.kv.codecs import paired
from kvmap.kv.codecs.none import PlainCodec
from kvmap.kv.codecs.quant import FP8Grid, IntGrid, _fp8_table
from kvmap.model.native_decode_kernel import SOURCE
from kvmap.native_build import ENABLED, ISA, ISA_FLAGS, NativeLibrary

LANES = 16                      # the kernel's vector width in fp32 values (kW)
LIBRARY = NativeLibrary(f"kvmap_attention_{ISA.lower()}", SOURCE, "kvmap_attn",
                        "native decode attention", ISA_FLAGS)


def ops():
    """``torch.ops.kvmap_attn`` built for this machine's instruction set, or None."""
    return LIBRARY.ops() if ENABLED else None


def decode(q: torch.Tensor, store: LayerStore, codec: Codec, table: torch.Tensor,
           lens: torch.Tensor, window: int | None, out: torch.Tensor) -> bool:
    """Attention of decode rows q (B, Hq, D), pre-scaled, over keys 0 .. lens[b]-1 of
    each row's blocks ``table`` (B, nb) (the last ``window`` of them for a sliding
    layer) into ``out`` (B, Hq * D). False (nothing written) when this codec, store or
    device has no native form here; the caller then runs eager."""
    if q.device.type != "cpu":
        return False
    form = _form(store, codec, q.dtype)
    if form is None or not _lanes_fit(form, q.shape[-1]):
        return False
    op = ops()
    if op is None:
        return False
    w = 0 if window is None else int(window)
    if form[0] == "plain":
        op.decode_plain(q, store.blocks["k"], store.blocks["v"], table, lens, w, out)
    else:
        _, pair, quant = form
        grid = quant.grid
        lut = _fp8_table(grid.dtype, torch.float32) if isinstance(grid, FP8Grid) else None
        offset = grid.offset if isinstance(grid, IntGrid) else 0.0
        op.decode_codes(q, pair.q.full, pair.r.full, None if pair.z is None else pair.z.full,
                        lut, table, lens, w, grid.bits, grid.amplitude, offset, out)
    return True


def _lanes_fit(form, head_dim: int) -> bool:
    """Whether rows split into the kernel's 16 lanes: the head, each range group and
    each bit plane of codes a whole number of 16 values."""
    if head_dim % LANES:
        return False
    if form[0] == "plain":
        return True
    _, pair, _ = form
    groups = pair.r.full.shape[-1]
    return pair.q.full.shape[-1] % LANES == 0 and (head_dim // groups) % LANES == 0


def _form(store: LayerStore, codec: Codec, dtype: torch.dtype):
    """("plain",) for K/V stored as floats (read as ``codec.read`` casts them to the
    compute dtype); ("codes", buffers, quantizer) for stacked per-slot codes; None
    otherwise."""
    if store.state.get("compute_dtype") != dtype:
        return None
    if isinstance(codec, PlainCodec):
        return ("plain",)
    quant = getattr(codec, "quant", None)
    if not quant or not paired.pairs(quant["k"], quant["v"]):
        return None
    qk = quant["k"]            # a plain per-slot quantizer: ranges per slot, any granularity
    if not isinstance(qk.grid, (IntGrid, FP8Grid)):
        return None
    pair = paired.buffers(store, qk.prefix)
    return None if pair is None else ("codes", pair, qk)
