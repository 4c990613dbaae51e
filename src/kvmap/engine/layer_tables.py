"""Per-layer attention inputs: for a cache with per-layer block tables
(``kvmap.kv.layer_pool``) and for a hybrid model's sliding-window layers.

With per-layer tables the runner lays a batch out in group ids, as for the shared
table; here each layer gets its own copy of the metadata with the group ids replaced by
that layer's blocks:

    group slot s = g * bs + o   ->   layer l slot = members[g, l] * bs + o

A sliding-window layer starts from the step's windowed metadata
(``AttentionMetadata.windowed``: tables cut to the first visible block, window masks)
instead of the full one. Everything else (holes, attention statistics, the dicts a
policy reads back) is shared by reference, so what attention records in one layer's
copy is seen by all.
"""
from __future__ import annotations

from dataclasses import replace

from kvmap.kv.layer_pool import LayerBlockPool
from kvmap.model.attention import AttentionMetadata


def window_sources(meta: AttentionMetadata, windows: tuple, decode_tables: list[list[int]],
                   decode_kv_lens: list[int], block_size: int) -> list[AttentionMetadata]:
    """Per layer, the metadata it attends with: ``meta`` for a global layer (window
    None), one windowed metadata per window size, shared by the layers that have it."""
    by_window = {w: meta.windowed(w, decode_tables, decode_kv_lens, block_size)
                 for w in set(windows) if w is not None}
    return [meta if w is None else by_window[w] for w in windows]


def per_layer_metas(meta: AttentionMetadata, pool: LayerBlockPool,
                    sources: list[AttentionMetadata] | None = None) -> list[AttentionMetadata]:
    """One metadata per layer, each reading and writing through that layer's blocks;
    layer l starts from ``sources[l]`` (by default ``meta`` for every layer)."""
    sources = sources or [meta] * pool.num_layers
    bs = pool.block_size
    mapped: dict[int, tuple] = {}            # id(source) -> its tables in layer blocks
    out = []
    for layer, src in enumerate(sources):
        if id(src) not in mapped:
            slots = src.slot_ids
            mapped[id(src)] = (
                (pool.layer_blocks(slots // bs) * bs + (slots % bs)[:, None]).T,  # (L, T)
                pool.layer_blocks(src.decode_block_ids)
                if src.decode_block_ids is not None else None,                   # (B, nb, L)
                [pool.layer_blocks(seg.block_ids) for seg in src.prefills])       # (nb, L)
        layer_slots, decode, prefill = mapped[id(src)]
        out.append(replace(src, slot_ids=layer_slots[layer].contiguous(),
                           decode_block_ids=None if decode is None
                           else decode[..., layer].contiguous(),
                           prefills=[replace(seg, block_ids=p[:, layer].contiguous())
                                     for seg, p in zip(src.prefills, prefill)],
                           layers=None))
    return out
