"""The paged KV cache: one codec, one LayerStore per layer, one shared BlockPool.

All layers share block ids: block b of layer l lives in ``layers[l].blocks[...][b]``, so
a sequence has a single block table. The pool is sized from a byte budget using the
codec's exact bytes per block (all layers), or from an explicit block count.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvmap.kv.codecs import Codec, LayerStore
from kvmap.kv.pool import BlockPool
from kvmap.kv.spec import KVGeometry


@dataclass(frozen=True)
class KVUsage:
    resident_bytes: int          # bytes of blocks in use, all layers, scales included
    capacity_bytes: int          # bytes of the whole pool
    num_blocks_used: int
    num_blocks_total: int
    bytes_per_block: int
    tiers: dict                  # per lower tier: {"resident_bytes": ...}; empty without tiers
    staging_bytes: int = 0       # staging rows of blocks in use (KIVI's residual window)

    def to_dict(self) -> dict:
        return {
            "resident_bytes": self.resident_bytes,
            "capacity_bytes": self.capacity_bytes,
            "num_blocks_used": self.num_blocks_used,
            "num_blocks_total": self.num_blocks_total,
            "bytes_per_block": self.bytes_per_block,
            "usage": self.num_blocks_used / self.num_blocks_total,
            "tiers": dict(self.tiers),
            "staging_bytes": self.staging_bytes,
        }


def num_blocks_for_budget(codec: Codec, geom: KVGeometry, kv_memory_bytes: int,
                          compute_dtype: torch.dtype) -> int:
    """How many blocks fit a byte budget together with the codec's staging pool for
    them (``Codec.num_blocks_in``); raises if fewer than one block does."""
    per_block = codec.block_bytes(geom, compute_dtype)
    n = codec.num_blocks_in(kv_memory_bytes, geom, compute_dtype)
    if n < 1:
        raise ValueError(
            f"kv_memory={kv_memory_bytes} bytes is too small for one block of "
            f"{geom.block_size} tokens across {geom.num_layers} layers "
            f"({per_block} bytes with codec {codec!r})")
    return int(n)


class PagedKVCache:
    def __init__(self, codec: Codec, geom: KVGeometry, num_blocks: int,
                 device: torch.device | str, compute_dtype: torch.dtype):
        codec.validate_geometry(geom)
        self.codec = codec
        self.geom = geom
        self.device = torch.device(device)
        self.compute_dtype = compute_dtype
        self.pool = BlockPool(num_blocks, geom.block_size)
        self.layers: list[LayerStore] = [
            codec.allocate(num_blocks, geom, self.device, compute_dtype, layer_id=i)
            for i in range(geom.num_layers)]
        self.bytes_per_block = sum(layer.block_bytes() for layer in self.layers)
        self.staging_bytes = sum(layer.staging_bytes() for layer in self.layers)   # all rows
        # the levels below the pool (kvmap.kv.tiers.store.TieredStore installs itself)
        self.tiers = None

    @property
    def block_size(self) -> int:
        return self.geom.block_size

    def usage(self) -> KVUsage:
        staged = 0
        if self.staging_bytes:
            live = torch.tensor(self.pool.ref_counts, device=self.device) > 0
            staged = sum(layer.staging_bytes(live) for layer in self.layers)
        return KVUsage(
            resident_bytes=self.pool.num_used * self.bytes_per_block + staged,
            capacity_bytes=self.pool.num_blocks * self.bytes_per_block + self.staging_bytes,
            num_blocks_used=self.pool.num_used,
            num_blocks_total=self.pool.num_blocks,
            bytes_per_block=self.bytes_per_block,
            tiers=self.tiers.resident() if self.tiers is not None else {},
            staging_bytes=staged,
        )
