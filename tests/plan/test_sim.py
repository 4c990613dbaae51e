"""The simulator: conservation, closed-form cases, determinism, agreement with the planner."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from kvmap.kv.config import KVConfig
from kvmap.kv.offload.cost import prefill_flops
from kvmap.plan.catalogue import get_gpu, get_model
from kvmap.plan.planner import plan_capacity
from kvmap.plan.sim import EngineSettings, SimConfig, SimRequest, simulate
from kvmap.plan.sim.costmodel import StepLoad, causal_pairs, model_cost, step_cost
from kvmap.plan.sim.engine import SimState, Simulator
from kvmap.plan.sim.hardware import Hardware, TierHardware, gpu_hardware
from kvmap.plan.sim.workload import requests_from_spec
from kvmap.workloads.arrivals import ClosedLoop, Poisson
from kvmap.workloads.lengths import Fixed, LogNormal, Uniform
from kvmap.workloads.spec import WorkloadSpec

GiB = 2**30
MODEL = get_model("llama-3-8b")


def ideal_hardware(**fields) -> Hardware:
    """A device whose only cost is what ``fields`` give (the rest is effectively free)."""
    base = dict(name="ideal", memory_bytes=80 * GiB, compute_flops=1e30, memory_bandwidth=1e30,
                compute_efficiency=1.0, bandwidth_efficiency=1.0, step_overhead_s=0.0,
                layer_overhead_s=0.0, gpu_memory_utilization=1.0, reserve_bytes=0)
    return Hardware(**{**base, **fields})


def multi_turn(num_requests=64, seed=0, concurrency=12) -> WorkloadSpec:
    return WorkloadSpec("chat", "multi-turn", num_requests, prompt_len=LogNormal(300, 0.5),
                        output_len=LogNormal(60, 0.5), arrival=ClosedLoop(concurrency),
                        num_turns=4, seed=seed)


def tiered_config(**changes) -> SimConfig:
    """Llama-3-8B on an H100 with a small pool and small tiers: lots of tier traffic."""
    tiers = (TierHardware("host", 96 * 2**20 * 16, 50e9, 10e-6, link="pcie"),
             TierHardware("nvme", 256 * 2**20 * 16, 7e9, 80e-6, iops=5e5, io_bytes=131072,
                          link="nvme"))
    config = SimConfig(name="t", model=MODEL, hardware=gpu_hardware("h100-80gb"),
                       kv=KVConfig.parse("bf16"), workload=multi_turn(), tiers=tiers,
                       engine=EngineSettings(max_num_seqs=8, max_num_batched_tokens=2048,
                                             kv_memory_bytes=24 * 2**20 * 16))
    return replace(config, **changes)


# ---- conservation -------------------------------------------------------------------

@pytest.mark.parametrize("changes", [
    {},
    {"eviction": "lfu"},
    {"eviction": "arc", "prefetch": "queue"},
    {"prefetch": "queue"},
    {"kv": KVConfig.parse("int8")},
    {"kv": KVConfig.parse("streaming_llm(sinks=4, window=128)+int8")},
    {"engine": EngineSettings(max_num_seqs=8, max_num_batched_tokens=2048,
                              kv_memory_bytes=24 * 2**20 * 16, hbm_window_tokens=64),
     "tiers": (TierHardware("host", 8 * GiB, 50e9, 10e-6),)},
], ids=["lru", "lfu", "arc-prefetch", "lru-prefetch", "int8", "streaming", "offload"])
def test_conservation_of_requests_blocks_and_bytes(changes):
    config = tiered_config(**changes)
    requests = requests_from_spec(config.workload)
    sim = Simulator(config, requests)
    result = sim.run()
    # no request lost: every arrival finished or was counted rejected
    assert result.num_finished + result.num_rejected == len(requests) == result.num_requests
    assert result.num_finished > 0
    done = {st.req.request_id: st for st in sim.done}
    for st in done.values():
        assert len(st.token_times_s) == st.req.output_tokens
        assert st.token_times_s == sorted(st.token_times_s)
        assert st.first_scheduled_s >= st.arrival_s
    # every block given back; the store's own invariants hold
    assert sim.store.num_used == 0
    sim.store.check_integrity()
    # bytes in = bytes out + bytes resident, per tier
    for name, tier in result.tiers.items():
        assert tier["bytes_in"] - tier["bytes_out"] == tier["resident_bytes"], name
        assert tier["resident_bytes"] <= tier["capacity_bytes"]
    assert result.metrics["num_output_tokens"] == sum(st.req.output_tokens
                                                      for st in done.values())


def test_tiers_see_traffic_and_hits():
    result = simulate(tiered_config())
    host = result.tiers["host"]
    assert host["bytes_in"] > 0 and host["hits"] > 0
    assert 0 < host["hit_rate"] < 1
    assert result.metrics["num_cached_prompt_tokens"] > 0


def test_rejects_a_request_that_can_never_fit():
    config = tiered_config(workload=None)
    small = SimRequest("small", 100, 10, arrival_s=0.0)
    huge = SimRequest("huge", 20000, 10, arrival_s=0.0)    # > the 24-block pool
    result = simulate(config, [small, huge])
    assert (result.num_finished, result.num_rejected) == (1, 1)
    assert "huge" in result.rejections[0]


# ---- closed forms -------------------------------------------------------------------

def test_md1_mean_waiting_time():
    """A single-slot server (max_num_seqs=1) whose every request takes one step of a fixed
    D seconds, fed by Poisson arrivals: M/D/1, mean wait rho / (2 mu (1 - rho)), with rho
    from the sample's own arrival rate (20,000 arrivals at a nominal rho of 0.5)."""
    service_s = 0.01
    mu = 1 / service_s
    rng = np.random.default_rng(1)
    arrivals = np.cumsum(rng.exponential(1 / (0.5 * mu), size=20000))
    requests = [SimRequest(f"r{i}", 1, 1, arrival_s=float(t)) for i, t in enumerate(arrivals)]
    config = SimConfig(name="md1", model=MODEL, kv=KVConfig.parse("bf16"), workload=None,
                       hardware=ideal_hardware(step_overhead_s=service_s),
                       engine=EngineSettings(max_num_seqs=1, max_num_batched_tokens=16,
                                             kv_memory_bytes=2 * GiB))
    result = simulate(config, requests)
    rho = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0]) / mu
    expected_wait_s = rho / (2 * mu * (1 - rho))
    assert result.metrics["queue_s"]["mean"] == pytest.approx(expected_wait_s, rel=0.05)
    assert result.metrics["e2e_s"]["mean"] == pytest.approx(expected_wait_s + service_s,
                                                            rel=0.03)
    assert result.metrics["e2e_s"]["p50"] >= service_s


def test_bandwidth_bound_decode_step_is_bytes_over_bandwidth():
    bandwidth = 2e12
    hw = ideal_hardware(memory_bandwidth=bandwidth)
    mc = model_cost(MODEL, KVConfig.parse("bf16"), hw)
    kv_per_token = 2 * 32 * 8 * 128 * 2            # Llama-3-8B bf16: 131,072 B
    assert mc.kv_bytes_per_token_per_device == kv_per_token
    context = 1000
    load = StepLoad(num_tokens=1, num_sampled=1, attention_pairs=context + 1,
                    kv_read_tokens=context + 1, kv_write_tokens=1)
    cost = step_cost(mc, hw, load)
    expected = (mc.weight_bytes + (context + 2) * kv_per_token) / bandwidth
    assert cost.total_s == pytest.approx(expected, rel=1e-12)
    assert cost.bound == "hbm"

    # the simulator's TBT for one request is exactly that, step after step
    prompt, output = 1000, 5
    config = SimConfig(name="bw", model=MODEL, hardware=hw, kv=KVConfig.parse("bf16"),
                       workload=None, engine=EngineSettings(kv_memory_bytes=4 * GiB))
    result = simulate(config, [SimRequest("r", prompt, output, arrival_s=0.0)])
    gaps = [(mc.weight_bytes + (c + 2) * kv_per_token) / bandwidth
            for c in range(prompt, prompt + output - 1)]
    assert result.metrics["tbt_s"]["mean"] == pytest.approx(np.mean(gaps), rel=1e-9)
    assert result.metrics["tbt_s"]["max"] == pytest.approx(max(gaps), rel=1e-9)


def test_prefill_flops_match_the_engine_cost_model():
    hw = ideal_hardware()
    mc = model_cost(MODEL, KVConfig.parse("bf16"), hw)
    load = StepLoad(num_tokens=700, num_sampled=0, attention_pairs=causal_pairs(300, 1000),
                    kv_read_tokens=0, kv_write_tokens=0)
    assert step_cost(mc, hw, load).flops == pytest.approx(
        prefill_flops(MODEL.config, 300, 1000), rel=1e-12)


def test_tier_transfer_time_is_latency_plus_bandwidth_or_iops():
    tier = TierHardware("nvme", GiB, bandwidth=1e9, latency_s=1e-4, iops=1000, io_bytes=4096)
    # 2 blocks of 1 MiB: 2 MiB / 1 GB/s = 2.1 ms; 512 IOs / 1000 IOPS = 512 ms: IOPS bound
    assert tier.transfer_s(2, 2**20) == pytest.approx(1e-4 + 512 / 1000)
    fast = replace(tier, iops=1e9)
    assert fast.transfer_s(2, 2**20) == pytest.approx(1e-4 + 2 * 2**20 / 1e9)
    assert tier.transfer_s(0, 2**20) == 0.0


def test_pool_matches_the_planner():
    config = SimConfig(name="p", model=MODEL, hardware=gpu_hardware("h100-80gb"),
                       kv=KVConfig.parse("int8"), workload=None)
    sim = Simulator(config, [])
    plan = plan_capacity(MODEL, get_gpu("h100-80gb"), "int8", context_tokens=8192)
    assert sim.num_hbm_blocks == plan.num_blocks_per_gpu


# ---- determinism and findings ------------------------------------------------------------

def test_same_seed_same_result_other_seed_other_result():
    a = simulate(tiered_config()).to_dict()
    b = simulate(tiered_config()).to_dict()
    assert a == b
    c = simulate(tiered_config(workload=multi_turn(seed=1))).to_dict()
    assert c["metrics"] != a["metrics"]


def test_open_loop_arrivals_follow_the_workload():
    spec = WorkloadSpec("s", "synthetic", 50, prompt_len=Fixed(64), output_len=Fixed(8),
                        arrival=Poisson(5.0), seed=3)
    requests = requests_from_spec(spec)
    assert [r.arrival_s for r in requests] == sorted(r.arrival_s for r in requests)
    assert requests[-1].arrival_s == pytest.approx(50 / 5.0)
    config = SimConfig(name="o", model=MODEL, hardware=gpu_hardware("h100-80gb"),
                       kv=KVConfig.parse("bf16"), workload=spec)
    result = simulate(config)
    assert result.num_finished == 50
    assert result.metrics["ttft_s"]["p50"] < 0.1        # an idle H100: no queue


def test_int8_doubles_the_batch_when_kv_bounds_it():
    spec = WorkloadSpec("tp", "synthetic", 160, prompt_len=Uniform(768, 1280),
                        output_len=Uniform(96, 160), arrival=ClosedLoop(160))
    batch = {}
    for kv in ("bf16", "int8"):
        config = SimConfig(name=kv, model=get_model("llama-2-13b"),
                           hardware=gpu_hardware("a100-80gb"), kv=KVConfig.parse(kv),
                           workload=spec, engine=EngineSettings(max_num_seqs=512))
        batch[kv] = simulate(config).kv["max_running"]
    assert 1.8 < batch["int8"] / batch["bf16"] < 2.1


def test_prefetch_hides_tier_reads():
    config = tiered_config(workload=multi_turn(num_requests=96, concurrency=24))
    plain, ahead = simulate(config), simulate(replace(config, prefetch="queue"))
    stall = lambda r: sum(t["stall_s"] for t in r.tiers.values())  # noqa: E731
    assert ahead.prefetch["used"] > 0
    assert stall(ahead) < stall(plain)


def test_offload_window_bounds_hbm_and_streams_over_the_link():
    engine = EngineSettings(max_num_seqs=2, kv_memory_bytes=4 * GiB, hbm_window_tokens=512)
    config = SimConfig(name="w", model=MODEL, hardware=gpu_hardware("h100-80gb"),
                       kv=KVConfig.parse("bf16"), workload=None, engine=engine,
                       tiers=(TierHardware("host", 64 * GiB, 50e9, 10e-6),))
    result = simulate(config, [SimRequest("r", 8000, 20, arrival_s=0.0)])
    block = result.kv["kv_block_bytes_per_device"]
    assert result.kv["peak_hbm_kv_bytes_per_seq"] == (math.ceil(512 / 16) + 1) * block
    assert result.kv["peak_kv_bytes_per_seq"] == math.ceil(8019 / 16) * block
    assert result.tiers["host"]["bytes_streamed"] > 0
    assert "pcie" in result.time_s


def test_closed_loop_and_turn_order():
    config = tiered_config(workload=multi_turn(num_requests=48, concurrency=5))
    sim = Simulator(config, requests_from_spec(config.workload))
    sim.run()
    finished = {(st.req.conversation_id, st.req.turn): st for st in sim.done}
    for (conv, turn), st in finished.items():
        if turn:
            assert st.arrival_s >= finished[conv, turn - 1].finished_s
    events = sorted([(st.arrival_s, 1) for st in sim.done] + [(st.finished_s, -1)
                                                             for st in sim.done])
    in_flight = peak = 0
    for _, change in events:          # at equal times a departure sorts first
        in_flight += change
        peak = max(peak, in_flight)
    assert peak == 5


def test_generation_stops_at_the_model_context():
    config = tiered_config(workload=None, tiers=(),      # llama-3-8b: 8192 positions
                           engine=EngineSettings(kv_memory_bytes=4 * GiB))
    result = simulate(config, [SimRequest("r", 8000, 500, arrival_s=0.0)])
    assert result.num_finished == 1
    assert result.metrics["num_output_tokens"] == 192


def test_policy_residency_follows_the_engine_rule():
    """The simulator sizes a compressed sequence by ``Policy.resident_tokens``: a
    fractional budget is a fraction of the prompt, also once decoding has outgrown it
    (the engine fixes budgets at admission), and per-layer budgets on the shared table
    hold the largest (per-layer tables: ``test_capacity_layer_tables``)."""
    request = SimRequest("r", 1000, 600, arrival_s=0.0)
    for spec, at_prompt, at_end in [("snapkv(budget=0.25)", 250, 250),
                                    ("streaming_llm(sinks=4,window=128)", 132, 132),
                                    ("h2o(budget=40,layer_budgets=pyramid,layer_tables=shared)", 78, 78)]:
        config = tiered_config(kv=KVConfig.parse(spec), workload=None, tiers=())
        sim = Simulator(config, [request])
        state = SimState(request, arrival_s=0.0)
        assert sim._resident_tokens(state, 999) == 999              # prompt not in yet
        assert sim._resident_tokens(state, 1000) == at_prompt
        assert sim._resident_tokens(state, 1599) == at_end
        assert sim._total_blocks(state, 1599, True) == math.ceil(at_end / 16) + 1
