"""How an admitted request's tier-held prefix gets into the pool: the tiered store's
choice between copying frames block by block at admission and loading them layer by
layer during the forward pass (``layer_loader.py``).

``prefix_load`` (an attribute of :class:`PrefixLoads`, one of ``PREFIX_LOADS``):

- ``layerwise`` (default): read and check the frames at admission, allocate and name
  their blocks, copy them in on the loader thread while the forward pass runs; attention
  waits per layer (``AttentionMetadata.layer_loads``).
- ``batched``: the same reads, checks and copies, finished before admission returns (the
  synchronous form of the same work: what ``layerwise`` is measured against).
- ``per-block``: decode each frame and copy it, block by block, at admission (the
  store's original path; also what serves a compacted state, whose last block is copied
  at once, and any store with a shared level, which publishes a block's content as soon
  as it is named). Within a layer-wise take, a block from a level of another codec
  (``disk_codec=int4``) is decoded and copied this way too.
"""
from __future__ import annotations

from kvmap.kv.offload.layer_loader import FrameLayout, LayerLoader

PREFIX_LOADS = ("layerwise", "batched", "per-block")


class PrefixLoads:
    """The layer-wise prefix loads of one tiered store. Engine thread only."""

    def __init__(self, store) -> None:
        self.store = store
        self.loader = LayerLoader(store.kv.layers)
        # every frame of the pool's codec has this layout (block 0's content is any)
        self.layout = FrameLayout(store.frames.encode_pool_block(0, store.kv.codec))
        self._prefix_load = "layerwise"
        self._waits_counted_s = 0.0
        # the loader copies bytes into each pool tensor seen as (blocks, bytes)
        self._contiguous = all(t.is_contiguous() for layer in store.kv.layers
                               for t in layer.blocks.values())

    @property
    def prefix_load(self) -> str:
        return self._prefix_load

    @prefix_load.setter
    def prefix_load(self, mode: str) -> None:
        if mode not in PREFIX_LOADS:
            raise ValueError(f"prefix_load={mode!r}; choose one of {', '.join(PREFIX_LOADS)}")
        self.finish()
        self._prefix_load = mode

    def serves(self, plan: list, layerwise: bool) -> bool:
        """Whether a take of ``plan`` (per block: its level, or None for the pool) is
        loaded here: the caller allows it, some block comes from a level of the pool's
        codec, and no level is shared."""
        store = self.store
        if not layerwise or self._prefix_load == "per-block" or not self._contiguous or \
                any(lv.tier.shared for lv in store.levels):
            return False
        return any(lv is not None and store.frames.is_pool_codec(lv.codec) for lv in plan)

    def take(self, hashes: list[bytes]) -> list[int]:
        """Read and check the frames of ``hashes`` (a planned run) now, allocate and name
        their blocks, and start copying them in. Returns the block ids taken, each with a
        reference; stops at a frame that is missing or bad, or a full pool (counted)."""
        store = self.store
        pool, stats = store.kv.pool, store.stats
        taken, block_ids, sources = [], [], []
        for h in hashes:
            if h in pool.hash_to_block:
                taken += pool.lookup([h])
                continue
            if pool.num_free == 0:
                stats.errors["pool_full"] += 1
                break
            level, frame, num_bytes, error, read_s = store.reader.read_for_layers(h, self.layout)
            if error is not None:
                stats.errors[error] += 1
            if frame is None:
                break
            block_id = pool.allocate(1)[0]      # may demote a block: earlier loads finish
            if store.frames.is_pool_codec(level.codec):
                block_ids.append(block_id)
                sources.append(frame)
            else:       # a level of another codec (disk_codec=int4): decoded, copied now
                store.frames.write_pool_block(block_id, frame, level.codec)
                stats.num_promoted_blocks += 1
                stats.num_fetched_tokens += store.block_size
            pool.register_hash(block_id, h)
            store.cost.observe_fetch(level.tier.name, num_bytes, read_s)
            taken.append(block_id)
        if block_ids:
            self.loader.start(self.layout, block_ids, sources)
            stats.num_layerwise_loads += 1
            stats.num_layerwise_blocks += len(block_ids)
            stats.num_promoted_blocks += len(block_ids)
            stats.num_fetched_tokens += len(block_ids) * store.block_size
            if self._prefix_load == "batched":
                self.finish(count_wait=False)     # inside take_prefix's own io_wait_s
        return taken

    def pending(self) -> LayerLoader | None:
        """The loader while a load is pending: what attention waits on, layer by layer."""
        return self.loader if self.loader.pending else None

    def finish_for(self, block_id: int) -> None:
        """Before pool block ``block_id``'s content is read outside the forward pass:
        complete the loads if one is still to write it."""
        if self.loader.pending and self.loader.loading(block_id):
            self.finish()

    def finish(self, count_wait: bool = True) -> None:
        """Complete every pending load. The engine's waits on it (per layer and now)
        count as ``io_wait_s``; the copy time it did not wait for, as hidden."""
        if not self.loader.pending:
            return
        block_ids = self.loader.pending_block_ids()
        try:
            copy_s = self.loader.finish()
        except BaseException:    # a copy failed (a bug, not a bad frame: those were
            pool = self.store.kv.pool    # refused at admission): no one reuses the blocks
            for block_id in block_ids:
                pool.forget_hash(block_id)
            raise
        waited_s = self.loader.wait_s - self._waits_counted_s
        self._waits_counted_s = self.loader.wait_s
        stats = self.store.stats
        stats.layerwise_copy_s += copy_s
        stats.layerwise_wait_s += waited_s
        if count_wait:
            stats.io_wait_s += waited_s
            stats.layerwise_hidden_s += max(0.0, copy_s - waited_s)

    def close(self) -> None:
        self.loader.close()
