"""Load curves and SLA capacity.

Cells of one load sweep share ``workload`` and differ by their record's ``load``
(``{"label": "closed:64", "kind": "closed", "value": 64.0}``). Per configuration the
curve is one ``LoadPoint`` per level, in increasing load; a failed cell is a point with
no figures (a gap in the curve). The *SLA capacity* is the load at which the first SLA
key crosses its limit, linearly interpolated between the last passing level a and the
first failing level b, per key k that fails at b (r = measured / limit):

    capacity = min_k  L_a + (1 - r_k(a)) / (r_k(b) - r_k(a)) * (L_b - L_a)

    r  |            x  b          the levels are read in increasing load; the first
    1 -|-------*----/----         failing level ends the search (a later pass is noise:
       |   o  a  /               a deployment needs every lower load to work too)
       +--------------- load

Statuses: ``"interpolated"``; ``"top"`` (every measured level passes: capacity ≥ the
top level); ``"below"`` (even the lowest level misses); ``"unmeasured"`` (no SLA, or no
level has figures). Failed levels are skipped and named in ``gaps``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvmap.runs.record import CellRecord
from kvmap.report.intervals import bootstrap_ci
from kvmap.report.noise import idle_parts, throughput_ci
from kvmap.report.slo import measure_key, request_groups, split_key
from kvmap.runs.cell_payloads import LoadLevel
from kvmap.runs.workload_metrics import WorkloadMetrics


@dataclass(frozen=True)
class LoadPoint:
    """One load level of one configuration's curve (figures None when the cell failed)."""

    label: str
    kind: str
    value: float
    cell_id: str
    ok: bool
    throughput_tok_s: float | None = None
    throughput_ci: tuple[float, float] | None = None
    measured: dict[str, float | None] = field(default_factory=dict)   # SLA key -> value (s)
    # SLA key -> (low, high)
    measured_ci: dict[str, tuple[float, float] | None] = field(default_factory=dict)
    concurrency_max: float | None = None
    idle: tuple[str, ...] = ()                       # parts that never acted here

    def meets(self, slo: dict[str, float]) -> bool | None:
        """Whether every SLA key is met here (None: failed cell or not measured)."""
        if not self.ok or not slo or any(self.measured.get(k) is None for k in slo):
            return None
        return all((v := self.measured[k]) is not None and v <= limit
                   for k, limit in slo.items())


@dataclass(frozen=True)
class Capacity:
    value: float | None           # load units of ``kind``; None when below the lowest
    status: str                   # interpolated | top | below | unmeasured
    kind: str
    lowest: float | None = None
    top: float | None = None
    ci: tuple[float, float] | None = None      # from the keys' bootstrap intervals
    gaps: tuple[str, ...] = ()
    note: str = ""                             # a search's: "indeterminate at this power"

    def describe(self) -> str:
        text = self._describe()
        return f"{text} ({self.note})" if self.note else text

    def _describe(self) -> str:
        unit = {"closed": " concurrent", "poisson": " req/s"}.get(self.kind, "")
        if self.status == "unmeasured":
            return "not measured"
        if self.status == "below":
            return f"below the lowest level ({self.lowest:g}{unit})"
        ci = f" [{self.ci[0]:.1f}, {self.ci[1]:.1f}]" if self.ci else ""
        if self.status == "top":
            return f"≥ top level ({self.top:g}{unit})"
        return f"{self.value:.1f}{unit}{ci}"

    @property
    def sort_value(self) -> float:
        """For ranking: below the lowest level sorts under every measured capacity."""
        return -1.0 if self.value is None else self.value


def load_of(cell: CellRecord) -> LoadLevel | None:
    """The cell's load level when it has a value (a level of a curve), else None."""
    level = cell.load_level
    return level if level is not None and level.value is not None else None


def load_value(cell: CellRecord) -> float:
    """The value of the cell's load level (0 for a cell of one load)."""
    level = load_of(cell)
    return float(level.value) if level is not None and level.value is not None else 0.0


def _level_value(metrics: WorkloadMetrics, rows: list[dict[str, Any]], key: str
                 ) -> float | None:
    if rows:
        return measure_key(rows, key)
    metric, stat = split_key(key)           # no rows stored: the record's summary
    summary = metrics.summary(f"{metric}_s")
    value = getattr(summary, stat or "p99", None)
    return value if value is not None else summary.extra.get(stat or "p99")


def _level_ci(rows: list[dict[str, Any]], key: str, seed: int) -> tuple[float, float] | None:
    metric, stat = split_key(key)
    groups = request_groups(rows, metric)
    if stat is None and metric == "tbt":     # a bare key: one value (worst gap) a request
        groups = [[max(g)] for g in groups if g]
    ci = bootstrap_ci(groups, stat or "p99", seed=seed) if rows else None
    return (ci["ci_low"], ci["ci_high"]) if ci else None


def load_points(cells: list[CellRecord], rows_by_cell: dict[str, list[dict[str, Any]]],
                slo: dict[str, float], seed: int = 0) -> list[LoadPoint]:
    """The curve of one configuration on one swept workload, in increasing load."""
    out = []
    for c in sorted(cells, key=load_value):
        load, value = load_of(c) or LoadLevel(), load_value(c)
        common: dict[str, Any] = dict(label=str(load.label or load.value),
                                      kind=str(load.kind or ""), value=value,
                                      cell_id=c.cell_id)
        if c.status != "ok":
            out.append(LoadPoint(**common, ok=False))
            continue
        m, rows = c.workload_metrics, rows_by_cell.get(c.cell_id, [])
        keys = list(dict.fromkeys([*slo, "ttft_p99_s", "tbt_p99_s"]))
        out.append(LoadPoint(
            **common, ok=True, throughput_tok_s=m.output_tokens_per_s,
            throughput_ci=throughput_ci(m, rows),
            measured={k: _level_value(m, rows, k) for k in keys},
            measured_ci={k: _level_ci(rows, k, seed) for k in keys},
            concurrency_max=m.concurrency_max, idle=tuple(idle_parts(c.kv, m))))
    return out


def _crossing(a: LoadPoint, b: LoadPoint, slo: dict[str, float], va: dict[str, Any],
              vb: dict[str, Any]) -> float:
    crossings = []
    for key, limit in slo.items():
        ra, rb = va[key] / limit, vb[key] / limit
        if rb > 1:
            frac = (1 - ra) / (rb - ra) if rb > ra else 0.0
            crossings.append(a.value + frac * (b.value - a.value))
    return min(crossings)


def _capacity(points: list[LoadPoint], slo: dict[str, float],
              values: Callable[[LoadPoint], dict[str, Any] | None]) -> tuple[str, float | None]:
    """(status, value) with the per-level SLA figures ``values(point)``."""
    last: tuple[LoadPoint, dict[str, Any]] | None = None
    for p in points:
        v = values(p)
        if v is None:
            continue
        if all(v[k] <= limit for k, limit in slo.items()):
            last = (p, v)
            continue
        if last is None:
            return "below", None
        return "interpolated", _crossing(last[0], p, slo, last[1], v)
    assert last is not None       # every usable point has figures: the first passed
    return "top", last[0].value


def sla_capacity(points: list[LoadPoint], slo: dict[str, float]) -> Capacity:
    """The configuration's SLA capacity on one swept workload (module docstring)."""
    kind = next((p.kind for p in points), "")
    gaps = tuple(p.label for p in points if not p.ok)
    usable = [p for p in points if p.meets(slo) is not None]
    if not slo or not usable:
        return Capacity(None, "unmeasured", kind, gaps=gaps)
    lowest, top = usable[0].value, usable[-1].value

    def at(bound: int) -> Callable[[LoadPoint], dict[str, Any]]:
        def values(p: LoadPoint) -> dict[str, Any]:
            if bound < 0:
                return p.measured
            cis = [p.measured_ci.get(k) for k in slo]
            if any(ci is None for ci in cis):
                return p.measured
            return {k: ci[bound] for k, ci in zip(slo, cis) if ci is not None}
        return values

    status, value = _capacity(usable, slo, at(-1))
    ci: tuple[float, float] | None = None
    if status == "interpolated" and value is not None:
        bounds = [_capacity(usable, slo, at(i)) for i in (1, 0)]  # pessimistic, optimistic
        lo, hi = (v if s != "below" and v is not None else lowest for s, v in bounds)
        ci = (min(lo, value), max(hi, value))
    return Capacity(value, status, kind, lowest, top, ci, gaps)


def swept_workloads(cells: list[CellRecord]) -> set[str]:
    """Workloads with more than one load level among ``cells``."""
    levels: dict[str, set[float]] = {}
    for c in cells:
        if c.workload and load_of(c):
            levels.setdefault(c.workload, set()).add(load_value(c))
    return {w for w, v in levels.items() if len(v) > 1}
