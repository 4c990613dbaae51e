"""Quantizers of one KV tensor (K or V) in paged blocks; a codec holds one for each.

A quantizer stores codes per slot and decides where the (r, z) parameters of
:mod:`kvmap.kv.codecs.quant` live. Values of one token are viewed as groups:

    x (T, H, D)  ->  xv (T, H, G, g)      g = values per group along head_dim, G = D / g

    granularity  g           params shared over     reduce dims of xv
    token        D           one token, one head    (3,)
    group        group_size  one token, g channels  (3,)
    head         D           the write call         (0, 3)
    tensor       D           the write call, heads  (0, 1, 2, 3)
    channel      1           tokens (block / file)  (0, 3)

Subclasses differ in one place each: :class:`SlotQuant` stores the parameters of each
written slot next to its codes (computed from the call, or :class:`EmaQuant`'s moving
average), :class:`StaticQuant` keeps calibrated parameters per layer in ``store.state``.
Per-channel dynamic scales live per block: see :mod:`kvmap.kv.codecs.block_quant`.
"""
from __future__ import annotations

import math

import torch

from kvmap.kv.codecs.base import LayerStore, ScaledRead, gather_blocks
from kvmap.kv.codecs.rows import HeadRows
from kvmap.kv.codecs.quant import Grid, dequantize, minmax, quantize, range_params
from kvmap.kv.spec import KVGeometry

DEFAULT_GROUP_SIZE = 32     # granularity=group without group_size: gcd(32, head_dim)
REDUCE_DIMS = {"token": (3,), "group": (3,), "head": (0, 3), "tensor": (0, 1, 2, 3),
               "channel": (0, 3)}


def flat_slots(t: torch.Tensor) -> torch.Tensor:
    """(num_blocks, block_size, ...) viewed as (num_slots, ...); slot = block*bs + offset."""
    return t.view(-1, *t.shape[2:])


class TensorQuant:
    """Codes of one tensor: ``{prefix}.q`` (num_blocks, bs, H, D * bits / 8) uint8.

    ``write`` mutates ``store`` only; ``read`` returns (N, bs, H, D) in ``dtype``.
    """

    def __init__(self, prefix: str, grid: Grid, symmetric: bool, granularity: str,
                 group_size: int | None = None):
        self.prefix, self.grid, self.symmetric = prefix, grid, symmetric
        self.granularity, self.group_size = granularity, group_size

    def group_len(self, head_dim: int) -> int:
        """g: values per (r, z) along head_dim."""
        if self.granularity == "group":
            return self.group_size or math.gcd(DEFAULT_GROUP_SIZE, head_dim)
        return 1 if self.granularity == "channel" else head_dim

    def param_heads(self, num_kv_heads: int) -> int:
        return 1 if self.granularity == "tensor" else num_kv_heads

    def allocate(self, num_blocks: int, geom: KVGeometry, device, dtype: torch.dtype,
                 store: LayerStore) -> None:
        shape = (num_blocks, geom.block_size, geom.num_kv_heads,
                 self.grid.stored_dim(geom.head_dim))
        store.blocks[f"{self.prefix}.q"] = torch.zeros(shape, dtype=torch.uint8, device=device)

    def write(self, store: LayerStore, slot_ids: torch.Tensor, x: torch.Tensor) -> None:
        T, H, D = x.shape
        xv = x.float().view(T, H, -1, self.group_len(D))             # (T, H, G, g)
        r, z = self.write_params(store, slot_ids, xv)                 # (T|1, Hp, G, 1)
        q = quantize(xv, r, z, self.grid)                             # (T, H, Ds)
        flat_slots(store.blocks[f"{self.prefix}.q"]).index_copy_(0, slot_ids, q)

    def read(self, store: LayerStore, block_ids: torch.Tensor, dtype: torch.dtype
             ) -> torch.Tensor:
        q = gather_blocks(store.blocks[f"{self.prefix}.q"], block_ids)   # (N, bs, H, Ds)
        r, z = self.read_params(store, block_ids)                          # (N|1, bs|1, Hp, G, 1)
        return dequantize(q, r, z, self.grid, dtype)

    def read_scaled(self, store: LayerStore, block_ids: torch.Tensor, dtype: torch.dtype
                    ) -> ScaledRead | None:
        """The codes of ``block_ids`` and x = y * scale + bias per group (ScaledRead):
        the grid's y = c * mult + shift, so scale = mult * r / amplitude and
        bias = z + shift * r / amplitude."""
        q = gather_blocks(store.blocks[f"{self.prefix}.q"], block_ids)   # (N, bs, H, Ds)
        return self._scaled(q, *self.read_params(store, block_ids), dtype)

    def _scaled(self, q: torch.Tensor, r: torch.Tensor, z: torch.Tensor | None,
                dtype: torch.dtype) -> ScaledRead:
        """Gathered codes q (..., Ds) and their (r, z) (..., G, 1) -> ScaledRead."""
        c, mult, shift = self.grid.codes(q, dtype)                         # (..., D)
        step = r.squeeze(-1).float() / self.grid.amplitude
        bias = None if z is None else z.squeeze(-1).float()
        if shift:
            bias = step * shift if bias is None else bias + step * shift
        return ScaledRead(c, step * mult if mult != 1 else step, bias)

    def read_rows(self, store: LayerStore, rows: HeadRows, dtype: torch.dtype
                  ) -> torch.Tensor | None:
        """The slots of ``rows`` heads first, (H, B*L, D) in ``dtype``: the arithmetic
        of ``read``, so the same values; None when the parameters do not live per slot
        or per layer (``row_params``)."""
        params = self.row_params(store, rows)
        if params is None:
            return None
        q = rows.gather(store.blocks[f"{self.prefix}.q"])                 # (H, B*L, Ds)
        return dequantize(q, *params, self.grid, dtype)

    def read_rows_scaled(self, store: LayerStore, rows: HeadRows, dtype: torch.dtype
                         ) -> ScaledRead | None:
        """``read_scaled`` of the slots of ``rows``, heads first: y (H, B*L, D) and the
        map (H, B*L, G) per slot, or (Hp, 1, G) per layer; None as for ``read_rows``."""
        params = self.row_params(store, rows)
        if params is None:
            return None
        q = rows.gather(store.blocks[f"{self.prefix}.q"])                 # (H, B*L, Ds)
        return self._scaled(q, *params, dtype)

    # ---- where the parameters live: one override each ---------------------------------
    def write_params(self, store, slot_ids, xv):
        raise NotImplementedError

    def read_params(self, store, block_ids):
        raise NotImplementedError

    def row_params(self, store, rows: HeadRows):
        """(r, z) broadcastable to (H, B*L, G, 1), or None (no row form)."""
        return None


class SlotQuant(TensorQuant):
    """Parameters per written slot: ``{prefix}.r`` / ``.z`` (num_blocks, bs, Hp, G) fp16.
    A call-wide scale (head, tensor) is replicated into each slot it was used for."""

    def allocate(self, num_blocks, geom, device, dtype, store) -> None:
        super().allocate(num_blocks, geom, device, dtype, store)
        shape = (num_blocks, geom.block_size, self.param_heads(geom.num_kv_heads),
                 geom.head_dim // self.group_len(geom.head_dim))
        names = ["r"] if self.symmetric else ["r", "z"]
        for n in names:
            store.blocks[f"{self.prefix}.{n}"] = torch.zeros(shape, dtype=torch.float16,
                                                             device=device)

    def call_range(self, store: LayerStore, xv: torch.Tensor):
        """(lo, hi) of this call's values at this granularity, (T|1, Hp, G, 1) float32."""
        return minmax(xv, REDUCE_DIMS[self.granularity], self.symmetric)

    def write_params(self, store, slot_ids, xv):
        r, z = range_params(*self.call_range(store, xv), self.symmetric)  # (T|1, Hp, G, 1)
        for name, p in (("r", r), ("z", z)):
            if p is not None:
                p_slots = p.squeeze(-1).expand(xv.shape[0], -1, -1)    # (T, Hp, G)
                flat_slots(store.blocks[f"{self.prefix}.{name}"]).index_copy_(0, slot_ids, p_slots)
        return r, z

    def read_params(self, store, block_ids):
        def get(name):
            t = store.blocks.get(f"{self.prefix}.{name}")
            return None if t is None else gather_blocks(t, block_ids).unsqueeze(-1)
        return get("r"), get("z")

    def row_params(self, store, rows):
        def get(name):
            t = store.blocks.get(f"{self.prefix}.{name}")
            return None if t is None else rows.gather(t).unsqueeze(-1)      # (H, B*L, G, 1)
        return get("r"), get("z")


class EmaQuant(SlotQuant):
    """Call-wide range smoothed over calls, per layer:
    ema = momentum * ema + (1 - momentum) * current (the first call sets ema = current).
    Values beyond the updated EMA range are clipped. State: ``store.state[prefix+'.ema']``
    = (lo, hi) float32 of shape (1, Hp, 1, 1)."""

    def __init__(self, *args, momentum: float = 0.9, **kwargs):
        super().__init__(*args, **kwargs)
        self.momentum = momentum

    def call_range(self, store, xv):
        lo, hi = super().call_range(store, xv)
        key = f"{self.prefix}.ema"
        if key in store.state:
            m = self.momentum
            old_lo, old_hi = store.state[key]
            lo, hi = m * old_lo + (1 - m) * lo, m * old_hi + (1 - m) * hi
        store.state[key] = (lo, hi)
        return lo, hi


class StaticQuant(TensorQuant):
    """Calibrated per-layer parameters, nothing per slot. ``allocate`` reduces the
    layer's calibrated per-channel (lo, hi), each (H, D), to the granularity and keeps
    fp16 (r, z) of shape (1, Hp, G, 1) in ``store.state[prefix+'.static']``."""

    def set_range(self, store: LayerStore, lo: torch.Tensor, hi: torch.Tensor) -> None:
        H, D = lo.shape
        dims = REDUCE_DIMS[self.granularity]
        g = self.group_len(D)
        lo = lo.float().view(1, H, -1, g).amin(dims, keepdim=True)
        hi = hi.float().view(1, H, -1, g).amax(dims, keepdim=True)
        device = store.blocks[f"{self.prefix}.q"].device
        r, z = range_params(lo.to(device), hi.to(device), self.symmetric)
        store.state[f"{self.prefix}.static"] = (r, z)

    def write_params(self, store, slot_ids, xv):
        return store.state[f"{self.prefix}.static"]

    def read_params(self, store, block_ids):
        r, z = store.state[f"{self.prefix}.static"]
        return r.unsqueeze(0), (None if z is None else z.unsqueeze(0))   # (1, 1, Hp, G, 1)

    def row_params(self, store, rows):
        r, z = store.state[f"{self.prefix}.static"]                     # (1, Hp, G, 1)
        return r.transpose(0, 1), (None if z is None else z.transpose(0, 1))  # (Hp, 1, G, 1)
