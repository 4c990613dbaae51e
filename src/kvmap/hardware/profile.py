"""The machine's profile: what it is, what it can do, and the compute dtype it runs best.

Two halves, one concept:

- **What it is** (:func:`detect`, free, no measurement): CPU model, vendor, family and
  model number; the instruction sets that decide which kernels run (AVX2, AVX-512F,
  AVX512_BF16, AMX, VNNI, F16C, FMA; NEON/SVE/BF16 on ARM); torch's dispatch capability
  (``torch.backends.cpu.get_cpu_capability()``, lowered by ``ATEN_CPU_CAPABILITY``) and
  oneDNN's ISA cap (``ONEDNN_MAX_CPU_ISA``); cores and threads; on CUDA, each device's
  name, compute capability and memory. The machine's *class* (``x86-avx512-bf16``,
  ``x86-avx512``, ``x86-avx2``, ``arm-neon-bf16``, ...) and whether it multiplies bf16
  natively follow from these alone, so ``dtype: auto`` is decided without a probe and is
  the same in every process of a run.
- **What it can do** (:func:`measure`, about ten seconds, cached per machine fingerprint
  under the user's cache directory; :func:`profile` reads the cache or measures): matrix
  products per dtype at a model's own shapes (a prefill GEMM and a decode GEMV that
  streams its weights from memory), read bandwidth, and the rate of each weight format's
  kernel (:mod:`kvmap.hardware.probes`).

It belongs to the floor of the house: the model, the engine, the bench, the planner and
the report import it; it imports none of them.

``KVMAP_NATIVE_BF16=0|1`` forces the native-bf16 verdict (tests, and a user who knows
better); the profile records that it was forced.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

SCHEMA_VERSION = 1
AUTO = "auto"
# ISA flags (as /proc/cpuinfo spells them) that decide which kernels run
X86_FLAGS = ("sse4_2", "avx", "f16c", "fma", "avx2", "avx512f", "avx512bw", "avx512vl",
             "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16",
             "amx_int8", "amx_tile")
ARM_FLAGS = ("asimd", "asimddp", "sve", "sve2", "bf16", "i8mm", "fphp", "asimdhp")
# torch's capability names, lowest first; ATEN_CPU_CAPABILITY can only lower it
_CAPABILITY_ORDER = ("DEFAULT", "NO AVX", "AVX2", "AVX512", "ZVECTOR", "SVE256", "SVE")


@dataclass(frozen=True)
class CPUInfo:
    """The CPU as the kernels see it."""

    model_name: str
    vendor: str
    family: str
    model: str
    arch: str                          # platform.machine(): x86_64, aarch64, ...
    flags: tuple[str, ...]             # the kernel-deciding subset, sorted
    torch_capability: str              # after ATEN_CPU_CAPABILITY
    onednn_max_isa: str | None         # ONEDNN_MAX_CPU_ISA when set
    num_cores: int                     # logical CPUs this process may run on
    num_threads: int                   # torch's intra-op threads at detection


@dataclass(frozen=True)
class CUDAInfo:
    name: str
    capability: tuple[int, int]
    memory_bytes: int


@dataclass(frozen=True)
class HardwareProfile:
    """What the machine is (``cpu``, ``cuda``) and, once measured, what it can do
    (``rates``: :func:`kvmap.hardware.probes.measure_rates`'s dict).

    ``native_bf16`` is the verdict ``dtype: auto`` uses on the CPU; ``forced`` says it
    came from ``KVMAP_NATIVE_BF16`` rather than the ISA."""

    cpu: CPUInfo
    cuda: tuple[CUDAInfo, ...] = ()
    native_bf16: bool = False
    forced: bool = False
    torch_version: str = torch.__version__
    rates: dict | None = None
    schema_version: int = SCHEMA_VERSION

    @property
    def machine_class(self) -> str:
        """A short name of the CPU class: the ISA level torch and oneDNN run at, and
        whether bf16 is native (``x86-avx512-bf16``, ``x86-avx512``, ``x86-avx2``, ...)."""
        flags, cap = set(self.cpu.flags), self.cpu.torch_capability
        if self.cpu.arch in ("aarch64", "arm64"):
            base = "arm-sve" if "sve" in flags else "arm-neon"
        elif cap == "AVX512" and "avx512f" in flags:
            base = "x86-amx" if "amx_bf16" in flags and self.native_bf16 else "x86-avx512"
        elif cap in ("AVX2", "AVX512") and "avx2" in flags:
            base = "x86-avx2"
        else:
            base = f"{self.cpu.arch}-{cap.lower().replace(' ', '-')}"
        return base + ("-bf16" if self.native_bf16 and not base.endswith("amx") else "")

    @property
    def fingerprint(self) -> str:
        """Stable id of this machine as the kernels see it (the cache key): CPU model,
        ISA flags, torch version and capability, oneDNN cap, cores, threads."""
        c = self.cpu
        key = json.dumps([c.model_name, c.vendor, c.family, c.model, c.arch, c.flags,
                          c.torch_capability, c.onednn_max_isa, c.num_cores, c.num_threads,
                          self.torch_version, self.native_bf16,
                          [asdict(d) for d in self.cuda]])
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def auto_dtype(self, device: str = "cpu") -> str:
        """The fastest compute dtype that keeps full accuracy on ``device``: on CUDA bf16
        from compute capability 8.0, else fp16; on the CPU bf16 where it multiplies bf16
        natively, else fp32. A CUDA device this machine does not have (a bench cell bound
        for a Ray node elsewhere) is taken to be of compute capability 8.0 or more; the
        cell's own process, where the device is, decides again."""
        if str(device).startswith("cuda"):
            index = _cuda_index(device)
            if index >= len(self.cuda):
                return "bf16"
            return "bf16" if self.cuda[index].capability >= (8, 0) else "fp16"
        return "bf16" if self.native_bf16 else "fp32"

    def summary(self) -> dict:
        """The fields every record carries (``hardware`` in cell records, run.json and
        benchmark JSON): class, CPU, ISA, bf16 verdict, threads, and the probe rates."""
        out = {"machine_class": self.machine_class, "cpu_model": self.cpu.model_name,
               "vendor": self.cpu.vendor, "family": self.cpu.family, "model": self.cpu.model,
               "isa": list(self.cpu.flags), "torch_capability": self.cpu.torch_capability,
               "onednn_max_isa": self.cpu.onednn_max_isa, "native_bf16": self.native_bf16,
               "native_bf16_forced": self.forced, "auto_dtype_cpu": self.auto_dtype("cpu"),
               "num_cores": self.cpu.num_cores, "num_threads": self.cpu.num_threads,
               "torch": self.torch_version, "fingerprint": self.fingerprint,
               "cuda": [asdict(d) for d in self.cuda]}
        if self.rates:
            out["rates"] = self.rates
        return out

    def to_dict(self) -> dict:
        return {"schema_version": self.schema_version, "cpu": asdict(self.cpu),
                "cuda": [asdict(d) for d in self.cuda], "native_bf16": self.native_bf16,
                "forced": self.forced, "torch_version": self.torch_version,
                "rates": self.rates, "fingerprint": self.fingerprint}

    @classmethod
    def from_dict(cls, data: dict) -> "HardwareProfile":
        """The inverse of :meth:`to_dict`; ValueError on another schema or a fingerprint
        that does not match its own fields (a corrupt or edited file)."""
        if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"hardware profile schema "
                             f"{data.get('schema_version') if isinstance(data, dict) else data!r}"
                             f" is not {SCHEMA_VERSION}")
        try:
            cpu = dict(data["cpu"])
            cpu["flags"] = tuple(cpu["flags"])
            profile = cls(cpu=CPUInfo(**cpu),
                          cuda=tuple(CUDAInfo(d["name"], tuple(d["capability"]),
                                              d["memory_bytes"]) for d in data["cuda"]),
                          native_bf16=bool(data["native_bf16"]), forced=bool(data["forced"]),
                          torch_version=data["torch_version"], rates=data["rates"])
        except (KeyError, TypeError) as e:
            raise ValueError(f"hardware profile is malformed: {e!r}") from None
        if profile.fingerprint != data.get("fingerprint"):
            raise ValueError("hardware profile's fingerprint does not match its fields")
        return profile


def _cuda_index(device: str) -> int:
    _, _, index = str(device).partition(":")
    return int(index) if index.isdigit() else 0


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def _capability() -> str:
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):
        return "DEFAULT"


def _native_bf16(arch: str, flags: set[str], capability: str, onednn_cap: str | None) -> bool:
    """bf16 matrix products in hardware, at the ISA level torch and oneDNN may use."""
    if arch in ("aarch64", "arm64"):
        return "bf16" in flags
    if not ({"avx512_bf16", "amx_bf16"} & flags) or capability != "AVX512":
        return False
    if onednn_cap is None:
        return True
    cap = onednn_cap.upper()
    return "BF16" in cap or "AMX" in cap or cap in ("ALL", "AVX10_1_512", "AVX10_1_512_AMX")


def detect(num_threads: int | None = None) -> HardwareProfile:
    """What this machine is (no measurement; see the module docstring)."""
    info = _cpuinfo()
    arch = platform.machine() or "unknown"
    raw_flags = set((info.get("flags") or info.get("Features") or "").split())
    wanted = ARM_FLAGS if arch in ("aarch64", "arm64") else X86_FLAGS
    flags = tuple(sorted(f for f in wanted if f in raw_flags))
    capability = _capability()
    onednn_cap = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    try:
        num_cores = len(os.sched_getaffinity(0))
    except AttributeError:
        num_cores = os.cpu_count() or 1
    cpu = CPUInfo(model_name=info.get("model name") or platform.processor() or arch,
                  vendor=info.get("vendor_id") or info.get("CPU implementer") or "unknown",
                  family=info.get("cpu family") or info.get("CPU architecture") or "",
                  model=info.get("model") or info.get("CPU part") or "", arch=arch,
                  flags=flags, torch_capability=capability, onednn_max_isa=onednn_cap,
                  num_cores=num_cores, num_threads=num_threads or torch.get_num_threads())
    native = _native_bf16(arch, set(flags), capability, onednn_cap)
    forced = os.environ.get("KVMAP_NATIVE_BF16")
    if forced is not None:
        if forced not in ("0", "1"):
            raise ValueError(f"KVMAP_NATIVE_BF16={forced!r} must be 0 or 1")
        native = forced == "1"
    cuda: tuple[CUDAInfo, ...] = ()
    if torch.cuda.is_available():
        cuda = tuple(CUDAInfo(p.name, (p.major, p.minor), p.total_memory)
                     for p in (torch.cuda.get_device_properties(i)
                               for i in range(torch.cuda.device_count())))
    return HardwareProfile(cpu=cpu, cuda=cuda, native_bf16=native, forced=forced is not None)


# --- measured rates, cached per machine ---------------------------------------------------

def cache_dir() -> Path:
    """``$KVMAP_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvmap``, else ``~/.cache/kvmap``."""
    if os.environ.get("KVMAP_CACHE_DIR"):
        return Path(os.environ["KVMAP_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kvmap"


def _cache_path(hw: HardwareProfile) -> Path:
    return cache_dir() / "hardware" / f"{hw.fingerprint}.json"


def load_cached(hw: HardwareProfile) -> HardwareProfile | None:
    """The cached measured profile of this machine, or None: a missing, corrupt or
    foreign file (another fingerprint) is ignored, never trusted; one measured by older
    probes (``probe_version``) lacks rates that are now read, and is measured again."""
    path = _cache_path(hw)
    try:
        cached = HardwareProfile.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None
    from kvmap.hardware.probes import PROBE_VERSION
    if cached.fingerprint != hw.fingerprint or not cached.rates \
            or cached.rates.get("probe_version", 1) < PROBE_VERSION:
        return None                  # measured by older probes: measured again
    return replace(hw, rates=cached.rates)


def measure(hw: HardwareProfile | None = None, device: str = "cpu") -> HardwareProfile:
    """``hw`` (default :func:`detect`) with its rates measured now (about ten seconds)
    and written to the cache."""
    from kvmap.hardware.probes import measure_rates
    hw = hw or detect()
    measured = replace(hw, rates=measure_rates(hw, device=device))
    path = _cache_path(measured)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(measured.to_dict(), indent=1))
        tmp.replace(path)
    except OSError:
        pass                         # a read-only home still gets its profile
    return measured


def profile(refresh: bool = False, num_threads: int | None = None) -> HardwareProfile:
    """This machine with measured rates: from the cache, or measured now (``refresh``:
    always measured)."""
    hw = detect(num_threads)
    if not refresh:
        cached = load_cached(hw)
        if cached is not None:
            return cached
    return measure(hw)


def prefill_flops_prior(dtype: torch.dtype, device: str | torch.device = "cpu") -> float:
    """A prefill-shaped product's FLOP/s in ``dtype``, for a prior that a run's own steps
    correct (the offloader's fetch-or-recompute cost model): the cached profile's
    ``matmul_flops.<dtype>.prefill`` on a CPU, else one quick probe of the profile's own
    kind (:func:`kvmap.hardware.probes.gemm_flops`, ``PREFILL_ROWS`` rows of the default
    shape) -- the code base's one matrix-rate probe."""
    from kvmap.hardware.probes import DEFAULT_SHAPE, DTYPES, PREFILL_ROWS, gemm_flops
    name = next((k for k, v in DTYPES.items() if v == dtype), None)
    if torch.device(device).type == "cpu" and name is not None:
        cached = load_cached(detect())
        rate = (((cached.rates or {}).get("matmul_flops") or {}).get(name) or {}) \
            .get("prefill") if cached is not None else None
        if isinstance(rate, (int, float)) and rate > 0:
            return float(rate)
    k, n = DEFAULT_SHAPE
    return gemm_flops(dtype, PREFILL_ROWS, k, n, device=device)


def record_summary(measure_if_missing: bool = False) -> dict:
    """What a record says of the machine (:meth:`HardwareProfile.summary`): with the
    cached rates when there are any (measured now with ``measure_if_missing``), and the
    class, ISA and bf16 verdict always."""
    hw = detect()
    cached = load_cached(hw)
    if cached is None and measure_if_missing:
        cached = measure(hw)
    return (cached or hw).summary()
