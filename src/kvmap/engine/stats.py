"""What the engine reports about itself: one typed ``EngineStats``, a dict only at the
JSON edge (``to_dict``, the form ``LLM.kv_usage()`` and the server's metrics read).

``LoadCounters`` are the concurrency counters a deployment cares about (how many
sequences ran and waited, how often the pool was full), kept in O(1) per engine step:
a max, a running time integral and a count -- nothing that grows with the batch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kvmap.kv.fragmentation import Waste, internal_waste

# keys of a tier's usage dict (kvmap.kv.offload.store.TieredStore.usage) read by name;
# the rest (codec, frame bytes, latencies, ...) travel in ``TierUsage.detail``
_TIER_FIELDS = ("resident_bytes", "capacity_bytes", "num_blocks", "num_hits", "num_misses",
                "bytes_read", "bytes_written", "io_s")


@dataclass(frozen=True)
class TierUsage:
    """One tier below the pool: what it holds and what it served."""

    resident_bytes: int = 0
    capacity_bytes: int = 0
    num_blocks: int = 0
    num_hits: int = 0
    num_misses: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    io_s: float = 0.0
    errors: dict = field(default_factory=dict)      # error kind -> count
    detail: dict = field(default_factory=dict)      # everything else the tier reports

    @classmethod
    def from_dict(cls, usage: dict) -> TierUsage:
        known = {k: usage[k] for k in _TIER_FIELDS if usage.get(k) is not None}
        detail = {k: v for k, v in usage.items() if k not in _TIER_FIELDS and k != "errors"}
        return cls(**known, errors=dict(usage.get("errors") or {}), detail=detail)

    @property
    def num_errors(self) -> int:
        return int(sum(self.errors.values()))

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in _TIER_FIELDS}
        return {**out, **self.detail, "errors": dict(self.errors)}


class LoadCounters:
    """Running / waiting sequences per engine step: max, and their time integral (the
    caller divides by its own wall time for a time-weighted mean, so idle gaps count as
    zero running); steps where the pool was full (a waiting request not admitted, or a
    running one preempted, for lack of free blocks)."""

    def __init__(self) -> None:
        self.max_num_running = self.max_num_waiting = 0
        self.running_seq_s = self.waiting_seq_s = 0.0
        self.num_steps = self.num_pool_full_steps = 0

    def observe(self, num_running: int, num_waiting: int, step_s: float,
                pool_full: bool) -> None:
        self.max_num_running = max(self.max_num_running, num_running)
        self.max_num_waiting = max(self.max_num_waiting, num_waiting)
        self.running_seq_s += num_running * step_s
        self.waiting_seq_s += num_waiting * step_s
        self.num_steps += 1
        self.num_pool_full_steps += bool(pool_full)


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine: pool bytes and blocks, queues, counters, tiers."""

    resident_bytes: int                 # bytes of pool blocks in use, all layers
    capacity_bytes: int                 # bytes of the whole pool
    num_blocks_used: int
    num_blocks_total: int
    bytes_per_block: int
    block_size: int                     # tokens per block
    num_running: int
    num_waiting: int
    num_preemptions: int
    prefix_cache_queries: int           # blocks looked up in the prefix cache
    prefix_cache_hits: int
    max_num_running: int = 0
    max_num_waiting: int = 0
    running_seq_s: float = 0.0          # integral of running sequences over step time
    waiting_seq_s: float = 0.0
    num_steps: int = 0
    num_pool_full_steps: int = 0
    tiers: dict[str, TierUsage] = field(default_factory=dict)
    tier_store: dict | None = None      # the tiered store's own counters (paging, cost)
    num_compressions: int | None = None     # None: no selection policy
    num_evicted_tokens: int | None = None

    @property
    def usage(self) -> float:
        return self.num_blocks_used / self.num_blocks_total

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks_total * self.block_size

    @property
    def num_tier_errors(self) -> int:
        return sum(t.num_errors for t in self.tiers.values())

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in (
            "resident_bytes", "capacity_bytes", "num_blocks_used", "num_blocks_total",
            "bytes_per_block", "num_running", "num_waiting", "num_preemptions",
            "prefix_cache_queries", "prefix_cache_hits", "max_num_running",
            "max_num_waiting", "num_steps", "num_pool_full_steps")}
        out["usage"] = self.usage
        out["tiers"] = {name: t.to_dict() for name, t in self.tiers.items()}
        if self.tier_store is not None:
            out["tier_store"] = self.tier_store
        if self.num_compressions is not None:
            out["num_compressions"] = self.num_compressions
            out["num_evicted_tokens"] = self.num_evicted_tokens
        return out


def kv_waste(engine) -> Waste:
    """Internal waste of ``engine``'s running sequences now (``kvmap.kv.fragmentation``):
    what the bench's time series and ``kvmap serve``'s metrics both sample."""
    kv, bs = engine.kv, engine.kv.block_size
    # clamped: a request being preempted may have lost its blocks but not yet its count.
    # Prompt tokens not yet computed hold the slots allocated for them: a sample taken
    # during a prefill's forward pass must not count the chunk being written as waste.
    held = [(n, min(r.num_kv_slots + max(0, len(r.prompt_token_ids) - r.num_computed_tokens),
                    n * bs)) for r in list(engine.scheduler.running)
            for n in [len(r.block_ids)]]
    return internal_waste(held, bs, kv.bytes_per_block)
