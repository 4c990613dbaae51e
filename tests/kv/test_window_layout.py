"""``all_global``, the window-layout part of a KV spec (``kvmap.kv.window_layout``): a
hybrid model's sliding layers keep their whole history (attention still masked to the
window), the reference the hybrid saving is measured against. Parsing, the planner's
agreement with ``kvmap plan --all-global``, and the engine's bytes per layer kind."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvmap import SamplingParams
from kvmap.evals.kv_peak import track_peak_kv_bytes
from kvmap.kv.config import KVConfig, spec_names
from kvmap.kv.layer_kinds import LayerKindPeak
from tests.conftest import make_tiny_llm, random_prompts

FIXTURES = Path(__file__).parents[1] / "plan" / "fixtures" / "hf"


def test_parses_beside_every_other_part():
    kv = KVConfig.parse("snapkv(budget=0.2)+int8+all_global")
    assert kv.window_layout.name == "all_global" and kv.codec.name == "int8"
    assert KVConfig.parse("int8").window_layout is None
    assert "all_global" in spec_names()["window layout"]
    with pytest.raises(ValueError, match="has no option 'window'"):
        KVConfig.parse("all_global(window=4)")
    with pytest.raises(ValueError, match="two window layout parts"):
        KVConfig.parse("all_global+all_global")


def test_the_planner_counts_it_as_plan_all_global():
    from kvmap.plan.catalogue import get_gpu, get_model
    from kvmap.plan.planner import plan_capacity
    gemma, gpu = get_model(str(FIXTURES / "gemma-3-27b-it")), get_gpu("h100-80gb")
    spec = plan_capacity(gemma, gpu, "bf16+all_global", context_tokens=32768)
    flat = plan_capacity(gemma.all_global(), gpu, "bf16", context_tokens=32768)
    hybrid = plan_capacity(gemma, gpu, "bf16", context_tokens=32768)
    assert spec.kv_bytes_per_seq == flat.kv_bytes_per_seq > 4 * hybrid.kv_bytes_per_seq
    assert spec.layer_tables == "shared" and hybrid.layer_tables == "per-layer"
    assert any("all_global layout keeps every layer's whole context" in n for n in spec.notes)


def _peak(kv: str, prompt: list[int]):
    llm = make_tiny_llm(model="dummy:tiny-hybrid", kv=kv, block_size=4,
                        max_num_batched_tokens=16)
    with track_peak_kv_bytes(llm.engine) as peak, LayerKindPeak(llm.engine.kv) as kinds:
        out = llm.generate([prompt], SamplingParams(max_tokens=3, ignore_eos=True))
    return llm, peak[0], kinds.by_kind, out[0].token_ids


def test_sliding_layers_keep_everything_and_the_saving_is_measured():
    """A 100-token prompt, block size 4, window 8 on layers 0 and 2: all_global holds
    every block in all three layers (the shared table: 2 sliding layers = 2 x the
    global one), the default layout the window only; same global bytes, same tokens."""
    prompt = random_prompts([100], seed=3)[0]
    flat_llm, flat_peak, flat, flat_ids = _peak("fp32+all_global", prompt)
    hyb_llm, hyb_peak, hybrid, hyb_ids = _peak("fp32", prompt)
    assert not flat_llm.engine.kv.per_layer_tables and hyb_llm.engine.kv.per_layer_tables
    assert flat_ids == hyb_ids
    block = flat_llm.engine.kv.layer_block_bytes
    assert sum(flat.values()) == flat_peak and sum(hybrid.values()) == hyb_peak
    assert flat["sliding"] == 2 * flat["global"] == 2 * 26 * block     # 103 slots / 4
    assert hybrid["sliding"] < flat["sliding"] / 4
    assert flat_peak / hyb_peak > 2


def test_a_model_without_sliding_layers_is_unchanged():
    llm = make_tiny_llm(kv="fp32+all_global", block_size=4)
    assert llm.engine.kv.usage().layer_kinds == {}
