"""Per-layer attention inputs for a cache with per-layer block tables
(``kvmap.kv.layer_pool``): the runner lays a batch out in group ids, as for the shared
table; here each layer gets its own copy of the metadata with the group ids replaced by
that layer's blocks:

    group slot s = g * bs + o   ->   layer l slot = members[g, l] * bs + o

Everything else (masks, holes, attention statistics, the dicts a policy reads back) is
shared by reference, so what attention records in one layer's copy is seen by all.
"""
from __future__ import annotations

from dataclasses import replace

from kvmap.kv.layer_pool import LayerBlockPool
from kvmap.model.attention import AttentionMetadata


def per_layer_metas(meta: AttentionMetadata, pool: LayerBlockPool) -> list[AttentionMetadata]:
    """One metadata per layer, each reading and writing through that layer's blocks."""
    bs = pool.block_size
    slots = meta.slot_ids
    layer_slots = (pool.layer_blocks(slots // bs) * bs + (slots % bs)[:, None]).T   # (L, T)
    decode = pool.layer_blocks(meta.decode_block_ids) \
        if meta.decode_block_ids is not None else None                        # (B, nb, L)
    prefill = [pool.layer_blocks(seg.block_ids) for seg in meta.prefills]     # (nb, L) each
    return [replace(meta, slot_ids=layer_slots[layer].contiguous(),
                    decode_block_ids=None if decode is None else decode[..., layer].contiguous(),
                    prefills=[replace(seg, block_ids=p[:, layer].contiguous())
                              for seg, p in zip(meta.prefills, prefill)],
                    layers=None)
            for layer in range(pool.num_layers)]
