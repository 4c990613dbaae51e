"""What the server's metrics read from an engine every tick, and nothing more.

``Engine.kv_usage()`` also computes each tier's latency percentiles (a sort of up to
65,536 samples per window); at a 0.1 s tick on the engine thread that is work no scrape
asked for. The tick reads counters only (``EngineState``); the percentiles are computed
when ``/metrics`` is scraped, from the latency windows ``tier_windows`` hands over.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kvmap.engine.engine import Engine
from kvmap.engine.stats import kv_waste


@dataclass(frozen=True)
class TierCounters:
    resident_bytes: int
    capacity_bytes: int
    num_hits: int
    num_misses: int
    io_s: float
    bytes_read: int = 0
    bytes_written: int = 0


@dataclass(frozen=True)
class EngineState:
    num_running: int
    resident_bytes: int
    capacity_bytes: int
    usage: float                         # fraction of the pool's blocks in use
    num_preemptions: int
    prefix_cache_queries: int            # in blocks
    prefix_cache_hits: int               # in blocks
    num_evicted_tokens: int
    tiers: dict[str, TierCounters] = field(default_factory=dict)
    waste_bytes: int = 0                 # allocated slots holding no token


def engine_state(engine: Engine) -> EngineState:
    """Engine thread only."""
    pool = engine.kv.pool
    per_block = engine.kv.bytes_per_block
    tiers = {}
    if engine.offload is not None:
        for lv in engine.offload.levels:
            stats = lv.tier.stats
            tiers[lv.tier.name] = TierCounters(lv.tier.used_bytes, lv.tier.capacity_bytes,
                                               stats.hits, stats.misses,
                                               stats.read_s + stats.write_s,
                                               stats.bytes_read, stats.bytes_written)
    runner = engine.policy_runner
    return EngineState(
        num_running=len(engine.scheduler.running),
        resident_bytes=engine.kv.resident_block_bytes(), capacity_bytes=pool.num_blocks * per_block,
        usage=pool.usage(), num_preemptions=engine.scheduler.num_preemptions,
        prefix_cache_queries=pool.num_prefix_queries, prefix_cache_hits=pool.num_prefix_hits,
        num_evicted_tokens=runner.num_evicted_tokens if runner is not None else 0,
        tiers=tiers, waste_bytes=kv_waste(engine).waste_bytes)


def tier_windows(engine: Engine) -> dict[str, object]:
    """Tier name -> its read-latency window (a deque the engine thread appends to; the
    scrape copies it, which is atomic under the GIL)."""
    if engine.offload is None:
        return {}
    return {lv.tier.name: lv.tier.stats.read_latencies_s for lv in engine.offload.levels}
