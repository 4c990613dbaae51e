"""One calibration per machine class and dtype: found beside the profile, else shipped;
its rates stand in for the profile's on its own class only (the speed counted once)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from kvmap.hardware.profile import detect
from kvmap.perf import calibration as calmod
from kvmap.perf.calibration import CALIBRATION, Calibration, calibration_for, store
from kvmap.perf.rates import Rates

RATES = {"matmul_flops": {"fp32": {"prefill": 1e11}, "bf16": {"prefill": 4e11}},
         "read_bandwidth_bytes_per_s": 1e10,
         "weight_kernels": {"int8": {"bf16": {"prefill": 2e11}}}}


@pytest.fixture
def hw(tmp_path, monkeypatch):
    monkeypatch.setenv("KVMAP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(calmod, "SHIPPED_DIR", tmp_path / "shipped")
    return detect()


def test_round_trip_and_unknown_field():
    cal = replace(CALIBRATION, machine_class="x", dtype="bf16", cell_s=1.5)
    assert Calibration.from_dict(cal.to_dict()) == cal
    with pytest.raises(ValueError, match="'bogus'"):
        Calibration.from_dict({**cal.to_dict(), "bogus": 1})


def test_own_fit_then_the_class_then_another_class(hw, tmp_path):
    mine = replace(CALIBRATION, machine_class=hw.machine_class, dtype="bf16", cell_s=2.0)
    other = replace(CALIBRATION, machine_class="elsewhere", dtype="bf16", cell_s=3.0)
    store(other, hw, tmp_path / "shipped")
    assert calibration_for(hw, "bf16").cell_s == 3.0
    assert not calibration_for(hw, "bf16").same_class
    store(replace(mine, cell_s=2.5, reference_cpu="some other CPU"), hw, tmp_path / "shipped")
    found = calibration_for(hw, "bf16")         # its class, another CPU: not its rates
    assert found.cell_s == 2.5 and not found.same_class
    store(replace(mine, reference_cpu=hw.cpu.model_name), hw, tmp_path / "shipped")
    found = calibration_for(hw, "bf16")
    assert found.same_class and found.cell_s == 2.0       # its CPU model first
    store(replace(mine, cell_s=7.0), hw)                  # this machine's own fit
    assert calibration_for(hw, "bf16").cell_s == 7.0
    assert calibration_for(hw, "fp16") == CALIBRATION     # nothing in that dtype


def test_rates_on_the_class_are_the_calibrations():
    cal = replace(CALIBRATION, reference_flops=(("bf16", 8e11), ("fp32", 2e11)),
                  reference_bandwidth=3e10, same_class=True)
    assert Rates.of(RATES, "bf16", None, cal) == Rates(8e11, 3e10)
    # a weight kernel keeps its ratio to the dense product of the profile
    assert Rates.of(RATES, "bf16", "int8", cal).flops == pytest.approx(4e11)
    off = replace(cal, same_class=False)
    assert Rates.of(RATES, "bf16", None, off) == Rates(4e11, 1e10)
