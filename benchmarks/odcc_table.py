"""The ODCC KV Cache evaluation report's headline figures beside what a `kvmap bench` run
measured: ratios read from the run's stored cell records (nothing is rerun).

    python benchmarks/odcc_table.py runs/default-<sha>

Prints one markdown table per claim and writes a record under benchmarks/results/
(`odcc_table-*.json`) with every ratio, the cells it came from and the run's load
averages. A claim whose cells are missing or failed says so instead of a number.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_record  # noqa: E402

from kvmap.runs.record import as_dicts  # noqa: E402
from kvmap.runs.store import RunStore  # noqa: E402


COMBO = "snapkv(budget=0.2,evict_to=host)+int8+tiers(host=256MiB)"   # selection+int8+offload


def _cells(run: Path) -> list[dict]:
    return [c for c in as_dicts(RunStore(run).cells()) if c.get("status") == "ok"]


def _level(c: dict) -> str | None:
    """A cell's load level: its label, or ``saturated`` for an ``arrival: auto``
    search's saturated run (the level every configuration of a search shares)."""
    load = c.get("load") or {}
    return (load.get("search") or {}).get("role") == "saturated" and "saturated" \
        or load.get("label")


def _base_kv(cells, model) -> str:
    """The baseline KV of ``model``'s cells: its compute dtype (``kv: auto``)."""
    return next((c["dtype"] for c in cells if c["model"] == model and c.get("dtype")), "bf16")


def _workload_cell(cells, model, kv, workload, load=None, quantization=None):
    for c in cells:
        level = _level(c)
        if (c["model"], c["kv"], c.get("workload"), c.get("quantization")) == \
                (model, kv, workload, quantization) and (load is None or level == load):
            return c
    return None


def _task_cell(cells, model, kv, task, quantization=None):
    for c in cells:
        if (c["model"], c["kv"], c.get("task"), c.get("quantization")) == \
                (model, kv, task, quantization):
            return c
    return None


def _tbt_p99(c) -> float | None:
    return ((c["metrics"].get("tbt_s") or {}).get("p99")) if c else None


def _ratio(a, b):
    return a / b if a is not None and b else None


def speed_rows(cells, model, workload, load, base_kv, other_kv, quantization=None) -> dict:
    """``other_kv`` (on ``quantization`` weights) against ``base_kv`` at one load level."""
    b = _workload_cell(cells, model, base_kv, workload, load)
    o = _workload_cell(cells, model, other_kv, workload, load, quantization)
    if b is None or o is None:
        return {"missing": [x for x, c in ((base_kv, b), (other_kv, o)) if c is None]}
    bm, om = b["metrics"], o["metrics"]
    return {
        "cells": [b["cell_id"], o["cell_id"]],
        "kv_bytes_per_token_ratio": _ratio(om["kv_bytes_per_token"], bm["kv_bytes_per_token"]),
        "peak_kv_bytes_ratio": _ratio(om["peak_kv_resident_bytes"],
                                      bm["peak_kv_resident_bytes"]),
        "concurrency_max": [bm["concurrency_max"], om["concurrency_max"]],
        "concurrency_max_ratio": _ratio(om["concurrency_max"], bm["concurrency_max"]),
        "concurrency_mean_ratio": _ratio(om["concurrency_mean"], bm["concurrency_mean"]),
        "output_tok_s": [bm["output_tokens_per_s"], om["output_tokens_per_s"]],
        "throughput_ratio": _ratio(om["output_tokens_per_s"], bm["output_tokens_per_s"]),
        "tbt_p99_s": [_tbt_p99(b), _tbt_p99(o)],
        "tbt_p99_ratio": _ratio(_tbt_p99(o), _tbt_p99(b)),
        "weight_bytes": [bm.get("weight_bytes"), om.get("weight_bytes")],
        "needle_accuracy": ([None, None] if model.startswith("dummy:")    # random weights
                            else [bm.get("needle_accuracy"), om.get("needle_accuracy")]),
        "num_requests": [bm.get("num_requests"), om.get("num_requests")],
    }


def accuracy_rows(cells, model, base_kv, kv) -> dict:
    out = {}
    for task in ("passkey", "ppl-policies", "ppl", "chat_generation"):
        c = _task_cell(cells, model, kv, task)
        if c is None:
            continue
        m = c["metrics"]
        out[task] = {k: m.get(k) for k in ("accuracy", "accuracy_ci95", "num_samples",
                                            "ppl_delta_rel", "ppl_delta_rel_ci95",
                                            "output_tokens_mean_ratio",
                                            "natural_stop_rate") if m.get(k) is not None}
        base = _task_cell(cells, model, base_kv, task)
        if base is not None and m.get("accuracy") is not None:
            out[task]["baseline_accuracy"] = base["metrics"].get("accuracy")
    return out


def _fmt(x, pct=False):
    if x is None:
        return "-"
    return f"{100 * x:.1f}%" if pct else f"{x:.2f}"


def _needle(row: dict) -> str:
    (a, b), (n, _) = row["needle_accuracy"], row["num_requests"]
    return "-" if a is None or b is None else f"{_fmt(a, True)} -> {_fmt(b, True)} of {n}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--model-8b", default="dummy:llama-3-8b?layers=2&vocab=4096")
    args = ap.parse_args()
    cells = _cells(args.run_dir)
    meta = RunStore(args.run_dir).metadata()
    m, m8 = args.model, args.model_8b
    base, base8 = _base_kv(cells, m), _base_kv(cells, m8)
    result = {
        "s1_int8": speed_rows(cells, m, "s1-throughput", "saturated", base, "int8"),
        "s1_int4": speed_rows(cells, m, "s1-throughput", "saturated", base, "int4"),
        "s1_w8a8_int8": speed_rows(cells, m, "s1-throughput", "saturated", base, "int8",
                                   quantization="w8a8"),
        "s1_8b_int8": speed_rows(cells, m8, "s1-throughput-8b", "closed:8", base8, "int8"),
        "s2_snapkv_int8": speed_rows(cells, m, "s2-long-context", None, base,
                                     "snapkv(budget=0.2)+int8"),
        "s2_snapkv_int8_host": speed_rows(cells, m, "s2-long-context", None, base,
                                          COMBO),
        "s2_host": speed_rows(cells, m, "s2-long-context", None, base, "tiers(host=256MiB)"),
        "s2_8b_snapkv": speed_rows(cells, m8, "s2-long-context-8b", None, base8,
                                   "snapkv(budget=0.2)"),
        "accuracy_int8": accuracy_rows(cells, m, base, "int8"),
        "accuracy_snapkv_int8": accuracy_rows(cells, m, base, "snapkv(budget=0.2)+int8"),
        "accuracy_snapkv_int8_host": accuracy_rows(cells, m, base,
                                                   COMBO),
    }
    w8 = _task_cell(cells, m, "int8", "ppl", "w8a8")
    if w8 is not None:
        result["accuracy_w8a8_int8"] = {k: w8["metrics"].get(k) for k in
                                        ("ppl_delta_rel", "ppl_delta_rel_ci95", "num_samples")}
    sha = (meta.get("git") or {}).get("sha")
    hw = (meta.get("hardware") or {})
    print(f"run {args.run_dir} ({len(cells)} ok cells, git {sha}; machine class "
          f"{hw.get('machine_class')}, baseline KV {base})\n")
    print("| comparison | KV B/token | peak KV | max concurrent | throughput | P99 TBT "
          "| needle (base -> this) |")
    print("|---|---|---|---|---|---|---|")
    for key, row in result.items():
        if not key.startswith(("s1", "s2")):
            continue
        if "missing" in row:
            print(f"| {key} | missing: {row['missing']} | | | | |")
            continue
        print(f"| {key} | {_fmt(row['kv_bytes_per_token_ratio'])}x "
              f"| {_fmt(row['peak_kv_bytes_ratio'])}x "
              f"| {row['concurrency_max'][0]} -> {row['concurrency_max'][1]} "
              f"({_fmt(row['concurrency_max_ratio'])}x) "
              f"| {_fmt(row['output_tok_s'][0])} -> {_fmt(row['output_tok_s'][1])} tok/s "
              f"({_fmt(row['throughput_ratio'])}x) "
              f"| {_fmt(row['tbt_p99_ratio'])}x "
              f"| {_needle(row)} |")
    for key in ("accuracy_int8", "accuracy_snapkv_int8", "accuracy_snapkv_int8_host",
                "accuracy_w8a8_int8"):
        print(f"\n{key}: {result.get(key)}")
    path = write_record("odcc_table", {"run_dir": str(args.run_dir), "run_git_sha": sha,
                                       "baseline_kv": base,
                                       "run_hardware": meta.get("hardware")}, result)
    print(f"\nrecord: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
