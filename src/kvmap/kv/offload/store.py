"""The tiered store: the one place where the pool and the tiers meet.

    pool block --demote--> host --victims--> disk --victims--> redis --victims--> gone
        ^                   |                 |                  |
        +----- promote -----+-----------------+------------------+    (take_prefix)

Keys are the pool's chained prefix hashes (``kvmap.kv.prefix``): a block is found again
exactly when a later request shares every token up to the end of that block. Values are
``serde`` frames of one block, all layers, in the level's codec.

- ``demote(block_id, hash)`` is the pool's ``on_evict``: the pool is about to reuse a
  cached block, so its tensors are serialized -- re-encoded first when the top level's
  codec is not the pool's -- and put into the top level. Promoted blocks stay in the
  tiers (inclusive levels), so a block the top level still holds costs no second write.
- A level's victims go one level down (``Tier.on_evict``), re-encoded when the codec
  changes there, e.g. ``disk_codec=int4``.
- ``take_prefix(hashes, start_block)`` continues a request's pool prefix hit: the run of
  following blocks that the pool or a tier holds is priced by the cost model (fetch the
  tiers' part, or recompute it); each fetched frame is checked (CRC, names, dtypes,
  shapes) before a pool block is allocated, then copied into every layer and registered
  under its hash, so the pool serves it from then on.

Frames and codec conversion are ``frames.py``'s; this file decides where blocks go.

Faults never escape: a missing, corrupt or mismatched frame, a dead or full Redis, a full
disk are misses or failed puts, counted by the tier (``TierStats.errors``) or here
(``stats.errors``), and the blocks not fetched are recomputed.

A waiting request's prefix frames are read ahead on a background thread while the
model runs (:class:`~kvmap.kv.offload.prefix_reader.PrefixReader`, ``read_ahead``). An
admitted request's fetched frames are copied into the pool layer by layer while its
forward pass runs (:mod:`~kvmap.kv.offload.prefix_loads`): until :meth:`finish_loads`,
those blocks are named but not yet written, so everything here that reads a block's
content (demotion, publishing) finishes the loads first.

The :class:`~kvmap.kv.offload.pager.Pager` pages a context larger than the pool through
the same levels (keys ``page/...``, one frame per page per layer, ``page_frames``) with
a prefetch thread. That thread and the engine loop both use the tiers, so every tier
call holds ``lock``; everything else is the engine loop's. The engine reaches neither
directly: both sit behind the doorway ``offloader.py``.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

from kvmap.config import ModelConfig
from kvmap.kv.cache import PagedKVCache
from kvmap.kv.codecs import Codec
from kvmap.hardware.profile import prefill_flops_prior
from kvmap.kv.tiers import serde
from kvmap.kv.tiers.backend import TIER_BACKENDS
from kvmap.kv.tiers.base import Key, Tier
from kvmap.kv.offload.cost import CostModel
from kvmap.kv.offload.frames import BlockFrames, same_codec
from kvmap.kv.tiers.layout import Layout, TierLevel
from kvmap.kv.offload.page_frames import PageFrames, page_layer
from kvmap.kv.tiers.shared_namespace import layout_fingerprint
from kvmap.kv.offload.prefix_loads import PrefixLoads
from kvmap.kv.offload.prefix_reader import PrefixReader


@dataclass
class StoreStats:
    """What the store did; per-tier hits, misses, bytes and latencies are in each
    tier's ``TierStats``."""

    num_demoted_blocks: int = 0       # pool blocks written to the top level
    num_demotes_skipped: int = 0      # ... that the top level already held
    num_soft_evicted_blocks: int = 0  # blocks a policy dropped that its evict_to level holds
    #                                   (written now, or already there)
    num_promoted_blocks: int = 0      # tier blocks copied into the pool
    num_fetched_tokens: int = 0
    num_recomputed_tokens: int = 0    # tokens a tier held but that were recomputed
    io_wait_s: float = 0.0            # engine time spent fetching (model idle)
    # prefix read-ahead (``read_ahead``): frames of waiting requests' prefixes read on a
    # background thread while the model runs the current step
    num_read_ahead_blocks: int = 0    # frames read ahead ...
    num_read_ahead_used: int = 0      # ... that a fetch then used
    tier_fetch_read_s: float = 0.0    # time reading + checking frames, either thread
    tier_fetch_hidden_s: float = 0.0  # ... of it spent while the engine did other work
    # layer-wise prefix loads (``prefix_loads.py``): an admitted request's fetched blocks
    # copied into the pool layer by layer while its forward pass runs
    num_layerwise_loads: int = 0
    num_layerwise_blocks: int = 0
    layerwise_copy_s: float = 0.0     # loader thread time copying
    layerwise_wait_s: float = 0.0     # engine time blocked on a layer not yet copied
    layerwise_hidden_s: float = 0.0   # copy time that ran while the engine computed
    demote_s: float = 0.0             # engine time spent demoting
    errors: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict:
        out = asdict(self)
        out["errors"] = dict(self.errors)
        return out


@dataclass
class StoreLevel:
    """A tier in the store: its codec and what one of its block frames weighs."""

    tier: Tier
    codec: Codec
    frame_bytes: int


def make_tier(level: TierLevel, eviction: str) -> Tier:
    """The level's tier, built by its registered backend (``backend.py``)."""
    return TIER_BACKENDS[level.name].create(level.capacity_bytes, eviction,
                                            **level.backend_options)


class TieredStore:
    """Levels below one paged KV cache, top-down, per ``layout`` (a ``tiers(...)`` part).
    Installs itself as the pool's ``on_evict`` (and ``on_register`` with a shared
    level); :meth:`close` undoes it."""

    def __init__(self, layout: Layout, kv: PagedKVCache, model_config: ModelConfig,
                 model_identity: str | None = None) -> None:
        """``model_identity`` (``shared_namespace.weights_identity``) names the weights
        for a shared level's namespace; default: the model's shape alone."""
        if not layout.levels:
            raise ValueError(f"KV layout {layout!r} has no tier levels")
        self.kv = kv
        self.block_size = kv.block_size
        self.frames = BlockFrames(kv)
        self.stats = StoreStats()
        self.levels: list[StoreLevel] = []
        self.lock = threading.RLock()       # tier calls: engine loop and prefetch thread
        self.model_identity = model_identity or repr(model_config)
        codec = kv.codec
        try:
            for level in layout.levels:
                codec = level.codec or codec            # default: the codec of the level above
                codec.validate_geometry(kv.geom)
                self.levels.append(self._make_level(level, layout.options.get("evict", "lru"),
                                                    codec))
        except BaseException:
            self.close()
            raise
        for i, upper in enumerate(self.levels[:-1]):       # victims go one level down
            upper.tier.on_evict = (lambda key, data, i=i: self._demote_frame(i, key, data))
        self.cost = CostModel(model_config, [lv.tier.name for lv in self.levels],
                              prefill_flops_prior(kv.compute_dtype, kv.device), layout.fetch)
        # a paged-out page is one frame per layer (the pager's; victims transcode here)
        self.page_frames = PageFrames(kv, layout.options.get("page_blocks", 16),
                                      [lv.codec for lv in self.levels])
        kv.pool.on_evict = self.demote
        if any(lv.tier.shared for lv in self.levels):
            kv.pool.on_register = self.publish
        self.reader = PrefixReader(self)          # prefix frames read ahead
        self.loads = PrefixLoads(self)            # ... and copied in layer by layer

    def _make_level(self, level: TierLevel, eviction: str, codec: Codec) -> StoreLevel:
        frame_bytes = self.frames.frame_bytes(codec)
        if level.backend_options.get("shared"):     # its namespace: model and KV layout
            fingerprint = layout_fingerprint(self.model_identity, self.kv.geom,
                                             self.kv.codec, codec, self.kv.compute_dtype)
            level = TierLevel(level.name, level.capacity_bytes, level.codec,
                              {**level.backend_options, "layout_fingerprint": fingerprint})
        return StoreLevel(make_tier(level, eviction), codec, frame_bytes)

    # ---- demotion ---------------------------------------------------------------------
    def demote(self, block_id: int, block_hash: bytes, level_name: str | None = None) -> bool:
        """The pool is about to reuse cached block ``block_id`` (or a selection policy to
        rewrite it, ``evict_to``): keep a copy in the top level, or in the level named
        ``level_name``. True if that level holds it afterwards. Never raises for a
        storage fault (a failed put is counted by the tier)."""
        level = self.levels[0] if level_name is None else self.level(level_name)
        self.loads.finish_for(block_id)      # it may be one still being copied in
        with self.lock:
            if level.tier.contains(block_hash):
                self.stats.num_demotes_skipped += 1
                return True
            start_s = time.perf_counter()
            data = self.frames.encode_pool_block(block_id, level.codec)
            stored = level.tier.put(block_hash, data)
            if stored:
                self.stats.num_demoted_blocks += 1
            self.stats.demote_s += time.perf_counter() - start_s
            return stored

    def keep_evicted(self, block_id: int, block_hash: bytes, level_name: str) -> bool:
        """Soft eviction: a selection policy is about to rewrite or drop block
        ``block_id`` (prefix hash ``block_hash``); keep a copy in level ``level_name``.
        True if that level holds it afterwards."""
        kept = self.demote(block_id, block_hash, level_name)
        self.stats.num_soft_evicted_blocks += kept
        return kept

    def level(self, name: str) -> StoreLevel:
        """The level named ``name`` (``host``, ``disk``, ``redis``)."""
        for level in self.levels:
            if level.tier.name == name:
                return level
        raise ValueError(f"no tier level {name!r}; this store has "
                         f"{', '.join(lv.tier.name for lv in self.levels)}")

    def publish(self, block_id: int, block_hash: bytes) -> None:
        """The pool's ``on_register`` when a level is shared: a block just named by its
        hash is written through to every shared level, so peers find it now."""
        self.loads.finish_for(block_id)
        with self.lock:
            for level in self.levels:
                if level.tier.shared and not level.tier.contains(block_hash):
                    level.tier.put(block_hash,
                                   self.frames.encode_pool_block(block_id, level.codec))

    def _demote_frame(self, index: int, key: Key, data: bytes) -> None:
        """Level ``index``'s victim goes one level down, re-encoded if the codec changes."""
        upper, lower = self.levels[index], self.levels[index + 1]
        if not same_codec(upper.codec, lower.codec):
            layer = page_layer(key)
            try:
                if layer is not None:        # one layer of a paged-out page
                    data = self.page_frames.transcode(data, layer, upper.codec, lower.codec)
                else:
                    frame = self.frames.decode(data, upper.codec)
                    data = self.frames.transcode(frame, upper.codec, lower.codec)
            except serde.DECODE_ERRORS as e:   # CorruptBlockError, FrameMismatch, ...
                self.stats.errors["demote_" + _kind(e)] += 1
                return
        lower.tier.put(key, data)

    # ---- promotion --------------------------------------------------------------------
    def take_prefix(self, block_hashes: list[bytes], start_block: int,
                    layerwise: bool = False) -> list[int]:
        """Continue a prefix hit after the pool's first ``start_block`` blocks.

        ``block_hashes`` are the request's full-block hashes. Returns the ids of the
        following blocks found, in order, each holding one reference: blocks the pool
        still caches, and blocks fetched from the tiers (registered under their hash).
        Stops at the first block held nowhere, where the cost model prefers recompute,
        at a fetch that fails, or when the pool has no free block. With ``layerwise``
        (the caller runs the forward pass next, before reading any block itself) and
        ``loads.prefix_load="layerwise"``, the fetched blocks' contents arrive during
        that forward pass (``prefix_loads.py``)."""
        # tier calls take ``lock`` one by one, never across a wait for a read-ahead
        # frame (its reader thread needs the lock too)
        pool, bs = self.kv.pool, self.block_size
        hashes = block_hashes[start_block:]
        plan = self._plan(hashes, start_block)
        start_s = time.perf_counter()
        if self.loads.serves(plan, layerwise):
            taken = self.loads.take(hashes[:len(plan)])
        else:
            taken = []
            for h in hashes[:len(plan)]:
                if h in pool.hash_to_block:             # still (or again) in the pool
                    taken += pool.lookup([h])
                    continue
                block_id = self._fetch(h)
                if block_id is None:
                    break
                taken.append(block_id)
        if any(lv is not None for lv in plan):
            self.stats.io_wait_s += time.perf_counter() - start_s
        self.stats.num_recomputed_tokens += (len(plan) - len(taken)) * bs
        return taken

    def _plan(self, hashes: list[bytes], start_block: int) -> list[StoreLevel | None]:
        """Where each block of the run after ``start_block`` comes from (None: the pool),
        up to the first held nowhere, cut where the cost model prefers recompute."""
        pool, bs = self.kv.pool, self.block_size
        plan: list[StoreLevel | None] = []
        with self.lock:      # discover changes a shared level's local view: the reader's too
            for level in self.levels:               # shared levels read their index
                level.tier.discover(hashes)
            for h in hashes:
                if h in pool.hash_to_block:
                    plan.append(None)
                    continue
                level = next((lv for lv in self.levels if lv.tier.contains(h)), None)
                if level is None:
                    self._count_lookup_miss(h)
                    break
                plan.append(level)
        tier_blocks = [(lv.tier.name, lv.frame_bytes) for lv in plan if lv is not None]
        if tier_blocks and not self.cost.decide(
                tier_blocks, start_block * bs, (start_block + len(plan)) * bs):
            first_tier = next(i for i, lv in enumerate(plan) if lv is not None)
            self.stats.num_recomputed_tokens += (len(plan) - first_tier) * bs
            plan = plan[:first_tier]
        return plan

    def finish_loads(self) -> None:
        """Complete every layer-wise load (``prefix_loads.py``): after the forward pass,
        and before anything reads a block's content."""
        self.loads.finish()

    def read_ahead(self, block_hashes: list[bytes]) -> None:
        """Read a waiting request's tier-held prefix frames on a background thread
        (``prefix_reader.py``), so that its fetch finds them read and checked."""
        self.reader.read_ahead(block_hashes)

    def _fetch(self, block_hash: bytes) -> int | None:
        """Read ``block_hash`` from the highest level that has it (or take its read-ahead
        frame) and copy it into a new pool block; None (counted) on a miss, a bad frame
        or a full pool."""
        pool = self.kv.pool
        if pool.num_free == 0:
            self.stats.errors["pool_full"] += 1
            return None
        level, frame, num_bytes, error, read_s = self.reader.read(block_hash)
        if error is not None:
            self.stats.errors[error] += 1
            return None
        if level is None:
            return None
        block_id = pool.allocate(1)[0]          # may demote another cached block
        start_s = time.perf_counter()
        self.frames.write_pool_block(block_id, frame, level.codec)
        pool.register_hash(block_id, block_hash)
        self.cost.observe_fetch(level.tier.name, num_bytes,
                                read_s + time.perf_counter() - start_s)
        self.stats.num_promoted_blocks += 1
        self.stats.num_fetched_tokens += self.block_size
        return block_id

    def _count_lookup_miss(self, block_hash: bytes) -> None:
        """A block held nowhere: one lookup that misses at every level (no I/O)."""
        for level in self.levels:
            level.tier.get(block_hash)

    # ---- reporting and lifetime ----------------------------------------------------------
    def resident(self) -> dict:
        """Per level: resident bytes and blocks, capacity."""
        return {lv.tier.name: {"resident_bytes": lv.tier.used_bytes,
                               "capacity_bytes": lv.tier.capacity_bytes,
                               "num_blocks": len(lv.tier)} for lv in self.levels}

    def usage(self) -> dict:
        """Per level: :meth:`resident`, codec, frame bytes and the tier's stats
        (``TierStats.as_dict``: hits, misses, bytes, IO seconds, read P50/P99, errors)."""
        with self.lock:                  # the prefetch thread appends latencies
            resident = self.resident()
            return {lv.tier.name: {**resident[lv.tier.name], "codec": repr(lv.codec),
                                   "frame_bytes": lv.frame_bytes, **lv.tier.stats.as_dict()}
                    for lv in self.levels}

    def as_dict(self) -> dict:
        return {**self.stats.as_dict(), "cost": self.cost.as_dict()}

    def check_integrity(self) -> None:
        with self.lock:
            for level in self.levels:
                level.tier.check_integrity()

    def close(self) -> None:
        """Empty and release every level; the pool stops demoting. Idempotent."""
        if getattr(self, "loads", None) is not None:
            self.loads.close()
        if getattr(self, "reader", None) is not None:
            self.reader.close()
        if self.kv.pool.on_evict == self.demote:
            self.kv.pool.on_evict = None
        if self.kv.pool.on_register == self.publish:
            self.kv.pool.on_register = None
        for level in self.levels:
            level.tier.on_evict = None
            level.tier.close()
        self.levels = []


def _kind(e: ValueError) -> str:
    return "corrupt" if isinstance(e, serde.CorruptBlockError) else "mismatch"
