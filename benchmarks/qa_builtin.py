"""The built-in QA set (task ``qa`` with no data file) on the embedded model: exact match
and token F1 of the codec family and two selection policies, with Wilson intervals and
paired intervals against the bf16 full-cache baseline (issue 19.3). Writes
``benchmarks/results/qa_builtin-<time>.json``; ``docs/qa.md`` reads it.

    PYTHONPATH=src python benchmarks/qa_builtin.py [--kv SPEC ...] [--samples 48] [--threads 1]

The same as ``kvmap eval --task qa --kv bf16 --kv int8 --kv int4
--kv "snapkv(budget=0.25)" --kv "streaming_llm(budget=0.25)" --threads 1 --json``, plus the
record's environment and a per-context-length breakdown.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402

DEFAULT_KV = ("bf16", "int8", "int4", "snapkv(budget=0.25)", "streaming_llm(budget=0.25)")
SUMMARY_KEYS = ("exact_match", "accuracy_ci95", "f1", "delta_exact_match", "delta_f1",
                "negative_rate", "negative_rate_ci95", "num_samples", "kv_bytes_peak", "wall_s")


def by_context(per_sample: list[dict]) -> dict[str, float]:
    """Exact match per built-in context length, ``{"384": 0.92, ...}``."""
    groups: dict[int, list[bool]] = {}
    for r in per_sample:
        groups.setdefault(r.get("context_tokens", 0), []).append(r["correct"])
    return {str(k): sum(v) / len(v) for k, v in sorted(groups.items())}


def main() -> None:
    from kvmap.config import EngineArgs
    from kvmap.evals import EvalOptions, evaluate
    ap = argparse.ArgumentParser()
    ap.add_argument("--kv", action="append", default=None)
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    specs = args.kv or list(DEFAULT_KV)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    result = evaluate("qa", specs, EvalOptions(num_samples=args.samples),
                      engine=EngineArgs(num_threads=args.threads), log=print)
    rows = {}
    for row in result["results"]:
        m = row["metrics"]
        rows[row["kv"]] = {**{k: m.get(k) for k in SUMMARY_KEYS},
                           "exact_match_by_context": by_context(row["per_sample"])}
        print(f"{row['kv']:28s} EM {m['exact_match']:.3f} {m['accuracy_ci95']}  "
              f"F1 {m['f1']:.3f}  dEM {m['delta_exact_match']}  "
              f"neg {m.get('negative_rate')}")
    metrics = {"results": rows, "baseline_per_sample": result["baseline"]["per_sample"],
               "wall_s": time.perf_counter() - t0, "load_avg_before": load_before,
               "load_avg_after": os.getloadavg()}
    config = {"task": "qa", "data": "built-in", "kv": specs, "model": result["model"],
              "dtype": result["dtype"], "threads": args.threads, "options": result["options"]}
    print(f"wrote {write_record('qa_builtin', config, metrics)}")


if __name__ == "__main__":
    main()
