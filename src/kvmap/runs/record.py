"""The self-describing record of one cell (``RECORD_SCHEMA``): a ``CellRecord`` on both
sides -- where a cell writes it and where the runner, the store, the report and ``kvmap
tune`` read it -- and a dict only at the JSON edge (``to_dict`` / ``from_dict``).
``docs/bench.md`` lists every field; the metric keys a report may read are there too.

``from_dict`` reads any record of this schema's version or older: keys it does not know
(written by a newer kvmap) are kept in ``extra`` and written back by ``to_dict``, never
dropped; a record written before ``task_kind`` existed gets it from the rule the report
used then (``legacy_task_kind``).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from typing import Any

from kvmap.jsonable import jsonable
from kvmap.runs.cell_payloads import CellEnv, EndpointInfo, Estimate, LoadLevel, Prediction
from kvmap.runs.payload import view
from kvmap.runs.task_metrics import AnyTaskMetrics, task_metrics
from kvmap.runs.workload_metrics import WorkloadMetrics

JSONObject = dict[str, Any]       # a record's payload as JSON holds it

RECORD_SCHEMA_NAME = "kvmap.bench.cell"
RECORD_VERSION = 1
RECORD_SCHEMA = f"{RECORD_SCHEMA_NAME}/{RECORD_VERSION}"
_REQUIRED = ("cell_id", "kind", "model", "kv")
_ABSENT_WHEN_NONE = ("traceback", "env", "task_kind", "estimate", "prediction")     # as records were written before


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class CellRecord:
    """One cell's result. ``load``: the load level of a sweep's cell (``Load.to_dict``);
    ``quantization``: the model's weight quantization (None: dense); ``task_kind``: how
    a task cell is judged (``kvmap.evals.TASK_KINDS``: ``ppl``, ``accuracy``,
    ``generation``, ``other``); ``extra``: keys of a newer writer, kept as read."""

    cell_id: str
    kind: str                        # "workload" | "task" | "loadgen"
    model: str
    dtype: str | None
    kv: str
    workload: str | None = None
    task: str | None = None
    task_kind: str | None = None
    params: JSONObject = field(default_factory=dict)
    load: JSONObject | None = None
    quantization: str | None = None
    started_at: str = field(default_factory=now_iso)
    status: str = "ok"               # "ok" | "failed" | "unavailable" (endpoint_spec)
    error: str | None = None
    traceback: str | None = None
    warnings: list[str] = field(default_factory=list)
    metrics: JSONObject = field(default_factory=dict)
    details: JSONObject = field(default_factory=dict)
    duration_s: float | None = None
    env: JSONObject | None = None
    # the preflight's estimate of the cell and its actual wall time (``bench.estimate``)
    estimate: JSONObject | None = None
    # the simulator's prediction of a workload cell on this machine (``plan.sim.predict``)
    prediction: JSONObject | None = None
    schema: str = RECORD_SCHEMA
    extra: JSONObject = field(default_factory=dict)

    @classmethod
    def of_cell(cls, cell: Any, **values: Any) -> CellRecord:
        """The record of bench cell ``cell`` (a ``bench.cellspec.CellSpec``: typed ``Any``,
        runs stands below the bench), before it runs."""
        w, t = cell.workload, cell.task
        return cls(cell_id=cell.cell_id, kind=cell.kind, model=cell.model.name,
                   dtype=cell.model.dtype, kv=cell.kv,
                   workload=w.name if w else None, task=t.name if t else None,
                   params=w.options if w else t.params if t else {}, load=w.load if w else None,
                   quantization=cell.model.quantization,
                   **values)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CellRecord:
        """The record of a stored JSON object. ValueError naming the problem for another
        schema, a newer version of this one, or a missing required key."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a cell record is a JSON object, not {type(data).__name__}")
        schema = str(data.get("schema", RECORD_SCHEMA))
        name, _, version = schema.rpartition("/")
        if name != RECORD_SCHEMA_NAME or not version.isdigit() or \
                not 1 <= int(version) <= RECORD_VERSION:
            raise ValueError(f"record schema {schema!r} is not {RECORD_SCHEMA_NAME!r} "
                             f"version 1..{RECORD_VERSION} (a newer kvmap wrote it?)")
        missing = [k for k in _REQUIRED if k not in data]
        if missing:
            raise ValueError(f"cell record {data.get('cell_id')!r} lacks {', '.join(missing)}")
        known = {f.name for f in fields(cls)} - {"extra"}
        record = cls(**{k: v for k, v in data.items() if k in known and k != "dtype"},
                     dtype=data.get("dtype"),
                     extra={k: v for k, v in data.items() if k not in known})
        for name, empty in (("params", dict), ("metrics", dict), ("details", dict),
                            ("warnings", list)):
            if getattr(record, name) is None:
                setattr(record, name, empty())
        if record.kind == "task" and "task_kind" not in data:
            record.task_kind = legacy_task_kind(record.metrics, record.details)
        return record

    def fail(self, error: str, traceback: str | None = None) -> None:
        self.status, self.error, self.traceback = "failed", error, traceback

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def job(self) -> str | None:
        """The workload or task the cell ran."""
        return self.workload or self.task

    @property
    def load_level(self) -> LoadLevel | None:
        """The cell's load level typed; None for a cell of one load."""
        return None if self.load is None else view(LoadLevel, self.load,
                                                   f"load of cell {self.cell_id!r}")

    @property
    def load_label(self) -> str | None:
        """The label of the cell's load level, None without one."""
        level = self.load_level
        return None if level is None or level.label is None else str(level.label)

    @property
    def workload_metrics(self) -> WorkloadMetrics:
        """``metrics`` typed, for a workload or loadgen cell (ValueError for a task's, or a
        value of the wrong kind, naming the cell)."""
        if self.kind == "task":
            raise ValueError(f"cell {self.cell_id!r} is a task cell: its metrics are not a "
                             "workload's")
        return WorkloadMetrics.of(self)

    @property
    def per_sample(self) -> list[Any]:
        """A task cell's samples as it wrote them (``details.per_sample``; [] without)."""
        samples = self.details.get("per_sample")
        return list(samples) if isinstance(samples, list) else []

    @property
    def task_metrics(self) -> AnyTaskMetrics:
        """``metrics`` typed by the task's kind (``runs.task_metrics``); ValueError for a
        workload's, or a value of the wrong kind, naming the cell."""
        if self.kind != "task":
            raise ValueError(f"cell {self.cell_id!r} is a {self.kind} cell: its metrics are "
                             "not a task's")
        return task_metrics(self)

    @property
    def endpoint(self) -> EndpointInfo | None:
        """The server an endpoint cell measured (``metrics.endpoint``); None for kvmap's
        own engine."""
        data = self.metrics.get("endpoint")
        return view(EndpointInfo, data, f"endpoint of cell {self.cell_id!r}") if data else None

    @property
    def cell_env(self) -> CellEnv:
        """``env`` typed (every field None for a record without one)."""
        return view(CellEnv, self.env, f"env of cell {self.cell_id!r}")

    @property
    def cell_estimate(self) -> Estimate:
        """``estimate`` typed (every field None for a record without one)."""
        return view(Estimate, self.estimate, f"estimate of cell {self.cell_id!r}")

    @property
    def cell_prediction(self) -> Prediction | None:
        """``prediction`` typed; None for a record without one."""
        if self.prediction is None:
            return None
        return Prediction.read(self.prediction, f"prediction of cell {self.cell_id!r}")

    def metric(self, *keys: str) -> Any:
        """``metrics[k1][k2]...``, or None where any level is missing."""
        value: Any = self.metrics
        for key in keys:
            if not isinstance(value, dict):
                return None
            value = value.get(key)
        return value

    def to_dict(self) -> JSONObject:
        out = {**self.extra, **{f.name: getattr(self, f.name) for f in fields(self)
                                if f.name != "extra"}}
        for key in _ABSENT_WHEN_NONE:            # absent rather than null, as before
            if out[key] is None:
                del out[key]
        stored: JSONObject = jsonable(out)
        return stored


def as_dicts(records: Iterable[CellRecord | JSONObject]) -> list[JSONObject]:
    """Records as their stored JSON objects (readers written against the dict form)."""
    return [r if isinstance(r, dict) else r.to_dict() for r in records]


def headline_kind(metrics: Mapping[str, Any], per_sample: list[Any] | None = None) -> str:
    """How a task's result reads when the task does not say (``task_kind``): by its
    headline metric -- ``ppl``, else ``accuracy`` -- else ``generation`` for samples of
    a natural-stopping generation (a length and why it stopped), else ``other``."""
    if metrics.get("ppl") is not None:
        return "ppl"
    if metrics.get("accuracy") is not None:
        return "accuracy"
    if per_sample and all(isinstance(s, dict) and "num_output_tokens" in s
                          and "finish_reason" in s for s in per_sample):
        return "generation"
    return "other"


def legacy_task_kind(metrics: Mapping[str, Any], details: Mapping[str, Any]) -> str:
    """``task_kind`` of a task record written before the field existed."""
    return headline_kind(metrics or {}, (details or {}).get("per_sample"))
