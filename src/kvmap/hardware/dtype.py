"""`dtype: auto` and the dtypes a device can run."""
from __future__ import annotations

import warnings

import torch

from kvmap.hardware.profile import AUTO, HardwareProfile, _cuda_index, detect

# compute dtype names -> torch attribute names
DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16",
          "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}


def check_dtype(dtype: str, allow_auto: bool = True) -> str:
    """``dtype`` if it names a compute dtype of ``DTYPES`` (or ``auto``: the machine's
    fastest exact dtype); ValueError naming it and the choices."""
    if dtype not in DTYPES and not (allow_auto and dtype == AUTO):
        raise ValueError(f"dtype={dtype!r} is not one of "
                         f"{sorted(DTYPES) + ([AUTO] if allow_auto else [])}")
    return dtype


def canonical_dtype(dtype: str) -> str:
    """The short name (fp32, bf16, fp16) of a concrete dtype name."""
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[
        DTYPES[check_dtype(dtype, allow_auto=False)]]

_WARNED: set[tuple[str, str]] = set()


def supported_dtypes(device: str, hw: HardwareProfile | None = None) -> tuple[str, ...]:
    """Compute dtypes ``device`` can run at all (CPU: all three, slowly where not native;
    CUDA: fp16 and fp32, and bf16 from compute capability 8.0; all three for a CUDA
    device this machine does not have, which its own machine checks)."""
    device = str(device)
    if device.startswith("cuda") and device.partition(":")[2] in ("", *map(str, range(64))):
        hw = hw or detect()
        index = _cuda_index(device)
        if index >= len(hw.cuda):
            return ("fp32", "bf16", "fp16")
        return ("fp32", "fp16") + (("bf16",) if hw.cuda[index].capability >= (8, 0) else ())
    if device == "cpu":
        return ("fp32", "bf16", "fp16")
    raise ValueError(f"device={device!r} is not one of cpu, cuda, cuda:N")


def resolve_dtype(dtype: str, device: str = "cpu", hw: HardwareProfile | None = None) -> str:
    """``dtype`` as a concrete compute dtype on ``device``: ``auto`` becomes the profile's
    choice; an explicit dtype is kept (a bf16 on a CPU without native bf16 warns once with
    the measured slowdown); a dtype the device cannot run is refused here, before any
    weight is loaded. ValueError names the bad value and the choices."""
    check_dtype(dtype)
    hw = hw or detect()
    if dtype == AUTO:
        return hw.auto_dtype(device)
    name = canonical_dtype(dtype)
    choices = supported_dtypes(device, hw)
    if name not in choices:
        raise ValueError(f"dtype={dtype!r} cannot run on device={device!r} "
                         f"({hw.cuda[_cuda_index(device)].name}); "
                         f"choices that work: {', '.join(choices + (AUTO,))}")
    if str(device) == "cpu" and name in ("bf16", "fp16") and not hw.native_bf16 \
            and (name, device) not in _WARNED:
        _WARNED.add((name, device))
        slowdown = _slowdown(name, hw)
        warnings.warn(f"dtype={name} on a CPU without native {name} "
                      f"({hw.cpu.model_name}, class {hw.machine_class}): its matrix products "
                      f"run {slowdown}; dtype='auto' picks fp32", RuntimeWarning,
                      stacklevel=3)
    return name


def _slowdown(name: str, hw: HardwareProfile) -> str:
    """'N.Nx slower' from the cached profile's rates, or a 0.1-second probe."""
    from kvmap.hardware.probes import gemm_flops
    from kvmap.hardware.profile import load_cached
    rates = (hw.rates or (load_cached(hw) or hw).rates or {}).get("matmul_flops", {})
    fast = rates.get("fp32", {}).get("prefill")
    slow = rates.get(name, {}).get("prefill")
    if not (fast and slow):
        fast = gemm_flops(torch.float32, 256, 576, 1536, repeats=2)
        slow = gemm_flops(getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[name]),
                          256, 576, 1536, repeats=1)
    return f"{fast / slow:.1f}x slower than fp32's here ({slow / 1e9:.1f} against " \
           f"{fast / 1e9:.1f} GFLOP/s, measured)"
