"""The simulator's predictions of a stored run, made again with the code as it is now.

A bench run stores each workload cell's prediction beside its measurement (``prediction``,
written at bench time). This script predicts every such cell again -- the same cell
configuration (the scenario's cell of that model, KV spec and workload), the same
requests (the cell's request rows: token counts and arrivals), the same pool -- on this
machine's ``cpu-this-machine`` as the code now builds it (since issue 34: the profile's
rates and the calibration record of the class and dtype the budget estimate uses,
``kvmap.perf``), and prints, per cell, measured output throughput beside the stored and
the new prediction, then the MAPE of each over the run. Only the simulation runs (no
engine): a minute at most on two cores.

    .venv/bin/python benchmarks/repredict_run.py /work/runs/default-main
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402

from kvmap.bench.scenario import load_scenario  # noqa: E402
from kvmap.plan.sim.predict import CellPredictor  # noqa: E402
from kvmap.report.calibration import calibration, mape  # noqa: E402
from kvmap.report.loader import load_run  # noqa: E402
from kvmap.runs.names import base_name  # noqa: E402

KEY = "output_tokens_per_s"


def scenario_cell(scenario, record: dict):
    """The scenario's cell of ``record``'s model, KV spec and workload; a search's probe
    is its search's cell at the probe's arrival (``Scenario.probe_cell``)."""
    search = (record.get("load") or {}).get("search")
    for cell in scenario.searches() if search else scenario.cells():
        if cell.workload is not None and cell.kv == record["kv"] \
                and base_name(cell.workload.name) == base_name(record["workload"]) \
                and cell.model.name == record["model"]:
            if search:
                params = record.get("params") or {}
                cell = scenario.probe_cell(cell, search.get("role", "level"),
                                           params["arrival"], int(params["num_requests"]))
            return replace(cell, cell_id=record["cell_id"])
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir")
    args = ap.parse_args()
    run = load_run(args.run_dir)
    scenario = load_scenario(os.path.join(args.run_dir, "scenario.yaml"))
    predictor = CellPredictor(gpu=None)
    by_id = {r.cell_id: r.to_dict() for r in run.cells}
    rows, skipped = [], {}
    for cal in calibration(run.cells).cells:
        record = by_id[cal.cell_id]
        cell = scenario_cell(scenario, record)
        if cell is None:
            skipped[cal.cell_id] = "no cell of its model, KV spec and workload"
            continue
        new = predictor(cell, record, run.rows_by_cell.get(cal.cell_id, []))
        if "metrics" not in new:
            skipped[cal.cell_id] = new.get("skipped") or new.get("error")
            continue
        rows.append({"cell_id": cal.cell_id, "kv": record["kv"],
                     "measured": cal.measured[KEY], "stored": cal.predicted[KEY],
                     "new": new["metrics"][KEY],
                     "tbt_measured": cal.measured["tbt_p50_s"],
                     "tbt_stored": cal.predicted["tbt_p50_s"],
                     "tbt_new": new["metrics"]["tbt_p50_s"],
                     "load": cal.load, "calibration": new.get("calibration")})
    print(f"{'cell':<66} {'measured':>9} {'stored':>9} {'new':>9}   tok/s")
    for r in rows:
        print(f"{r['cell_id'][:66]:<66} {r['measured']:>9.1f} {r['stored']:>9.1f} "
              f"{r['new']:>9.1f}")
    fits = {k: mape([(r[k], r["measured"]) for r in rows]) for k in ("stored", "new")}
    tbt = {k: mape([(r[f"tbt_{k}"], r["tbt_measured"]) for r in rows
                    if r[f"tbt_{k}"] and r["tbt_measured"]]) for k in ("stored", "new")}
    print(f"\n{len(rows)} cells ({len(skipped)} skipped): throughput MAPE stored "
          f"{fits['stored']:.0%}, new {fits['new']:.0%}; TBT P50 MAPE stored "
          f"{tbt['stored']:.0%}, new {tbt['new']:.0%} (load now {os.getloadavg()[0]:.1f})")
    path = write_record("repredict_run", {"run_dir": args.run_dir,
                                          "calibration": rows[0]["calibration"] if rows else None},
                        {"rows": rows, "skipped": skipped, "throughput_mape": fits,
                         "tbt_p50_mape": tbt, "load_average": os.getloadavg()[0]})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
