"""The simulator on this machine's hardware profile, the KV configuration's own costs in
the step, the labels and the errors: hand-made profiles and costs, no measurement."""
from __future__ import annotations

import pytest

from kvmap.kv.config import KVConfig
from kvmap.plan.catalogue import get_model
from kvmap.plan.sim import EngineSettings, SimConfig, SimRequest, simulate
from kvmap.plan.sim.costmodel import StepLoad, model_cost, step_cost
from kvmap.plan.sim.hardware import Hardware, gpu_hardware
from kvmap.plan.sim.kvcost import KVCosts, bytes_only
from kvmap.plan.sim.machine import MissingRate, hardware_from_rates
from kvmap.plan.sim.predict import ridge_num_seqs
from kvmap.plan.sim.scenario import ScenarioError, parse_hardware, parse_sim_scenario

MODEL = get_model("smollm2-135m")
OVERHEADS = {"step_overhead_s": 1e-3, "layer_overhead_s": 2e-5, "seq_overhead_s": 0.0,
             "seq_layer_overhead_s": 0.0}
RATES = {"matmul_curve": {"fp32": {"1": 2e9, "4": 1e10, "16": 4e10, "64": 1e11, "256": 9e10,
                                   "512": 1e11}},
         "matmul_flops": {"fp32": {"prefill": 1e11, "decode": 5e9}}}


def machine(rates=RATES) -> Hardware:
    return hardware_from_rates(rates, "fp32", memory_bytes=2**34, overheads=OVERHEADS)


def test_hardware_is_the_profile_rates():
    hw = machine()
    assert hw.compute_flops == 1e11 and hw.compute_dtype == "fp32"
    # the weight stream: a one-row product's FLOP/s / 2 x 4 bytes per fp32 weight
    assert hw.memory_bandwidth == pytest.approx(5e9 / 2 * 4)
    # the curve is each row count's share of the peak, never falling (256 rows' dip is load)
    assert dict(hw.compute_curve) == {1: 0.02, 4: 0.1, 16: 0.4, 64: 1.0, 256: 1.0, 512: 1.0}
    assert hw.step_overhead_s == 1e-3 and hw.source == "measured"
    assert "spec sheet" not in hw.label


@pytest.mark.parametrize("drop, named", [
    ("matmul_curve", "matmul_curve.fp32"),
    ("matmul_flops", "matmul_flops.fp32.decode")])
def test_a_missing_rate_is_named_with_how_to_measure_it(drop, named):
    rates = {k: v for k, v in RATES.items() if k != drop}
    with pytest.raises(MissingRate) as e:
        machine(rates)
    assert named in str(e.value) and "kvmap hw --refresh" in str(e.value)
    with pytest.raises(MissingRate, match="kvmap hw --refresh"):
        machine(None)


def test_gpu_profiles_are_labelled_spec_sheet_and_unknown_names_say_how():
    hw = gpu_hardware("h100-80gb")
    assert hw.is_spec_sheet and "spec sheet x assumed efficiency" in hw.label
    with pytest.raises(ValueError) as e:
        parse_hardware({"gpu": "b300"})
    message = str(e.value)
    assert "'b300'" in message and "h100-80gb" in message and "a100-80gb" in message
    assert "cpu-this-machine" in message and "memory_bandwidth" in message


def test_codec_costs_are_charged_per_token_and_bound_the_attention():
    hw = machine()
    kv = KVConfig.parse("int4")
    costs = KVCosts("int4", read_s=1e-7, prefill_read_s=5e-8, write_s=2e-7, step_s=1e-4,
                    seq_s=1e-5)
    plain = model_cost(MODEL, kv, hw, weights="fp32")
    charged = model_cost(MODEL, kv, hw, weights="fp32", kv_costs=costs)
    load = StepLoad(num_tokens=8, num_sampled=8, attention_pairs=8 * 500, kv_read_tokens=4000,
                    kv_write_tokens=8, num_seqs=8, num_decode=8, decode_read_tokens=4000)
    a, b = step_cost(plain, hw, load), step_cost(charged, hw, load)
    layers = MODEL.config.num_layers
    codec_s = layers * (1e-7 * 4000 + 2e-7 * 8)
    assert b.kv_codec_s == pytest.approx(codec_s) and a.kv_codec_s == 0
    assert b.overhead_s - a.overhead_s == pytest.approx(layers * (1e-4 + 8 * 1e-5))
    # the attention's bytes and FLOPs are no longer charged: the codec's operators bound it
    attention_a = a.compute_s + a.hbm_s - b.compute_s - b.hbm_s
    assert b.total_s - a.total_s == pytest.approx(codec_s - attention_a + layers * 1.8e-4)
    assert bytes_only("int4").charges is False
    assert model_cost(MODEL, kv, hw, kv_costs=bytes_only("int4")).kv_costs is None


def test_a_layers_own_elementwise_work_is_charged_per_token_and_prefill_pair():
    hw = machine()
    kv = KVConfig.parse("fp32")
    costs = KVCosts("fp32", activation_s=2e-6, pair_s=1e-9)
    plain = model_cost(MODEL, kv, hw, weights="fp32")
    charged = model_cost(MODEL, kv, hw, weights="fp32", kv_costs=costs)
    # a 256-token chunk from scratch beside 4 decode rows of 100 cached tokens
    pairs = 256 * 257 // 2
    load = StepLoad(num_tokens=260, num_sampled=5, attention_pairs=pairs + 4 * 101,
                    kv_read_tokens=256 + 4 * 101, kv_write_tokens=260, num_seqs=5,
                    num_decode=4, decode_read_tokens=4 * 101)
    a, b = step_cost(plain, hw, load), step_cost(charged, hw, load)
    assert b.overhead_s - a.overhead_s == pytest.approx(
        MODEL.config.num_layers * (2e-6 * 260 + 1e-9 * pairs))


def test_a_slower_codec_read_lowers_the_simulated_throughput():
    hw = machine()
    reqs = [SimRequest(f"r{i}", 200, 32, arrival_s=0.0) for i in range(16)]
    engine = EngineSettings(kv_memory_bytes=64 * 2**20, max_num_batched_tokens=512)

    def rate(costs):
        config = SimConfig(name="c", model=MODEL, hardware=hw, kv=KVConfig.parse("int4"),
                           workload=None, weights="fp32", engine=engine, kv_costs=costs)
        return simulate(config, reqs)
    free, slow = rate(None), rate(KVCosts("int4", read_s=2e-6, prefill_read_s=1e-6))
    assert slow.metrics["output_tokens_per_s"] < 0.8 * free.metrics["output_tokens_per_s"]
    assert slow.time_s["kv_codec"] > 0 and free.time_s.get("kv_codec", 0) == 0


def test_scenario_kv_costs_by_hand_and_bad_ones():
    data = {"model": "smollm2-135m", "hardware": {"gpu": "h100-80gb"}, "kv": "int8",
            "workload": {"preset": "throughput", "num_requests": 4},
            "kv_costs": {"read": "2ns", "write": "5ns", "step": "20us"}}
    (config,) = parse_sim_scenario(data, "t.yaml").configs
    assert (config.kv_costs.read_s, config.kv_costs.write_s, config.kv_costs.step_s) == \
        pytest.approx((2e-9, 5e-9, 2e-5))
    data["kv_costs"] = {"reed": "2ns"}
    with pytest.raises(ScenarioError, match="kv_costs: unknown key.*'reed'"):
        parse_sim_scenario(data, "t.yaml")
    with pytest.raises(ValueError, match="read_s=-1"):
        KVCosts("x", read_s=-1)


def test_ridge_is_where_the_products_at_peak_outrun_the_weight_stream():
    hw = machine()
    mc = model_cost(MODEL, KVConfig.parse("fp32"), hw, weights="fp32")
    n = ridge_num_seqs(mc, hw)
    read_s = mc.weight_bytes / hw.memory_bandwidth

    def compute_s(k):
        return k * (mc.dense_flops_per_token + mc.lm_head_flops) / hw.compute_flops
    assert compute_s(n) >= read_s > compute_s(n - 1)


def test_this_machine_is_timed_by_the_calibration_of_its_class(tmp_path, monkeypatch):
    """The simulator's step on this machine is ``kvmap.perf``'s: the calibration record
    the budget estimate uses, no probe of its own."""
    from types import SimpleNamespace

    from kvmap.perf.calibration import calibration_for
    from kvmap.perf.roofline import step_time
    from kvmap.plan.sim import machine
    monkeypatch.setenv("KVMAP_CACHE_DIR", str(tmp_path))
    profile = SimpleNamespace(fingerprint="f1", machine_class="x86-test",
                              rates={**RATES, "measured_at": "t0"},
                              cpu=SimpleNamespace(num_threads=2, model_name="test cpu"),
                              auto_dtype=lambda device: "fp32")
    monkeypatch.setattr(machine, "_profile", lambda threads, refresh=False: profile)
    hw = machine.this_machine("auto", 2)
    assert hw.compute_dtype == "fp32" and "x86-test" in hw.label
    cal = calibration_for(profile, "fp32")        # the record the estimate reads
    assert hw.calibration == cal and cal.source in hw.label
    mc = model_cost(MODEL, KVConfig.parse("int8"), hw, weights="fp32")
    load = StepLoad(num_tokens=5, num_sampled=5, attention_pairs=400, kv_read_tokens=400,
                    kv_write_tokens=5, num_seqs=5, num_decode=5, decode_read_tokens=400)
    want = step_time(mc.perf.shape, mc.perf.rates, "int8", cal, prefill_tokens=0,
                     prefill_pairs=0, decode_tokens=5, decode_pairs=400)
    assert step_cost(mc, hw, load).total_s == pytest.approx(want.total_s)
    base = step_time(mc.perf.shape, mc.perf.rates, "fp32", cal, prefill_tokens=0,
                     prefill_pairs=0, decode_tokens=5, decode_pairs=400).total_s
    # the codec's measured factor moves the step its way: above 1 on the classes where
    # int8's decode was slower than the full cache, below 1 where it was faster (the
    # x86-avx2 fit, which a class without its own fit may borrow)
    factor = cal.decode_factor_of("int8")
    assert (want.total_s - base) * (factor - 1.0) > 0, (factor, want, base)
