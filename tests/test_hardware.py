"""The hardware profile: the machine's class, `dtype: auto` forced each way, the cache that
is never trusted when corrupt or foreign, and explicit dtypes kept, warned or refused."""
from __future__ import annotations

import json
import warnings
from dataclasses import replace

import pytest
import torch

from kvmap import hardware
from kvmap.hardware import dtype as hw_dtype
from kvmap.hardware import probes
from kvmap.hardware.profile import CUDAInfo

FAKE_RATES = {"num_threads": 2, "shape_in_out": [576, 1536], "prefill_rows": 512,
              "matmul_flops": {"fp32": {"prefill": 2e11, "decode": 1e10},
                               "bf16": {"prefill": 5e10, "decode": 1.4e10}},
              "weight_kernels": {"int8": {"fp32": {"prefill": 3e9, "decode": 3e9},
                                          "bf16": {"prefill": 1e11, "decode": 2.4e10}},
                                 "int4": {"fp32": {"prefill": 2e9, "decode": 2e9},
                                          "bf16": {"prefill": 1.3e11, "decode": 5e10}}},
              "read_bandwidth_bytes_per_s": 2.4e10, "measured_s": 0.0,
              "probe_version": 2,
              "matmul_curve": {"fp32": {"1": 5e9, "16": 8e10, "512": 2e11},
                               "bf16": {"1": 2e9, "16": 2e10, "512": 5e10}}}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache directory and a measurement that takes no time (counted)."""
    monkeypatch.setenv("KVMAP_CACHE_DIR", str(tmp_path))
    calls = []

    def fake(hw, device="cpu"):
        calls.append(hw.fingerprint)
        return dict(FAKE_RATES)
    monkeypatch.setattr(probes, "measure_rates", fake)
    return calls


@pytest.mark.parametrize("forced, want", [("0", "fp32"), ("1", "bf16")])
def test_auto_is_fp32_without_native_bf16_and_bf16_with_it(monkeypatch, forced, want):
    monkeypatch.setenv("KVMAP_NATIVE_BF16", forced)
    hw = hardware.detect()
    assert hw.native_bf16 is (forced == "1") and hw.forced
    assert hw.auto_dtype("cpu") == want
    assert hardware.resolve_dtype("auto", "cpu") == want
    assert hw.summary()["auto_dtype_cpu"] == want
    # a native-bf16 class: "-bf16" (Zen 4 and the like) or AMX (Sapphire Rapids on)
    native_class = hw.machine_class.endswith("-bf16") or hw.machine_class == "x86-amx"
    assert native_class is (forced == "1")


def test_the_isa_decides_native_bf16_when_not_forced(monkeypatch):
    monkeypatch.delenv("KVMAP_NATIVE_BF16", raising=False)
    hw = hardware.detect()
    flags = set(hw.cpu.flags)
    if hw.cpu.arch == "x86_64":
        expected = bool({"avx512_bf16", "amx_bf16"} & flags) \
            and hw.cpu.torch_capability == "AVX512" and hw.cpu.onednn_max_isa is None
        assert hw.native_bf16 is expected
    assert not hw.forced
    # a lowered oneDNN ISA takes native bf16 away, whatever the flags say
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert hardware.detect().native_bf16 is False


def test_bad_force_and_bad_dtype_name_the_value():
    with pytest.raises(ValueError, match="'bogus'.*auto"):
        hardware.resolve_dtype("bogus")
    from kvmap.config import EngineArgs
    with pytest.raises(ValueError, match="'fp64'.*auto"):
        EngineArgs(dtype="fp64")


def test_bad_force_value_is_refused(monkeypatch):
    monkeypatch.setenv("KVMAP_NATIVE_BF16", "yes")
    with pytest.raises(ValueError, match="KVMAP_NATIVE_BF16='yes'"):
        hardware.detect()


def test_a_dtype_the_device_cannot_run_is_refused_naming_device_and_choices():
    hw = replace(hardware.detect(), cuda=(CUDAInfo("Tesla T4", (7, 5), 16 * 2**30),))
    assert hw.auto_dtype("cuda") == "fp16"
    with pytest.raises(ValueError, match=r"dtype='bf16' cannot run on device='cuda' "
                                         r"\(Tesla T4\).*fp32, fp16, auto"):
        hardware.resolve_dtype("bf16", "cuda", hw)
    with pytest.raises(ValueError, match="device='tpu'"):
        hardware.resolve_dtype("fp32", "tpu", hw)


def test_explicit_bf16_without_native_bf16_warns_once_with_the_ratio(monkeypatch):
    monkeypatch.setattr(hw_dtype, "_WARNED", set())
    hw = replace(hardware.detect(), native_bf16=False, rates=dict(FAKE_RATES))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert hardware.resolve_dtype("bf16", "cpu", hw) == "bf16"
        assert hardware.resolve_dtype("bfloat16", "cpu", hw) == "bf16"
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "4.0x slower than fp32" in messages[0]
    native = replace(hw, native_bf16=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        monkeypatch.setattr(hw_dtype, "_WARNED", set())
        assert hardware.resolve_dtype("bf16", "cpu", native) == "bf16"
        assert hardware.resolve_dtype("fp32", "cpu", hw) == "fp32"


def test_rates_are_measured_once_then_read_from_the_cache(cache):
    first = hardware.profile()
    assert first.rates["matmul_flops"] == FAKE_RATES["matmul_flops"] and len(cache) == 1
    again = hardware.profile()
    assert again.rates == first.rates and len(cache) == 1
    hardware.profile(refresh=True)
    assert len(cache) == 2


def test_a_cache_of_older_probes_is_measured_again(cache):
    """A profile cached before the compute curve existed lacks a rate the simulator
    reads: it is measured again rather than read."""
    hw = hardware.detect()
    old = replace(hw, rates={k: v for k, v in FAKE_RATES.items()
                             if k not in ("probe_version", "matmul_curve")})
    path = hardware.cache_dir() / "hardware" / f"{hw.fingerprint}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(old.to_dict()))
    assert hardware.load_cached(hw) is None
    assert "matmul_curve" in hardware.profile().rates and len(cache) == 1


def test_a_corrupt_or_foreign_cache_is_ignored_and_measured_again(cache):
    hw = hardware.detect()
    path = hardware.cache_dir() / "hardware" / f"{hw.fingerprint}.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert hardware.profile().rates is not None and len(cache) == 1
    # another machine's profile under this machine's name: its fingerprint does not match
    data = json.loads(path.read_text())
    data["cpu"]["model_name"] = "Some Other CPU"
    data["rates"]["read_bandwidth_bytes_per_s"] = 1.0
    path.write_text(json.dumps(data))
    assert hardware.load_cached(hw) is None
    assert hardware.profile().rates["read_bandwidth_bytes_per_s"] == 2.4e10
    assert len(cache) == 2
    # an edited rate with the old fingerprint kept is a foreign file too
    data = json.loads(path.read_text())
    data["native_bf16"] = not data["native_bf16"]
    path.write_text(json.dumps(data))
    assert hardware.load_cached(hw) is None


@pytest.mark.parametrize("forced, want", [("0", "fp32"), ("1", "bf16")])
def test_llm_runs_the_auto_dtype_and_its_own_cache(monkeypatch, forced, want):
    monkeypatch.setenv("KVMAP_NATIVE_BF16", forced)
    from kvmap import LLM
    llm = LLM(model="dummy:tiny", num_blocks=32, block_size=4, device="cpu")
    assert llm.config.dtype == want and llm.engine.model.dtype == getattr(
        torch, {"fp32": "float32", "bf16": "bfloat16"}[want])
    assert llm.engine.kv_config.codec.name == want
    policy_only = LLM(model="dummy:tiny", num_blocks=32, block_size=4, device="cpu",
                      kv="window(size=8)")
    assert policy_only.engine.kv_config.codec.name == want
    explicit = LLM(model="dummy:tiny", dtype="fp32", kv="bf16", num_blocks=32, block_size=4,
                   device="cpu")
    assert explicit.config.dtype == "fp32" and explicit.engine.kv_config.codec.name == "bf16"


def test_kv_auto_is_the_compute_dtypes_cache_and_takes_no_options():
    from kvmap.kv.config import KVConfig
    assert KVConfig.parse("auto", "fp32").codec.name == "fp32"
    assert KVConfig.parse("auto", "bf16").codec.name == "bf16"
    assert KVConfig.parse("h2o(budget=64)", "fp32").codec.name == "fp32"
    assert KVConfig.parse("h2o(budget=64)+auto", "fp16").codec.name == "fp16"
    with pytest.raises(ValueError, match="auto takes no options"):
        KVConfig.parse("auto(bits=4)", "fp32")
    with pytest.raises(ValueError, match="two codec parts"):
        KVConfig.parse("int8+auto", "fp32")


@pytest.mark.parametrize("forced, want", [("0", "fp32"), ("1", "bf16")])
def test_the_quick_scenario_baseline_follows_the_machine(monkeypatch, forced, want):
    monkeypatch.setenv("KVMAP_NATIVE_BF16", forced)
    from kvmap.bench.scenario import load_scenario
    scenario = load_scenario(quick=True)
    assert {m.dtype for m in scenario.models} == {want}
    cells = scenario.cells()
    assert {c.kv for c in cells} >= {want, "int8"} and "auto" not in {c.kv for c in cells}
    assert all(c.engine_args().dtype == want for c in cells)


def test_weight_kernels_take_the_activation_dtype_the_profile_timed_faster(monkeypatch,
                                                                          cache):
    from kvmap.model.linear import Int4Linear, Int8Linear
    monkeypatch.setattr(hardware, "profile",
                        lambda refresh=False, num_threads=None: replace(
                            hardware.detect(), rates=dict(FAKE_RATES)))
    w = torch.randn(64, 128)
    x = torch.randn(5, 128)
    for cls in (Int8Linear, Int4Linear):
        lin = cls(w)
        assert lin.kernel_dtype == torch.bfloat16
        y = lin(x)
        assert y.dtype == torch.float32 and y.shape == (5, 64)
        # the product matches the dense one within the format's error (int4: coarser)
        err = (y - x @ w.T).norm() / (x @ w.T).norm()
        assert err < (0.02 if cls is Int8Linear else 0.15), (cls.__name__, float(err))
    assert Int8Linear(w.to(torch.bfloat16)).kernel_dtype == torch.bfloat16
    slow_bf16 = json.loads(json.dumps(FAKE_RATES))
    slow_bf16["weight_kernels"]["int8"]["bf16"] = {"prefill": 1e9, "decode": 1e9}
    monkeypatch.setattr(hardware, "profile",
                        lambda refresh=False, num_threads=None: replace(
                            hardware.detect(), rates=slow_bf16))
    assert Int8Linear(w).kernel_dtype == torch.float32


def test_the_cells_wait_policy_is_the_faster_one_measured_here(monkeypatch):
    from kvmap.hardware import threads
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(threads, "_RECENT", {})
    settings = threads.choose(num_threads=2)
    assert settings.source == "measured" and set(settings.step_s) == set(threads.POLICIES)
    assert all(s > 0 for s in settings.step_s.values())
    assert settings.wait_policy == min(settings.step_s, key=settings.step_s.get)
    assert threads.choose(num_threads=2) is settings          # reused within the process
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert threads.choose().source == "user" and threads.choose().wait_policy == "ACTIVE"
    monkeypatch.delenv("OMP_WAIT_POLICY")
    with pytest.raises(ValueError, match="'SPIN'"):
        threads.choose(given="SPIN")


@pytest.mark.parametrize("chosen, want", [("default", None), ("PASSIVE", "PASSIVE"),
                                          (None, "PASSIVE")])
def test_cells_get_the_runs_wait_policy(monkeypatch, chosen, want):
    from kvmap.bench.cell_process import CELL_WAIT_POLICY_ENV, child_env
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    if chosen is None:
        monkeypatch.delenv(CELL_WAIT_POLICY_ENV, raising=False)
    else:
        monkeypatch.setenv(CELL_WAIT_POLICY_ENV, chosen)
    env = child_env()
    assert env.get("OMP_WAIT_POLICY") == want and CELL_WAIT_POLICY_ENV not in env
