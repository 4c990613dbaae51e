"""What every section of a scenario shares when it is parsed (``scenario_parse.py``): the
``Problems`` it collects (all of them, raised together as one ``ScenarioError``), unknown
keys, integers, KV spec lists and SLAs."""
from __future__ import annotations

from typing import Any

from kvmap.cli_errors import ScenarioError
from kvmap.metrics import normalize_slo, parse_slo


class Problems:
    """Collects every problem with the key it is about, then raises them together."""

    def __init__(self, source: str):
        self.source, self.items = source, []

    def add(self, where: str, message: str) -> None:
        self.items.append(f"{where}: {message}")

    def raise_if_any(self) -> None:
        if self.items:
            lines = "\n".join(f"  - {item}" for item in self.items)
            raise ScenarioError(f"scenario {self.source}: {len(self.items)} problem(s), "
                                f"nothing was run:\n{lines}")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def unknown_keys(mapping: dict, allowed: set[str], where: str, problems: Problems) -> None:
    for key in mapping:
        if key not in allowed:
            problems.add(f"{where}{key}" if not where else f"{where}.{key}",
                         f"unknown key {key!r}; valid keys: {', '.join(sorted(allowed))}")


def parse_kv(raw: Any, section: str, problems: Problems, notes: list[str], skip: bool
             ) -> list[str]:
    """A list of KV spec strings (``section`` names it in problems)."""
    from kvmap.kv import grammar
    from kvmap.kv.config import KVConfig, valid_names
    if raw is None:
        raw = ["auto"]
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        problems.add(section, f"{raw!r} must be a non-empty list of KV spec strings")
        return []
    specs, known = [], set(valid_names())
    for i, spec in enumerate(raw):
        where = f"{section}[{i}]"
        if not isinstance(spec, str):
            problems.add(where, f"{spec!r} must be a KV spec string such as 'int8'")
            continue
        try:
            missing = [p.name for p in grammar.parse(spec) if p.name not in known]
            if missing and skip:
                notes.append(f"skipped KV spec {spec!r}: {', '.join(missing)} not "
                             "registered yet")
                continue
            KVConfig.parse(spec)
        except ValueError as e:
            problems.add(where, str(e))
            continue
        if spec.strip() in specs:
            problems.add(where, f"KV spec {spec!r} is listed twice")
            continue
        specs.append(spec.strip())
    if not specs and not problems.items:
        problems.add(section, "no KV spec is available")
    return specs


def as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def parse_slo_section(raw: Any, problems: Problems, where: str = "slo") -> dict | None:
    """The scenario's SLA, or a workload's own (``where`` names it in a problem)."""
    if raw is None:
        return None
    try:
        if isinstance(raw, str):
            return parse_slo(raw)
        if isinstance(raw, dict):
            # {ttft_p99: 2s} or {ttft_p99_s: 2.0}: strings need a unit, numbers are seconds
            text_items = [f"{k}={v}" for k, v in raw.items() if isinstance(v, str)]
            slo = parse_slo(",".join(text_items)) if text_items else {}
            numbers = {k: v for k, v in raw.items() if not isinstance(v, str)}
            for key, value in normalize_slo(numbers).items():
                if key in slo:
                    raise ValueError(f"SLO key {key!r} is given twice")
                slo[key] = value
            return slo
        raise ValueError(f"{raw!r} must be a string like 'ttft_p99=2s,tbt_p99=150ms' or a "
                         "mapping")
    except ValueError as e:
        problems.add(where, str(e))
        return None
