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

from kvmap.runs.search import (Probe, SearchResult, SearchSettings,
                                         requests_to_resolve, result)
from kvmap.report.loadcurve import Capacity, load_of
from kvmap.runs.record import CellRecord

RANGE_ROLES = ("serial", "saturated")


def search_of(cell: CellRecord) -> dict | None:
    """The ``search`` part of a probe cell's load (None for any other cell)."""
    load = load_of(cell)
    return load.get("search") if load and isinstance(load.get("search"), dict) else None


def search_role(cell: CellRecord) -> str | None:
    """A probe cell's role in its search (``serial``, ``saturated``, ``level``, ...)."""
    return (search_of(cell) or {}).get("role")


def level_cells(cells: list[CellRecord]) -> list[CellRecord]:
    """The cells that are levels of a load curve (a search's range runs are not)."""
    return [c for c in cells if (search_of(c) or {}).get("role") not in RANGE_ROLES]


def search_result(cells: list[CellRecord]) -> SearchResult | None:
    """The search over ``cells`` (one configuration's cells of one workload), or None
    when they are not a search's probes. Probes in the order they ran (``started_at``)."""
    probes = [c for c in cells if search_of(c)]
    if not probes:
        return None
    first = search_of(probes[0])
    fields = {k: first[k] for k in ("attainment", "tolerance", "levels", "max_probes")
              if k in first}
    settings = SearchSettings(**fields)
    ordered = sorted(probes, key=lambda c: c.started_at or "")
    return result([Probe.of(c, settings.attainment) for c in ordered], settings)


def search_capacity(cells: list[CellRecord]) -> Capacity | None:
    """The configuration's ``Capacity`` from its search (None: not a search)."""
    found = search_result(cells)
    if found is None:
        return None
    status = {"bracketed": "interpolated", "indeterminate": "interpolated"}.get(
        found.status, found.status)
    rates = [p.rate for p in found.probes if p.rate is not None and p.ok]
    n = max(c.metrics.get("num_requests") or 0 for c in cells)
    note = ""
    if not found.sure:
        note = (f"indeterminate at this power: an attainment of {found.attainment:g} needs "
                f"about {requests_to_resolve(found.attainment)} requests a level, "
                f"{n} ran")
    return Capacity(found.capacity, status, "poisson", min(rates, default=None),
                    max(rates, default=None), found.bracket, note=note)


def search_lines(run_dir) -> list[str]:
    """Each search of a run (``searches.json``): its capacity, its probes with their
    attainment intervals and verdicts, and the knee; [] for a run without searches."""
    import json
    from pathlib import Path
    path = Path(run_dir) / "searches.json"
    if not path.is_file():
        return []
    out = ["SLA capacity searches (arrival: auto):"]
    for entry in json.loads(path.read_text()).values():
        res = entry["result"]
        name = entry["kv"] if not entry.get("quantization") else \
            f"{entry['quantization']} weights + {entry['kv']}"
        out.append(f"  {entry['model']}: {name} on {entry['workload']}: {res['describe']} "
                   f"(attainment >= {res['attainment_target']:g}, tolerance "
                   f"{res['tolerance']:g})")
        for p in entry["probes"]:
            share = "" if p["share"] is None else f" attainment {p['share']:.3f}"
            ci = "" if not p["interval"] else f" [{p['interval'][0]:.3f}, {p['interval'][1]:.3f}]"
            tag = "over-saturated, stopped early" if p["over_saturated"] else \
                p["verdict"] or p["status"]
            out.append(f"    {p['role']:<9} {p['label']:<16}{share}{ci} {tag}")
        knee = res.get("knee")
        if knee:
            out.append(f"    knee: throughput reaches {knee['share']:.0%} of its peak "
                       f"({knee['peak_tok_s']:.0f} tok/s) at {knee['concurrency']:.1f} "
                       "sequences")
    return out
