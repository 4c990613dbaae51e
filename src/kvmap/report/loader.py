"""Read one run directory into memory: its metadata, cell records and per-request rows.

``load_run(run_dir)`` is the only place the report touches the store; everything after
works on the returned ``Run``. Rows are plain dicts (``REQUEST_SCHEMA`` fields), grouped
by cell id, so pure functions can be tested on hand-made rows without Parquet.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvmap.runs.record import CellRecord
from kvmap.runs.run_metadata import RunMetadata
from kvmap.runs.store import RunStore


@dataclass
class Run:
    """A stored run: ``cells`` in scenario order, ``rows_by_cell`` cell id -> request rows."""

    run_dir: Path
    metadata: dict[str, Any]
    cells: list[CellRecord]
    rows_by_cell: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def meta(self) -> RunMetadata:
        """``metadata`` (run.json) typed."""
        return RunMetadata.read(self.metadata, f"run.json of {str(self.run_dir)!r}")

    @property
    def scenario(self) -> dict[str, Any]:
        return self.meta.scenario or {}

    @property
    def name(self) -> str:
        return self.scenario.get("name") or self.run_dir.name

    @property
    def slo(self) -> dict[str, float]:
        """The scenario's SLA (normalized keys, seconds); empty when it gives none."""
        return dict(self.scenario.get("slo") or {})

    @property
    def workload_slo(self) -> dict[str, dict[str, float]]:
        """Workload name -> its own SLA, for the workloads that give one (a scenario of
        several deployments: each is held to its own)."""
        out: dict[str, dict[str, float]] = {}
        for w in self.scenario.get("workloads") or ():
            if isinstance(w, dict) and w.get("slo"):
                out[w["name"]] = dict(w["slo"])
        return out

    @property
    def kv_memory(self) -> str | None:
        """The scenario's KV pool budget as written (e.g. ``"128MiB"``)."""
        return (self.scenario.get("engine") or {}).get("kv_memory")


def load_run(run_dir: str | Path) -> Run:
    """The run in ``run_dir``; ``ValueError`` naming the directory when it holds no run."""
    store = RunStore(run_dir)
    if not store.run_json.is_file():
        raise ValueError(f"{str(run_dir)!r} is not a kvmap run directory (no run.json); "
                         "give the --out directory of a `kvmap bench` run")
    cells = store.cells()
    if not cells:
        raise ValueError(f"run directory {str(run_dir)!r} holds no finished cell yet")
    rows_by_cell: dict[str, list[dict[str, Any]]] = {}
    for row in store.requests().to_pylist():
        rows_by_cell.setdefault(row["cell_id"], []).append(row)
    return Run(Path(run_dir), store.metadata(), cells, rows_by_cell)
