"""The small record of an ``examples/engines.yaml`` run: one row per cell of a run
directory (configuration, workload or task, status, the figures docs/engines.md quotes)
and the throughput ratios of each configuration to kvmap's bf16 at the same level.

    python benchmarks/engines_summary.py runs/engines [--wall-s S] [--command "..."]
    python benchmarks/engines_summary.py runs/peers --name peers     # examples/peers.yaml

Reads only the run directory (``RunStore.cells``); writes
``benchmarks/results/<name>-*.json`` (default ``engines``) and prints a table.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_record  # noqa: E402

from kvmap.runs.store import RunStore  # noqa: E402

WORKLOAD_KEYS = ("output_tokens_per_s", "num_completed", "num_failed", "num_output_tokens",
                 "peak_kv_resident_bytes", "kv_capacity_bytes", "kv_memory_source",
                 "kv_memory_note", "client_cpu_share")
PERCENTILES = ("ttft_s", "tpot_s", "tbt_s", "e2e_s")
TASK_KEYS = ("accuracy", "passkey_accuracy", "ppl", "num_samples", "num_tokens_scored",
             "ppl_definition", "nll_mean")


def _row(cell: dict) -> dict:
    cell = cell.to_dict() if hasattr(cell, "to_dict") else cell     # a CellRecord
    m = cell.get("metrics") or {}
    row = {"cell_id": cell["cell_id"], "kv": cell.get("kv"), "workload": cell.get("workload"),
           "job": "_".join(cell["cell_id"].split("_")[1:-2]),   # the workload level or task
           "task": cell.get("task"), "status": cell.get("status"), "error": cell.get("error"),
           "duration_s": cell.get("duration_s"),
           "load_avg_1m": (cell.get("env") or {}).get("load_avg_1m_start",
                                                      (cell.get("env") or {}).get("load_avg"))}
    for key in WORKLOAD_KEYS + TASK_KEYS:
        if key in m:
            row[key] = m[key]
    for key in PERCENTILES:
        if isinstance(m.get(key), dict):
            row[key] = {p: m[key].get(p) for p in ("p50", "p99", "mean")}
    return row


def _ratios(rows: list[dict]) -> dict:
    """Each configuration's output tokens/s over kvmap bf16's, per workload level."""
    base = {r["job"]: r.get("output_tokens_per_s") for r in rows
            if r["kv"] == "bf16" and r["workload"] and r["status"] == "ok"}
    out: dict = {}
    for r in rows:
        b = base.get(r["job"])
        if r["workload"] and r["status"] == "ok" and b and r.get("output_tokens_per_s"):
            out.setdefault(r["kv"], {})[r["job"]] = r["output_tokens_per_s"] / b
    return out


def _ppl_drops(cells: list[dict], draws: int = 2000) -> dict:
    """Each ``prompt_ppl`` cell's perplexity over its baseline's (``baseline_kv``, else
    bf16), paired by sample: exp(mean per-sample NLL difference) - 1, with a 95%
    percentile bootstrap over the samples (seeded)."""
    import math
    import random
    nll = {c["kv"]: {s["sample_id"]: s["nll_mean"] for s in
                     (c.get("details") or {}).get("per_sample") or []}
           for c in cells if c.get("task") == "prompt_ppl" and c.get("status") == "ok"}
    out: dict = {}
    for c in cells:
        if c.get("task") != "prompt_ppl" or c["kv"] not in nll:
            continue
        base = (c.get("metrics") or {}).get("baseline_kv") or "bf16"
        if base == c["kv"] or base not in nll:
            continue
        diffs = [v - nll[base][k] for k, v in nll[c["kv"]].items() if k in nll[base]]
        if not diffs:
            continue
        rng = random.Random(0)
        boot = sorted(sum(rng.choices(diffs, k=len(diffs))) / len(diffs) for _ in range(draws))
        out[c["kv"]] = {"baseline": base, "n": len(diffs),
                        "ppl_change": math.exp(sum(diffs) / len(diffs)) - 1,
                        "ci95": [math.exp(boot[int(0.025 * draws)]) - 1,
                                 math.exp(boot[int(0.975 * draws) - 1]) - 1]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--wall-s", type=float, default=None, help="the run's wall time")
    ap.add_argument("--command", default=None, help="the command(s) that made the run")
    ap.add_argument("--name", default="engines", help="the record's name")
    args = ap.parse_args()
    cells = [c.to_dict() for c in RunStore(args.run_dir).cells()]
    rows = [_row(c) for c in cells]
    drops = _ppl_drops(cells)
    for kv, d in drops.items():
        print(f"prompt_ppl {kv:>14} vs {d['baseline']:>8}: {100 * d['ppl_change']:+.2f}% "
              f"[{100 * d['ci95'][0]:+.2f}, {100 * d['ci95'][1]:+.2f}] (n={d['n']})")
    for r in rows:
        fig = next((r[k] for k in ("output_tokens_per_s", "accuracy", "ppl")
                    if r.get(k) is not None), None)
        print(f"{r['kv']:>14} {r['job']:>24} {r['status']:>11} "
              f"{'' if fig is None else f'{fig:.4g}'}  {(r.get('error') or '')[:90]}")
    path = write_record(args.name, {"run_dir": str(args.run_dir), "command": args.command},
                        {"cells": rows, "throughput_vs_kvmap_bf16": _ratios(rows),
                         "prompt_ppl_vs_baseline": drops,
                         "wall_s": args.wall_s, "load_avg_end": os.getloadavg()})
    print(f"record: {path}")


if __name__ == "__main__":
    main()
