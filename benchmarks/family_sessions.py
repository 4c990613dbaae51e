"""How many concurrent 32K-token sessions of each model family fit on one 80 GB GPU,
bf16 vs int8 vs a selection policy: the planner on each published ``config.json``
(``tests/plan/fixtures/hf``), cross-checked by the simulator on three of them
(``examples/sessions-32k-*.yaml``). Analytical and simulated: the figures are the
spec-sheet H100's, the same on any host; the record names the host class anyway.

    PYTHONPATH=src python benchmarks/family_sessions.py              # plans + 3 simulations
    PYTHONPATH=src python benchmarks/family_sessions.py --no-sim
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402

from kvmap.config import format_bytes  # noqa: E402
from kvmap.plan import get_gpu, get_model, plan_capacity  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "plan" / "fixtures" / "hf"
CONTEXT = 32768
# model, the weight format that fits one 80 GB GPU where one does
ROWS = [("gemma-3-1b-it", "bf16"), ("gemma-3-4b-it", "bf16"), ("gemma-3-27b-it", "bf16"),
        ("gpt-oss-20b", "mxfp4"), ("gpt-oss-120b", "mxfp4"), ("qwen3-8b", "bf16"),
        ("qwen3-32b", "fp8"), ("qwen3-30b-a3b", "bf16"), ("qwen3-next-80b-a3b-instruct", "int4"),
        ("deepseek-v3", "int4"), ("llama-4-scout-17b-16e-instruct", "int4")]
SPECS = ["bf16", "int8", "snapkv(budget=0.25)", "int8+snapkv(budget=0.25)"]
# what a calculator counting every layer as global attention says per token, where the
# planner's own bytes per token is not that (all 48 layers of Qwen3-Next as its 2 x 256
# attention; DeepSeek V3 as 128 heads of K 192 + V 128 values)
ALL_GLOBAL_BYTES_PER_TOKEN = {"qwen3-next-80b-a3b-instruct": 48 * 2 * 2 * 256 * 2,
                              "deepseek-v3": 61 * 128 * (192 + 128) * 2}
SIMULATED = ["gemma-3-27b-it", "qwen3-next-80b-a3b-instruct", "gpt-oss-120b"]


def plan_row(name: str, weights: str, gpu: str = "h100-80gb", num_gpus: int = 1) -> dict:
    model = get_model(str(FIXTURES / name))
    plans = [plan_capacity(model, get_gpu(gpu), spec, context_tokens=CONTEXT,
                           weights=weights, num_gpus=num_gpus) for spec in SPECS]
    p = plans[0]
    all_global = ALL_GLOBAL_BYTES_PER_TOKEN.get(name, p.kv_bytes_per_token) * CONTEXT
    return {"model": name, "gpu": gpu, "num_gpus": num_gpus, "weights": weights,
            "weight_bytes": p.weight_bytes, "kv_room_bytes_per_gpu": p.usable_kv_bytes_per_gpu,
            "kv_bytes_per_seq_by_kind": {k: v["kv_bytes_per_seq"]
                                         for k, v in p.layer_kinds.items()},
            "kv_bytes_per_seq": p.kv_bytes_per_seq, "all_global_kv_bytes_per_seq": all_global,
            "sessions": {q.kv_spec: q.max_concurrent_seqs for q in plans}}


def simulate_row(name: str) -> dict:
    from kvmap.plan.sim import simulate
    from kvmap.plan.sim.scenario import load_sim_scenario
    scenario = load_sim_scenario(ROOT / "examples" / f"sessions-32k-{name}.yaml")
    out = {}
    for config in scenario.configs:
        kv = simulate(config).kv
        out[config.name] = {"batch_mean": kv["mean_running"], "batch_max": kv["max_running"]}
    return {"scenario": scenario.name, "batch": out}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-sim", action="store_true")
    args = ap.parse_args()
    rows = [plan_row(n, w) for n, w in ROWS] + [plan_row("deepseek-v3", "fp8", "h200", 8)]
    for r in rows:
        print(f"{r['model']:32s} {r['num_gpus']}x{r['gpu']:10s} {r['weights']:6s} "
              f"KV/seq {format_bytes(r['kv_bytes_per_seq']):>10s} all-global "
              f"{format_bytes(r['all_global_kv_bytes_per_seq']):>10s}  sessions "
              + " ".join(f"{s}={n}" for s, n in r["sessions"].items()))
    sims = [] if args.no_sim else [simulate_row(n) for n in SIMULATED]
    for s in sims:
        print(s["scenario"], {k: f"{v['batch_mean']:.1f} / {v['batch_max']}"
                              for k, v in s["batch"].items()})
    path = write_record("family_sessions", {"context_tokens": CONTEXT, "specs": SPECS,
                                            "rows": ROWS, "simulated": SIMULATED},
                        {"plans": rows, "simulations": sims})
    print(f"record: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
