"""Resident KV of a hybrid sequence at 8,192 tokens, in the engine, equals the per-layer
formula and the planner's figure. Random weights of Gemma 3 270M's shape cut to its
first six layers (five sliding, one global) and a 1,024-token vocabulary, so the
8k-token prefill stays short. Marked slow (about a minute on 2 cores)."""
from __future__ import annotations

import pytest

from kvmap import LLM, SamplingParams
from kvmap.kv.spec import layer_resident_blocks, sequence_layer_blocks
from kvmap.plan.catalogue import PlanModel, get_gpu
from kvmap.plan.planner import plan_capacity

pytestmark = pytest.mark.slow
CONTEXT = 8192


def test_resident_kv_at_8k_equals_the_per_layer_formula_and_the_planner():
    llm = LLM(model="dummy:gemma3-270m?layers=6&vocab=1024", dtype="fp32", kv="bf16",
              kv_memory="48MiB", max_num_batched_tokens=1024, device="cpu")
    eng = llm.engine
    assert eng.kv.per_layer_tables and eng.geom.sliding_layers == (0, 1, 2, 3, 4)
    req = eng.add_request([i % 1000 for i in range(CONTEXT - 1)],
                          SamplingParams(max_tokens=3, ignore_eos=True))
    while req.num_kv_slots < CONTEXT:
        eng.step()
        eng.check_integrity()
        want = [layer_resident_blocks(req.num_kv_slots, 16, w) for w in eng.geom.windows]
        assert eng.kv.pool.layer_blocks_in_use() == want
    resident = eng.kv.usage().resident_bytes
    assert resident == sequence_layer_blocks(CONTEXT, eng.geom) * eng.kv.layer_block_bytes
    assert resident == (512 + 5 * 32) * 16 * 2 * 256 * 2
    plan = plan_capacity(PlanModel(llm.model_config), get_gpu("h100-80gb"), "bf16",
                         context_tokens=CONTEXT)
    assert plan.kv_bytes_per_seq == resident
