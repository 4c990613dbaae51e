"""What ``OMP_WAIT_POLICY=PASSIVE`` costs: S1's workload of the default scenario (128
requests of 256 random prompt tokens + 64 output tokens, all in flight, a pool of 4,096
bf16 tokens, 512-token steps) run in one process per setting, the engine alone (no
bench cell around it), with OpenMP's default wait policy and with PASSIVE, which
``bench.cell_process.child_env`` sets for every bench cell.

Per KV spec and policy: output tokens/s of each of --repeat runs after a warm-up, the
policies alternating run by run (a fresh process each) so that load changes fall on
both. The load average is recorded.

    .venv/bin/python benchmarks/omp_wait_policy.py [--kv bf16,int8] [--repeat 2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402
from kvmap.hardware.threads import policy_env  # noqa: E402

CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import numpy as np, torch
from memory_bound import run
from kvmap import LLM
torch.set_num_threads(2)
rng = np.random.default_rng(0)
prompts = [rng.integers(100, 40000, 256).tolist() for _ in range(128)]
llm = LLM(kv=sys.argv[2], kv_memory="4096 tokens", max_num_seqs=128,
          max_num_batched_tokens=512)
run(llm, prompts[:4], 4)
rate, most = run(llm, prompts, 64)
print(json.dumps({"tokens_per_s": rate, "max_running": most}))
"""


def one(kv: str, policy: str | None) -> dict:
    env = policy_env(policy or "default")
    out = subprocess.run([sys.executable, "-c", CHILD, os.path.dirname(__file__), kv],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kv", default="bf16,int8")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    specs = args.kv.split(",")
    policies = {"default": None, "PASSIVE": "PASSIVE"}
    rates: dict = {s: {p: [] for p in policies} for s in specs}
    loads = []
    for _ in range(args.repeat):
        for s in specs:
            for name, value in policies.items():
                r = one(s, value)
                rates[s][name].append(r["tokens_per_s"])
                loads.append(os.getloadavg()[0])
                print(f"{s:6s} {name:8s} {r['tokens_per_s']:7.1f} tok/s  running "
                      f"{r['max_running']}", flush=True)
    metrics = {}
    for s in specs:
        d, p = (statistics.median(rates[s][n]) for n in policies)
        metrics[s] = {"tokens_per_s": rates[s], "default_over_passive": d / p}
        print(f"{s}: default {d:.1f}, PASSIVE {p:.1f} tok/s (median): {d / p:.2f}x")
    for name in policies:
        if len(specs) > 1:
            base = statistics.median(rates[specs[0]][name])
            for s in specs[1:]:
                ratio = statistics.median(rates[s][name]) / base
                metrics.setdefault("ratios", {})[f"{s}/{specs[0]} {name}"] = ratio
                print(f"{s} / {specs[0]} with {name}: {ratio:.2f}")
    print(f"load average during the runs: {min(loads):.1f}-{max(loads):.1f}")
    path = write_record("omp_wait_policy", vars(args), {**metrics, "load_average": loads})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
