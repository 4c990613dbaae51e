"""What a scenario is, once parsed: frozen ``Scenario`` -> the list of ``CellSpec`` to run.

A cell is a model and a KV configuration on one workload load level or one accuracy
task. ``CellSpec`` travels to the cell's process as JSON (``to_dict`` / ``from_dict``).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from kvmap.bench.endpoint_spec import EndpointEntry
from kvmap.config import EngineArgs
from kvmap.kv.redact import redact_obj, redact_spec
from kvmap.model.dummy import DUMMY_PREFIX
from kvmap.runs.names import base_name
from kvmap.workloads.options import workload_spec

DEFAULT_CELL_TIMEOUT_S = 1800.0     # a cell that hangs must not hang the run
AUTO_ARRIVAL = "auto"               # load levels found by the run (runs.search)


@dataclass(frozen=True)
class ModelEntry:
    name: str                       # "smollm2", a .gguf path, a HF directory, "dummy:<shape>"
    dtype: str | None = "fp32"     # concrete (the parser resolves "auto"); None: an
    #                                endpoint's model (its server's dtype)
    quantization: str | None = None  # weights: None | int8 | w8a8 | int4 (model/wquant.py)

    @property
    def label(self) -> str:
        """How workloads and tasks name this entry: ``smollm2``, ``smollm2+w8a8``."""
        return f"{self.name}+{self.quantization}" if self.quantization else self.name

    @property
    def is_dummy(self) -> bool:
        """Random weights: speed and memory only, its accuracy is not applicable."""
        return self.name.lower().startswith(DUMMY_PREFIX)


@dataclass(frozen=True)
class WorkloadEntry:
    """One load level of a named workload: ``options`` are the validated YAML keys of
    that level (paths made absolute); ``load`` the level (``Load.to_dict``) when the
    workload is a sweep; ``kv``, ``kv_memory``, ``models`` and ``slo`` the workload's own
    KV list, pool budget, models and SLA when it names them (else the scenario's: a
    scenario of two deployments gives each its own SLA).

    ``spec(seed)`` rebuilds the ``WorkloadSpec`` (in the cell's process too)."""

    name: str
    options: dict
    load: dict | None = None
    kv: tuple[str, ...] | None = None
    kv_memory: str | int | None = None
    models: tuple[str, ...] | None = None      # the scenario's models this one runs on
    slo: dict | None = None                    # its own SLA (normalized keys, seconds)
    endpoints: tuple[str, ...] | None = None   # the endpoints it runs on (None: all)
    block_size: int | None = None              # one value of a block-size sweep (block_sweep)
    search: dict | None = None                 # arrival: auto (runs.search settings)
    optional: bool = False                     # a budget may leave it out (bench.budget)

    def spec(self, seed: int = 0):
        """The workload of this level; an ``arrival: auto`` entry's (its probes set
        their own arrival) is taken at ``closed:1``."""
        options = self.options
        if options.get("arrival") == AUTO_ARRIVAL:
            options = {**options, "arrival": "closed:1"}
        return workload_spec(self.name, options, seed)

    @property
    def is_search(self) -> bool:
        return self.options.get("arrival") == AUTO_ARRIVAL


@dataclass(frozen=True)
class TaskEntry:
    """An accuracy task: ``task`` is a registered name or ``module:function``."""

    name: str
    task: str
    params: dict = field(default_factory=dict)
    kv: tuple[str, ...] | None = None          # its own KV list (else the scenario's)
    models: tuple[str, ...] | None = None      # model labels it runs on (else all)
    endpoints: tuple[str, ...] | None = None   # the endpoints it runs on (None: all)
    optional: bool = False                     # a budget may leave it out (bench.budget)

    @property
    def is_accuracy_task(self) -> bool:
        """An evals task (by name), as opposed to a user's ``module:function``."""
        return ":" not in self.task


@dataclass(frozen=True)
class CellSpec:
    """One cell: a model and a KV configuration on one workload or one task.

    ``cell_id`` is a readable slug plus a hash of everything that defines the cell, so a
    resumed run recognises finished cells and never reuses a result of a changed cell.
    """

    cell_id: str
    model: ModelEntry
    kv: str
    engine: EngineArgs
    seed: int
    workload: WorkloadEntry | None = None
    task: TaskEntry | None = None
    slo: dict | None = None
    timeout_s: float | None = None
    memory_limit_bytes: int | None = None   # RLIMIT_AS of the cell process (None: none)
    endpoint: EndpointEntry | None = None   # an endpoint's cell (``kv`` is its name)
    # the checklist probes (bench/probes.py) measure the configuration, not the load: a
    # configuration's first workload cell runs them (``Scenario.cells``); not in the id
    run_probes: bool = True

    @property
    def job(self) -> str:
        if self.workload is None:
            return self.task.name
        load = self.workload.load
        return self.workload.name if load is None else f"{self.workload.name}@{load['label']}"

    @property
    def kind(self) -> str:
        return "workload" if self.workload is not None else "task"

    def engine_args(self, kv: str | None = None) -> EngineArgs:
        """The engine of this cell (``kv``: another KV spec on the same engine)."""
        model = None if self.model.name.lower() == "smollm2" else self.model.name
        return replace(self.engine, model=model, dtype=self.model.dtype,
                       kv=kv or self.kv, seed=self.seed, quantization=self.model.quantization)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> CellSpec:
        data = dict(data)
        data["model"] = ModelEntry(**data["model"])
        data["engine"] = EngineArgs(**data["engine"])
        if data.get("workload") is not None:
            w = dict(data["workload"])
            for key in ("kv", "models", "endpoints"):
                w[key] = tuple(w[key]) if w.get(key) is not None else None
            data["workload"] = WorkloadEntry(**w)
        if data.get("task") is not None:
            data["task"] = TaskEntry(**data["task"])
        if data.get("endpoint") is not None:
            data["endpoint"] = EndpointEntry(**data["endpoint"])
        return cls(**data)


@dataclass(frozen=True)
class Scenario:
    name: str
    source: str                     # the file it came from, or "builtin:<name>"
    seed: int
    models: tuple[ModelEntry, ...]
    kv: tuple[str, ...]
    workloads: tuple[WorkloadEntry, ...]     # one entry per load level
    tasks: tuple[TaskEntry, ...] = ()
    slo: dict | None = None
    engine: EngineArgs = EngineArgs()
    cell_timeout_s: float | None = DEFAULT_CELL_TIMEOUT_S
    cell_memory_limit_bytes: int | None = None
    description: str = ""
    notes: tuple[str, ...] = ()     # what was skipped (skip_unavailable) and why
    endpoints: tuple[EndpointEntry, ...] = ()   # servers measured as configurations

    def all_kv(self) -> list[str]:
        """The scenario's KV specs, then those only some workloads name, in order."""
        specs = list(self.kv)
        for job in (*self.workloads, *self.tasks):
            specs += [s for s in (job.kv or ()) if s not in specs]
        return specs

    def cells(self) -> list[CellSpec]:
        """Every cell, model by model, then KV config by KV config, workloads first (a
        workload with its own ``kv`` list only for those; a dummy model on no evals
        task: random weights have no accuracy)."""
        cells = []
        for model in self.models:
            done: set[str] = set()      # "auto" is the model's dtype: one cell, not two
            for kv in self.all_kv():
                spec = model.dtype if kv == "auto" else kv
                if spec in done:
                    continue
                done.add(spec)
                for w in self.workloads:
                    if kv not in (w.kv or self.kv) or (w.models is not None
                                                       and model.label not in w.models) \
                            or w.is_search:       # its cells come from its search
                        continue
                    engine = self.engine if w.kv_memory is None else \
                        replace(self.engine, kv_memory=w.kv_memory)
                    if w.block_size is not None:
                        engine = replace(engine, block_size=w.block_size)
                    cells.append(self._cell(model, spec, engine, workload=w,
                                            slo=w.slo or self.slo))
                for t in self.tasks:
                    if kv not in (t.kv or self.kv) or (t.models is not None
                                                       and model.label not in t.models):
                        continue
                    if not (model.is_dummy and t.is_accuracy_task):
                        cells.append(self._cell(model, spec, self.engine, task=t))
        return with_probes_once(cells) + self.endpoint_cells()

    def searches(self) -> list[CellSpec]:
        """One cell per configuration of each ``arrival: auto`` workload, in the order
        ``cells`` would place them: the template its search's probes are made from
        (``probe_cell``); never run itself."""
        out = []
        for model in self.models:
            done: set[str] = set()
            for kv in self.all_kv():
                spec = model.dtype if kv == "auto" else kv
                if spec in done:
                    continue
                done.add(spec)
                for w in self.workloads:
                    if not w.is_search or kv not in (w.kv or self.kv) or (
                            w.models is not None and model.label not in w.models):
                        continue
                    engine = self.engine if w.kv_memory is None else \
                        replace(self.engine, kv_memory=w.kv_memory)
                    out.append(self._cell(model, spec, engine, workload=w,
                                          slo=w.slo or self.slo))
        return out

    def probe_cell(self, template: CellSpec, role: str, arrival: str,
                   num_requests: int, seed_offset: int = 0) -> CellSpec:
        """The probe of a search at ``arrival`` (``closed:N`` | ``poisson:R``);
        ``seed_offset``: an extension of a level draws other requests (another seed)."""
        from kvmap.workloads.options import Load
        load = {**Load.of(arrival).to_dict(),
                "search": {"role": role, **(template.workload.search or {})}}
        options = {**template.workload.options, "arrival": arrival,
                   "num_requests": num_requests}
        if seed_offset:
            options["seed"] = int(options.get("seed", self.seed)) + 1000 * seed_offset
            load["search"]["extension"] = seed_offset
        w = replace(template.workload, options=options, load=load)
        return self._cell(template.model, template.kv, template.engine, workload=w,
                          slo=template.slo)

    def endpoint_cells(self) -> list[CellSpec]:
        """Every endpoint's cells, endpoint by endpoint (its server runs once for them):
        the workloads, then the tasks, that name it (or name no endpoints)."""
        cells = []
        # a block-size sweep is one job for a server (its block size is the server's
        # own): its first size's entries only
        jobs, seen = [], set()
        for w in self.workloads:
            key = (base_name(w.name), json.dumps(w.load, sort_keys=True))
            if w.block_size is not None and key in seen:
                continue
            seen.add(key)
            jobs.append(w)
        for ep in self.endpoints:
            model = ModelEntry(ep.model, dtype=None)     # the server's, not known here
            for job in (*jobs, *self.tasks):
                if job.endpoints is None or ep.name in job.endpoints:
                    kind = "workload" if isinstance(job, WorkloadEntry) else "task"
                    cells.append(self._cell(model, ep.name, self.engine, endpoint=ep,
                                            slo=(job.slo or self.slo) if kind == "workload"
                                            else None,
                                            **{kind: job}))
        return cells

    def _cell(self, model: ModelEntry, kv: str, engine: EngineArgs, **job) -> CellSpec:
        cell = CellSpec("", model, kv, engine, self.seed, timeout_s=self.cell_timeout_s,
                        memory_limit_bytes=self.cell_memory_limit_bytes, **job)
        return replace(cell, cell_id=_cell_id(cell))

    def to_dict(self) -> dict:
        return asdict(self)

    def fingerprint(self) -> str:
        """A hash of what the run computes (not the file's name, notes, description or
        cell timeout), so a resumed run may change those. It hashes the redacted fields
        (``redact_obj``), as cell ids do: it is stored beside the redacted scenario, so a
        hash of a credential there would be an offline guessing oracle for it."""
        data = redact_obj({k: v for k, v in self.to_dict().items()
                           if k not in ("source", "notes", "description", "cell_timeout_s",
                                        "cell_memory_limit_bytes")})
        _drop_unset_endpoints(data)
        return hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def with_probes_once(cells: list[CellSpec], done: set | None = None) -> list[CellSpec]:
    """``cells`` with ``run_probes`` on the first workload cell of each configuration
    (model entry and KV spec) only; ``done`` (updated): configurations already probed."""
    done = set() if done is None else done
    out = []
    for c in cells:
        key = (c.model.label, c.model.dtype, c.kv)
        if c.workload is not None and c.endpoint is None:
            out.append(replace(c, run_probes=key not in done))
            done.add(key)
        else:
            out.append(c)
    return out


def _cell_id(cell: CellSpec) -> str:
    """A slug and a hash of the secrets-free fields (``redact_obj``): a password in a
    KV spec's URL never reaches a file name."""
    data = redact_obj({k: v for k, v in cell.to_dict().items()
                       if k not in ("cell_id", "timeout_s", "memory_limit_bytes",
                                    "run_probes")})
    _drop_unset_endpoints(data)
    digest = hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()[:8]
    model = Path(cell.model.label).stem if "/" in cell.model.name else cell.model.label
    slug = re.sub(r"[^A-Za-z0-9.=_-]+", "-",
                  redact_spec(f"{model}_{cell.job}_{cell.kv}")).strip("-")
    return f"{slug[:80]}_{digest}"


def _drop_unset_endpoints(data: dict) -> None:
    """Leave the endpoint fields (and a workload's own SLA) out of a hash where they are
    unset, so cells and runs of scenarios without them keep the ids they had before
    those keys existed."""
    for key in ("endpoint", "endpoints"):
        if data.get(key) in (None, [], ()):
            data.pop(key, None)
    for jobs in (data.get("workloads") or [], data.get("tasks") or [],
                 [data.get("workload") or {}, data.get("task") or {}]):
        for job in jobs:
            if isinstance(job, dict):       # what a cell computes does not depend on it
                job.pop("optional", None)
            for key in ("endpoints", "slo", "block_size", "search"):
                if isinstance(job, dict) and key in job and job[key] is None:
                    job.pop(key)
