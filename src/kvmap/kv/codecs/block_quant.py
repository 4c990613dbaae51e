"""Per-channel quantization over the tokens of a paged block (KIVI keys; int/fp8
``granularity=channel`` with dynamic scales).

Per-channel parameters need every token they cover, but a block fills one decode step
at a time. The group along tokens is the block; the block's parameters are recomputed
whenever a write touches it, from the block's tokens so far plus the new ones:

    block b, bs = 4      offsets 0 1 2 | 3      write at offset 3
    {prefix}.r/.z[b]  (H, D)  <- min/max over offsets 0..3 of each channel
    {prefix}.q[b]     all 4 offsets re-encoded with the new parameters

Where "the block's tokens so far" come from is the one choice:

* ``staging=False``: decoded from the block's own codes. No extra bytes; a token is
  re-rounded only when a later token widens its channel's range (decoding and encoding
  on an unchanged grid is exact), so the error grows by at most half a step per widening.
* ``staging=True``: from the block's exact rows in KIVI's staging pool (staging.py)
  where it has them, else from its codes. A block being filled always has them unless
  the pool overflowed, so codes are rounded once from exact values. ``{prefix}.full``
  (num_blocks,) bool records that a block's last offset is written (kivi.py reads a
  partial block exactly).

Assumes tokens are written into a block in offset order (appends, prefill chunks,
compaction into fresh blocks), so a block's valid offsets after a write are 0..the
largest offset written. Vectorized over blocks: no Python loop over tokens or blocks.
"""
from __future__ import annotations

import torch

from kvmap.kv.codecs import staging
from kvmap.kv.codecs.base import LayerStore
from kvmap.kv.codecs.quant import minmax, quantize, range_params
from kvmap.kv.codecs.quantizers import TensorQuant


class BlockQuant(TensorQuant):
    """Parameters ``{prefix}.r`` / ``.z`` (num_blocks, H, D) fp16, one per block and channel."""

    def __init__(self, prefix, grid, symmetric, staging: bool = False):
        super().__init__(prefix, grid, symmetric, "channel")
        self.staging = staging

    def allocate(self, num_blocks, geom, device, dtype, store) -> None:
        super().allocate(num_blocks, geom, device, dtype, store)
        shape = (num_blocks, geom.num_kv_heads, geom.head_dim)
        names = ["r"] if self.symmetric else ["r", "z"]
        for n in names:
            store.blocks[f"{self.prefix}.{n}"] = torch.zeros(shape, dtype=torch.float16,
                                                             device=device)
        if self.staging:
            store.blocks[f"{self.prefix}.full"] = torch.zeros(num_blocks, dtype=torch.bool,
                                                              device=device)

    def write(self, store: LayerStore, slot_ids: torch.Tensor, x: torch.Tensor) -> None:
        p, blocks = self.prefix, store.blocks
        bs = blocks[f"{p}.q"].shape[1]
        block_of, offset = slot_ids // bs, slot_ids % bs                  # (T,) each
        touched, which = torch.unique(block_of, return_inverse=True)      # (N,), (T,)
        src = super().read(store, touched, torch.float32)                # (N, bs, H, D)
        if self.staging:
            exact, staged = staging.gather(store, p, touched)
            src = torch.where(staged[:, None, None, None], exact.float(), src)
            x = x.to(exact.dtype)                    # what the staging rows will hold
        src[which, offset] = x.float()
        last = torch.full_like(touched, -1).scatter_reduce_(0, which, offset, "amax")
        valid = torch.arange(bs, device=x.device) <= last[:, None]       # (N, bs)
        keep = valid[..., None, None]                                     # (N, bs, 1, 1)
        lo, hi = minmax(src, (1,), self.symmetric, keep)                  # (N, 1, H, D)
        r, z = range_params(lo, hi, self.symmetric)                       # (N, 1, H, D)
        q = quantize(src.unsqueeze(-1), r.unsqueeze(-1),                  # groups of g=1
                     None if z is None else z.unsqueeze(-1), self.grid)
        blocks[f"{p}.q"].index_copy_(0, touched, q)
        blocks[f"{p}.r"].index_copy_(0, touched, r.squeeze(1))
        if z is not None:
            blocks[f"{p}.z"].index_copy_(0, touched, z.squeeze(1))
        if self.staging:
            blocks[f"{p}.full"].index_copy_(0, touched, last == bs - 1)

    def read_params(self, store, block_ids):
        def get(name):                                   # (N, H, D) -> (N, 1, H, D, 1)
            t = store.blocks.get(f"{self.prefix}.{name}")
            return None if t is None else t.index_select(0, block_ids)[:, None, :, :, None]
        return get("r"), get("z")

    def read_scaled(self, store, block_ids, dtype):
        """None: the parameters vary per block and per channel at once, which folds
        neither into the query (per channel) nor into the scores (per token)."""
        return None

    def read(self, store: LayerStore, block_ids: torch.Tensor, dtype) -> torch.Tensor:
        """The codes, decoded; with staging the caller (kivi.py) picks the exact rows."""
        return super().read(store, block_ids, dtype)                      # (N, bs, H, D)
