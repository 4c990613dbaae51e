"""This machine's rates for one model entry (FLOP/s, bytes/s): ``Rates.of``."""
from __future__ import annotations

from dataclasses import dataclass

from kvmap.perf.calibration import CALIBRATION, Calibration


@dataclass(frozen=True)
class Rates:
    flops: float                     # prefill-shaped product in the model's dtype / format
    read_bytes_per_s: float

    @classmethod
    def of(cls, rates: dict | None, dtype: str, quantization: str | None,
           calibration: Calibration = CALIBRATION) -> Rates:
        """From a profile's ``rates``. On the calibration's own class its reference
        rates (measured beside its timings) are taken, the profile giving only the ratio
        of a weight kernel to the dense product; off its class the profile's rates are
        (``kvmap.perf.calibration``: the speed is counted once)."""
        rates = rates or {}
        dense = rates.get("matmul_flops") or {}
        ref = calibration.reference_flops_of(dtype) or calibration.reference_flops_of("fp32")
        mine = (dense.get(dtype) or {}).get("prefill") or \
            (dense.get("fp32") or {}).get("prefill") or ref
        flops = mine
        if quantization:
            kernels = (rates.get("weight_kernels") or {}).get(quantization) or {}
            found = [v.get("prefill") for v in kernels.values()
                     if isinstance(v, dict) and v.get("prefill")]
            flops = max(found) if found else mine
        bandwidth = rates.get("read_bandwidth_bytes_per_s") or calibration.reference_bandwidth
        if calibration.same_class or not rates:
            return cls(flops * ref / mine, calibration.reference_bandwidth)
        return cls(flops, bandwidth)
