"""One simulation, fully resolved: ``SimConfig`` (model, hardware, tiers, KV, engine, workload).

A scenario file (:mod:`kvmap.plan.sim.scenario`) parses into a base ``SimConfig`` and,
optionally, variants that change some of its fields; the simulator runs each.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvmap.kv.config import KVConfig
from kvmap.kv.tiers.eviction import EVICTION_ORDERS
from kvmap.plan.catalogue import PlanModel
from kvmap.plan.sim.hardware import Hardware, TierHardware
from kvmap.plan.sim.kvcost import KVCosts
from kvmap.workloads.spec import WorkloadSpec

PREFETCH_MODES = ("none", "queue")
RESERVATIONS = ("paged", "contiguous")


@dataclass(frozen=True)
class EngineSettings:
    """The serving engine's knobs, as ``kvmap.LLM`` / vLLM name them.

    ``kv_memory_bytes`` fixes the pool (per device) instead of sizing it from the GPU's
    memory; ``hbm_window_tokens`` keeps only the last N tokens of each running request
    in HBM and offloads the rest to the first tier, streamed back every step;
    ``stream_overlap`` says whether that stream overlaps compute (layer-ahead prefetch);
    ``prefetch_depth`` is how many requests at the head of the waiting queue have their
    prefix staged ahead (with ``prefetch: queue``). ``reservation: contiguous`` models a
    static allocator that reserves ``reservation_tokens`` (default: the model's context)
    per request on admission instead of growing block by block (``paged``); it shares no
    prefix blocks.
    """

    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_prefix_caching: bool = True
    kv_memory_bytes: int | None = None
    hbm_window_tokens: int | None = None
    stream_overlap: bool = True
    prefetch_depth: int = 8
    reservation: str = "paged"
    reservation_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "prefetch_depth"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"engine.{name}={value!r} must be an integer >= 1")
        if self.reservation not in RESERVATIONS:
            raise ValueError(f"engine.reservation={self.reservation!r} is not one of "
                             f"{', '.join(RESERVATIONS)}")
        for name in ("kv_memory_bytes", "hbm_window_tokens", "reservation_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"engine.{name}={value!r} must be a positive integer")
        for name in ("enable_prefix_caching", "stream_overlap"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"engine.{name}={getattr(self, name)!r} must be true or false")


@dataclass(frozen=True)
class SimConfig:
    """Everything one simulation needs; ``name`` labels it in the results. ``kv_costs``:
    what the KV configuration's own operators cost on ``hardware`` beyond their bytes
    (:mod:`kvmap.plan.sim.kvcost`; None: bytes only)."""

    name: str
    model: PlanModel
    hardware: Hardware
    kv: KVConfig
    workload: WorkloadSpec | None
    tiers: tuple[TierHardware, ...] = ()
    weights: str = "bf16"
    eviction: str = "lru"
    prefetch: str = "none"
    engine: EngineSettings = EngineSettings()
    kv_costs: KVCosts | None = None

    def __post_init__(self) -> None:
        if self.eviction not in EVICTION_ORDERS:           # the engine's tiers' own orders
            raise ValueError(f"eviction={self.eviction!r} is not one of "
                             f"{', '.join(EVICTION_ORDERS)}")
        if self.prefetch not in PREFETCH_MODES:
            raise ValueError(f"prefetch={self.prefetch!r} is not one of "
                             f"{', '.join(PREFETCH_MODES)}")
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"tiers: names {names} repeat; give each tier once")
        if self.engine.hbm_window_tokens is not None and not self.tiers:
            raise ValueError(f"engine.hbm_window_tokens={self.engine.hbm_window_tokens} "
                             "offloads KV to a tier, but there are no tiers")

    def describe(self) -> dict:
        """A JSON-able summary of the configuration."""
        hw = self.hardware
        return {
            "name": self.name, "model": self.model.name, "weights": self.weights,
            "hardware": dict(hw.__dict__), "hardware_label": hw.label, "kv": self.kv.spec,
            "tiers": [dict(t.__dict__) for t in self.tiers], "eviction": self.eviction,
            "prefetch": self.prefetch, "engine": dict(self.engine.__dict__),
            "kv_costs": None if self.kv_costs is None else self.kv_costs.to_dict(),
            "workload": None if self.workload is None else {
                "name": self.workload.name, "kind": self.workload.kind,
                "num_requests": self.workload.num_requests,
                "arrival": repr(self.workload.arrival),
                "prompt_len": repr(self.workload.prompt_len),
                "output_len": repr(self.workload.output_len)},
        }
