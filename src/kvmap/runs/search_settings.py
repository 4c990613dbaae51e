"""The settings of an ``arrival: auto`` search as a scenario writes them
(``SearchSettings``, validated: ValueError naming the bad value), and the requests a level
needs before its pass can be decided (``requests_to_decide``). The rules that use them are
``runs.search``'s."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvmap.metrics.evidence import key_quantile, needed_for_pass
from kvmap.runs.record import JSONObject


@dataclass(frozen=True)
class SearchSettings:
    """``search:`` of a workload (validated: ValueError naming the bad value)."""

    attainment: float = 0.99
    tolerance: float = 0.25           # relative gap of the final bracket
    levels: int = 3
    max_probes: int = 6               # levels, bisections and extensions, besides serial
    #                                   and saturated
    max_level_requests: int | None = None   # sequential sampling's cap a rate (None: 4
    #                                         probes' requests)

    def __post_init__(self) -> None:
        a = self.attainment
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 < a <= 1:
            raise ValueError(f"search.attainment={a!r} must be in (0, 1]")
        t = self.tolerance
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
            raise ValueError(f"search.tolerance={t!r} must be a positive fraction")
        for key in ("levels", "max_probes"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"search.{key}={v!r} must be an integer >= 1")
        m = self.max_level_requests
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError(f"search.max_level_requests={m!r} must be an integer >= 1")
        if self.levels > self.max_probes:
            raise ValueError(f"search.levels={self.levels} is more than "
                             f"search.max_probes={self.max_probes}")

    @classmethod
    def parse(cls, raw: Any) -> SearchSettings:
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise ValueError(f"search: {raw!r} must be a mapping of attainment, tolerance, "
                             "levels, max_probes")
        unknown = sorted(set(raw) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"search: unknown key {unknown[0]!r}; valid keys: "
                             f"{', '.join(sorted(cls.__dataclass_fields__))}")
        return cls(**raw)

    def to_dict(self) -> JSONObject:
        out: JSONObject = {"attainment": self.attainment, "tolerance": self.tolerance,
                           "levels": self.levels, "max_probes": self.max_probes}
        if self.max_level_requests is not None:
            out["max_level_requests"] = self.max_level_requests
        return out


def search_settings(item: JSONObject, options: JSONObject) -> JSONObject | None:
    """A scenario workload's search settings (``SearchSettings.to_dict``), or None for a
    workload with its own levels; ValueError naming the bad value."""
    if options.get("arrival") != "auto":
        if "search" in item:
            raise ValueError("search settings need arrival: auto")
        return None
    if isinstance(options.get("num_requests"), list):
        raise ValueError(f"num_requests: {options['num_requests']!r}: arrival: auto takes "
                         "one num_requests (the requests of each probe)")
    return SearchSettings.parse(item.get("search")).to_dict()


def requests_to_decide(slo: JSONObject | None, attainment: float, gaps_per_request: int = 1
                       ) -> int:
    """Requests a level needs before a pass can be decided, every value within the limit:
    the most over the SLA keys (a TBT key counts ``gaps_per_request`` values a request)."""
    from kvmap.metrics import split_slo_key
    need = 1
    for key in slo or {}:
        metric, _ = split_slo_key(key)
        values = needed_for_pass(key_quantile(key, attainment))
        per = max(1, gaps_per_request) if metric in ("tbt", "itl") else 1
        need = max(need, math.ceil(values / per))
    return need
