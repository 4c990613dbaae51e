"""K and V of one layer in stacked buffers, encoded, written and read back together.

When a codec quantizes K and V alike (two plain :class:`SlotQuant` of one
configuration: int8 / int4 / int2 / fp8 with scale=max), each of its tensors is one
buffer with a leading axis of two, and the store's named tensors are its halves:

    pair.q  (2, num_blocks, bs, H, Ds) uint8      blocks["k.q"] = pair.q[0], ["v.q"] = [1]
    pair.r  (2, num_blocks, bs, Hp, G) fp16       blocks["k.r"], ["v.r"]   (and .z)

so the names, shapes and bytes of the store are those of two separate quantizers
(tiers, serde and byte counts see no difference), while a decode step runs every
operator of the encode, the write and the row read once per layer instead of once per
tensor: a decode step is mostly such small operators, and their count, not their
bytes, is what a quantized cache added to it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvmap.kv.codecs.base import LayerStore, ScaledRead
from kvmap.kv.codecs import native
from kvmap.kv.codecs.quant import FP8Grid, IntGrid, call_params, dequantize, on_grid, quantize
from kvmap.kv.codecs.quantizers import REDUCE_DIMS, SlotQuant, TensorQuant
from kvmap.kv.codecs.rows import HeadRows
from kvmap.kv.spec import KVGeometry

STATE_KEY = "pair"


@dataclass(frozen=True)
class Stacked:
    """One stacked tensor (2, num_blocks, bs, Hp, R) and the views that a step's write
    and row read index, made once (each view would be an operator of every step)."""

    full: torch.Tensor
    slots: torch.Tensor        # (2, num_slots, Hp, R)             the write's
    by_block: torch.Tensor     # (2 * num_blocks, bs * Hp * R)     HeadRows.gather_pair's
    by_row: torch.Tensor       # (2 * num_slots * Hp, R)

    @classmethod
    def of(cls, t: torch.Tensor) -> "Stacked":
        return cls(t, t.view(2, -1, *t.shape[3:]), t.view(2 * t.shape[1], -1),
                   t.view(-1, t.shape[-1]))

    def gather(self, rows: HeadRows) -> torch.Tensor:
        """(2, H, B*L, R): ``rows.gather`` of K's half and of V's, in one pass."""
        return rows.gather_pair(self.full, self.by_block, self.by_row)


@dataclass(frozen=True)
class PairBuffers:
    """One layer's stacked codes and range parameters; ``z`` None when symmetric."""

    q: Stacked
    r: Stacked
    z: Stacked | None


def pairs(qk: TensorQuant, qv: TensorQuant) -> bool:
    """Whether K's and V's quantizers can share stacked buffers: plain per-slot
    quantizers (no EMA, static or per-block state) of one configuration."""
    return (type(qk) is SlotQuant and type(qv) is SlotQuant and qk.grid == qv.grid
            and qk.symmetric == qv.symmetric and qk.granularity == qv.granularity
            and qk.group_size == qv.group_size)


def allocate_pair(store: LayerStore, qk: SlotQuant, qv: SlotQuant, num_blocks: int,
                  geom: KVGeometry, device) -> None:
    """Zeroed stacked buffers of K and V into ``store``: its ``blocks`` get the halves,
    named as ``qk.allocate`` then ``qv.allocate`` would name them, in that order."""
    bs, H, D = geom.block_size, geom.num_kv_heads, geom.head_dim
    q = torch.zeros((2, num_blocks, bs, H, qk.grid.stored_dim(D)), dtype=torch.uint8,
                    device=device)
    params = (2, num_blocks, bs, qk.param_heads(H), D // qk.group_len(D))
    r = torch.zeros(params, dtype=torch.float16, device=device)
    z = None if qk.symmetric else torch.zeros(params, dtype=torch.float16, device=device)
    for i, prefix in enumerate((qk.prefix, qv.prefix)):
        store.blocks[f"{prefix}.q"] = q[i]
        store.blocks[f"{prefix}.r"] = r[i]
        if z is not None:
            store.blocks[f"{prefix}.z"] = z[i]
    store.state[STATE_KEY] = PairBuffers(Stacked.of(q), Stacked.of(r),
                                         None if z is None else Stacked.of(z))


def buffers(store: LayerStore, prefix: str = "k") -> PairBuffers | None:
    """The store's stacked buffers, or None when it has none (its tensors were
    allocated apart, or it is a copy of a pool store's tensors sharing its state)."""
    pair = store.state.get(STATE_KEY)
    if pair is None or store.blocks.get(f"{prefix}.q") is None:
        return None
    return pair if store.blocks[f"{prefix}.q"]._base is pair.q.full else None


def write_pair(store: LayerStore, slot_ids: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               q: SlotQuant) -> bool:
    """Encode k and v (T, H, D) stacked (2, T, H, D) with quantizer ``q``'s arithmetic
    and write codes and parameters into the stacked buffers, one ``index_copy_`` each:
    the values ``SlotQuant.write`` of K then of V stores. False (nothing written) when
    the store has no stacked buffers."""
    pair = buffers(store, q.prefix)
    if pair is None or k.shape != v.shape:
        return False
    T, H, D = k.shape
    if _native(store, slot_ids, k, v, q, pair):
        return True
    x = torch.stack((k, v))
    x = x if x.dtype == torch.float32 else x.float()                     # (2, T, H, D)
    g = q.group_len(D)
    if g == D:             # one group per head: reduce the (2, T, H, D) tensor itself
        dims = tuple(d + 1 if d < 2 else 3 for d in REDUCE_DIMS[q.granularity] if d != 2)
        r, z = call_params(x, dims, q.symmetric)                          # (2, T|1, Hp, 1)
        codes = q.grid.encode(on_grid(x, r, z, q.grid))                  # (2, T, H, Ds)
    else:
        xv = x.view(2, T, H, -1, g)                                        # (2, T, H, G, g)
        r, z = call_params(xv, tuple(d + 1 for d in REDUCE_DIMS[q.granularity]), q.symmetric)
        codes = quantize(xv, r, z, q.grid)                                 # (2, T, H, Ds)
        r, z = r.squeeze(-1), (None if z is None else z.squeeze(-1))      # (2, T|1, Hp, G)
    pair.q.slots.index_copy_(1, slot_ids, codes)
    for p, dst in ((r, pair.r), (z, pair.z)):
        if p is not None:           # a call-wide range (2, 1, ...) expanded to the slots
            dst.slots.index_copy_(1, slot_ids, p if p.shape[1] == T else p.expand(2, T, -1, -1))
    return True


def _native(store: LayerStore, slot_ids: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            q: SlotQuant, pair: "PairBuffers") -> bool:
    """The encode and write as one native operator (``native.py``) when the ranges are
    per slot or per call (an integer or an fp8 grid, any granularity but channel); False:
    run eager."""
    fp8 = _FP8_CODES.get(q.grid.format) if isinstance(q.grid, FP8Grid) else 0
    span = _SPANS.get(q.granularity)
    if fp8 is None or span is None or k.device.type != "cpu":
        return False
    op = native.ops()
    if op is None:
        return False
    offset = q.grid.offset if isinstance(q.grid, IntGrid) else 0.0
    op.quant_write(k, v, slot_ids, pair.q.slots, pair.r.slots,
                   None if pair.z is None else pair.z.slots, q.grid.bits, q.symmetric,
                   q.group_len(k.shape[-1]), q.grid.amplitude, offset, fp8, span)
    return True


_FP8_CODES = {"e4m3": 1, "e5m2": 2}      # quant_write's fp8 argument (0: an integer grid)
# quant_write's span: a range per row / group (0), per head over the call (1), one over the
# call (2); channel ranges (per dimension over the call) run eager
_SPANS = {"token": 0, "group": 0, "head": 1, "tensor": 2}


def read_rows_pair(store: LayerStore, rows: HeadRows, q: SlotQuant, dtype: torch.dtype,
                   scaled: bool):
    """``read_rows`` (scaled=False: values (H, B*L, D) in ``dtype``) or
    ``read_rows_scaled`` (ScaledRead) of K and of V, each gathered and decoded once for
    both; None when the store has no stacked buffers."""
    pair = buffers(store, q.prefix)
    if pair is None:
        return None
    op = native.ops() if rows.table.device.type == "cpu" else None
    if op is not None:      # the three gathers in one operator (native.py)
        stacked = [pair.q.full, pair.r.full] + ([] if pair.z is None else [pair.z.full])
        codes, r, *z = op.pair_rows(stacked, rows.table, rows.num_heads)
        z = z[0] if z else None
    else:
        codes = pair.q.gather(rows)                                      # (2, H, B*L, Ds)
        r = pair.r.gather(rows)                                          # (2, H, B*L, G)
        z = None if pair.z is None else pair.z.gather(rows)
    if not scaled:
        x = dequantize(codes, r.unsqueeze(-1), None if z is None else z.unsqueeze(-1),
                       q.grid, dtype)
        return x.unbind(0)
    c, mult, shift = q.grid.codes(codes, dtype)                          # (2, H, B*L, D)
    c = c if c.dtype == dtype else c.to(dtype)   # exact: int8 and fp8 values fit dtype
    step = r.float().div_(q.grid.amplitude)
    bias = None if z is None else z.float()
    if shift:
        bias = step * shift if bias is None else bias.add_(step * shift)
    scale = step.mul_(mult) if mult != 1 else step
    ks, vs = scale.unbind(0)
    kb, vb = (None, None) if bias is None else bias.unbind(0)
    kc, vc = c.unbind(0)
    return ScaledRead(kc, ks, kb), ScaledRead(vc, vs, vb)
