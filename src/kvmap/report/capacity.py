"""The SLA capacity of a configuration whose load levels were found by an ``arrival:
auto`` search (``kvmap.runs.search``), read from its probe cells.

A probe cell's ``load`` carries ``search`` (its role and the search's settings). The
serial and saturated runs give the range and the knee, not levels of the curve: the
curve and the capacity are read on the open-loop levels only. The capacity is the
highest rate whose SLA attainment reached the target, bracketed by the lowest that
missed (``Capacity.ci``), ``indeterminate`` when either bracket's attainment interval
straddles the target; the knee is the lowest concurrency measured whose throughput
reaches 90% of the peak.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from kvmap.report.loadcurve import Capacity, load_of
from kvmap.runs.record import CellRecord
from kvmap.runs.search import Probe, SearchResult, result
from kvmap.runs.search_record import read_searches
from kvmap.runs.search_settings import SearchSettings

RANGE_ROLES = ("serial", "saturated")


def search_of(cell: CellRecord) -> dict[str, Any] | None:
    """The ``search`` part of a probe cell's load (None for any other cell)."""
    load = load_of(cell)
    return load.search if load else None


def search_role(cell: CellRecord) -> str | None:
    """A probe cell's role in its search (``serial``, ``saturated``, ``level``, ...)."""
    load = load_of(cell)
    return load.search_role if load else None


def level_cells(cells: list[CellRecord]) -> list[CellRecord]:
    """The cells that are levels of a load curve (a search's range runs are not)."""
    return [c for c in cells if search_role(c) not in RANGE_ROLES]


def search_result(cells: list[CellRecord]) -> SearchResult | None:
    """The search over ``cells`` (one configuration's cells of one workload), or None
    when they are not a search's probes. Probes in the order they ran (``started_at``)."""
    probes = [c for c in cells if search_of(c)]
    if not probes:
        return None
    first = search_of(probes[0]) or {}        # a probe: its search is there
    fields = {k: first[k] for k in SearchSettings.__dataclass_fields__ if k in first}
    settings = SearchSettings(**fields)
    ordered = sorted(probes, key=lambda c: c.started_at or "")
    return result([Probe.of(c, settings.attainment) for c in ordered], settings)


def search_capacity(cells: list[CellRecord]) -> Capacity | None:
    """The configuration's ``Capacity`` from its search (None: not a search)."""
    found = search_result(cells)
    if found is None:
        return None
    status = {"decided": "interpolated", "undecided": "interpolated"}.get(
        found.status, found.status)
    rates = [p.rate for p in found.probes if p.rate is not None and p.ok]
    n = sum(p.num_requests for p in found.probes)
    note = f"decided on {n} requests" if found.sure else ""
    if not found.sure:
        note = (f"undecided at this power: {n} requests ran and no level's verdict "
                "brackets the capacity (searches.json: what each level needs)")
    return Capacity(found.capacity, status, "poisson", min(rates, default=None),
                    max(rates, default=None), found.bracket, note=note)


def search_lines(run_dir: str | Path) -> list[str]:
    """Each search of a run (``searches.json``): its capacity, its probes with their
    attainment intervals and verdicts, and the knee; [] for a run without searches."""
    searches = read_searches(run_dir)
    if not searches:
        return []
    out = ["SLA capacity searches (arrival: auto):"]
    for entry in searches.values():
        res = entry.result
        pred = res.predicted_req_s
        out.append(f"  {entry.model}: {entry.name} on {entry.workload}: {res.describe} "
                   f"(tolerance {res.tolerance or 0:g}"
                   + (f"; simulator predicted {pred:.3g} req/s" if pred else "") + ")")
        for p in entry.probes:
            shares = ", ".join(f"{k} {v['within']}/{v['n']} {v['unit']} (>= {v['quantile']:g})"
                               for k, v in (p.keys or {}).items())
            tag = "over-saturated, stopped early" if p.over_saturated else \
                (p.verdict or p.status or "")
            pooled = p.pooled_verdict
            tag += f"; pooled: {pooled}" if pooled and pooled != p.verdict else ""
            out.append(f"    {p.role or '':<9} {p.label or '':<16} {shares} {tag}")
        knee = res.knee
        if knee:
            out.append(f"    knee: throughput reaches {knee['share']:.0%} of its peak "
                       f"({knee['peak_tok_s']:.0f} tok/s) at {knee['concurrency']:.1f} "
                       "sequences")
    return out
