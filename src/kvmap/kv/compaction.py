"""Compaction: move each layer's kept tokens to the front of the sequence's blocks and
give the emptied blocks back to the pool. Memory is really returned, never masked.

    before (L = 10 slots, keep 5 of head h):  [s0 s1 s2 s3|s4 s5 s6 s7|s8 s9 . .]
    kept[h] = [0, 1, 5, 8, 9]               -> [s0 s1 s5 s8|s9 . . .  ]  block 2 freed

Kept tokens are read back through the codec and written again into slots 0..n-1, so a
quantized cache re-encodes them (per-token codecs reproduce their codes exactly).
"""
from __future__ import annotations

import torch

from kvmap.kv.cache import PagedKVCache


def slots_of(block_ids: list[int], num_slots: int, block_size: int) -> torch.Tensor:
    """Slot ids (num_slots,) of the first num_slots token positions of a block table."""
    idx = torch.arange(num_slots)
    table = torch.tensor(block_ids, dtype=torch.long)
    return table[idx // block_size] * block_size + idx % block_size


def read_sequence(kv: PagedKVCache, layer_idx: int, block_ids: list[int], num_slots: int):
    """(k, v), each (num_slots, H, D), of one layer of one sequence, compute dtype."""
    nb = -(-num_slots // kv.block_size)
    table = torch.tensor(kv.layer_block_ids(layer_idx, block_ids[:nb]), dtype=torch.long,
                         device=kv.device)
    k, v = kv.codec.read(kv.layers[layer_idx], table)
    H, D = k.shape[-2], k.shape[-1]
    return k.reshape(-1, H, D)[:num_slots], v.reshape(-1, H, D)[:num_slots]


def compact_layer(kv: PagedKVCache, layer_idx: int, block_ids: list[int],
                  k: torch.Tensor, v: torch.Tensor, kept: torch.Tensor) -> None:
    """Write the kept tokens (kept: (H, n) slot indices per KV head) of one layer into
    slots 0..n-1. k, v: (L, H, D) as read before any write."""
    H = k.shape[1]
    heads = torch.arange(H)[:, None]                                    # (H, 1)
    k_new = k[kept, heads].transpose(0, 1).contiguous()                  # (n, H, D)
    v_new = v[kept, heads].transpose(0, 1).contiguous()
    num_dst_blocks = -(-kept.shape[1] // kv.block_size)
    dst = slots_of(kv.layer_block_ids(layer_idx, block_ids[:num_dst_blocks]), kept.shape[1],
                   kv.block_size).to(kv.device)
    kv.codec.write(kv.layers[layer_idx], dst, k_new, v_new)


def release_tail(kv: PagedKVCache, block_ids: list[int], num_slots: int) -> list[int]:
    """Free the blocks beyond ``num_slots``; returns the shortened block table. Blocks
    that stay had their content changed, so their prefix hashes are forgotten."""
    num_keep_blocks = -(-num_slots // kv.block_size)
    for b in block_ids[:num_keep_blocks]:
        kv.pool.forget_hash(b)
    kv.pool.free(block_ids[num_keep_blocks:])
    return block_ids[:num_keep_blocks]
