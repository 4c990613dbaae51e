"""What a simulation reports: serving metrics, KV residency, tier traffic, bottlenecks.

Serving metrics are ``kvmap.metrics.aggregate`` of the simulated request records,
so a simulated and a measured run are summarised by the same code (TTFT, TBT, TPOT, E2E
percentiles, throughput). On top:

- ``time_s``: seconds of step time each resource needed, summed over steps, and the
  stalls spent waiting on each tier's link (one step is bound by its largest resource;
  the others overlap it, see ``costmodel``);
- ``bound_share``: the share of busy time in steps bound by each resource;
- ``timeline``: the run cut into ``TIMELINE_SEGMENTS`` equal spans of simulated time,
  each with its dominant resource and mean batch: where the bottleneck moves;
- ``tiers``: per tier, hits and misses of prefix lookups, bytes in and out (their
  difference is what is resident: conservation), bytes read up into HBM, bytes streamed
  in place (offloaded KV), link busy time, and the step time spent waiting on it;
- ``kv``: pool size, peak HBM blocks used, the largest KV one request held in HBM and in
  all, mean and peak running batch.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from kvmap.jsonable import jsonable
from kvmap.metrics import aggregate

TIMELINE_SEGMENTS = 10


@dataclass
class StepLog:
    """Per-step records (parallel lists)."""

    start_s: list = field(default_factory=list)
    stall_s: list = field(default_factory=list)
    total_s: list = field(default_factory=list)
    bound: list = field(default_factory=list)
    num_seqs: list = field(default_factory=list)
    num_decode: list = field(default_factory=list)
    num_tokens: list = field(default_factory=list)
    used_blocks: list = field(default_factory=list)
    resource_s: dict = field(default_factory=lambda: defaultdict(float))
    stall_by_link: dict = field(default_factory=lambda: defaultdict(float))

    def add(self, start_s, stall_s, stall_link, cost, num_seqs, num_decode, num_tokens,
            used_blocks) -> None:
        self.start_s.append(start_s)
        self.stall_s.append(stall_s)
        self.total_s.append(stall_s + cost.total_s)
        # a stall longer than the step's own work makes the link the step's bottleneck
        times = cost.resource_s()
        bound = cost.bound
        if stall_link is not None and stall_s > times[bound]:
            bound = stall_link
        self.bound.append(bound)
        self.num_seqs.append(num_seqs)
        self.num_decode.append(num_decode)
        self.num_tokens.append(num_tokens)
        self.used_blocks.append(used_blocks)
        for name, seconds in times.items():
            self.resource_s[name] += seconds
        if stall_link is not None:
            self.stall_by_link[stall_link] += stall_s

    def __len__(self) -> int:
        return len(self.start_s)


@dataclass(frozen=True)
class SimResult:
    """One simulated configuration's results; ``to_dict`` is JSON-able."""

    name: str
    config: dict
    metrics: dict
    num_requests: int
    num_finished: int
    num_rejected: int
    rejections: tuple
    num_steps: int
    num_preemptions: int
    kv: dict
    tiers: dict
    prefetch: dict
    time_s: dict
    bound_share: dict
    timeline: tuple
    records: tuple = field(default=(), compare=False, repr=False)   # per request, for SLAs

    def to_dict(self) -> dict:
        return jsonable({k: getattr(self, k) for k in self.__dataclass_fields__
                         if k != "records"}, finite_only=True)


def _timeline(steps: StepLog) -> tuple:
    if not steps.start_s:
        return ()
    t0, t1 = steps.start_s[0], steps.start_s[-1] + steps.total_s[-1]
    span = (t1 - t0) / TIMELINE_SEGMENTS or 1.0
    buckets = [Counter() for _ in range(TIMELINE_SEGMENTS)]
    seqs = [[0.0, 0.0] for _ in range(TIMELINE_SEGMENTS)]
    for start, dur, bound, n in zip(steps.start_s, steps.total_s, steps.bound, steps.num_seqs):
        i = min(TIMELINE_SEGMENTS - 1, int((start - t0) / span))
        buckets[i][bound] += dur
        seqs[i][0] += n * dur
        seqs[i][1] += dur
    return tuple({"start_s": t0 + i * span, "end_s": t0 + (i + 1) * span,
                  "bound": b.most_common(1)[0][0] if b else "idle",
                  "mean_batch": s[0] / s[1] if s[1] else 0.0}
                 for i, (b, s) in enumerate(zip(buckets, seqs)))


def build_result(sim) -> SimResult:
    """Summarise a finished :class:`~kvmap.plan.sim.engine.Simulator`."""
    steps, store, mc = sim.steps, sim.store, sim.mc
    records = [st.record() for st in sim.done]
    metrics = aggregate(records) if records else aggregate([])
    busy_s = sum(steps.total_s)
    share = Counter()
    for bound, dur in zip(steps.bound, steps.total_s):
        share[bound] += dur
    tiers = {}
    for state in store.levels:
        looked = state.num_hits + state.num_misses
        tiers[state.spec.name] = {
            "link": state.spec.link, "capacity_bytes": state.spec.capacity_bytes,
            "hits": state.num_hits, "misses": state.num_misses,
            "hit_rate": state.num_hits / looked if looked else None,
            "bytes_in": state.bytes_in, "bytes_out": state.bytes_out,
            "bytes_read": state.bytes_read,
            "resident_bytes": (state.num_cached + state.num_pinned) * store.block_bytes,
            "bytes_streamed": state.bytes_streamed, "evicted_blocks": state.num_evicted,
            "link_busy_s": state.busy_s, "stall_s": state.stall_s}
    hbm_looked = store.num_hbm_hits + store.num_hbm_misses
    duration_s = metrics.get("duration_s") or 0.0
    weighted = sum(n * d for n, d in zip(steps.num_seqs, steps.total_s))
    peak_hbm = max((st.peak_hbm_blocks for st in sim.done), default=0)
    peak_total = max((st.peak_total_blocks for st in sim.done), default=0)
    peak_layers = max((st.peak_layer_blocks for st in sim.done), default=0)
    kv = {
        "kv_bytes_per_token": mc.kv_bytes_per_token,
        "kv_block_bytes_per_device": mc.kv_block_bytes_per_device,
        "weight_bytes_per_device": mc.weight_bytes_per_device,
        "num_hbm_blocks": sim.num_hbm_blocks,
        "hbm_kv_bytes_per_device": sim.num_hbm_blocks * mc.kv_block_bytes_per_device,
        "peak_used_blocks": max(steps.used_blocks, default=0),
        "max_running": max(steps.num_seqs, default=0),
        "mean_running": weighted / busy_s if busy_s else 0.0,
        "peak_hbm_kv_bytes_per_seq": peak_hbm * mc.kv_block_bytes,
        "peak_kv_bytes_per_seq": peak_total * mc.kv_block_bytes,
        # a hybrid model: layer blocks held (sliding layers only their window), exact
        **({"peak_layer_kv_bytes_per_seq": peak_layers * mc.kv_block_bytes
            // sim.num_layers} if peak_layers else {}),
        "final_hbm_kv_bytes_per_seq": max((st.final_hbm_blocks for st in sim.done), default=0)
        * mc.kv_block_bytes,
        "prefix_hits": store.num_hbm_hits, "prefix_misses": store.num_hbm_misses,
        "hbm_hit_rate": store.num_hbm_hits / hbm_looked if hbm_looked else None,
        "dropped_blocks": store.num_dropped,
        "busy_fraction": busy_s / duration_s if duration_s else None,
    }
    return SimResult(
        name=sim.config.name, config=sim.config.describe(), metrics=metrics,
        num_requests=len(sim.requests), num_finished=len(sim.done),
        num_rejected=len(sim.rejected),
        rejections=tuple(f"{r.request_id}: {why}" for r, why in sim.rejected[:5]),
        num_steps=len(steps), num_preemptions=sim.num_preemptions, kv=kv, tiers=tiers,
        prefetch={"started": store.num_prefetched, "used": store.num_prefetch_used,
                  "wasted": store.num_prefetch_wasted},
        time_s={**dict(steps.resource_s),
                **{f"stall_{link}": s for link, s in steps.stall_by_link.items()},
                "busy": busy_s},
        bound_share={k: v / busy_s for k, v in share.items()} if busy_s else {},
        timeline=_timeline(steps), records=tuple(records))
