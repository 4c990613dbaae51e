"""The paged KV cache: one codec, one LayerStore per layer, one shared BlockPool.

All layers share block ids: block b of layer l lives in ``layers[l].blocks[...][b]``, so
a sequence has a single block table. The pool is sized from a byte budget using the
codec's exact bytes per block (all layers), or from an explicit block count.

With ``per_layer_tables`` (per-layer budgets; ``kvmap.kv.layer_pool``) every layer
reads one store of ``num_layers * num_blocks`` layer blocks instead, and each layer has
its own table (``layer_block_ids``), so a layer that keeps fewer tokens gives its
blocks back. Same bytes, same codec; only a codec without per-layer state can do it.

A hybrid model's sliding-window layers (``geom.layer_windows``) use the same per-layer
tables: ``release_slid_out`` gives back each sliding layer's blocks that no query can
see any more, so such a layer holds at most ``layer_resident_blocks`` blocks of a
sequence. Where per-layer tables are impossible (a codec with per-layer state, tiers),
the sliding layers keep their whole context, masked out of attention.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvmap.kv.codecs import Codec, LayerStore
from kvmap.kv.layer_pool import LayerBlockPool, shareable
from kvmap.kv.pool import BlockPool
from kvmap.kv.spec import KVGeometry, first_live_slot, peak_layer_blocks


@dataclass(frozen=True)
class KVUsage:
    resident_bytes: int          # bytes of blocks in use, all layers, scales included
    capacity_bytes: int          # bytes of the whole pool
    num_blocks_used: int
    num_blocks_total: int
    bytes_per_block: int
    staging_bytes: int = 0       # staging rows of blocks in use (KIVI's residual window)
    layer_tables: str = "shared"   # "per-layer": kvmap.kv.layer_pool (blocks are groups)
    # hybrid models: per layer kind (``KVGeometry.layer_kinds``), its layers, window,
    # bytes per token and resident bytes; empty for a model whose layers are all global
    layer_kinds: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "resident_bytes": self.resident_bytes,
            "capacity_bytes": self.capacity_bytes,
            "num_blocks_used": self.num_blocks_used,
            "num_blocks_total": self.num_blocks_total,
            "bytes_per_block": self.bytes_per_block,
            "usage": self.num_blocks_used / self.num_blocks_total,
            "staging_bytes": self.staging_bytes,
            "layer_tables": self.layer_tables,
            **({"layer_kinds": self.layer_kinds} if self.layer_kinds else {}),
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
                 device: torch.device | str, compute_dtype: torch.dtype,
                 per_layer_tables: bool = False):
        codec.validate_geometry(geom)
        self.codec = codec
        self.geom = geom
        self.device = torch.device(device)
        self.compute_dtype = compute_dtype
        if per_layer_tables and not shareable(codec, geom, compute_dtype):
            raise ValueError(f"codec {codec!r} keeps per-layer state (static scales or "
                             f"staging rows), so its layers cannot share one store of "
                             f"per-layer blocks (per_layer_tables)")
        self.per_layer_tables = per_layer_tables
        if per_layer_tables:
            self.pool = LayerBlockPool(num_blocks, geom.block_size, geom.num_layers,
                                       geom.windows)
            shared = codec.allocate(num_blocks * geom.num_layers, geom, self.device,
                                    compute_dtype)
            self.layers: list[LayerStore] = [shared] * geom.num_layers
        else:
            self.pool = BlockPool(num_blocks, geom.block_size)
            self.layers = [
                codec.allocate(num_blocks, geom, self.device, compute_dtype, layer_id=i)
                for i in range(geom.num_layers)]
        self.layer_block_bytes = self.layers[0].block_bytes()    # one layer's block
        self.bytes_per_block = sum(layer.block_bytes() for layer in self.layers)
        self.staging_bytes = sum(layer.staging_bytes() for layer in self.layers)   # all rows

    @property
    def block_size(self) -> int:
        return self.geom.block_size

    def layer_block_ids(self, layer_idx: int, block_ids: list[int]) -> list[int]:
        """The blocks of layer ``layer_idx`` for a sequence's table: the table itself, or
        with per-layer tables that layer's own blocks (``LayerBlockPool.layer_table``)."""
        if not self.per_layer_tables:
            return block_ids
        return self.pool.layer_table(layer_idx, block_ids)

    def release_holes(self, block_ids: list[int], holes: dict | None) -> int:
        """Give back the blocks wholly inside each layer's hole (layer -> (first, end)
        slots a per-layer budget left empty); a no-op with the shared table, where the
        hole stays resident and masked. Returns the layer blocks released."""
        if not self.per_layer_tables or not holes:
            return 0
        return self.pool.release_holes(block_ids, holes)

    def peak_blocks(self, num_tokens: int, chunk_tokens: int) -> int:
        """Blocks (whole groups' worth, with per-layer tables) a sequence of
        ``num_tokens`` needs at its peak when prefilled in ``chunk_tokens`` chunks: its
        table, or with sliding layers releasing theirs, ``peak_layer_blocks`` spread
        over the layers."""
        if not (self.per_layer_tables and self.geom.sliding_layers):
            return -(-num_tokens // self.block_size)
        return -(-peak_layer_blocks(num_tokens, chunk_tokens, self.geom)
                 // self.geom.num_layers)

    def release_slid_out(self, block_ids: list[int], num_slots: int,
                         num_released: int) -> int:
        """Give back, in every sliding layer, the blocks of groups
        ``block_ids[num_released:]`` that lie wholly before the layer's
        ``first_live_slot(num_slots)`` (no later query sees them). Returns how many
        leading groups are released now (the caller keeps it, as ``num_released`` of
        the next call). A no-op without per-layer tables (sliding layers then keep their
        context, masked). A group another sequence shares (a prefix hit) keeps its
        blocks: the other may still see them; they go with the group."""
        if not (self.per_layer_tables and self.geom.sliding_layers):
            return num_released
        ends = []
        for layer in self.geom.sliding_layers:
            layer_end = min(len(block_ids), first_live_slot(
                num_slots, self.geom.windows[layer]) // self.block_size)
            for j in range(num_released, layer_end):
                if self.pool.ref_counts[block_ids[j]] == 1:
                    self.pool.release(block_ids[j], layer)     # False if it already was
            ends.append(layer_end)
        return max(num_released, min(ends))

    def layer_kinds_usage(self) -> dict:
        """Per layer kind: its layers, window, bytes per token of the codec (one layer's
        block / block size, times the layers) and resident bytes now; {} when every
        layer is global."""
        if not self.geom.sliding_layers:
            return {}
        used = self.pool.layer_blocks_in_use() if self.per_layer_tables else \
            [self.pool.num_used] * self.geom.num_layers
        out = {}
        for kind, info in self.geom.layer_kinds().items():
            layers = info["layers"]
            out[kind] = {**info, "num_layers": len(layers),
                         "bytes_per_token": len(layers) * self.layer_block_bytes
                         // self.block_size,
                         "resident_bytes": sum(used[i] for i in layers)
                         * self.layer_block_bytes}
        return out

    def resident_block_bytes(self) -> int:
        """Bytes of the blocks in use, all layers: exact with per-layer tables too."""
        if self.per_layer_tables:
            return self.pool.num_used_layer_blocks * self.layer_block_bytes
        return self.pool.num_used * self.bytes_per_block

    def usage(self) -> KVUsage:
        staged = 0
        if self.staging_bytes:
            live = torch.tensor(self.pool.ref_counts, device=self.device) > 0
            staged = sum(layer.staging_bytes(live) for layer in self.layers)
        return KVUsage(
            resident_bytes=self.resident_block_bytes() + staged,
            capacity_bytes=self.pool.num_blocks * self.bytes_per_block + self.staging_bytes,
            num_blocks_used=self.pool.num_used,
            num_blocks_total=self.pool.num_blocks,
            bytes_per_block=self.bytes_per_block,
            staging_bytes=staged,
            layer_tables="per-layer" if self.per_layer_tables else "shared",
            layer_kinds=self.layer_kinds_usage(),
        )
