"""A ``kvmap bench`` run's wall time beside its preflight estimate, per family of cells and
in all, read back from stored run directories (nothing is rerun).

    python benchmarks/bench_wall.py RUN_DIR[:WALL_S] [RUN_DIR[:WALL_S] ...]

``WALL_S``: the command's own wall time as ``time`` measured it (process start, preflight
and the report included); without it the run's span from ``run.json`` (created to last
update) stands in. Per cell the record keeps ``estimate`` (``estimate_s``, ``actual_s``:
the cell's wall time in the runner, start-up included); a family's estimate is the
preflight's (``run.json``: a search's probes at their most), else the sum of its cells'. Prints a table per run and writes one record
(``bench_wall-*.json``) with the machine class of each run.
"""
from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_record  # noqa: E402

from kvmap.runs.store import RunStore  # noqa: E402


def _span_s(meta: dict) -> float | None:
    try:
        return (datetime.fromisoformat(meta["updated_at"])
                - datetime.fromisoformat(meta["created_at"])).total_seconds()
    except (KeyError, TypeError, ValueError):
        return None


def run_summary(run_dir: Path, wall_s: float | None) -> dict:
    store = RunStore(run_dir)
    meta = store.metadata()
    families: dict[str, dict] = {}
    for c in store.cells():
        est = c.estimate or {}
        f = families.setdefault(c.job or "?", {"cells": 0, "estimate_s": 0.0, "actual_s": 0.0,
                                                "unestimated_cells": 0})
        f["cells"] += 1
        if est.get("estimate_s") is None:
            f["unestimated_cells"] += 1       # a search's probe beyond its estimate
        else:
            f["estimate_s"] += est["estimate_s"]
        f["actual_s"] += est.get("actual_s") or c.duration_s or 0.0
    preflight = meta.get("preflight") or {}
    for name, f in families.items():   # a search's family: its estimate at its most
        f["estimate_s"] = (preflight.get("by_family_s") or {}).get(name, f["estimate_s"])
        f["ratio"] = f["actual_s"] / f["estimate_s"] if f["estimate_s"] else None
    hw = meta.get("hardware") or {}
    return {"run_dir": str(run_dir), "scenario": (meta.get("scenario") or {}).get("name"),
            "git": (meta.get("git") or {}).get("sha"),
            "machine_class": hw.get("machine_class"), "cpu_model": hw.get("cpu_model"),
            # the run's own dtype: a run with KVMAP_NATIVE_BF16 forced has its profile's
            "dtype": hw.get("auto_dtype_cpu"),
            "native_bf16_forced": hw.get("native_bf16_forced"),
            "num_cells_ok": meta.get("num_cells_ok"),
            "num_cells_failed": meta.get("num_cells_failed"),
            "wall_s": wall_s, "run_span_s": _span_s(meta),
            "estimate_s": preflight.get("estimate_s"),
            "budget_s": (preflight.get("budget") or {}).get("budget_s"),
            "slowdown": preflight.get("slowdown"), "wait_policy": preflight.get("wait_policy"),
            "cuts": (preflight.get("budget") or {}).get("cuts"), "families": families}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", help="RUN_DIR[:WALL_S]")
    args = ap.parse_args()
    out = []
    for item in args.runs:
        path, _, wall = item.partition(":")
        s = run_summary(Path(path), float(wall) if wall else None)
        out.append(s)
        wall_s = s["wall_s"] or s["run_span_s"]
        print(f"\n{s['scenario']} ({s['run_dir']}, {s['machine_class']}, git {s['git']}): "
              f"wall {wall_s:.0f} s, estimate {s['estimate_s']} s, budget {s['budget_s']} s")
        print("| family | cells | estimate s | actual s | actual / estimate |")
        print("|---|---|---|---|---|")
        for name, f in sorted(s["families"].items()):
            ratio = f"{f['ratio']:.2f}" if f["ratio"] else "-"
            print(f"| {name} | {f['cells']} | {f['estimate_s']:.0f} | {f['actual_s']:.0f} "
                  f"| {ratio} |")
    # the record's class and dtype are its runs' (one forced to the other dtype is that
    # dtype), when they agree; else the machine's, and each run entry says its own
    dtypes = {s["dtype"] for s in out if s["dtype"]}
    config = {"runs": args.runs, **({"dtype": dtypes.pop()} if len(dtypes) == 1 else {})}
    path = write_record("bench_wall", config, {"runs": out})
    print(f"\nrecord: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
