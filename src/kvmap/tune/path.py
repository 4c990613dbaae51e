"""The path a search took: one ``Step`` per decision, written to ``<run>/tune.json``
beside the bench's files, and as a table for the terminal and ``<run>/tune.md``.

    tune.json = {"schema": "kvmap.tune/1", "objective", "constraints", "space",
                 "steps": [{step, config, why, verdict, cells, num_cells_total}],
                 "recommendation": {...}, "num_cells", "num_cells_grid", "wall_s",
                 "stopped": null | "why the search stopped early"}
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.table import Table

from kvmap.kv.redact import redact_obj, redact_spec

TUNE_SCHEMA = "kvmap.tune/1"
TUNE_FILE = "tune.json"


@dataclass(frozen=True)
class Step:
    step: int
    config: str              # the point's label
    why: str                 # why it was tried
    verdict: str             # what it showed
    cells: tuple[str, ...]   # the jobs run for it in this step (screen, task, workload)
    num_cells_total: int     # cells used so far, this step included


def path_table(steps: list[Step], title: str = "kvmap tune: the search path") -> Table:
    table = Table(title=title)
    for col in ("step", "config", "why", "cells", "verdict"):
        table.add_column(col, overflow="fold")
    for s in steps:
        table.add_row(*(redact_spec(v) for v in (
            str(s.step), s.config, s.why, f"{', '.join(s.cells) or '-'} ({s.num_cells_total})",
            s.verdict)))
    return table


def path_markdown(steps: list[Step]) -> str:
    lines = ["| step | config | why | cells (total) | verdict |", "|---|---|---|---|---|"]
    for s in steps:
        cells = ", ".join(s.cells) or "-"
        lines.append(f"| {s.step} | `{s.config}` | {s.why} | {cells} ({s.num_cells_total}) "
                     f"| {s.verdict} |")
    return "\n".join(lines) + "\n"


def write_path(run_dir: str | Path, steps: list[Step], **fields) -> Path:
    """Write ``tune.json`` (atomically) and ``tune.md``; returns the JSON's path. Both
    go through the bench's redaction (``kvmap.kv.redact``), as every run file does."""
    run_dir = Path(run_dir)
    data = {"schema": TUNE_SCHEMA, **fields,
            "steps": [{**asdict(s), "cells": list(s.cells)} for s in steps]}
    data = redact_obj(json.loads(json.dumps(data, default=str)))
    out = run_dir / TUNE_FILE
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, out)
    (run_dir / "tune.md").write_text(redact_spec(path_markdown(steps)))
    return out


def read_path(run_dir: str | Path) -> dict | None:
    """``tune.json`` of a run directory, or None when the run is no tune."""
    path = Path(run_dir) / TUNE_FILE
    return json.loads(path.read_text()) if path.is_file() else None
