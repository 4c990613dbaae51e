"""A hybrid model's resident KV (Gemma 3 270M: 15 sliding layers of a 512-token window,
3 global layers) counted per layer, the same in the planner, the simulator and the
engine's own arithmetic: at 8,192 tokens and block size 16,

    3 global layers x 512 blocks + 15 sliding layers x 32 blocks = 2,016 layer blocks

of one layer's block (16 tokens x K and V x 1 KV head x 256 x 2 bytes in bf16 = 16 KiB).
The engine itself is checked against the same formula at 8k in
``tests/engine/test_hybrid_8k.py`` (slow) and step by step in ``test_hybrid.py``."""
from __future__ import annotations

from kvmap.kv.config import KVConfig
from kvmap.kv.spec import KVGeometry, layer_resident_blocks, sequence_layer_blocks
from kvmap.plan import capacity
from kvmap.plan.catalogue import get_gpu, get_model
from kvmap.plan.planner import plan_capacity
from kvmap.plan.sim import EngineSettings, SimConfig, SimRequest
from kvmap.plan.sim.engine import Simulator
from kvmap.plan.sim.hardware import gpu_hardware

MODEL = get_model("gemma3-270m")
CONTEXT = 8192
LAYER_BLOCK_BYTES = 16 * 2 * 1 * 256 * 2          # bf16, one layer's block of 16 tokens


def test_the_per_layer_formula():
    geom = KVGeometry.of(MODEL.config, 16)
    assert geom.sliding_layers == tuple(i for i in range(18) if (i + 1) % 6)
    assert geom.global_layers == (5, 11, 17)
    assert layer_resident_blocks(CONTEXT, 16, None) == 512
    assert layer_resident_blocks(CONTEXT, 16, 512) == 32          # slots 7681.. -> block 480
    assert layer_resident_blocks(CONTEXT - 2, 16, 512) == 33      # an unaligned window
    assert layer_resident_blocks(300, 16, 512) == 19              # shorter than the window
    assert sequence_layer_blocks(CONTEXT, geom) == 3 * 512 + 15 * 32 == 2016
    assert capacity.hybrid_layer_blocks(CONTEXT, 16, None, geom.windows) == 2016


def test_planner_sizes_the_hybrid_sequence_per_layer():
    plan = plan_capacity(MODEL, get_gpu("h100-80gb"), "bf16", context_tokens=CONTEXT)
    assert plan.layer_tables == "per-layer"
    assert plan.layer_blocks_per_seq == 2016
    assert plan.kv_bytes_per_seq == 2016 * LAYER_BLOCK_BYTES
    assert plan.kv_bytes_per_token == 18 * LAYER_BLOCK_BYTES / 16       # all layers
    kinds = plan.layer_kinds
    assert kinds["global"]["kv_bytes_per_seq"] == 3 * 512 * LAYER_BLOCK_BYTES
    assert kinds["sliding"]["kv_bytes_per_seq"] == 15 * 32 * LAYER_BLOCK_BYTES
    assert kinds["sliding"]["bytes_per_token"] == 15 * LAYER_BLOCK_BYTES / 16
    # a planner that multiplied bytes per token by the context would say 4.5x as much
    naive = plan.kv_bytes_per_token * CONTEXT
    assert naive / plan.kv_bytes_per_seq > 4.5
    int8 = plan_capacity(MODEL, get_gpu("h100-80gb"), "int8", context_tokens=CONTEXT)
    assert int8.layer_blocks_per_seq == 2016 and int8.kv_bytes_per_seq < plan.kv_bytes_per_seq


def test_planner_says_what_a_policy_leaves_alone():
    plan = plan_capacity(MODEL, get_gpu("h100-80gb"), "streaming_llm(budget=1024,sinks=4)",
                         context_tokens=CONTEXT)
    text = " ".join(plan.notes)
    assert "only; it leaves the sliding layers 0-4, 6-10, 12-16 alone" in text
    assert "global layers 5, 11, 17" in text
    # the sliding layers hold their window whatever the policy: no saving counted there
    full = plan_capacity(MODEL, get_gpu("h100-80gb"), "bf16", context_tokens=CONTEXT)
    assert plan.layer_kinds["sliding"]["kv_bytes_per_seq"] == \
        full.layer_kinds["sliding"]["kv_bytes_per_seq"]
    assert plan.layer_kinds["global"]["kv_bytes_per_seq"] < \
        full.layer_kinds["global"]["kv_bytes_per_seq"]


def test_shared_table_keeps_sliding_layers_whole_and_says_so():
    plan = plan_capacity(MODEL, get_gpu("h100-80gb"), "kivi(bits=4)", context_tokens=CONTEXT)
    assert plan.layer_tables == "shared"
    assert any("keep their whole context resident" in n for n in plan.notes)
    assert plan.blocks_per_seq == 512


def test_simulator_holds_the_same_bytes_at_8k():
    config = SimConfig(name="hybrid", model=MODEL, hardware=gpu_hardware("h100-80gb"),
                       kv=KVConfig.parse("bf16"), workload=None,
                       engine=EngineSettings(max_num_seqs=4, max_num_batched_tokens=512))
    sim = Simulator(config, [SimRequest("r0", CONTEXT - 1, 2)])
    result = sim.run()
    assert result.num_finished == 1
    # the last step computed token 8,192 (8,191 prompt + 1 output fed back)
    assert result.kv["peak_layer_kv_bytes_per_seq"] == 2016 * LAYER_BLOCK_BYTES
    plan = plan_capacity(MODEL, get_gpu("h100-80gb"), "bf16", context_tokens=CONTEXT)
    assert result.kv["peak_layer_kv_bytes_per_seq"] == plan.kv_bytes_per_seq
