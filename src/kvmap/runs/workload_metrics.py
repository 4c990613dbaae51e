"""The metrics of a workload cell, typed: ``WorkloadMetrics.of(record)`` reads the
``metrics`` a workload cell wrote (``bench/cell.py``: ``metrics.aggregate`` over its
requests, then the engine's pool, load, prefix, tier and probe figures) into a frozen
view; ``Summary`` is one distribution (``metrics.requests.summarize``). A record written
before a key existed reads it as None; ``output_throughput_tok_s`` (the name of older
records) reads as ``output_tokens_per_s``; keys this view does not name stay in
``extra``. ``docs/bench.md`` defines each field.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvmap.runs.payload import view


@dataclass(frozen=True)
class Summary:
    """Mean, percentiles and maximum of one distribution (seconds for times)."""

    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    max: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, data: Any) -> Summary:
        return view(cls, data, "")


@dataclass(frozen=True)
class TierCounters:
    """One tier below the pool over the cell (``engine.stats.TierUsage`` as written, with
    the tier's own detail: read latency percentiles, hit rate)."""

    resident_bytes: int | None = None
    capacity_bytes: int | None = None
    num_blocks: int | None = None
    num_hits: int | None = None
    num_misses: int | None = None
    bytes_read: int | None = None
    bytes_written: int | None = None
    io_s: float | None = None
    errors: dict[str, int] | None = None
    hit_rate: float | None = None
    read_p50_s: float | None = None
    read_p99_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_errors(self) -> int:
        return sum((self.errors or {}).values())


def _tiers(data: Any) -> dict[str, TierCounters]:
    if not isinstance(data, dict):
        raise ValueError(f"is not a JSON object of tiers ({data!r:.80})")
    return {str(name): view(TierCounters, stats, f"tier {name!r}")
            for name, stats in data.items()}


@dataclass(frozen=True)
class Stability:
    """The checklist's stability probe: temperature-0 output alone vs in a mixed batch."""

    identical: bool | None = None
    num_tokens: int | None = None
    num_identical_prefix: int | None = None
    batch_size: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DecodeOps:
    """The checklist's operator count of a decode step (``bench.probes.decode_ops``)."""

    num_ops_per_step: float | None = None
    num_ops_all: float | None = None
    num_kernel_launches: float | None = None
    num_steps: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Probes:
    """The checklist's probes of a configuration, run once after one of its workloads."""

    stability: Stability | None = None
    decode_ops: DecodeOps | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, data: Any) -> Probes:
        return view(cls, data, "",
                    nested={"stability": lambda d: view(Stability, d, "")
                            if d else None,        # {}: not measured, as it read before
                            "decode_ops": lambda d: view(DecodeOps, d, "")
                            if d else None})


@dataclass(frozen=True)
class WorkloadMetrics:
    """A workload cell's metrics (every field None where the record lacks it)."""

    # the requests (metrics.aggregate, vLLM's definitions)
    num_requests: int | None = None
    num_completed: int | None = None
    num_failed: int | None = None
    duration_s: float | None = None
    num_prompt_tokens: int | None = None
    num_output_tokens: int | None = None
    num_cached_prompt_tokens: int | None = None
    num_preemptions: int | None = None
    requests_per_s: float | None = None
    output_tokens_per_s: float | None = None
    total_tokens_per_s: float | None = None
    ttft_s: Summary | None = None
    tbt_s: Summary | None = None
    tpot_s: Summary | None = None
    e2e_s: Summary | None = None
    queue_s: Summary | None = None
    goodput_requests_per_s: float | None = None
    num_good_requests: int | None = None
    slo_violations: dict[str, float | None] | None = None
    slo_attainment: dict[str, Any] | None = None
    output_throughput_windows_tok_s: list[float] | None = None
    needle_accuracy: float | None = None
    # the KV pool and the memory
    peak_kv_resident_bytes: int | None = None
    peak_kv_resident_bytes_per_tier: dict[str, int] | None = None
    peak_kv_resident_bytes_by_kind: dict[str, int] | None = None
    kv_bytes_per_token: float | None = None
    kv_bytes_per_block: int | None = None
    kv_block_size: int | None = None
    kv_capacity_bytes: int | None = None
    kv_capacity_tokens: int | None = None
    kv_budget_tokens_bf16: int | None = None
    num_kv_blocks: int | None = None
    weight_bytes: int | None = None
    kv_waste_bytes_max: int | None = None
    kv_waste_bytes_mean: float | None = None
    kv_waste_share_mean: float | None = None
    peak_rss_bytes: int | None = None
    device_peak_bytes: int | None = None
    model_load_s: float | None = None
    # the engine's scheduler
    concurrency_max: int | None = None
    concurrency_mean: float | None = None
    waiting_max: int | None = None
    waiting_mean: float | None = None
    num_pool_full_steps: int | None = None
    num_preemptions_engine: int | None = None
    max_num_running_seqs: int | None = None
    num_engine_steps: int | None = None
    # prefix cache, selection policies, tiers
    prefix_cache_queries: int | None = None
    prefix_cache_hits: int | None = None
    prefix_cache_hit_rate: float | None = None
    num_compressions: int | None = None
    num_evicted_tokens: int | None = None
    num_soft_evicted_blocks: int | None = None
    tier_hit_rate: float | None = None
    io_bytes: int | None = None
    io_latency_s: float | None = None
    tier_errors: int | None = None
    tiers: dict[str, TierCounters] | None = None
    # the checklist's probes (once per configuration); an endpoint cell's server
    probes: Probes | None = None
    endpoint: dict[str, Any] | None = None
    kv_memory_note: str | None = None
    stopped_early: dict[str, Any] | None = None   # an over-saturated search level's stop
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, data: Any, where: str = "workload metrics") -> WorkloadMetrics:
        summary = Summary.read
        return view(cls, data, where,
                    nested={k: summary for k in ("ttft_s", "tbt_s", "tpot_s", "e2e_s",
                                                 "queue_s")} | {"tiers": _tiers,
                                                             "probes": Probes.read},
                    renamed={"output_throughput_tok_s": "output_tokens_per_s"})

    @classmethod
    def of(cls, record: Any) -> WorkloadMetrics:
        """The metrics of ``record`` (a ``CellRecord``), named by its cell id in an error."""
        return cls.read(record.metrics, f"metrics of cell {record.cell_id!r}")

    def summary(self, name: str) -> Summary:
        """The summary ``name`` (``"tbt_s"``), empty where the record has none."""
        value = getattr(self, name)
        if not isinstance(value, Summary):
            if value is not None:
                raise ValueError(f"{name!r} is not a summary of these metrics")
            return Summary()
        return value
