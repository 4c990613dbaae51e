"""What the simulated server runs on: the accelerator (``Hardware``) and the KV tiers below it.

``Hardware`` is one tensor-parallel group of ``num_devices`` identical devices: peak
compute, HBM bandwidth and memory per device, the link between devices (all-reduce of
tensor parallelism), and two efficiencies that turn spec-sheet peaks into what kernels
achieve. ``step_overhead_s``, ``layer_overhead_s``, ``seq_overhead_s`` and ``seq_layer_overhead_s``
are fixed costs per engine step, per layer, per scheduled sequence and per sequence and
layer (scheduling,
kernel launches, input building; on a CPU, operator dispatch), which dominate small
batches on a CPU and are small on a GPU with CUDA graphs.

``compute_curve`` makes the matrix-multiply efficiency depend on how many tokens a step
multiplies at once: ``((num_tokens, multiplier), ...)``, interpolated in log2(tokens) and
clamped at the ends. A decode step multiplies a few rows by each weight matrix, which no
machine does at its peak rate; ``cpu-this-machine`` measures the curve, GPU profiles
leave it empty (a constant ``compute_efficiency``).

A ``TierHardware`` is one level below HBM (host RAM over PCIe, local NVMe, a network
storage pool) seen from HBM: end-to-end bandwidth, a latency per transfer and an IOPS ceiling::

    transfer_s(n blocks of b bytes) = latency_s + max(n * b / bandwidth, ops / iops)
    ops = n * ceil(b / io_bytes)           (io_bytes = 0: one operation per block)

Each tier names the ``link`` it loads (``pcie``, ``nvme``, ``network``), which is how the
results attribute stalls and streaming time to a resource. Presets are in ``TIER_PRESETS``;
any field can be overridden in a scenario file.

``cpu-this-machine`` is measured, not catalogued: its rates are the machine's hardware
profile (``kvmap hw``) and its step is timed by ``kvmap.perf`` from the calibration
record the budget estimate uses (``calibration``), see :mod:`kvmap.plan.sim.machine`. ``source`` says which kind a
``Hardware`` is -- ``spec-sheet`` (a catalogued GPU: vendor peaks times assumed
efficiencies, until a record from a real device calibrates it), ``measured`` (this
machine's profile), ``custom`` (rates given by hand) -- and :attr:`Hardware.label` is
the phrase every output that uses it shows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from kvmap.perf.calibration import Calibration
from kvmap.plan.catalogue import get_gpu

RESOURCES = ("compute", "hbm", "kv_codec", "interconnect", "overhead")   # + one per tier link


@dataclass(frozen=True)
class Hardware:
    """One tensor-parallel group. Rates are per device; ``memory_bytes`` per device."""

    name: str
    memory_bytes: int
    compute_flops: float               # peak FLOP/s in the compute dtype
    memory_bandwidth: float            # HBM bytes/s
    num_devices: int = 1
    interconnect_bandwidth: float = 0.0    # bytes/s per device per direction (TP)
    compute_efficiency: float = 0.6        # achieved / peak in matrix work (MFU-like)
    bandwidth_efficiency: float = 0.85     # achieved / peak when streaming weights and KV
    step_overhead_s: float = 0.0
    layer_overhead_s: float = 0.0
    seq_overhead_s: float = 0.0
    seq_layer_overhead_s: float = 0.0
    compute_curve: tuple = ()              # ((num_tokens, efficiency multiplier), ...)
    gpu_memory_utilization: float = 0.9
    reserve_bytes: int = 2 * 2**30         # per device: activations, graphs, NCCL
    source: str = "custom"                 # "spec-sheet" | "measured: ..." | "custom"
    compute_dtype: str = "bf16"            # the dtype the rates are of (weights default)
    # this machine: the step is timed by ``kvmap.perf`` from the calibration of its class
    # and dtype (the budget estimate's record) over the profile's rates; None: the roofline
    calibration: Calibration | None = None
    profile_rates: dict | None = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("compute_flops", "memory_bandwidth"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"hardware.{name}={value!r} must be > 0")
        if not isinstance(self.num_devices, int) or self.num_devices < 1:
            raise ValueError(f"hardware.num_devices={self.num_devices!r} must be an integer >= 1")
        for name in ("compute_efficiency", "bandwidth_efficiency", "gpu_memory_utilization"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ValueError(f"hardware.{name}={value!r} must be in (0, 1]")
        for name in ("step_overhead_s", "layer_overhead_s", "seq_overhead_s",
                     "seq_layer_overhead_s", "interconnect_bandwidth"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0 or not math.isfinite(value):
                raise ValueError(f"hardware.{name}={value!r} must be a finite number >= 0")
        points = self.compute_curve
        if not isinstance(points, tuple) or any(
                len(p) != 2 or not p[0] >= 1 or not 0 < p[1] <= 1 for p in points) \
                or [p[0] for p in points] != sorted({p[0] for p in points}):
            raise ValueError(f"hardware.compute_curve={points!r} must be increasing "
                             "(num_tokens >= 1, multiplier in (0, 1]) pairs")
        if self.num_devices > 1 and not self.interconnect_bandwidth > 0:
            raise ValueError(f"hardware.interconnect_bandwidth must be > 0 with "
                             f"num_devices={self.num_devices}")

    @property
    def is_spec_sheet(self) -> bool:
        return self.source == "spec-sheet"

    @property
    def label(self) -> str:
        """How far to trust the rates, in words, for every output that uses them."""
        if self.is_spec_sheet:
            return (f"{self.name}: spec sheet x assumed efficiency (compute "
                    f"{self.compute_efficiency:.0%}, bandwidth {self.bandwidth_efficiency:.0%})")
        if self.source.startswith("measured"):
            return f"{self.name}: {self.source}"
        return f"{self.name}: rates given by hand"

    @property
    def effective_flops(self) -> float:
        """Achieved FLOP/s of the whole group."""
        return self.num_devices * self.compute_flops * self.compute_efficiency

    def curve_efficiency(self, num_tokens: int) -> float:
        """The ``compute_curve`` multiplier for a step of ``num_tokens`` tokens (1.0 without
        a curve)."""
        points = self.compute_curve
        if not points:
            return 1.0
        x = math.log2(max(1, num_tokens))
        if x <= math.log2(points[0][0]):
            return points[0][1]
        for (n0, e0), (n1, e1) in zip(points, points[1:]):
            x0, x1 = math.log2(n0), math.log2(n1)
            if x <= x1:
                return e0 + (e1 - e0) * (x - x0) / (x1 - x0)
        return points[-1][1]

    @property
    def effective_bandwidth(self) -> float:
        """Achieved HBM bytes/s of one device (every device streams its own share)."""
        return self.memory_bandwidth * self.bandwidth_efficiency


def gpu_hardware(name: str, num_devices: int = 1, **overrides) -> Hardware:
    """A catalogued GPU (``kvmap.plan.catalogue``) as simulator hardware."""
    gpu = get_gpu(name)
    hw = Hardware(name=gpu.name, memory_bytes=gpu.memory_bytes, compute_flops=gpu.bf16_flops,
                  memory_bandwidth=gpu.memory_bandwidth_bytes_per_s, num_devices=num_devices,
                  interconnect_bandwidth=gpu.interconnect_bytes_per_s,
                  # a few microseconds of launches per layer, a scheduler tick per step
                  step_overhead_s=1e-3, layer_overhead_s=10e-6, source="spec-sheet")
    return replace(hw, **overrides)


@dataclass(frozen=True)
class TierHardware:
    """One KV tier below HBM, as seen from HBM (see the module docstring)."""

    name: str
    capacity_bytes: int
    bandwidth: float                   # bytes/s, end to end, each direction
    latency_s: float
    iops: float = math.inf
    io_bytes: int = 0                  # bytes per IO operation; 0: one operation per block
    link: str = "pcie"

    def __post_init__(self) -> None:
        where = f"tiers.{self.name}"
        if not isinstance(self.capacity_bytes, int) or self.capacity_bytes < 0:
            raise ValueError(f"{where}.capacity={self.capacity_bytes!r} must be a byte size >= 0")
        if not isinstance(self.bandwidth, (int, float)) or not self.bandwidth > 0:
            raise ValueError(f"{where}.bandwidth={self.bandwidth!r} must be > 0 bytes/s")
        if not isinstance(self.latency_s, (int, float)) or not 0 <= self.latency_s < math.inf:
            raise ValueError(f"{where}.latency={self.latency_s!r} must be a finite time >= 0")
        if not isinstance(self.iops, (int, float)) or not self.iops > 0:
            raise ValueError(f"{where}.iops={self.iops!r} must be > 0")
        if not isinstance(self.io_bytes, int) or self.io_bytes < 0:
            raise ValueError(f"{where}.io_bytes={self.io_bytes!r} must be a byte size >= 0")
        if not isinstance(self.link, str) or not self.link:
            raise ValueError(f"{where}.link={self.link!r} must name a resource")

    def num_ops(self, num_blocks: int, block_bytes: int) -> int:
        per_block = 1 if self.io_bytes == 0 else math.ceil(block_bytes / self.io_bytes)
        return num_blocks * per_block

    def transfer_s(self, num_blocks: int, block_bytes: int) -> float:
        """Seconds to move ``num_blocks`` blocks in one transfer (0 for none)."""
        if num_blocks <= 0:
            return 0.0
        bandwidth_s = num_blocks * block_bytes / self.bandwidth
        iops_s = self.num_ops(num_blocks, block_bytes) / self.iops
        return self.latency_s + max(bandwidth_s, iops_s)


# Typical figures; every one can be overridden per scenario.
#   host:    PCIe 5.0 x16, ~50 GB/s achieved per direction of 64 GB/s raw, ~10 us a DMA.
#   nvme:    one PCIe 4.0 NVMe drive, ~7 GB/s reads, ~80 us, ~500K IOPS of 128 KiB reads
#            at queue depth (4 KiB reads would reach ~1M IOPS, i.e. only ~4 GB/s).
#   network: a storage pool over 100 Gb/s Ethernet/IB, ~12 GB/s, ~0.5 ms, 200K IOPS.
TIER_PRESETS: dict[str, dict] = {
    "host": dict(bandwidth=50e9, latency_s=10e-6, iops=math.inf, io_bytes=0, link="pcie"),
    "nvme": dict(bandwidth=7e9, latency_s=80e-6, iops=5e5, io_bytes=131072, link="nvme"),
    "network": dict(bandwidth=12e9, latency_s=500e-6, iops=2e5, io_bytes=65536,
                    link="network"),
}


def scaled(hw: Hardware, factor: float) -> Hardware:
    """``hw`` on a machine ``factor`` times as fast: rates up, fixed costs down; a
    calibration's efficiencies up and its step overhead down (the load of the moment,
    ``kvmap.bench.estimate.current_slowdown``'s inverse)."""
    cal = hw.calibration
    if cal is not None:
        cal = replace(cal, step_overhead_s_per_layer=cal.step_overhead_s_per_layer / factor,
                      **{k: getattr(cal, k) * factor
                         for k in ("e_prefill", "e_attn", "e_batch", "e_kv", "e_stream")})
    return replace(hw, calibration=cal, compute_flops=hw.compute_flops * factor,
                   memory_bandwidth=hw.memory_bandwidth * factor,
                   step_overhead_s=hw.step_overhead_s / factor,
                   layer_overhead_s=hw.layer_overhead_s / factor,
                   seq_overhead_s=hw.seq_overhead_s / factor,
                   seq_layer_overhead_s=hw.seq_layer_overhead_s / factor)
