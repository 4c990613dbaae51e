"""How long a scenario's cells will take, before any runs: ``estimate_cells``.

Seconds come from two things only: the tokens each cell computes (``estimate_work``) and
this machine's rates (``kvmap.hardware`` profile: the matrix-product rate at a prefill
shape in the model's dtype, or its weight kernel's; the read bandwidth), through a small
roofline with constants calibrated on measured cells (``Calibration``; how: docs/bench.md,
"The estimate"):

    prefill  = tokens x FLOP/token / (R x e_prefill) + pairs x attention FLOP/pair / (R x e_attn)
               + chunks x step overhead
    decode   = f[codec] x (steps x (weights / (bandwidth x e_stream) + step overhead)
               + tokens x FLOP/token / (R x e_batch) + pairs x attention FLOP/pair / (R x e_kv))
    fixed    = start (a fresh process, or a fork of a warm worker) + engine build per pass
               + the checklist probes (once per configuration)

(f[codec]: what a quantized cache's quantize and dequantize operators add to a decode
step, measured against the compute dtype's cache.) R is the profile's rate, so a
machine whose products run twice as fast is estimated twice as fast; the overheads
(Python, operator dispatch) scale by the ratio of its fp32 rate to the calibration
machine's. On the calibration machine's own CPU the calibration's rates are used (the
cached profile is one measurement, taken under whatever load there was). The profile
does not see the load of the moment either: every term is then multiplied by
``slowdown``, the
decode-step proxy measured at the run's start (``kvmap.hardware.threads``, the probe
that picks the cells' OpenMP wait policy) over the proxy during calibration. A machine
shared with other jobs is estimated as slow as it runs.

An estimate is a planning figure: the record keeps it beside the cell's actual wall time
(``estimate``: ``estimate_s``, ``actual_s``) so its error is in every run.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from kvmap.bench.cellspec import CellSpec, Scenario
from kvmap.bench.estimate_work import Pool, Work, task_work, workload_work


@dataclass(frozen=True)
class Calibration:
    """The estimator's constants (efficiencies are fractions of the profile's rate).

    Fitted by ``benchmarks/estimate_calibration.py`` on the calibration machine (its fp32
    prefill rate is ``reference_fp32_flops``): the values are ``--refit`` of the record
    ``source`` by that script's fit; ``probes_s`` and ``run_s`` from the quick runs of
    docs/bench.md ("The estimate")."""

    e_prefill: float = 1.13          # linear layers of a prefill chunk
    e_attn: float = 0.79             # prefill attention (causal, unfused)
    e_batch: float = 1.02            # the batch's linear FLOPs in a decode step
    e_kv: float = 0.032              # decode attention over the cache (paged reads)
    e_stream: float = 1.37           # weights streamed in a decode step, over the read probe
    step_overhead_s_per_layer: float = 0.00032  # dispatch of one layer's operators, a step
    decode_factor: tuple = (("fp", 1.0), ("int8", 1.10), ("int4", 1.31), ("other", 1.2))
    start_s: float = 4.39            # a fresh cell process: interpreter, torch, kvmap imports
    fork_s: float = 0.3              # a cell forked from a warm worker
    build_bytes_per_s: float = 4.5e8  # engine build per pass (weights packed, pool allocated)
    load_bytes_per_s: float = 2.6e9  # weights read from the cache (a fresh process only)
    probes_s: float = 6.5            # the probes' fixed part: their time less their compute
    run_s: float = 22.0              # once per run: thread-policy probe, report, summary
    reference_cpu: str = "Intel(R) Xeon(R) Processor @ 2.80GHz"
    reference_fp32_flops: float = 5.56e10      # measured with the timings
    reference_bandwidth: float = 4.55e9
    reference_step_s: float = 0.0464  # the decode-step proxy meanwhile (wait policy PASSIVE)
    source: str = "benchmarks/results/estimate_calibration-20261203-234152.json"

    def decode_factor_of(self, codec: str) -> float:
        table = dict(self.decode_factor)
        family = "fp" if codec in ("fp32", "bf16", "fp16") else codec
        return table.get(family, table["other"])


CALIBRATION = Calibration()


@dataclass(frozen=True)
class ModelCost:
    """What a token costs in one model: FLOPs and bytes from its shape."""

    prefill_flop: float              # per prompt token (no output head: last position only)
    decode_flop: float               # per decoded token (with the output head)
    attn_flop_per_pair: float        # QK^T and AV of one (query, cached key) pair, all layers
    weight_bytes: float              # streamed once per decode step
    num_layers: int

    @classmethod
    def of(cls, config, dtype: str, quantization: str | None = None) -> ModelCost:
        h, hd = config.hidden_size, config.head_dim
        per_layer = (h * config.num_heads * hd * 2 + h * config.num_kv_heads * hd * 2
                     + 3 * h * config.intermediate_size)
        head = h * config.vocab_size
        width = {"int8": 1.0, "w8a8": 1.0, "int4": 0.5}.get(quantization or "", None) or \
            {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0}.get(dtype, 2.0)
        return cls(prefill_flop=2.0 * per_layer * config.num_layers,
                   decode_flop=2.0 * (per_layer * config.num_layers + head),
                   attn_flop_per_pair=4.0 * config.num_heads * hd * config.num_layers,
                   weight_bytes=(per_layer * config.num_layers + head) * width,
                   num_layers=config.num_layers)


@dataclass(frozen=True)
class Rates:
    """This machine's rates for one model entry (FLOP/s, bytes/s), from its profile."""

    flops: float                     # prefill-shaped product in the model's dtype / format
    read_bytes_per_s: float
    speed: float                     # fp32 rate over the calibration machine's

    @classmethod
    def of(cls, rates: dict | None, dtype: str, quantization: str | None,
           calibration: Calibration = CALIBRATION, cpu_model: str | None = None) -> Rates:
        """From a profile's ``rates`` (None: the calibration machine's own); on the
        calibration's CPU (``cpu_model``) rescaled to the calibration's own fp32 rate and
        bandwidth, the dtype and kernel ratios kept (module docstring)."""
        ref = calibration.reference_fp32_flops
        if not rates:
            return cls(ref, calibration.reference_bandwidth, 1.0)
        dense = rates.get("matmul_flops") or {}
        fp32 = (dense.get("fp32") or {}).get("prefill") or ref
        flops = (dense.get(dtype) or {}).get("prefill") or fp32
        if quantization:
            kernels = (rates.get("weight_kernels") or {}).get(quantization) or {}
            found = [v.get("prefill") for v in kernels.values()
                     if isinstance(v, dict) and v.get("prefill")]
            flops = max(found) if found else flops
        bandwidth = rates.get("read_bandwidth_bytes_per_s") or calibration.reference_bandwidth
        if cpu_model is not None and cpu_model == calibration.reference_cpu:
            return cls(flops * ref / fp32, calibration.reference_bandwidth, 1.0)
        return cls(flops, bandwidth, fp32 / ref)


@dataclass(frozen=True)
class CellEstimate:
    cell_id: str
    family: str                      # the workload or task the cell belongs to
    seconds: float
    parts: dict                      # start, build, prefill, decode, probes (s)
    work: Work = field(repr=False, default_factory=Work)

    def to_dict(self) -> dict:
        return {"estimate_s": round(self.seconds, 2),
                "parts_s": {k: round(v, 2) for k, v in self.parts.items()},
                **({"note": self.work.note} if self.work.note else {})}


def family_of(cell: CellSpec) -> str:
    return cell.workload.name if cell.workload is not None else cell.task.name


def seconds_of(work: Work, cost: ModelCost, rates: Rates, codec: str, chunk_tokens: int,
               cal: Calibration = CALIBRATION) -> tuple[float, float]:
    """``(prefill_s, decode_s)`` of ``work`` (module docstring)."""
    overhead = cal.step_overhead_s_per_layer * cost.num_layers / rates.speed
    chunks = work.prefill_tokens / max(1, chunk_tokens) + work.num_requests
    prefill = (work.prefill_tokens * cost.prefill_flop / (rates.flops * cal.e_prefill)
               + work.prefill_pairs * cost.attn_flop_per_pair / (rates.flops * cal.e_attn)
               + chunks * overhead)
    decode = cal.decode_factor_of(codec) * (
        work.decode_steps * (cost.weight_bytes / (rates.read_bytes_per_s * cal.e_stream)
                             + overhead)
        + work.decode_tokens * cost.decode_flop / (rates.flops * cal.e_batch)
        + work.decode_pairs * cost.attn_flop_per_pair / (rates.flops * cal.e_kv))
    return prefill * work.passes, decode * work.passes


class Estimator:
    """Estimates cells of one run on this machine (``rates``: the profile's; None: the
    calibration machine's). ``warm``: cells fork from a warm worker (the local backend)."""

    def __init__(self, rates: dict | None, warm: bool = True,
                 calibration: Calibration = CALIBRATION, slowdown: float = 1.0,
                 cpu_model: str | None = None):
        if not slowdown > 0:
            raise ValueError(f"slowdown={slowdown!r} must be > 0")
        self.rates, self.warm, self.cal, self.slowdown = rates, warm, calibration, slowdown
        self.cpu_model = cpu_model
        self._configs: dict = {}

    def _model(self, cell: CellSpec):
        key = (cell.model.name, cell.model.dtype, cell.model.quantization)
        if key not in self._configs:
            from kvmap.model.loader import model_config_of
            # an endpoint's cell has no dtype of kvmap's (its server picks one): its
            # model's shape is what the estimate needs, read at float32
            config = model_config_of(cell.model.name, cell.model.dtype or "float32")
            self._configs[key] = (config, ModelCost.of(config, cell.model.dtype,
                                                       cell.model.quantization),
                                  Rates.of(self.rates, cell.model.dtype,
                                           cell.model.quantization, self.cal,
                                           self.cpu_model))
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
        config, cost, rates = self._model(cell)
        codec = self.codec_of(cell) if cell.endpoint is None else "other"
        pool = self._pool(cell, config) if cell.endpoint is None else Pool(1 << 20, 1 << 10)
        chunk = cell.engine.max_num_batched_tokens

        def alone_s(work: Work) -> float:
            return sum(seconds_of(work, cost, rates, codec, chunk, self.cal)) * self.slowdown

        work = workload_work(cell, pool, alone_s) if cell.workload is not None \
            else task_work(cell, pool)
        prefill, decode = seconds_of(work, cost, rates, codec, chunk, self.cal)
        overhead = 1.0 / rates.speed
        parts = {"start": (self.cal.fork_s if self.warm else self.cal.start_s) * overhead,
                 "build": work.passes * cost.weight_bytes / self.cal.build_bytes_per_s
                 * overhead, "prefill": prefill, "decode": decode}
        if not self.warm:
            parts["build"] += work.passes * cost.weight_bytes / self.cal.load_bytes_per_s
        if cell.workload is not None and probes:
            from kvmap.bench.estimate_work import batch_work
            probe_work = batch_work(1, 96, 12, 1) + batch_work(4, 157, 12, 4) \
                + batch_work(1, 64, 6, 1)
            parts["probes"] = self.cal.probes_s * overhead + sum(
                seconds_of(probe_work, cost, rates, codec, chunk, self.cal))
        parts = {k: v * self.slowdown for k, v in parts.items()}
        busy = sum(v for k, v in parts.items() if k in ("prefill", "decode"))
        if work.floor_s > busy:                 # an open loop waits for its schedule
            parts["schedule_wait"] = work.floor_s - busy
        return CellEstimate(cell.cell_id, family_of(cell), sum(parts.values()), parts, work)

    def run_overhead_s(self, cells: list[CellSpec]) -> float:
        """What a run pays besides its cells: the thread-policy probe, the report, and a
        warm worker's start (imports and weights) per model."""
        models = {(c.model.name, c.model.dtype) for c in cells if c.endpoint is None}
        starts = 0.0
        if self.warm:
            for c in cells:
                key = (c.model.name, c.model.dtype)
                if key in models:
                    models.discard(key)
                    _, cost, rates = self._model(c)
                    starts += (self.cal.start_s / rates.speed
                               + cost.weight_bytes / self.cal.load_bytes_per_s)
        return (self.cal.run_s + starts) * self.slowdown


    def search(self, scenario: Scenario, template: CellSpec,
               probes: bool = False) -> list[CellEstimate]:
        """An ``arrival: auto`` search at its most (``runs.search``): the serial and
        saturated runs, then ``max_probes`` open-loop levels, each taken at 0.6 of the
        saturated rate (a level lasts its schedule, N / rate). ``probes``: its first
        probe runs the configuration's checklist probes (no other cell does)."""
        from kvmap.runs.search import SERIAL_REQUESTS, SearchSettings
        settings = SearchSettings(**template.workload.search)
        n = int(template.workload.options.get("num_requests") or 32)
        serial = scenario.probe_cell(template, "serial", "closed:1", min(n, SERIAL_REQUESTS))
        c = max(1, min(n, template.engine.max_num_seqs))
        saturated = scenario.probe_cell(template, "saturated", f"closed:{c}", n)
        out = [self.cell(serial, probes=probes), self.cell(saturated, probes=False)]
        busy = out[1].parts["prefill"] + out[1].parts["decode"]
        rate = float(f"{0.6 * n / max(busy, 1e-3):.3g}")
        level = self.cell(scenario.probe_cell(template, "level", f"poisson:{rate:g}", n),
                          probes=False)
        return out + [level] * settings.max_probes

    def pool_requests(self, cells: list[CellSpec], entry) -> list[float]:
        """The requests the pool holds at each configuration that runs ``entry``."""
        from kvmap.bench.estimate_work import kept_fraction
        out = []
        for c in cells:
            if c.workload is None or c.workload.name != entry.name or c.endpoint is not None:
                continue
            config, _, _ = self._model(c)
            spec = entry.spec(c.seed)
            kept = spec.prompt_len.mean_tokens * kept_fraction(c.kv, c.model.dtype)
            out.append(self._pool(c, config).tokens / (kept + spec.output_len.mean_tokens))
        return out


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

    def by_family(self) -> OrderedDict:
        """family -> (number of cells, seconds), in scenario order."""
        out: OrderedDict = OrderedDict()
        for c in self.cells:
            n, s = out.get(c.family, (0, 0.0))
            out[c.family] = (n + 1, s + c.seconds)
        return out

    def of(self, cell_id: str) -> CellEstimate | None:
        return next((c for c in self.cells if c.cell_id == cell_id), None)

    def lines(self) -> list[str]:
        """The printout: one line per family, then the total."""
        from kvmap.bench.runner import _fmt_s
        rows = [f"  {family:<28} {n:>3} cells  {_fmt_s(s):>8}"
                for family, (n, s) in self.by_family().items()]
        rows.append(f"  {'run (probe, workers, report)':<28} {'':>9}  {_fmt_s(self.run_s):>8}")
        rows.append(f"  {'total':<28} {len(self.cells):>3} cells  {_fmt_s(self.seconds):>8}")
        notes = sorted({c.work.note for c in self.cells if c.work.note})
        return rows + [f"  note: {n}" for n in notes]


def estimate_cells(cells: list[CellSpec], rates: dict | None = None, warm: bool = True,
                   calibration: Calibration = CALIBRATION, slowdown: float = 1.0
                   ) -> RunEstimate:
    """Every cell's estimate and the run's (see the module docstring)."""
    est = Estimator(rates, warm, calibration, slowdown)
    probing = probe_cells(cells)
    return RunEstimate(tuple(est.cell(c, c.cell_id in probing) for c in cells),
                       est.run_overhead_s(cells))


def estimate_run(scenario: Scenario, est: Estimator) -> RunEstimate:
    """The whole run of ``scenario``: its cells, then its searches at their most."""
    cells = scenario.cells()
    probing = probe_cells(cells)
    out = [est.cell(c, c.cell_id in probing) for c in cells]
    probed = {(c.model.label, c.model.dtype, c.kv) for c in cells if c.workload is not None}
    for template in scenario.searches():
        key = (template.model.label, template.model.dtype, template.kv)
        out += est.search(scenario, template, probes=key not in probed)
        probed.add(key)
    return RunEstimate(tuple(out), est.run_overhead_s(cells + scenario.searches()))


def machine_rates() -> tuple[dict | None, str]:
    """This machine's measured rates (the cached profile, measured now if missing) and
    its CPU model."""
    from kvmap.hardware import profile
    hw = profile()
    return hw.rates, hw.cpu.model_name


SLOWDOWN_ENV = "KVMAP_BENCH_SLOWDOWN"


def current_slowdown(settings, calibration: Calibration = CALIBRATION) -> float:
    """The decode-step proxy now over the calibration's (module docstring), from the
    run's thread settings (``kvmap.hardware.threads.choose``; measured now when they
    were not): above 1 on a machine busier (or slower) than at calibration.
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
    import statistics

    from kvmap.hardware.threads import step_time_s
    # one short probe is noisy on a shared machine: the median of three
    seen = [s for s in [(settings.step_s or {}).get(settings.wait_policy)] if s is not None]
    seen += [step_time_s(settings.wait_policy, settings.num_threads, rounds=1)
             for _ in range(3 - len(seen))]
    return statistics.median(seen) / calibration.reference_step_s


__all__ = ["CALIBRATION", "Calibration", "CellEstimate", "Estimator", "ModelCost", "Rates",
           "RunEstimate", "current_slowdown", "estimate_cells", "estimate_run", "machine_rates"]
