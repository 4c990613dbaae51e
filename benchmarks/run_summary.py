"""A `kvmap bench` run's summary as a record small enough to commit (issue 40): a figure
in docs/ read from a run directory is backed only if what it was read from is in the
repository, and run directories are not.

    python benchmarks/run_summary.py RUN_DIR [--slo ...]

Writes ``benchmarks/results/run_summary-*.json`` with the run's ``run.json``, its
``searches.json`` (the SLA capacity searches, when it has any), every cell record without
its per-request rows, the simulator's predictions beside the measurements (rows,
verdicts, MAPE and Pearson's r) and the terminal summary as plain text lines -- the
trade-off table, recommendation, calibration table, checklist and power lines that
``kvmap report`` prints. Its ``machine_class`` is the run's, not this machine's.
"""
from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_record  # noqa: E402

from kvmap.runs.record import as_dicts  # noqa: E402
from kvmap.runs.store import RunStore  # noqa: E402


def terminal_lines(run_dir: Path) -> list[str]:
    """What ``kvmap report RUN_DIR`` prints, as plain text lines."""
    from rich.console import Console

    from kvmap.report.analysis import analyze
    from kvmap.report.loader import load_run
    from kvmap.report.terminal import summary
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(summary(analyze(load_run(run_dir))))
    return [line.rstrip() for line in out.getvalue().splitlines() if line.strip()]


def prediction(run_dir: Path) -> dict | None:
    """The simulator's predictions beside the measurements, as the report computes them."""
    from kvmap.report.loader import load_run
    from kvmap.report.prediction_view import prediction_context
    block = prediction_context(load_run(run_dir))["prediction"]
    return json.loads(json.dumps(block, default=str)) if block else None


def summary_record(run_dir: Path) -> tuple[dict, dict]:
    """(config, metrics) of the record of ``run_dir``."""
    store = RunStore(run_dir)
    meta = store.metadata()
    searches = run_dir / "searches.json"
    metrics = {"run": meta,
               "searches": json.loads(searches.read_text()) if searches.is_file() else None,
               "cells": as_dicts(store.cells()),
               "prediction": prediction(run_dir),
               "terminal": terminal_lines(run_dir)}
    hardware = meta.get("hardware") or {}
    config = {"run_dir": str(run_dir), "run_git_sha": (meta.get("git") or {}).get("sha"),
              "run_hardware": hardware}
    if hardware.get("auto_dtype_cpu"):
        config["dtype"] = hardware["auto_dtype_cpu"]
    return config, metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    args = ap.parse_args()
    config, metrics = summary_record(args.run_dir)
    path = write_record("run_summary", config, metrics)
    run_class = (config["run_hardware"] or {}).get("machine_class")
    if run_class:                      # the run's class, not the class of this machine
        record = json.loads(path.read_text())
        record.update(machine_class=run_class, machine_class_source="profile")   # run.json's
        path.write_text(json.dumps(record, indent=2))
    print("\n".join(metrics["terminal"]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
