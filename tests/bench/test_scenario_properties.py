"""The properties the built-in scenarios rely on, computed from the scenario and the
model for *each* baseline dtype (fp32 where the CPU has no native bf16, bf16 where it
does), without running the engine: whichever class CI lands on, the pool binds where a
scenario says it binds, a window slides where it says it slides, and a quantized cache
holds more sequences than the baseline."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvmap.bench.scenario import load_scenario
from kvmap.bench.scenario_checks import sequences_at_once
from kvmap.model.loader import model_config_of

SCENARIOS = Path(__import__("kvmap.bench.scenarios", fromlist=["x"]).__file__).parent
BASELINES = ("fp32", "bf16")          # `auto` on the two machine classes


def _workload(name: str, workload: str, model: str = "smollm2"):
    scenario = load_scenario(SCENARIOS / f"{name}.yaml")
    found = [w for w in scenario.workloads if w.name == workload
             and (w.models is None or model in w.models)]
    assert found, (name, workload)
    return scenario, found[0]


def _at_once(scenario, w, spec: str, dtype: str) -> tuple[int, int]:
    config = model_config_of("smollm2", dtype)
    kv_memory = w.kv_memory if w.kv_memory is not None else scenario.engine.kv_memory
    return sequences_at_once(config, spec, kv_memory, scenario.engine.block_size, dtype,
                             int(w.options["prompt_len"]), int(w.options["output_len"]))


@pytest.mark.parametrize("dtype", BASELINES)
def test_quick_throughput_binds_for_either_baseline(dtype):
    scenario, w = _workload("quick", "throughput")
    concurrency = int(str(w.options["arrival"]).split(":")[1])
    base_prompts, base_requests = _at_once(scenario, w, dtype, dtype)
    int8_prompts, _ = _at_once(scenario, w, "int8", dtype)
    # the baseline's pool admits fewer prompts than are in flight: memory binds; int8
    # admits more of them than the baseline (the quick-run test's assertion)
    assert base_prompts < concurrency, (dtype, base_prompts)
    assert min(int8_prompts, concurrency) > base_prompts, (dtype, int8_prompts, base_prompts)


@pytest.mark.parametrize("dtype", BASELINES)
def test_default_s1_binds_for_either_baseline_at_the_smallest_probe(dtype):
    from kvmap.bench.budget import MIN_SEARCH_REQUESTS
    scenario, w = _workload("default", "s1-throughput")
    # the saturated probe runs min(num_requests, max_num_seqs) at once; the budget may
    # size num_requests down to its minimum
    in_flight = min(MIN_SEARCH_REQUESTS, scenario.engine.max_num_seqs)
    _, base = _at_once(scenario, w, dtype, dtype)
    _, int8 = _at_once(scenario, w, "int8", dtype)
    _, int4 = _at_once(scenario, w, "int4", dtype)
    assert base < in_flight, (dtype, base, in_flight)
    assert base < int8 < int4, (dtype, base, int8, int4)


@pytest.mark.parametrize("dtype", BASELINES)
def test_default_s2_holds_its_documents_for_either_baseline(dtype):
    # S2 is the long-context deployment, not a memory-bound one: the full cache must
    # hold the documents in flight, or the baseline could not serve it at all
    scenario, w = _workload("default", "s2-long-context")
    in_flight = int(str(w.options["arrival"]).split(":")[1])
    _, base = _at_once(scenario, w, dtype, dtype)
    assert base >= in_flight, (dtype, base, in_flight)


@pytest.mark.parametrize("name", ["quick", "default"])
def test_gemma_ppl_windows_pass_its_sliding_window(name):
    scenario = load_scenario(SCENARIOS / f"{name}.yaml")
    window = model_config_of("gemma3-270m", "fp32").sliding_window
    tasks = [t for t in scenario.tasks if t.models and "gemma3-270m" in t.models
             and t.task == "ppl"]
    assert tasks and window
    for t in tasks:
        assert t.params["context_tokens"] > window, (t.name, window)
