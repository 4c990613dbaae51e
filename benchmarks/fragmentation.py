"""Fragmentation: waste against block size on the engine, and paged vs contiguous
reservation in the simulator (issue 19.2). Writes ``benchmarks/results/fragmentation.json``.

    PYTHONPATH=src python benchmarks/fragmentation.py [--model dummy:tiny] [--sim-only]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

BLOCK_SIZES = (8, 16, 32, 64)
SESSIONS = (16, 32, 64, 128, 256, 512)


def engine_sweep(model: str, num_requests: int, max_tokens: int) -> list[dict]:
    from kvmap import LLM
    from kvmap.bench.drive import drive
    from kvmap.bench.timeseries import TimeSeriesSampler
    from kvmap.workloads.spec import WorkloadRequest
    out = []
    for bs in BLOCK_SIZES:
        llm = LLM(model=model, dtype="fp32", kv="fp32", num_blocks=4096 // bs * 8,
                  block_size=bs, max_num_batched_tokens=256, device="cpu")
        reqs = [WorkloadRequest(f"r{i}", "x", max_tokens=max_tokens, ignore_eos=True)
                for i in range(num_requests)]
        prompts = [[1 + (i * 7 + j) % 50 for j in range(37 + 13 * i)] for i in range(num_requests)]
        with TimeSeriesSampler(llm.engine, period_s=0.01) as ts:
            _, _, stats = drive(llm.engine, reqs, prompts, concurrency=8)
        out.append({"block_size": bs, **ts.summary(),
                    "step_ms": 1e3 * stats.duration_s / max(1, stats.num_steps)})
    return out


def sim_sweep() -> list[dict]:
    from kvmap.kv.config import KVConfig
    from kvmap.plan.catalogue import get_model
    from kvmap.plan.sim import EngineSettings, SimConfig, simulate
    from kvmap.plan.sim.hardware import gpu_hardware
    from kvmap.workloads.arrivals import ClosedLoop
    from kvmap.workloads.lengths import Uniform
    from kvmap.workloads.spec import WorkloadSpec
    rows = []
    for n in SESSIONS:
        row = {"sessions": n}
        for reservation in ("paged", "contiguous"):
            wl = WorkloadSpec("frag", "synthetic", 2 * n, prompt_len=Uniform(256, 1024),
                              output_len=Uniform(128, 512), arrival=ClosedLoop(n), seed=0)
            cfg = SimConfig(name=reservation, model=get_model("llama-3-8b"),
                            hardware=gpu_hardware("a100-80gb"), kv=KVConfig.parse("bf16"),
                            workload=wl, engine=EngineSettings(
                                max_num_seqs=n, reservation=reservation,
                                reservation_tokens=4096, enable_prefix_caching=False))
            res = simulate(cfg)
            row[f"{reservation}_tok_s"] = res.metrics["output_tokens_per_s"]
            row[f"{reservation}_mean_running"] = res.kv["mean_running"]
        row["contiguous_vs_paged"] = row["contiguous_tok_s"] / row["paged_tok_s"]
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="dummy:tiny")
    ap.add_argument("--sim-only", action="store_true")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=24)
    args = ap.parse_args()
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from kvmap.hardware import record_summary
    from record_class import fields_from_profile
    record = {**fields_from_profile(record_summary(measure_if_missing=True), {"dtype": "fp32"}),
              "load_avg_1m": os.getloadavg()[0], "model": args.model,
              "simulator": sim_sweep()}
    for r in record["simulator"]:
        print(f"sessions {r['sessions']:4d}  paged {r['paged_tok_s']:9.0f} tok/s "
              f"(running {r['paged_mean_running']:6.1f})  contiguous {r['contiguous_tok_s']:9.0f}"
              f" tok/s (running {r['contiguous_mean_running']:6.1f})  ratio "
              f"{r['contiguous_vs_paged']:.2f}")
    if not args.sim_only:
        record["engine"] = engine_sweep(args.model, args.requests, args.max_tokens)
        for r in record["engine"]:
            print(f"block {r['block_size']:3d}  waste max {r['kv_waste_bytes_max']:9d} B  "
                  f"mean share {r['kv_waste_share_mean']:.3f}  step {r['step_ms']:.2f} ms")
    path = Path(__file__).parent / "results" / "fragmentation.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(record, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
