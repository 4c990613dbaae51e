"""How long a scenario's cells will take, before any runs: ``estimate_cells``.

Seconds come from the tokens each cell computes (``estimate_work``) through the roofline
of ``kvmap.perf`` (shape x rates x the calibration of this machine's class and the
model's dtype: ``kvmap.perf.calibration``), plus the fixed costs that calibration
measured, in seconds, never scaled by compute speed:

    cell     = cell_s (a warm worker's fork: build, setup, store) or, cold, start_s +
               weights / load rate + cell_s; + an extra build per further pass
               + probes_s (the checklist probes, once per configuration)
               + prefill + decode (``kvmap.perf.roofline``)
    run      = run_s (the CLI, thread-policy probe, estimate, report) + worker_s per model

On the calibration's own class the speed comes from its reference rates; off it, from
the profile's rates, once. The load of the moment: on its own class every term is
multiplied by ``slowdown``, the decode-step proxy measured at the run's start
(``kvmap.hardware.threads``) over the proxy during calibration; off its class the proxy
would count the other class's speed a second time, so ``slowdown`` is 1 and the runner's
re-plan after the first cells (``bench.replan``) corrects what the estimate missed.

An estimate is a planning figure: the record keeps it beside the cell's actual wall time
(``estimate``: ``estimate_s``, ``actual_s``) so its error is in every run.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace

from kvmap.bench.cellspec import CellSpec, Scenario
from kvmap.bench.duration import fmt_duration
from kvmap.bench.estimate_work import Pool, Work, task_work, workload_work
from kvmap.perf.calibration import CALIBRATION, Calibration, calibration_for
from kvmap.perf.rates import Rates
from kvmap.perf.roofline import seconds_of
from kvmap.perf.shape import StepShape


@dataclass(frozen=True)
class CellEstimate:
    cell_id: str
    family: str                      # the workload or task the cell belongs to
    seconds: float
    parts: dict                      # start, build, prefill, decode, probes (s)
    work: Work = field(repr=False, default_factory=Work)
    group: tuple = ()                # what a budget's sizing keeps (``group_of``)
    search: str | None = None        # a search's probe: its template's cell id
    optional: tuple | None = None    # its entry, when a budget may leave it out (``entry_of``)

    @property
    def left_out_as(self) -> str:
        """The id a budget leaves it out by: a search goes whole, by its template's."""
        return self.search or self.cell_id

    def to_dict(self) -> dict:
        return {"estimate_s": round(self.seconds, 2),
                "parts_s": {k: round(v, 2) for k, v in self.parts.items()},
                **({"note": self.work.note} if self.work.note else {})}


# A search's levels as it usually runs: a pass and a fail to bracket the capacity, then
# one bisection or sequential extension (x86-amx default run of 2026-12-04: 2, 2, 4 and 2
# levels; the most, ``max_probes``, is the budget guard's business, not the estimate's);
# its capacity sat at 0.54-1.0 of the saturated rate there, each level near 0.8 of it.
EXPECTED_LEVELS = 3
LEVEL_SHARE = 0.8


def family_of(cell: CellSpec) -> str:
    return cell.workload.name if cell.workload is not None else cell.task.name


def group_of(cell: CellSpec) -> tuple:
    """What a cell keeps whatever a budget sizes (its id does not: it hashes the sizes):
    the model, the KV configuration, the job and its load level."""
    load = cell.workload.load if cell.workload is not None else None
    return (cell.model.label, cell.model.dtype, cell.kv, family_of(cell),
            (load or {}).get("label"))


def entry_of(cell: CellSpec) -> tuple | None:
    """The scenario entry of an ``optional`` workload or task (its every configuration
    goes together, or none), else None."""
    job = cell.workload if cell.workload is not None else cell.task
    if not getattr(job, "optional", False):
        return None
    return (family_of(cell), job.models, job.kv)


class Estimator:
    """Estimates cells of one run on this machine: ``rates`` (the profile's; None: the
    calibration's own), ``hw`` (the ``HardwareProfile`` whose class picks each dtype's
    calibration; None: ``calibration`` for every dtype). ``warm``: cells fork from a warm
    worker (the local backend)."""

    def __init__(self, rates: dict | None, warm: bool = True,
                 calibration: Calibration = CALIBRATION, slowdown: float = 1.0,
                 hw=None):
        if not slowdown > 0:
            raise ValueError(f"slowdown={slowdown!r} must be > 0")
        self.rates, self.warm, self.cal, self.slowdown = rates, warm, calibration, slowdown
        self.hw = hw
        self._configs: dict = {}

    def calibration_of(self, dtype: str) -> Calibration:
        return calibration_for(self.hw, dtype) if self.hw is not None else self.cal

    def _model(self, cell: CellSpec):
        """``(config, shape, rates, calibration)`` of the cell's model entry."""
        key = (cell.model.name, cell.model.dtype, cell.model.quantization)
        if key not in self._configs:
            from kvmap.model.loader import model_config_of
            # an endpoint's cell has no dtype of kvmap's (its server picks one): its
            # model's shape is what the estimate needs, read at float32
            config = model_config_of(cell.model.name, cell.model.dtype or "float32")
            cal = self.calibration_of(cell.model.dtype)
            self._configs[key] = (config, StepShape.of(config, cell.model.dtype,
                                                       cell.model.quantization),
                                  Rates.of(self.rates, cell.model.dtype,
                                           cell.model.quantization, cal), cal)
        return self._configs[key]

    def _pool(self, cell: CellSpec, config) -> Pool:
        from kvmap.bench.scenario_checks import pool_tokens
        engine = cell.engine
        if engine.num_blocks is not None:
            tokens = engine.num_blocks * engine.block_size
        else:
            tokens = pool_tokens(config, cell.kv, engine.kv_memory, engine.block_size,
                                 cell.model.dtype)
        return Pool(tokens, engine.max_num_seqs)

    def codec_of(self, cell: CellSpec) -> str:
        from kvmap.kv.config import KVConfig
        return str(getattr(KVConfig.parse(cell.kv, cell.model.dtype).codec, "name", "other"))

    def cell(self, cell: CellSpec, probes: bool = True) -> CellEstimate:
        """The estimate of one cell (``probes``: it runs the checklist probes)."""
        config, shape, rates, cal = self._model(cell)
        codec = self.codec_of(cell) if cell.endpoint is None else "other"
        pool = self._pool(cell, config) if cell.endpoint is None else Pool(1 << 20, 1 << 10)
        chunk = cell.engine.max_num_batched_tokens

        def alone_s(work: Work) -> float:
            return sum(seconds_of(work, shape, rates, codec, chunk, cal)) * self.slowdown

        work = workload_work(cell, pool, alone_s) if cell.workload is not None \
            else task_work(cell, pool)
        prefill, decode = seconds_of(work, shape, rates, codec, chunk, cal)
        start = cal.cell_s if self.warm else \
            cal.cell_s + cal.start_s + shape.weight_bytes / cal.load_bytes_per_s
        parts = {"start": start,
                 "build": (work.passes - 1) * shape.weight_bytes / cal.build_bytes_per_s,
                 "prefill": prefill * work.passes, "decode": decode * work.passes}
        if cell.workload is not None and probes:
            parts["probes"] = cal.probes_s
        parts = {k: v * self.slowdown for k, v in parts.items()}
        busy = sum(v for k, v in parts.items() if k in ("prefill", "decode"))
        if work.floor_s > busy:                 # an open loop waits for its schedule
            parts["schedule_wait"] = work.floor_s - busy
        return CellEstimate(cell.cell_id, family_of(cell), sum(parts.values()), parts, work,
                            group_of(cell), optional=entry_of(cell))

    def run_overhead_s(self, cells: list[CellSpec]) -> float:
        """What a run pays besides its cells: the CLI, the thread-policy probe, the
        estimate and the report (the largest ``run_s`` among its models' calibrations)."""
        cals = [self._model(c)[3] for c in cells if c.endpoint is None] or [self.cal]
        return max(cal.run_s for cal in cals) * self.slowdown

    def with_workers(self, specs: list[CellSpec], out: list[CellEstimate]
                     ) -> list[CellEstimate]:
        """``out`` with a warm worker's start (``worker``: imports and weights) on the
        first cell of each model, where the run pays it (nothing when cold)."""
        if not self.warm:
            return out
        seen: set = set()
        for k, (spec, est) in enumerate(zip(specs, out)):
            key = (spec.model.name, spec.model.dtype, spec.model.quantization)
            if spec.endpoint is not None or key in seen:
                continue
            seen.add(key)
            extra = self._model(spec)[3].worker_s * self.slowdown
            out[k] = replace(est, seconds=est.seconds + extra,
                             parts={**est.parts, "worker": extra})
        return out

    def search(self, scenario: Scenario, template: CellSpec,
               probes: bool = False) -> list[CellEstimate]:
        """An ``arrival: auto`` search as it usually runs (``runs.search``): the serial
        and saturated runs, then ``EXPECTED_LEVELS`` open-loop levels (at most
        ``max_probes``), each taken at ``LEVEL_SHARE`` of the saturated rate (a level
        lasts its schedule, N / rate). A search that needs more probes is held to the
        budget while it runs (``search_backend``: it stops, undecided, before a probe
        that would overrun). ``probes``: its first probe runs the configuration's
        checklist probes (no other cell does)."""
        from kvmap.runs.search_settings import SearchSettings
        settings = SearchSettings(**template.workload.search)
        serial, saturated = search_range_cells(scenario, template)
        out = [self.cell(serial, probes=probes), self.cell(saturated, probes=False)]
        busy = out[1].parts["prefill"] + out[1].parts["decode"]
        n = saturated.workload.options["num_requests"]
        rate = float(f"{LEVEL_SHARE * n / max(busy, 1e-3):.3g}")
        level = self.cell(scenario.probe_cell(template, "level", f"poisson:{rate:g}", n),
                          probes=False)
        out += [level] * min(EXPECTED_LEVELS, settings.max_probes)
        return [replace(c, group=group_of(template), search=template.cell_id) for c in out]

    def pool_requests(self, cells: list[CellSpec], entry) -> list[float]:
        """The requests the pool holds at each configuration that runs ``entry``."""
        from kvmap.bench.estimate_work import kept_fraction
        out = []
        for c in cells:
            if c.workload is None or c.workload.name != entry.name or c.endpoint is not None:
                continue
            config = self._model(c)[0]
            spec = entry.spec(c.seed)
            kept = spec.prompt_len.mean_tokens * kept_fraction(c.kv, c.model.dtype)
            out.append(self._pool(c, config).tokens / (kept + spec.output_len.mean_tokens))
        return out


def search_range_cells(scenario: Scenario, template: CellSpec) -> tuple[CellSpec, CellSpec]:
    """A search's serial and saturated runs (``runs.search.next_probe``'s first two)."""
    from kvmap.runs.search import SERIAL_REQUESTS
    n = int(template.workload.options.get("num_requests") or 32)
    c = max(1, min(n, template.engine.max_num_seqs))
    return (scenario.probe_cell(template, "serial", "closed:1", min(n, SERIAL_REQUESTS)),
            scenario.probe_cell(template, "saturated", f"closed:{c}", n))


def probe_cells(cells: list[CellSpec]) -> set[str]:
    """The cells that run the checklist probes: a configuration's first workload cell
    (``CellSpec.run_probes``)."""
    return {c.cell_id for c in cells if c.workload is not None
            and getattr(c, "run_probes", True)}


@dataclass(frozen=True)
class RunEstimate:
    cells: tuple[CellEstimate, ...]
    run_s: float                      # the run's own fixed cost

    @property
    def seconds(self) -> float:
        return self.run_s + sum(c.seconds for c in self.cells)

    def by_family(self, leave_out: set = frozenset()) -> OrderedDict:
        """family -> (number of cells, seconds), in scenario order; without the cells
        whose ``group`` is in ``leave_out``."""
        out: OrderedDict = OrderedDict()
        for c in self.cells:
            if c.group in leave_out:
                continue
            n, s = out.get(c.family, (0, 0.0))
            out[c.family] = (n + 1, s + c.seconds)
        return out

    def of(self, cell_id: str) -> CellEstimate | None:
        return next((c for c in self.cells if c.cell_id == cell_id), None)

    def without(self, left_out: set[str]) -> RunEstimate:
        """The estimate of what runs: without the cells and searches a budget left out
        (``CellEstimate.left_out_as``)."""
        return replace(self, cells=tuple(c for c in self.cells
                                         if c.left_out_as not in left_out))

    def lines(self) -> list[str]:
        """The printout: one line per family, then the total."""
        rows = [f"  {family:<28} {n:>3} cells  {fmt_duration(s):>8}"
                for family, (n, s) in self.by_family().items()]
        rows.append(f"  {'run (probe, workers, report)':<28} {'':>9}  {fmt_duration(self.run_s):>8}")
        rows.append(f"  {'total':<28} {len(self.cells):>3} cells  {fmt_duration(self.seconds):>8}")
        notes = sorted({c.work.note for c in self.cells if c.work.note})
        return rows + [f"  note: {n}" for n in notes]


def estimate_cells(cells: list[CellSpec], rates: dict | None = None, warm: bool = True,
                   calibration: Calibration = CALIBRATION, slowdown: float = 1.0
                   ) -> RunEstimate:
    """Every cell's estimate and the run's (see the module docstring)."""
    est = Estimator(rates, warm, calibration, slowdown)
    probing = probe_cells(cells)
    out = est.with_workers(cells, [est.cell(c, c.cell_id in probing) for c in cells])
    return RunEstimate(tuple(out), est.run_overhead_s(cells))


def estimate_run(scenario: Scenario, est: Estimator) -> RunEstimate:
    """The whole run of ``scenario``: its cells, then its searches as they usually run."""
    cells = scenario.cells()
    probing = probe_cells(cells)
    out = [est.cell(c, c.cell_id in probing) for c in cells]
    probed = {(c.model.label, c.model.dtype, c.kv) for c in cells if c.workload is not None}
    specs = list(cells)
    for template in scenario.searches():
        key = (template.model.label, template.model.dtype, template.kv)
        found = est.search(scenario, template, probes=key not in probed)
        out += found
        specs += [template] * len(found)
        probed.add(key)
    out = est.with_workers(specs, out)
    return RunEstimate(tuple(out), est.run_overhead_s(specs))


SLOWDOWN_ENV = "KVMAP_BENCH_SLOWDOWN"


def current_slowdown(settings, calibration: Calibration = CALIBRATION) -> float:
    """The decode-step proxy now over the calibration's (module docstring), under the
    calibration's OpenMP wait policy (taken from the run's thread settings,
    ``kvmap.hardware.threads.choose``, when they measured it; else measured now): above 1
    on a machine busier than at calibration. 1.0 off the calibration's class.
    ``KVMAP_BENCH_SLOWDOWN`` gives it instead (tests: no measurement)."""
    import os
    given = os.environ.get(SLOWDOWN_ENV)
    if given:
        try:
            value = float(given)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise ValueError(f"{SLOWDOWN_ENV}={given!r} must be a number > 0")
        return value
    if not calibration.same_class:
        return 1.0
    import statistics

    from kvmap.hardware.threads import step_time_s
    # one short probe is noisy on a shared machine: the median of three
    policy = calibration.wait_policy
    seen = [s for s in [(settings.step_s or {}).get(policy)] if s is not None]
    seen += [step_time_s(policy, settings.num_threads, rounds=1) for _ in range(3 - len(seen))]
    return statistics.median(seen) / calibration.reference_step_s


__all__ = ["CellEstimate", "Estimator", "RunEstimate", "current_slowdown", "estimate_cells",
           "estimate_run"]
