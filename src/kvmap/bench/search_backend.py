"""The ``arrival: auto`` searches, run by the runner's backend after the scenario's cells.

``with_searches(backend, scenario, cells)`` wraps a backend so that, once the cells it
was given are done, each configuration's search (``runs.search.next_probe``) runs
its probes one at a time through the same backend: the next probe is decided from the
records of the previous ones, so the runner stores every probe as it ends and a
resumed run replays the stored probes and goes on where it stopped. A stored failed
probe counts as a failed level (``retry_failed`` runs it again).

After each configuration's search its result goes to ``searches.json`` in the run
directory (``{template cell id: {"workload", "model", "kv", "result"}}``) for the report.
"""
from __future__ import annotations

import json
from collections.abc import Iterator

from kvmap.bench.cell_backend import (CellBackend, CellResult, FractionCallback,
                                     WrappingBackend)
from kvmap.bench.capacity_prediction import predict_capacity
from kvmap.bench.search_budget import SearchBudget
from kvmap.runs.search import Probe, next_probe, own_rate, rate_verdicts, result
from kvmap.runs.search_record import SEARCHES_FILE
from kvmap.runs.search_settings import SearchSettings, requests_to_decide
from kvmap.bench.cellspec import CellSpec, Scenario, with_probes_once
from kvmap.runs.record import CellRecord
from kvmap.runs.store import RunStore



class SearchingBackend(WrappingBackend):
    """``inner``, then the searches ``keep`` (indices into ``Scenario.searches``)."""

    def __init__(self, inner: CellBackend, scenario: Scenario, keep: list[int],
                 cells: list[CellSpec], retry_failed: bool = False, predict=None,
                 budget: SearchBudget | None = None, sized=None):
        super().__init__(inner)
        self.scenario, self.keep = scenario, keep
        self.templates = [scenario.searches()[i] for i in keep]
        self.budget, self.sized = budget, sized
        self.predict = predict.local() if hasattr(predict, "local") else predict
        self.first_ordinal, self.retry_failed = len(cells), retry_failed
        self.probed = {(c.model.label, c.model.dtype, c.kv) for c in cells
                       if c.workload is not None}

    @property
    def max_extra_cells(self) -> int:
        """At most this many probe cells (the progress total)."""
        return sum(2 + SearchSettings(**t.workload.search).max_probes for t in self.templates)

    def run(self, todo: list[tuple[int, CellSpec]], store: RunStore,
            on_fraction: FractionCallback) -> Iterator[CellResult]:
        if todo:
            yield from self.inner.run(todo, store, on_fraction)
        ordinal = self.first_ordinal
        for index, template in enumerate(self._templates()):
            settings = SearchSettings(**template.workload.search)
            stored = {c.cell_id: c for c in store.cells()}
            probes: list[Probe] = []
            records: list[CellRecord] = []
            predicted: float | None = None
            stopped: str | None = None
            num_requests = int(template.workload.options.get("num_requests") or 32)
            while True:
                if predicted is None and len(probes) == 2 and all(p.ok for p in probes):
                    predicted = self._predicted(template, probes, records, store)
                step = next_probe(probes, settings, num_requests,
                                  template.engine.max_num_seqs, predicted)
                if step is None:
                    break
                cell = self.scenario.probe_cell(template, step.role, step.arrival,
                                                step.num_requests, step.seed_offset)
                cell = with_probes_once([cell], self.probed)[0]
                record = stored.get(cell.cell_id)
                fresh = record is None or (record.status == "failed" and self.retry_failed)
                if fresh and self.budget is not None:
                    stopped = self.budget.stop(index, step, probes,
                                               [r.duration_s for r in records])
                    if stopped:
                        break
                if fresh:
                    for res in self.inner.run([(ordinal, cell)], store, on_fraction):
                        yield res
                        record = res.record
                ordinal += 1
                records.append(record)
                probes.append(Probe.of(record, settings.attainment))
                if self.budget is not None:
                    self.budget.ran(step.role, record.duration_s)
            needed = requests_to_decide(template.slo, settings.attainment,
                                        int(template.workload.options.get("output_len") or 1))
            _save(store, template, result(probes, settings, predicted, needed), records,
                  stopped)

    def _templates(self) -> list[CellSpec]:
        """The searches at the run's present sizes: a re-plan after the cells may have cut
        a search's requests per probe (``sized()``, the re-planned scenario)."""
        if self.sized is None:
            return self.templates
        now = self.sized().searches()
        return [now[i] for i in self.keep] if len(now) == len(self.scenario.searches()) \
            else self.templates

    def _predicted(self, template: CellSpec, probes: list[Probe],
                   records: list[CellRecord], store: RunStore) -> float | None:
        """The simulator's SLA capacity from the saturated run (``capacity_prediction``)."""
        serial, saturated = probes[0], probes[1]
        x1 = own_rate(serial)
        n = saturated.num_requests

        def cell_at(rate: float) -> CellSpec:
            return self.scenario.probe_cell(template, "level", f"poisson:{rate:.6g}", n)
        return predict_capacity(self.predict, cell_at, records[1].to_dict(),
                                store.rows(records[1].cell_id), x1, saturated.requests_per_s)


def _save(store: RunStore, template: CellSpec, found, records: list[CellRecord],
          stopped: str | None = None) -> None:
    pooled = rate_verdicts(list(found.probes))
    path = store.dir / SEARCHES_FILE
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[template.cell_id] = {
        "workload": template.workload.name, "model": template.model.name,
        "quantization": template.model.quantization, "kv": template.kv,
        "result": {"status": found.status, "capacity_req_s": found.capacity,
                   "bracket_req_s": found.bracket, "tolerance": found.tolerance,
                   "attainment_target": found.attainment, "knee": found.knee,
                   "predicted_req_s": found.predicted, "num_requests": found.num_requests,
                   "requests_to_decide_a_pass": found.needed,
                   "stopped": stopped,
                   "describe": found.describe() + (f"; {stopped}" if stopped else "")},
        "probes": [{"cell_id": r.cell_id, "label": p.label, "role": p.role,
                    "status": r.status, "share": p.share, "num_requests": p.num_requests,
                    "keys": {e.key: {"within": e.within, "n": e.n, "quantile": e.quantile,
                                     "unit": e.unit} for e in p.evidence},
                    "verdict": p.verdict, "pooled_verdict": pooled.get(p.rate),
                    "over_saturated": p.over_saturated,
                    "concurrency": p.concurrency, "throughput_tok_s": p.throughput_tok_s}
                   for r, p in zip(records, found.probes)]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def with_searches(backend: CellBackend, scenario: Scenario, cells: list[CellSpec],
                  retry_failed: bool = False, predict=None, time_left=None,
                  sized=None, left_out: set[str] = frozenset()) -> CellBackend:
    """``backend`` itself when the scenario has no ``arrival: auto`` workload (or the
    budget left every search out: ``left_out``, template ids). ``time_left()``: seconds
    the run's budget has left (``search_budget``; None: no budget); ``sized()``: the
    scenario at the re-plan's present sizes."""
    keep = [i for i, t in enumerate(scenario.searches()) if t.cell_id not in left_out]
    if not keep:
        return backend
    budget = SearchBudget(time_left, len(keep)) if time_left is not None else None
    return SearchingBackend(backend, scenario, keep, cells, retry_failed, predict,
                            budget, sized)
