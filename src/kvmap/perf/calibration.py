"""The roofline's constants and the measured fixed costs, one record per machine class and
compute dtype: ``Calibration``, ``calibration_for(hw, dtype)``.

Fitted by ``benchmarks/estimate_calibration.py`` on whatever class runs it; the fit is
stored beside the hardware profile (``<cache>/hardware/<fingerprint>.estimate-<dtype>.json``,
this machine exactly) and, committed by a developer, under ``perf/calibrations/`` as
``<class>-<dtype>-<cpu>.json`` (every machine of that class; the CPU model tells apart two
fits of one class, e.g. a Sapphire Rapids forced to fp32 reports ``x86-avx512`` as an Ice
Lake does). ``calibration_for`` takes the
first of: this machine's own fit, the shipped fit of its class and dtype (its CPU model's first), the shipped fit
of another class in the same dtype, the built-in one (the x86-avx512 class at fp32, the
first fit). ``Calibration.same_class`` says whether the constants were measured on this
class and CPU model: only then are its reference rates used in place of the profile's (the profile's
rates say how fast an *other* class is; counting both would count the speed twice).

Fixed costs are seconds, measured, and never scaled by compute speed: a cell's fork,
build, setup and store (``cell_s``), the checklist probes (``probes_s``), a warm worker's
imports and weights (``worker_s``), a fresh process's start (``start_s``), the run's own
(``run_s``: the CLI, the thread-policy probe, the estimate, the report).
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

SHIPPED_DIR = Path(__file__).resolve().parent / "calibrations"


@dataclass(frozen=True)
class Calibration:
    """Efficiencies are fractions of the reference rates; ``*_s`` are measured seconds."""

    e_prefill: float = 1.13          # linear layers of a prefill chunk
    e_attn: float = 0.79             # prefill attention (causal, unfused)
    e_batch: float = 1.02            # the batch's linear FLOPs in a decode step
    e_kv: float = 0.032              # decode attention over the cache (paged reads)
    e_stream: float = 1.37           # weights streamed in a decode step, over the read probe
    step_overhead_s_per_layer: float = 0.00032  # dispatch of one layer's operators, a step
    decode_factor: tuple = (("fp", 1.0), ("int4", 1.31), ("int8", 1.10), ("other", 1.2))
    cell_s: float = 0.3              # a warm worker's fork: build, setup, store of one cell
    probes_s: float = 6.5            # the checklist probes of a configuration's first cell
    worker_s: float = 4.39           # a warm worker's start: imports and weights, per model
    start_s: float = 4.39            # a fresh cell process: interpreter, torch, kvmap imports
    build_bytes_per_s: float = 4.5e8  # an extra engine build in a cell (a second pass)
    load_bytes_per_s: float = 2.6e9  # weights read from the cache (a fresh process only)
    run_s: float = 22.0              # once per run: the CLI, probes, estimate, report
    machine_class: str = "x86-avx512"
    dtype: str = "fp32"
    reference_cpu: str = "Intel(R) Xeon(R) Processor @ 2.80GHz"
    reference_flops: tuple = (("fp32", 5.56e10),)   # prefill-shaped products, at the fit
    reference_bandwidth: float = 4.55e9
    reference_step_s: float = 0.0464  # the decode-step proxy meanwhile, under wait_policy
    wait_policy: str = "PASSIVE"     # the cells' OpenMP wait policy during the fit
    source: str = "benchmarks/results/estimate_calibration-20261203-234152.json"
    same_class: bool = False         # set by ``calibration_for``: fitted on this class

    def decode_factor_of(self, codec: str) -> float:
        table = dict(self.decode_factor)
        family = "fp" if codec in ("fp32", "bf16", "fp16") else codec
        return table.get(family, table["other"])

    def reference_flops_of(self, dtype: str) -> float | None:
        return dict(self.reference_flops).get(dtype)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["decode_factor"] = dict(self.decode_factor)
        out["reference_flops"] = dict(self.reference_flops)
        out.pop("same_class")
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Calibration:
        """The inverse of ``to_dict``; ValueError naming an unknown field."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"calibration fields {unknown} are not among {sorted(known)}")
        data = dict(data)
        for key in ("decode_factor", "reference_flops"):
            if isinstance(data.get(key), dict):
                data[key] = tuple(sorted(data[key].items()))
        return cls(**data)


CALIBRATION = Calibration()


def local_path(hw, dtype: str) -> Path:
    """This machine's own fit, beside its hardware profile."""
    from kvmap.hardware.profile import cache_dir
    return cache_dir() / "hardware" / f"{hw.fingerprint}.estimate-{dtype}.json"


def shipped_name(cal: Calibration) -> str:
    cpu = re.sub(r"[^a-z0-9]+", "-", cal.reference_cpu.lower()).strip("-")
    return f"{cal.machine_class}-{cal.dtype}-{cpu}.json"


def store(cal: Calibration, hw, directory: Path | None = None) -> Path:
    """Write ``cal`` beside ``hw``'s profile (``directory``: as a shipped record)."""
    path = local_path(hw, cal.dtype) if directory is None \
        else directory / shipped_name(cal)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cal.to_dict(), indent=1) + "\n")
    return path


def _read(path: Path) -> Calibration | None:
    try:
        return Calibration.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def shipped() -> list[Calibration]:
    return [c for c in (_read(p) for p in sorted(SHIPPED_DIR.glob("*.json"))) if c]


def calibration_for(hw, dtype: str) -> Calibration:
    """The calibration for ``hw`` (a ``HardwareProfile``) computing in ``dtype`` (module
    docstring: its own fit, its class's, another class's in ``dtype``, the built-in)."""
    own = _read(local_path(hw, dtype)) if hw is not None else None
    if own is not None and own.machine_class == hw.machine_class:
        return replace(own, same_class=True)
    every = [c for c in shipped() if c.dtype == dtype]
    if hw is not None:
        mine = sorted((c for c in every if c.machine_class == hw.machine_class),
                      key=lambda c: c.reference_cpu != hw.cpu.model_name)
        if mine:             # its reference rates only where they are this CPU's
            return replace(mine[0], same_class=mine[0].reference_cpu == hw.cpu.model_name)
    return every[0] if every else CALIBRATION


__all__ = ["CALIBRATION", "Calibration", "calibration_for", "local_path", "shipped_name",
           "store"]
