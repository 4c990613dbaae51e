"""A run's ``searches.json`` typed: per ``arrival: auto`` search (keyed by its template
cell id) the configuration, the result (``SearchSummary``) and each probe as it ran
(``ProbeSummary``), as ``bench.search_backend`` writes them after each search. Read by
the report (``report.capacity.search_lines``); keys these views do not name stay in
``extra`` (``runs.payload.view``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvmap.runs.payload import view

SEARCHES_FILE = "searches.json"


@dataclass(frozen=True)
class SearchSummary:
    """What one search found (``runs.search.SearchResult`` as written)."""

    status: str | None = None
    capacity_req_s: float | None = None
    bracket_req_s: list[float] | None = None
    tolerance: float | None = None
    attainment_target: float | None = None
    knee: dict[str, Any] | None = None          # share, peak_tok_s, concurrency
    predicted_req_s: float | None = None
    num_requests: int | None = None
    requests_to_decide_a_pass: int | None = None
    stopped: str | None = None
    describe: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ProbeSummary:
    """One probe of a search: its level, its SLA evidence per key, its verdicts."""

    cell_id: str | None = None
    label: str | None = None
    role: str | None = None
    status: str | None = None
    share: float | None = None
    num_requests: int | None = None
    keys: dict[str, dict[str, Any]] | None = None  # key -> within, n, quantile, unit
    verdict: str | None = None
    pooled_verdict: str | None = None
    over_saturated: bool | None = None
    concurrency: float | None = None
    throughput_tok_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SearchEntry:
    """One configuration's search on one workload."""

    workload: str | None = None
    model: str | None = None
    quantization: str | None = None
    kv: str | None = None
    result: SearchSummary = field(default_factory=SearchSummary)
    probes: list[ProbeSummary] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The configuration as the map names it."""
        kv = self.kv or "-"
        return f"{self.quantization} weights + {kv}" if self.quantization else kv


def _probes(data: Any) -> list[ProbeSummary]:
    if not isinstance(data, list):
        raise ValueError(f"is not a list of probes ({data!r:.80})")
    return [view(ProbeSummary, p, f"probe {i}") for i, p in enumerate(data)]


def read_searches(run_dir: str | Path) -> dict[str, SearchEntry]:
    """The searches of the run in ``run_dir`` ({} for a run without any); ValueError
    naming the file and the key for an entry of the wrong shape."""
    path = Path(run_dir) / SEARCHES_FILE
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} is a JSON object of searches, not "
                         f"{type(data).__name__}")
    return {str(key): view(SearchEntry, entry, f"{path.name}[{key!r}]",
                           nested={"result": lambda d: view(SearchSummary, d, ""),
                                   "probes": _probes})
            for key, entry in data.items()}
