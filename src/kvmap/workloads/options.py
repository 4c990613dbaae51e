"""A workload from the keys of a scenario file: ``workload_spec(name, options)``.

The bench (``kvmap bench``) and the simulator (``kvmap simulate``) read the same keys::

    {name: throughput, num_requests: 32, prompt_len: 200, output_len: 64,
     arrival: closed:16}

A *load sweep* lists several levels of one arrival kind, in increasing order, and
optionally one ``num_requests`` per level::

    arrival: [closed:4, closed:16, closed:64]      num_requests: [16, 32, 128]
    arrival: [poisson:2, poisson:8]

``load_levels`` splits such a workload into one option set per level, each with its
``Load`` (the record's ``load``: label, kind, value).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvmap.workloads.arrivals import ClosedLoop, Gamma, Poisson, parse_arrival
from kvmap.workloads.presets import PRESETS, get_preset
from kvmap.workloads.spec import WorkloadSpec

WORKLOAD_KEYS = {"name", "preset", "kind", "num_requests", "prompt_len", "output_len",
                 "arrival", "num_turns", "ignore_eos", "corpus", "trace", "seed"}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Load:
    """One load level of a sweep: ``closed:64`` -> kind ``closed``, value 64."""

    label: str
    kind: str            # "closed" | "poisson" | "gamma"
    value: float         # concurrency, or requests per second

    @classmethod
    def of(cls, text: str) -> Load:
        arrival = parse_arrival(text)
        if isinstance(arrival, ClosedLoop):
            return cls(str(text).strip(), "closed", float(arrival.concurrency))
        kind = "gamma" if isinstance(arrival, Gamma) else "poisson"
        assert isinstance(arrival, (Poisson, Gamma))
        return cls(str(text).strip(), kind, float(arrival.rate_per_s))

    def to_dict(self) -> dict:
        return {"label": self.label, "kind": self.kind, "value": self.value}


def load_levels(options: dict) -> list[tuple[dict, Load | None]]:
    """``[(options of one level, its Load)]``: one item with ``None`` when ``arrival`` is
    not a list. ValueError naming the value for levels of mixed kinds, levels that do not
    increase, or a ``num_requests`` list of another length."""
    arrival = options.get("arrival")
    if not isinstance(arrival, list):
        if isinstance(options.get("num_requests"), list):
            raise ValueError(f"num_requests: {options['num_requests']!r} is a list, but "
                             "arrival is not a list of load levels")
        return [(options, None)]
    if not arrival:
        raise ValueError("arrival: [] must list at least one load level")
    try:
        loads = [Load.of(level) for level in arrival]
    except ValueError as e:
        raise ValueError(f"arrival: {e}") from None
    kinds = {load.kind for load in loads}
    if len(kinds) > 1:
        raise ValueError(f"arrival: {arrival!r} mixes kinds {sorted(kinds)}; a sweep "
                         "has one kind")
    for a, b in zip(loads, loads[1:]):
        if b.value <= a.value:
            raise ValueError(f"arrival: load levels {arrival!r} must increase "
                             f"({b.label!r} after {a.label!r})")
    counts = options.get("num_requests")
    if isinstance(counts, list) and len(counts) != len(loads):
        raise ValueError(f"num_requests: {counts!r} has {len(counts)} values for "
                         f"{len(loads)} load levels")
    levels = []
    for i, load in enumerate(loads):
        level = {**options, "arrival": load.label}
        if isinstance(counts, list):
            level["num_requests"] = counts[i]
        levels.append((level, load))
    return levels


def _length(value: Any, preset_dist):
    """A YAML length: an int moves the preset's mean (keeping its shape); a string is
    parsed by ``kvmap.workloads.lengths.parse_length``."""
    from kvmap.workloads.lengths import parse_length
    if _is_int(value):
        if value < 1:
            raise ValueError(f"{value!r} must be >= 1")
        return preset_dist.with_mean(value)
    if isinstance(value, str):
        return parse_length(value)
    raise ValueError(f"{value!r} must be a token count or a distribution like "
                     "'uniform:128:384'")


def _base_spec(name: str, options: dict) -> WorkloadSpec:
    preset = options.get("preset")
    if preset is None and "kind" not in options and name in PRESETS:
        preset = name
    if preset is not None:
        spec = replace(get_preset(preset), name=name)
        if "kind" in options and options["kind"] != spec.kind:
            raise ValueError(f"kind: {options['kind']!r} contradicts preset {preset!r} "
                             f"(kind {spec.kind!r}); drop one")
        return spec
    if "kind" not in options:
        raise ValueError(f"kind: needed when the workload is not a preset "
                         f"({', '.join(sorted(PRESETS))})")
    if options["kind"] == "trace":
        if "trace" not in options:
            raise ValueError("trace: a workload of kind 'trace' needs a trace file")
        return WorkloadSpec(name, "trace", None, arrival=None, trace_path=options["trace"])
    return WorkloadSpec(name, options["kind"], 8)


def workload_spec(name: str, options: dict, seed: int = 0) -> WorkloadSpec:
    """The ``WorkloadSpec`` of one workload of one load level (ValueError naming the key).

    ``preset`` (default: ``name`` when it is a preset and no ``kind`` is given) is the
    starting point; without one, ``kind`` is required and the ``WorkloadSpec`` defaults
    apply. A ``trace`` replays the file's own arrival times unless ``arrival`` is given.
    """
    spec = _base_spec(name, options)
    changes: dict[str, Any] = {"seed": options.get("seed", seed)}
    for key in ("prompt_len", "output_len"):
        if key in options:
            try:
                changes[key] = _length(options[key], getattr(spec, key))
            except ValueError as e:
                raise ValueError(f"{key}: {e}") from None
    if "arrival" in options:
        try:
            changes["arrival"] = parse_arrival(options["arrival"])
        except ValueError as e:
            raise ValueError(f"arrival: {e}") from None
    if "ignore_eos" in options and not isinstance(options["ignore_eos"], bool):
        raise ValueError(f"ignore_eos: {options['ignore_eos']!r} must be true or false")
    for key in ("num_requests", "num_turns", "ignore_eos"):
        if key in options:
            changes[key] = options[key]
    if "corpus" in options:
        changes["corpus_path"] = options["corpus"]
    if "trace" in options:
        changes["trace_path"] = options["trace"]
    return replace(spec, **changes)


def upper_tokens(dist) -> int:
    """The largest length ``dist`` can draw."""
    for attr in ("hi_tokens", "num_tokens"):
        if hasattr(dist, attr):
            return int(getattr(dist, attr))
    return int(dist.max_tokens)


def longest_prompt_tokens(spec: WorkloadSpec) -> int:
    """The longest prompt the workload can send (a trace: its longest line)."""
    if spec.kind == "trace":
        from kvmap.workloads.trace import load_trace
        return max((e.prompt_tokens or 0 for e in load_trace(spec.trace_path)), default=0)
    return upper_tokens(spec.prompt_len)


def longest_request_tokens(spec: WorkloadSpec) -> int:
    """Prompt + output tokens of the largest request (a trace: its longest prompt plus
    its longest output, an upper bound)."""
    if spec.kind == "trace":
        from kvmap.workloads.trace import load_trace
        entries = load_trace(spec.trace_path)
        return max((e.prompt_tokens or 0) + (e.max_tokens or 0) for e in entries) \
            if entries else 0
    return upper_tokens(spec.prompt_len) + upper_tokens(spec.output_len)
