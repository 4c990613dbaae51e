"""``cpu-this-machine``: the simulator's hardware is this machine's hardware profile and
the calibration record of its class and dtype -- the record the budget estimate uses.

One set of probes, one model of a step. The rates come from :func:`kvmap.hardware.profile`
(``kvmap hw``; cached per machine fingerprint, so per thread count too):

- the compute side: ``matmul_curve.<dtype>``, the engine's matrix product by rows with
  its weight in the caches; its best rate is ``compute_flops`` and each row count's
  share of it the ``compute_curve`` (the label, the ridge, a GPU-shaped roofline);
- the weight stream: ``matmul_flops.<dtype>.decode``, a one-row product streaming its
  weights from memory: ``FLOP/s / 2 x bytes per weight`` is ``memory_bandwidth``.

The step itself is timed by :func:`kvmap.perf.roofline.step_time` from
:func:`kvmap.perf.calibration.calibration_for` (its efficiencies, its step overhead per
layer, its codec factors) over the profile's rates (``kvmap.perf.rates.Rates``): the
estimate's prefill and decode terms, step by step. The tiers' block moves are measured
here, once per machine and cached (``<cache>/sim/<fingerprint>.json``, measured again
after ``kvmap hw --refresh``) by :func:`kvmap.plan.sim.tier_probe.measure_tier_block`.

A profile without a rate the simulator reads raises :class:`MissingRate`, naming the
rate and the command that measures it -- never a silent default.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from kvmap.perf.shape import DENSE_BYTES as DTYPE_BYTES
from kvmap.plan.sim.hardware import Hardware, TierHardware

THIS_MACHINE = "cpu-this-machine"
REFRESH = "measure it with `kvmap hw --refresh`"


class MissingRate(ValueError):
    """A hardware profile lacks a rate the simulator needs."""


def _rate(rates: dict | None, path: tuple[str, ...], meaning: str, where: str) -> float:
    value = rates
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    if not isinstance(value, (int, float)) or not value > 0:
        raise MissingRate(f"the hardware profile {where} has no {'.'.join(path)} "
                          f"({meaning}); {REFRESH}")
    return float(value)


def hardware_from_rates(rates: dict | None, dtype: str, *, memory_bytes: int,
                        overheads: dict | None = None, where: str = "of this machine",
                        name: str = THIS_MACHINE, source: str = "measured",
                        calibration=None) -> Hardware:
    """Simulator hardware from a profile's ``rates`` (``HardwareProfile.rates``, or the
    ``rates`` of a record's ``hardware`` summary) in compute dtype ``dtype``; with a
    ``calibration`` (``kvmap.perf``) its steps are timed by perf, else by the roofline
    at efficiency 1 plus the step ``overheads`` given (seconds by ``Hardware`` field).
    :class:`MissingRate` for a rate the profile lacks."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype={dtype!r}: the simulator reads rates of "
                         f"{', '.join(DTYPE_BYTES)}")
    curve_rates = (rates or {}).get("matmul_curve", {}).get(dtype)
    if not isinstance(curve_rates, dict) or not curve_rates:
        raise MissingRate(f"the hardware profile {where} has no matmul_curve.{dtype} (the "
                          f"matrix-product rate by rows, the simulator's compute side); "
                          f"{REFRESH}")
    points = sorted((int(m), _rate(curve_rates, (m,), f"{dtype} products of {m} rows", where))
                    for m in curve_rates)
    peak = max(rate for _, rate in points)
    # non-decreasing in rows: a dip is a burst of other load during that one probe
    curve, best = [], 0.0
    for m, rate in points:
        best = max(best, rate)
        curve.append((m, best / peak))
    decode = _rate(rates, ("matmul_flops", dtype, "decode"),
                   f"a one-row {dtype} product streaming its weights: the weight stream", where)
    stream = decode / 2 * DTYPE_BYTES[dtype]
    return Hardware(name=name, memory_bytes=memory_bytes, compute_flops=peak,
                    memory_bandwidth=stream, compute_efficiency=1.0, bandwidth_efficiency=1.0,
                    compute_curve=tuple(curve), gpu_memory_utilization=1.0, reserve_bytes=0,
                    source=source, compute_dtype=dtype, calibration=calibration,
                    profile_rates=rates if calibration is not None else None,
                    **(overheads or {}))


# ---- the simulator's own probes, cached per machine ------------------------------------

def _cache_path(fingerprint: str) -> Path:
    from kvmap.hardware import cache_dir
    return cache_dir() / "sim" / f"{fingerprint}.json"


def _load(fingerprint: str, measured_at: str | None) -> dict:
    """The machine's simulator figures, or {} when they are absent, corrupt, another
    machine's, or older than its profile (``kvmap hw --refresh`` measures them again)."""
    try:
        data = json.loads(_cache_path(fingerprint).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("fingerprint") != fingerprint \
            or data.get("profile_measured_at") != measured_at:
        return {}
    return data


def _save(fingerprint: str, measured_at: str | None, data: dict) -> None:
    path = _cache_path(fingerprint)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**data, "fingerprint": fingerprint,
                                   "profile_measured_at": measured_at}, indent=1))
        tmp.replace(path)
    except OSError:
        pass                         # a read-only home still gets its figures


def _cached(hw_profile, keys: tuple[str, ...], measure, refresh: bool = False):
    """The value at ``keys`` in the machine's simulator cache, measured (and stored)
    when absent or ``refresh``."""
    fingerprint = hw_profile.fingerprint
    measured_at = (hw_profile.rates or {}).get("measured_at")
    node = _load(fingerprint, measured_at)
    for key in keys[:-1]:
        node = node.get(key, {}) if isinstance(node, dict) else {}
    if not refresh and isinstance(node, dict) and keys[-1] in node:
        return node[keys[-1]]
    value = measure()
    data = _load(fingerprint, measured_at)      # another process may have added figures
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    _save(fingerprint, measured_at, data)
    return value


def _profile(num_threads: int | None, refresh: bool = False):
    from kvmap.hardware import profile
    return profile(refresh=refresh, num_threads=num_threads)


def resolve(dtype: str, hw_profile) -> str:
    return hw_profile.auto_dtype("cpu") if dtype == "auto" else dtype


def this_machine(dtype: str = "auto", num_threads: int | None = None,
                 refresh: bool = False) -> Hardware:
    """This machine as simulator hardware: its profile's rates (measured now when not
    cached or ``refresh``) in ``dtype`` (``auto``: the profile's) and the calibration
    record of its class and dtype (``kvmap.perf.calibration.calibration_for``)."""
    import psutil

    from kvmap.perf.calibration import calibration_for
    hw_profile = _profile(num_threads, refresh)
    dtype = resolve(dtype, hw_profile)
    cal = calibration_for(hw_profile, dtype)
    return hardware_from_rates(
        hw_profile.rates, dtype, memory_bytes=psutil.virtual_memory().total,
        calibration=cal, source=f"measured: {hw_profile.machine_class} profile "
        f"{hw_profile.fingerprint}, {dtype}, {hw_profile.cpu.num_threads} threads; "
        f"calibration {cal.machine_class}/{cal.dtype} ({cal.source})")


def tiers(spec: str, model_config, dtype: str = "auto", num_threads: int | None = None,
          refresh: bool = False) -> tuple[TierHardware, ...]:
    """The tiers of KV spec ``spec`` (``tiers(host=..., disk=...)``) as this machine moves
    blocks through them: one pool block's read back (get + decode) per second as the
    bandwidth (:func:`tier_probe.measure_tier_block`); () without tiers."""
    import torch

    from kvmap.kv.config import KVConfig
    from kvmap.plan.sim.tier_probe import measure_tier_block
    hw_profile = _profile(num_threads)
    dtype = resolve(dtype, hw_profile)
    kv = KVConfig.parse(spec, dtype=dtype)
    if kv.tiers is None:
        return ()
    c = model_config
    torch_dtype = getattr(torch, {"fp32": "float32", "bf16": "bfloat16",
                                  "fp16": "float16"}[dtype])
    out = []
    for level in kv.tiers.levels:
        codec = level.codec or str(kv.codec)
        geometry = f"layers={c.num_layers},kv_heads={c.num_kv_heads},head_dim={c.head_dim}"
        moved = _cached(hw_profile, ("tiers", geometry, dtype, level.name, codec),
                        lambda: _with_threads(hw_profile.cpu.num_threads, lambda: (
                            measure_tier_block(level.name, codec, c.num_layers,
                                               c.num_kv_heads, c.head_dim, torch_dtype))),
                        refresh)
        out.append(TierHardware(name=level.name, capacity_bytes=level.capacity_bytes,
                        bandwidth=moved["block_bytes"] / moved["read_s"], latency_s=0.0,
                        link=f"{level.name} tier"))
    return tuple(out)


def _with_threads(num_threads: int, fn):
    import torch
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        return fn()
    finally:
        torch.set_num_threads(previous)
