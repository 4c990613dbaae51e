"""Simulator scenario files: YAML -> a frozen ``SimScenario`` of one or more ``SimConfig``.

    name: int8-batch
    description: what the experiment shows
    seed: 0
    model: llama-2-13b                 # catalogued name or a HF config.json path
    weights: bf16                      # fp32 | bf16 | fp8 | int8 | int4 (default: bf16;
                                       # cpu-this-machine: its compute dtype)
    hardware: {gpu: a100-80gb, num_devices: 1, compute_efficiency: 0.6}
                                       # or gpu: cpu-this-machine (the machine's hardware
                                       # profile; dtype: auto, num_threads), or no gpu and
                                       # memory, compute_flops, memory_bandwidth given
    kv_costs: {read: 2ns, write: 5ns}  # optional: the KV configuration's own operators per
                                       # layer and token (kvmap.plan.sim.kvcost); measured
                                       # on cpu-this-machine, bytes only on a GPU
    tiers:                             # top to bottom; presets host | nvme | network
      - {name: host, capacity: 256GiB}
      - {name: nvme, capacity: 2TiB, bandwidth: 7GB/s, latency: 80us, iops: 500000}
    kv: int8                           # a KV spec: codec + selection policy
    eviction: lru                      # lru | lfu | arc, every level
    prefetch: none                     # none | queue
    engine: {max_num_seqs: 256, max_num_batched_tokens: 8192, block_size: 16,
             kv_memory: 20GiB, hbm_window_tokens: 2048, stream_overlap: true,
             enable_prefix_caching: true, prefetch_depth: 8}
    workload: {preset: throughput, num_requests: 512}    # kvmap bench's workload keys
    variants:                          # optional: one simulation each, keys override
      - {name: bf16, kv: bf16}         # (mappings merge key by key; a workload with its
      - {name: int8, kv: int8}         #  own preset or kind replaces the base one)

Units: sizes as ``parse_size`` (``256GiB``, ``2TB``); bandwidths a size per second
(``7GB/s``) or bytes/s; times ``80us``, ``0.5ms``, ``2s`` or seconds; FLOP/s a number or
with a suffix (``989T``). Every problem is reported at once, each naming the file and the
key (``variants[1].engine.max_num_seqs``), as ``ScenarioError``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from kvmap.cli_errors import ScenarioError
from kvmap.config import parse_size
from kvmap.kv.config import KVConfig
from kvmap.kv.tiers.eviction import EVICTION_ORDERS
from kvmap.plan.catalogue import get_model
from kvmap.plan.sim.config import PREFETCH_MODES, EngineSettings, SimConfig
from kvmap.plan.sim.hardware import TIER_PRESETS, Hardware, TierHardware, gpu_hardware
from kvmap.plan.sim.kvcost import FIXED, PER_TOKEN, KVCosts
from kvmap.perf.weights import BYTE_RULES
from kvmap.workloads.options import WORKLOAD_KEYS, workload_spec

THIS_MACHINE = "cpu-this-machine"

TOP_KEYS = {"name", "description", "seed", "model", "weights", "hardware", "tiers", "kv",
            "eviction", "prefetch", "engine", "workload", "variants", "kv_costs"}
VARIANT_KEYS = TOP_KEYS - {"description", "seed", "variants"}
HARDWARE_KEYS = {"gpu", "num_devices", "memory", "compute_flops", "memory_bandwidth",
                 "interconnect_bandwidth", "compute_efficiency", "bandwidth_efficiency",
                 "step_overhead", "layer_overhead", "seq_overhead", "seq_layer_overhead",
                 "gpu_memory_utilization", "reserve",
                 "num_threads", "dtype"}
TIER_KEYS = {"name", "preset", "capacity", "bandwidth", "latency", "iops", "io_bytes", "link"}
ENGINE_KEYS = {"block_size", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching",
               "kv_memory", "hbm_window_tokens", "stream_overlap", "prefetch_depth",
               "reservation", "reservation_tokens"}
_TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
_SI = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}


@dataclass(frozen=True)
class SimScenario:
    name: str
    source: str
    description: str
    seed: int
    configs: tuple[SimConfig, ...]


# ---- units ---------------------------------------------------------------------------

def parse_duration(value: Any, what: str) -> float:
    """Seconds from ``80us``, ``0.5ms``, ``2s`` or a number of seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(ns|us|µs|ms|s)\s*", str(value))
    if not m:
        raise ValueError(f"{what}={value!r} is not a time (examples: 80us, 0.5ms, 2s)")
    return float(m.group(1)) * _TIME_UNITS[m.group(2)]


def parse_bandwidth(value: Any, what: str) -> float:
    """Bytes/s from ``7GB/s``, ``50GiB/s`` or a number."""
    if isinstance(value, str):
        value = re.sub(r"\s*/\s*s\s*$", "", value)
    result = parse_size(value, what)
    if result <= 0:
        raise ValueError(f"{what}={value!r} must be > 0 bytes/s")
    return float(result)


def parse_flops(value: Any, what: str) -> float:
    """FLOP/s from ``989e12``, ``989T``, ``989 TFLOP/s``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgtp]?)\s*(flop/?s|flops)?\s*",
                     str(value).lower())
    if not m:
        raise ValueError(f"{what}={value!r} is not a FLOP/s rate (examples: 989e12, 989T)")
    return float(m.group(1)) * _SI[m.group(2)]


# ---- sections --------------------------------------------------------------------------

def _unknown(raw: dict, allowed: set[str], where: str) -> None:
    extra = sorted(set(raw) - allowed)
    if extra:
        raise ValueError(f"{where}: unknown key(s) {', '.join(map(repr, extra))}; allowed: "
                         f"{', '.join(sorted(allowed))}")


def _mapping(raw: Any, where: str) -> dict:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: {raw!r} must be a mapping")
    return raw


def parse_hardware(raw: Any) -> Hardware:
    raw = dict(_mapping(raw, "hardware"))
    _unknown(raw, HARDWARE_KEYS, "hardware")
    gpu = raw.pop("gpu", None)
    num_threads, dtype = raw.pop("num_threads", 1), raw.pop("dtype", "auto")
    fields: dict[str, Any] = {}
    converters = {"memory": ("memory_bytes", lambda v, w: parse_size(v, w)),
                  "compute_flops": ("compute_flops", parse_flops),
                  "memory_bandwidth": ("memory_bandwidth", parse_bandwidth),
                  "interconnect_bandwidth": ("interconnect_bandwidth", parse_bandwidth),
                  "step_overhead": ("step_overhead_s", parse_duration),
                  "layer_overhead": ("layer_overhead_s", parse_duration),
                  "seq_overhead": ("seq_overhead_s", parse_duration),
                  "seq_layer_overhead": ("seq_layer_overhead_s", parse_duration),
                  "reserve": ("reserve_bytes", lambda v, w: parse_size(v, w))}
    for key, value in raw.items():
        name, convert = converters.get(key, (key, None))
        fields[name] = convert(value, f"hardware.{key}") if convert else value
    if gpu is None:
        missing = [k for k in ("memory", "compute_flops", "memory_bandwidth") if k not in raw]
        if missing:
            raise ValueError(f"hardware: without gpu, give {', '.join(missing)}")
        return Hardware(name="custom", **fields)
    if str(gpu).lower() == THIS_MACHINE:
        from kvmap.plan.sim import machine
        return replace(machine.this_machine(dtype, num_threads), **fields)
    try:
        return gpu_hardware(str(gpu), **fields)
    except ValueError as e:
        raise ValueError(f"hardware.gpu: {e}, or {THIS_MACHINE} (this machine's measured "
                         f"profile); or give the rates by hand without gpu: hardware: "
                         f"{{memory: 80GiB, compute_flops: 989T, memory_bandwidth: 3.35TB/s}}"
                         ) from None


def parse_kv_costs(raw: Any, spec: str = "given") -> KVCosts:
    """``kv_costs: {read: 2ns, prefill_read: 1ns, write: 5ns, stats: 0, compress: 0,
    step: 20us, seq: 1us}``: seconds per layer (per token, per step, per decoding row)."""
    raw = dict(_mapping(raw, "kv_costs"))
    names = {name.removesuffix("_s"): name for name in (*PER_TOKEN, *FIXED)}
    _unknown(raw, set(names), "kv_costs")
    return KVCosts(spec=spec, source="given",
                   **{names[k]: parse_duration(v, f"kv_costs.{k}") for k, v in raw.items()})


def parse_tiers(raw: Any) -> tuple[TierHardware, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError(f"tiers: {raw!r} must be a list of tiers")
    tiers = []
    for i, item in enumerate(raw):
        where = f"tiers[{i}]"
        item = _mapping(item, where)
        _unknown(item, TIER_KEYS, where)
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}.name: every tier needs a name")
        preset = item.get("preset", name if name in TIER_PRESETS else None)
        if preset is not None and preset not in TIER_PRESETS:
            raise ValueError(f"{where}.preset={preset!r} is not one of "
                             f"{', '.join(TIER_PRESETS)}")
        fields = dict(TIER_PRESETS.get(preset, {}))
        if "capacity" not in item:
            raise ValueError(f"{where}.capacity: every tier needs a capacity")
        fields["capacity_bytes"] = parse_size(item["capacity"], f"{where}.capacity")
        if "bandwidth" in item:
            fields["bandwidth"] = parse_bandwidth(item["bandwidth"], f"{where}.bandwidth")
        if "latency" in item:
            fields["latency_s"] = parse_duration(item["latency"], f"{where}.latency")
        for key in ("iops", "io_bytes", "link"):
            if key in item:
                fields[key] = item[key]
        missing = [k for k in ("bandwidth", "latency_s") if k not in fields]
        if missing:
            raise ValueError(f"{where}: tier {name!r} is no preset "
                             f"({', '.join(TIER_PRESETS)}); give bandwidth and latency")
        try:
            tiers.append(TierHardware(name=name, **fields))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    return tuple(tiers)


def parse_engine(raw: Any) -> EngineSettings:
    raw = dict(_mapping(raw or {}, "engine"))
    _unknown(raw, ENGINE_KEYS, "engine")
    if "kv_memory" in raw:
        raw["kv_memory_bytes"] = parse_size(raw.pop("kv_memory"), "engine.kv_memory")
    return EngineSettings(**raw)


def parse_workload(raw: Any, seed: int, base_dir: Path):
    raw = dict(_mapping(raw, "workload"))
    _unknown(raw, WORKLOAD_KEYS, "workload")
    for key in ("trace", "corpus"):
        if key in raw:
            raw[key] = str((base_dir / raw[key]).resolve())
    name = raw.pop("name", raw.get("preset", "workload"))
    try:
        return workload_spec(name, raw, seed)
    except ValueError as e:
        raise ValueError(f"workload.{e}") from None


def _build(raw: dict, name: str, seed: int, base_dir: Path, where: str,
           problems: list[str]) -> SimConfig | None:
    parts: dict[str, Any] = {}
    num_before = len(problems)

    def section(key: str, parse, default=None) -> None:
        try:
            parts[key] = parse(raw[key]) if key in raw else default
        except ValueError as e:
            message = str(e)
            prefix = "" if message.startswith(key) else f"{key}: "
            problems.append(f"{where}{prefix}{message}")

    if "model" not in raw:
        problems.append(f"{where}model: missing (a catalogued name or a config.json path)")
    else:
        section("model", lambda v: get_model(str(v)))
    if "hardware" not in raw:
        problems.append(f"{where}hardware: missing (gpu: NAME, or the rates)")
    else:
        section("hardware", parse_hardware)
    if "workload" not in raw:
        problems.append(f"{where}workload: missing")
    else:
        section("workload", lambda v: parse_workload(v, seed, base_dir))
    # a spec without a codec stores what the machine computes in (fp32 on a CPU without bf16)
    kv_dtype = parts["hardware"].compute_dtype if parts.get("hardware") is not None else None
    section("kv", lambda v: KVConfig.parse(str(v), dtype=kv_dtype),
            KVConfig.parse("auto", dtype=kv_dtype))
    section("tiers", parse_tiers, ())
    section("engine", parse_engine, EngineSettings())

    def weights(v: Any) -> str:
        if str(v).lower() not in BYTE_RULES:
            raise ValueError(f"weights={v!r} is not one of {', '.join(BYTE_RULES)}")
        return str(v).lower()

    hw = parts.get("hardware")
    # weights default to the dtype the machine computes in (fp32 on a CPU without bf16)
    section("weights", weights, hw.compute_dtype if hw is not None and hw.name == THIS_MACHINE
            else "bf16")
    section("kv_costs", parse_kv_costs)
    choices = {"eviction": str(raw.get("eviction", "lru")).lower(),
               "prefetch": str(raw.get("prefetch", "none")).lower()}
    for key, allowed in (("eviction", EVICTION_ORDERS), ("prefetch", PREFETCH_MODES)):
        if choices[key] not in allowed:
            problems.append(f"{where}{key}={raw.get(key)!r} is not one of {', '.join(allowed)}")
    if len(problems) > num_before:
        return None
    try:
        return SimConfig(name=name, **choices, **parts)
    except ValueError as e:
        problems.append(f"{where}{e}")
        return None


def _merge(base: dict, override: dict) -> dict:
    """A variant over the base: mappings merge key by key, except a workload that names
    its own ``preset`` or ``kind`` (it replaces the base workload); the rest replaces."""
    merged = dict(base)
    for key, value in override.items():
        fresh_workload = key == "workload" and isinstance(value, dict) and (
            "preset" in value or "kind" in value)
        if isinstance(value, dict) and isinstance(base.get(key), dict) and not fresh_workload:
            merged[key] = {**base[key], **value}
        else:
            merged[key] = value
    return merged


def parse_sim_scenario(data: Any, source: str = "<scenario>",
                       base_dir: Path | None = None) -> SimScenario:
    """Validate ``data`` (a parsed YAML mapping); raises ScenarioError listing problems."""
    base_dir = base_dir or Path.cwd()
    problems: list[str] = []
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: a scenario must be a mapping, not {type(data).__name__}")
    extra = sorted(set(data) - TOP_KEYS)
    if extra:
        problems.append(f"unknown key(s) {', '.join(map(repr, extra))}; allowed: "
                        f"{', '.join(sorted(TOP_KEYS))}")
    name = str(data.get("name", Path(source).stem))
    seed = data.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        problems.append(f"seed: {seed!r} must be an integer")
        seed = 0
    variants = data.get("variants")
    configs: list[SimConfig | None] = []
    if variants is None:
        configs.append(_build(data, name, seed, base_dir, "", problems))
    elif not isinstance(variants, list) or not variants:
        problems.append(f"variants: {variants!r} must be a non-empty list of mappings")
    else:
        names = set()
        for i, variant in enumerate(variants):
            where = f"variants[{i}]"
            if not isinstance(variant, dict):
                problems.append(f"{where}: {variant!r} must be a mapping")
                continue
            extra = sorted(set(variant) - VARIANT_KEYS)
            if extra:
                problems.append(f"{where}: unknown key(s) {', '.join(map(repr, extra))}")
                continue
            vname = str(variant.get("name", f"variant-{i}"))
            if vname in names:
                problems.append(f"{where}.name: {vname!r} repeats an earlier variant")
            names.add(vname)
            merged = _merge({k: v for k, v in data.items() if k != "variants"}, variant)
            configs.append(_build(merged, vname, seed, base_dir, f"{where}.", problems))
    if problems:
        raise ScenarioError(f"{source}: {len(problems)} problem(s):\n  "
                            + "\n  ".join(problems))
    return SimScenario(name=name, source=source, description=str(data.get("description", "")),
                       seed=seed, configs=tuple(configs))


def builtin_names() -> list[str]:
    folder = resources.files("kvmap.plan.sim") / "scenarios"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_sim_scenario(path: str | Path) -> SimScenario:
    """A scenario file, or a built-in one by name (``builtin:NAME`` or just ``NAME``)."""
    text_path = str(path)
    name = text_path.removeprefix("builtin:")
    file = Path(text_path)
    if text_path.startswith("builtin:") or (not file.exists() and name in builtin_names()):
        if name not in builtin_names():
            raise ScenarioError(f"no built-in scenario {name!r}; built-in: "
                                f"{', '.join(builtin_names())}")
        resource = resources.files("kvmap.plan.sim") / "scenarios" / f"{name}.yaml"
        text, source, base_dir = resource.read_text(), f"builtin:{name}", Path.cwd()
    else:
        if not file.is_file():
            raise ScenarioError(f"scenario file {text_path!r} not found; built-in: "
                                f"{', '.join(builtin_names())}")
        text, source, base_dir = file.read_text(), str(file), file.parent
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ScenarioError(f"{source}: not valid YAML: {e}") from None
    return parse_sim_scenario(data, source, base_dir)
