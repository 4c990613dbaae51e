"""Planner sizing with per-layer block tables (``layer_budgets``): a sequence holds the sum
over layers of each layer's blocks, not the largest layer's share times every layer."""
from __future__ import annotations

import math

from kvmap.kv.config import KVConfig
from kvmap.plan import capacity
from kvmap.plan.catalogue import get_gpu, get_model
from kvmap.plan.planner import plan_capacity
from kvmap.plan.sim import EngineSettings, SimConfig, SimRequest
from kvmap.plan.sim.engine import SimState, Simulator
from kvmap.plan.sim.hardware import gpu_hardware

PYRAMID = "h2o(budget=512,layer_budgets=pyramid)"
# benchmarks/layer_budgets_memory.py, docs/combinations.md: SmolLM2-135M, bf16 KV, a
# 2,048-token prompt compressed by PYRAMID with per-layer tables held 12,324,864 bytes
MEASURED_BYTES = 12_324_864
LAYER_BLOCK_BYTES = 16 * 2 * 3 * 64 * 2         # one layer, 16 tokens, 3 KV heads of 64, bf16


def plan(kv: str, **kwargs):
    return plan_capacity(get_model("smollm2-135m"), get_gpu("h100-80gb"), kv,
                         context_tokens=2048, **kwargs)


def test_per_layer_tables_are_decided_as_the_engine_decides():
    model = get_model("smollm2-135m").config
    for spec, want in [(PYRAMID, True), ("h2o(budget=512)", False),
                       (PYRAMID[:-1] + ",layer_tables=shared)", False),
                       (PYRAMID + "+kivi(group_size=16)", False)]:       # staging rows
        assert capacity.per_layer_tables(KVConfig.parse(spec), model, 16, False) is want, spec
    assert not capacity.per_layer_tables(KVConfig.parse(PYRAMID), model, 16, True)  # tiers


def test_planner_gives_the_measured_pyramid_bytes():
    p = plan(PYRAMID)
    assert p.layer_tables == "per-layer"
    assert p.layer_blocks_per_seq * LAYER_BLOCK_BYTES == MEASURED_BYTES
    assert p.kv_bytes_per_seq == MEASURED_BYTES
    assert p.blocks_per_seq == math.ceil(p.layer_blocks_per_seq / 30)
    assert p.max_concurrent_seqs == p.num_blocks_per_gpu * 30 // p.layer_blocks_per_seq
    # the shared table holds the largest layer's 998 slots in every layer, as before
    shared = plan(PYRAMID[:-1] + ",layer_tables=shared)")
    assert shared.layer_tables == "shared" and shared.layer_blocks_per_seq is None
    assert shared.kv_bytes_per_seq == (math.ceil(998 / 16) + 1) * 30 * LAYER_BLOCK_BYTES
    assert p.max_concurrent_seqs > 1.8 * shared.max_concurrent_seqs


def test_layer_blocks_formula_and_untouched_sequences():
    policy = KVConfig.parse(PYRAMID).policy
    budgets = policy.layer_budget_tokens(2048, 30)
    top = max(budgets)
    want = sum(math.ceil(top / 16) - max(0, top // 16 - math.ceil(b / 16)) for b in budgets)
    assert capacity.resident_layer_blocks(2048, 16, policy, num_layers=30) == want
    # no longer than the largest budget: never compressed, every layer holds every block
    assert capacity.resident_layer_blocks(900, 16, policy, num_layers=30) == 30 * 57
    # decoding past a fraction budget: the prompt fixes the budgets
    quarter = KVConfig.parse("snapkv(budget=0.25,layer_budgets=pyramid)").policy
    assert capacity.resident_layer_blocks(2100, 16, quarter, num_layers=30,
                                          num_prompt_tokens=2000) == \
        capacity.resident_layer_blocks(2000, 16, quarter, num_layers=30)


def test_max_context_counts_layer_blocks():
    policy = KVConfig.parse("h2o(budget=0.25,layer_budgets=pyramid)").policy
    got = capacity.max_context_tokens(100, 2, 16, policy, num_layers=30, per_layer_tables=True)
    assert 2 * capacity.resident_layer_blocks(got, 16, policy, num_layers=30) <= 100 * 30
    assert 2 * capacity.resident_layer_blocks(got + 1, 16, policy, num_layers=30) > 100 * 30
    shared = capacity.max_context_tokens(100, 2, 16, policy, num_layers=30)
    assert got > shared


def test_simulator_sizes_per_layer_tables_by_layer_blocks():
    """The simulator's pool is in groups (one block of every layer): a per-layer sequence
    holds its layer blocks rounded up to groups, plus one for decode growth."""
    config = SimConfig(name="p", model=get_model("smollm2-135m"),
                       hardware=gpu_hardware("h100-80gb"), kv=KVConfig.parse(PYRAMID),
                       workload=None, engine=EngineSettings())
    request = SimRequest("r", 2048, 8, arrival_s=0.0)
    sim = Simulator(config, [request])
    assert sim.per_layer and not sim.keyed
    state = SimState(request, arrival_s=0.0)
    assert sim._total_blocks(state, 2048, True) == math.ceil(MEASURED_BYTES / LAYER_BLOCK_BYTES
                                                             / 30) + 1
    assert sim._total_blocks(state, 2048, False) == 2048 // 16
    assert Simulator(config, [request]).run().num_finished == 1
