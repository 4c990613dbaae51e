"""The self-describing record of one cell (``RECORD_SCHEMA``): built once as a
``CellRecord``, a dict only at the JSON edge (``to_dict``). ``docs/bench.md`` lists every
field; the metric keys a report may read are in ``/docs/bench.md`` too.
"""
from __future__ import annotations

import os
import resource
import sys
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone

RECORD_SCHEMA = "kvmap.bench.cell/1"
PROGRESS_PREFIX = "@@kvmap-progress"


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class CellRecord:
    """One cell's result. ``load``: the load level of a sweep's cell (``Load.to_dict``);
    ``quantization``: the model's weight quantization (None: dense)."""

    cell_id: str
    kind: str                        # "workload" | "task" | "loadgen"
    model: str
    dtype: str | None
    kv: str
    workload: str | None = None
    task: str | None = None
    params: dict = field(default_factory=dict)
    load: dict | None = None
    quantization: str | None = None
    started_at: str = field(default_factory=now_iso)
    status: str = "ok"               # "ok" | "failed" | "unavailable" (endpoint_spec)
    error: str | None = None
    traceback: str | None = None
    warnings: list[str] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)
    duration_s: float | None = None
    env: dict | None = None
    schema: str = RECORD_SCHEMA

    @classmethod
    def of_cell(cls, cell, **values) -> CellRecord:
        """The record of bench cell ``cell`` (a ``CellSpec``), before it runs."""
        w, t = cell.workload, cell.task
        return cls(cell_id=cell.cell_id, kind=cell.kind, model=cell.model.name,
                   dtype=cell.model.dtype, kv=cell.kv,
                   workload=w.name if w else None, task=t.name if t else None,
                   params=w.options if w else t.params, load=w.load if w else None,
                   quantization=cell.model.quantization,
                   **values)

    def fail(self, error: str, traceback: str | None = None) -> None:
        self.status, self.error, self.traceback = "failed", error, traceback

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in ("traceback", "env"):         # absent rather than null, as before
            if out[key] is None:
                del out[key]
        return jsonable(out)


def jsonable(value):
    """Numbers, strings, lists and dicts only (tensors and numpy scalars converted)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def load_avg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def peak_rss_bytes() -> int:
    """Peak resident set of this process (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def machine_env(load_start: float | None) -> dict:
    """How busy the machine was: timings from a shared, loaded machine are not comparable."""
    torch = sys.modules.get("torch")
    from kvmap.hardware import record_summary
    return {"num_threads": torch.get_num_threads() if torch is not None else None,
            "load_avg_1m_start": load_start, "load_avg_1m_end": load_avg(),
            "num_cpus": os.cpu_count(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "hardware": record_summary()}
