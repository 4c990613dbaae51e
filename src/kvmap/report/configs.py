"""One ``ConfigSummary`` per KV configuration: the figures the map, the recommender and
the checklist compare, gathered from the configuration's cell records and request rows.

Definitions (``docs/report.md`` explains them for readers):

- ``peak_kv_bytes``: the largest ``peak_kv_resident_bytes`` of the configuration's cells
  (what must be provisioned for the worst job of the scenario);
- the *primary workload* is the scenario's workload with the most requests (the first on
  a tie); ``throughput_tok_s``, ``tbt_p99_s``... are its figures; for a workload swept
  over load levels (``loadcurve``), the figures of its top level that ran, and
  ``capacity`` its SLA capacity;
- ``accuracy_drop_pct`` is the worst drop over the accuracy tasks, each in percent: for
  ``ppl`` the relative rise in perplexity against the full cache (as the task stores it),
  for tasks with an ``accuracy`` the fall in percentage points against the baseline
  configuration's cell on the same samples (baseline: the model's dtype as the KV codec);
  a workload whose requests carry needle questions (``needle_accuracy``) counts as one
  more accuracy task, ``"<workload> (needle)"``, paired request by request (``tasks``);
- ``slo_measured``: for each SLA key, the worst value over the configuration's workloads
  (``measure_slo``); a bare key (``ttft``) is read at the 99th percentile of requests;
  a swept workload counts at its highest level within the SLA (its lowest when none is);
- ``kv_per_seq_bytes``: the primary workload's peak resident KV over its largest number
  of sequences running at once -- what one sequence costs where memory binds
  (``memory_binds``: some step could not admit or had to preempt for lack of blocks),
  since there every configuration fills the same pool and its peak shows no saving;
- ``idle``: the parts that never acted on the primary workload (``noise.idle_parts``);
  ``equal_to`` then names the configuration without them, which this one equals there.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kvmap.report.capacity import level_cells, search_capacity, search_role
from kvmap.runs.record import CellRecord
from kvmap.model.dummy import DUMMY_PREFIX
from kvmap.report import loadcurve as L
from kvmap.report.intervals import bootstrap_ci
from kvmap.report.noise import (complexity, idle_parts, reference_part, same_spec,
                                throughput_ci, without)
from kvmap.report.samples import Inflation
from kvmap.report.slo import (BARE_KEY_PERCENTILE, gaps, is_good, measure_key,  # noqa: F401
                              measure_slo, request_groups, split_key)
from kvmap.report.endpoints import endpoint_baseline, endpoint_of, memory_note
from kvmap.report.tasks import TaskResult, needle_result, task_result
from kvmap.runs.cell_payloads import EndpointInfo
from kvmap.runs.workload_metrics import Probes, TierCounters, WorkloadMetrics


class Level(NamedTuple):
    """One load level of a swept workload: its label, metrics (None: it failed), rows."""

    label: str
    metrics: WorkloadMetrics | None
    rows: list[dict[str, Any]]


@dataclass
class ConfigSummary:
    """A KV configuration's figures; every field may be None where the run lacks it."""

    name: str
    kv: str = ""
    model: str = ""
    dtype: str | None = None
    is_baseline: bool = False
    num_cells: int = 0
    num_failed: int = 0
    kv_bytes_per_token: float | None = None
    peak_kv_bytes: float | None = None
    primary_workload: str | None = None
    throughput_tok_s: float | None = None
    throughput_ci: tuple[float, float] | None = None
    goodput_tok_s: float | None = None
    ttft_p99_s: float | None = None
    tbt_p50_s: float | None = None
    tbt_p99_s: float | None = None
    tbt_p99_ci: tuple[float, float] | None = None
    kv_per_seq_bytes: float | None = None
    memory_binds: bool = False
    accuracy_drop_pct: float | None = None
    accuracy_na: bool = False          # dummy weights (or the run has tasks, this model none)
    capacity: L.Capacity | None = None                           # primary workload, swept
    curves: dict[str, list[L.LoadPoint]] = field(default_factory=dict)   # swept workloads
    levels: dict[str, list[Level]] = field(default_factory=dict)  # swept workloads
    idle: list[str] = field(default_factory=list)
    equal_to: str | None = None
    complexity: int = 0
    reference: str | None = None       # a reference-only part (``all_global``): not a choice
    tasks: dict[str, TaskResult] = field(default_factory=dict)
    slo_measured: dict[str, float | None] = field(default_factory=dict)
    workloads: dict[str, WorkloadMetrics] = field(default_factory=dict)   # name -> metrics
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)   # name -> rows
    probes: Probes | None = None                                 # bench.probes results
    tiers: dict[str, dict[str, TierCounters]] = field(default_factory=dict)  # workload ->
    endpoint: EndpointInfo | None = None   # a server measured over HTTP (endpoints.py)
    memory_note: str | None = None   # why an endpoint has no memory coordinate

    def measure(self, key: str) -> float | None:
        """One normalized SLA key: from ``slo_measured`` when there, else from the rows."""
        if key not in self.slo_measured:
            self.slo_measured[key] = measure_slo(self.rows, {key: 0.0})[key]
        return self.slo_measured[key]

    @property
    def primary(self) -> WorkloadMetrics:
        """The primary workload's metrics (every figure None when it has none)."""
        return self.workloads.get(self.primary_workload or "") or WorkloadMetrics()

    @property
    def worst_task(self) -> TaskResult | None:
        """The task that gives ``accuracy_drop_pct`` (its largest drop), with its interval."""
        tasks = [t for t in self.tasks.values() if t.drop_pct is not None]
        return max(tasks, key=lambda t: t.drop_pct or 0.0) if tasks else None  # None left out

    @property
    def inflation(self) -> Inflation | None:
        return next((t.inflation for t in self.tasks.values() if t.inflation), None)


# ---- building the summaries ---------------------------------------------------------------

def primary_workload(cells: list[CellRecord]) -> str | None:
    """The workload with the most requests (first in scenario order on a tie)."""
    sizes: dict[str, int] = {}
    for c in cells:
        if c.workload:
            n = c.metric("num_requests") or 0
            sizes[c.workload] = max(sizes.get(c.workload, 0), n)
    return max(sizes, key=lambda w: sizes[w]) if sizes else None


def _headline_order(c: CellRecord) -> tuple[bool, float]:
    """Cells in the order their figures stand in for the workload: the last wins."""
    return (search_role(c) == "saturated", L.load_value(c))


def _level_key(c: CellRecord) -> tuple[str | None, str | None]:
    load = L.load_of(c)
    return (c.workload, load.label if load else None)


def _workloads(s: ConfigSummary, group: list[CellRecord],
               rows_by_cell: dict[str, list[dict[str, Any]]], slo: dict[str, float],
               swept: set[str], seed: int) -> dict[str, list[dict[str, Any]]]:
    """Fill the workload figures; returns the rows that count for the SLA per workload."""
    ok = [c for c in group if c.status == "ok"]
    # one view per cell: the table finds the headline level's row by identity (``is``)
    views = {c.cell_id: c.workload_metrics for c in ok if c.workload}
    # a swept workload keeps its top level that ran; a searched one its saturated run, the
    # one load every configuration of the search shares (its serial run is not a point;
    # its open-loop levels are at rates of its own: report/capacity.py)
    for c in sorted([c for c in ok if search_role(c) != "serial"], key=_headline_order):
        if c.workload:
            m = s.workloads[c.workload] = views[c.cell_id]
            s.rows[c.workload] = rows_by_cell.get(c.cell_id, [])
            if m.tiers:
                s.tiers[c.workload] = m.tiers
            if m.probes and not s.probes:
                s.probes = m.probes
    for_slo = {w: rows for w, rows in s.rows.items() if w not in swept}
    for w in swept:
        cells = [c for c in group if c.workload == w and L.load_of(c)]
        searched = search_capacity(cells)       # arrival: auto (report/capacity.py)
        cells = level_cells(cells)
        s.curves[w] = points = L.load_points(cells, rows_by_cell, slo, seed)
        s.levels[w] = [Level(p.label, views[p.cell_id] if p.ok else None,
                             rows_by_cell.get(p.cell_id, [])) for p in points]
        cap = searched or L.sla_capacity(points, slo)
        if w == s.primary_workload:
            s.capacity = cap
        ran = [p for p in points if p.ok]
        if ran:                        # the SLA is read at the highest level within it
            within = [p for p in ran if cap.value is not None and p.value <= cap.value
                      and p.meets(slo)]
            chosen = (within[-1] if within and cap.status in ("interpolated", "top")
                      else ran[0] if cap.status == "below" else ran[-1])
            for_slo[w] = rows_by_cell.get(chosen.cell_id, [])
    primary_cells = [c for c in ok if c.workload and c.workload == s.primary_workload]
    if primary_cells and all(idle_parts(s.kv, views[c.cell_id]) for c in primary_cells):
        s.idle = sorted(set.intersection(*(set(idle_parts(s.kv, views[c.cell_id]))
                                           for c in primary_cells)))
    return for_slo


def _primary_figures(s: ConfigSummary, slo: dict[str, float], seed: int) -> None:
    main = s.workloads.get(s.primary_workload) if s.primary_workload else None
    if not main:
        return
    rows = s.rows.get(s.primary_workload or "", [])
    s.throughput_tok_s = main.output_tokens_per_s
    s.throughput_ci = throughput_ci(main, rows)
    s.ttft_p99_s = main.summary("ttft_s").p99
    s.tbt_p50_s, s.tbt_p99_s = main.summary("tbt_s").p50, main.summary("tbt_s").p99
    ci = bootstrap_ci(request_groups(rows, "tbt"), "p99", seed=seed) if rows else None
    s.tbt_p99_ci = (ci["ci_low"], ci["ci_high"]) if ci else None
    peak, running = main.peak_kv_resident_bytes, main.concurrency_max
    if peak is not None and running:
        s.kv_per_seq_bytes = peak / running
    s.memory_binds = bool(main.num_pool_full_steps)
    duration = main.duration_s
    if rows and duration:
        good = sum(r.get("num_output_tokens") or 0 for r in rows if is_good(r, slo))
        s.goodput_tok_s = good / duration


def _link_bases(out: list[ConfigSummary]) -> None:
    """``equal_to``: the configuration without its idle parts (its spec when not run)."""
    for s in out:
        if s.idle:
            base = without(s.kv, s.idle, s.dtype)
            match = next((o for o in out if o is not s and o.model == s.model
                          and same_spec(o.kv, base, s.dtype)), None)
            s.equal_to = match.name if match else base


def summarize(cells: list[CellRecord], rows_by_cell: dict[str, list[dict[str, Any]]],
              slo: dict[str, float] | None = None, seed: int = 0,
              several_models: bool | None = None) -> list[ConfigSummary]:
    """One summary per (model, weight quantization, kv), in scenario order; names carry
    the model when the cells have several (or ``several_models`` says the run has)."""
    slo = slo or {}
    primary = primary_workload(cells)
    swept = L.swept_workloads(cells)
    groups: dict[tuple[str, str | None, str], list[CellRecord]] = {}
    for c in cells:
        groups.setdefault((c.model, c.quantization, c.kv), []).append(c)
    if several_models is None:
        several_models = len({m for m, _, _ in groups}) > 1
    # the baseline: the model's dtype as KV codec, on unquantized weights
    base_workloads = {(m, *_level_key(c)): c for (m, q, kv), cs in groups.items() for c in cs
                      if c.workload and c.status == "ok" and kv == c.dtype
                      and q is None}
    baselines = {(m, c.task): c for (m, q, kv), cs in groups.items() for c in cs
                 if c.task and kv == c.dtype and q is None}
    has_tasks = any(c.task for c in cells)
    models_with_tasks = {c.model for c in cells if c.task}
    out = []
    for (model, quantization, kv), group in groups.items():
        ok = [c for c in group if c.status == "ok"]
        dtype = group[0].dtype
        endpoint = endpoint_of(group)
        label = (endpoint.label or endpoint.name or kv) if endpoint else \
            f"{quantization} weights + {kv}" if quantization else kv
        s = ConfigSummary(name=f"{model}: {label}" if several_models else label, kv=kv,
                          model=model, dtype=dtype,
                          is_baseline=kv == dtype and quantization is None,
                          num_cells=len(group), num_failed=len(group) - len(ok),
                          primary_workload=primary, complexity=complexity(kv, dtype),
                          reference=reference_part(kv),
                          accuracy_na=(has_tasks and model not in models_with_tasks)
                          or model.lower().startswith(DUMMY_PREFIX),
                          endpoint=endpoint, memory_note=memory_note(group))
        s.kv_bytes_per_token = next((c.metric("kv_bytes_per_token") for c in ok
                                     if c.metric("kv_bytes_per_token")), None)
        peaks = [c.metric("peak_kv_resident_bytes") for c in ok]
        peaks = [p for p in peaks if isinstance(p, (int, float))]
        s.peak_kv_bytes = max(peaks) if peaks else None
        for_slo = _workloads(s, group, rows_by_cell, slo, swept, seed)
        for c in group:
            if c.task:
                base = endpoint_baseline(c, endpoint, cells) if endpoint else \
                    baselines.get((model, c.task))
                s.tasks[c.task] = task_result(c, base, seed)
            elif c.status == "ok" and c.metric("needle_accuracy") is not None \
                    and not s.accuracy_na:       # random weights answer nothing
                base = base_workloads.get((model, *_level_key(c)))
                label = f"{c.workload} (needle)"
                s.tasks[label] = needle_result(
                    c, base, rows_by_cell.get(c.cell_id, []),
                    rows_by_cell.get(base.cell_id, []) if base else [])
        drops = [t.drop_pct for t in s.tasks.values() if t.drop_pct is not None]
        s.accuracy_drop_pct = max(drops) if drops else None
        _primary_figures(s, slo, seed)
        s.slo_measured = measure_slo(for_slo, slo)
        out.append(s)
    _link_bases(out)
    return out
