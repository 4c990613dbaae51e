"""Compaction: move each layer's kept tokens to the front of the sequence's blocks and
give the emptied blocks back to the pool. Memory is really returned, never masked.

    before (L = 10 slots, keep 5 of head h):  [s0 s1 s2 s3|s4 s5 s6 s7|s8 s9 . .]
    kept[h] = [0, 1, 5, 8, 9]               -> [s0 s1 s5 s8|s9 . . .  ]  block 2 freed

Kept tokens are read back through the codec and written again into slots 0..n-1, so a
quantized cache re-encodes them (per-token codecs reproduce their codes exactly).

Copy on write: with prefix caching a sequence may share its first blocks with other
requests (refcount > 1), and those must not change under them. The compacted sequence
is therefore written into blocks it alone holds (``destination_blocks``): its own
private blocks in table order -- any of them, a tail block too: layer l of every block
is read before layer l is written, and layer l+1 is untouched -- and fresh blocks from
the pool when it has too few. Shared blocks then only lose this sequence's reference:

    table  [A* B* C  D  E ]   (* shared, refcount 2)    keep 2 blocks
    dst    [C  D]             A, B: decref (still cached for their other holder)
                              E: freed with its content and prefix hash intact
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


def destination_blocks(kv: PagedKVCache, block_ids: list[int],
                       num_slots: int) -> list[int] | None:
    """The block table a sequence compacted to ``num_slots`` slots is written into: its
    private blocks (refcount 1) in table order, then fresh blocks (one reference each,
    taken now). None, allocating nothing, when the pool lacks the fresh blocks."""
    pool = kv.pool
    num_keep_blocks = -(-num_slots // kv.block_size)
    private = [b for b in block_ids if pool.ref_counts[b] == 1][:num_keep_blocks]
    need = num_keep_blocks - len(private)
    if need > pool.num_free:
        return None
    return private + (pool.allocate(need) if need else [])


def release_blocks(kv: PagedKVCache, block_ids: list[int], dst: list[int]) -> list[int]:
    """After compaction into ``dst`` (``destination_blocks``): drop this sequence's
    reference to every other block of ``block_ids`` and return ``dst``. Blocks in
    ``dst`` had their content changed, so their prefix hashes are forgotten; the others
    keep theirs (their content is intact)."""
    for b in dst:
        kv.pool.forget_hash(b)
    kept = set(dst)
    kv.pool.free([b for b in block_ids if b not in kept])
    return dst
