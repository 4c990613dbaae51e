"""The memory-bound workload of issue 15, codecs side by side in one run: a 72 MiB pool
(about 16 bf16 requests), 64 requests of 180-220 prompt tokens and 64 output tokens all
sent at once (closed loop of 64), the embedded model in bf16 weights (or --quantization).

Per KV spec: the most sequences running at once, output tokens/s (median over
--repeat runs, the specs alternating so that load changes fall on all of them), its
ratio to the first spec, and operators per decode step (``bench.probes.decode_ops``:
deterministic, so it is the figure to trust on a loaded machine).

    .venv/bin/python benchmarks/memory_bound.py [--kv bf16,int8,int4] [--repeat 1]
        [--requests 64] [--quantization int8] [--threads 2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402

from kvmap import LLM, SamplingParams  # noqa: E402
from kvmap.bench.probes import decode_ops  # noqa: E402


def run(llm: LLM, prompts: list[list[int]], new_tokens: int) -> tuple[float, int]:
    """(output tokens/s, most sequences running at once)."""
    engine, most = llm.engine, 0
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    reqs = [engine.add_request(p, params) for p in prompts]
    t0 = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
        most = max(most, len(engine.scheduler.running))
    elapsed = time.perf_counter() - t0
    for r in reqs:
        engine.pop_finished(r.request_id)
    return len(prompts) * new_tokens / elapsed, most


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kv", default="bf16,int8,int4")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--kv-memory", default="72MiB")
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    specs = [s.strip() for s in args.kv.split(",")]
    rng = np.random.default_rng(0)
    prompts = [rng.integers(100, 40000, int(rng.integers(180, 221))).tolist()
               for _ in range(args.requests)]
    # no prefix caching: the repeats send the same prompts, and a pool that kept them
    # (int4's holds most) would skip their prefill on the next repeat
    llms = {s: LLM(kv=s, kv_memory=args.kv_memory, max_num_seqs=64,
                   max_num_batched_tokens=512, quantization=args.quantization,
                   enable_prefix_caching=False)
            for s in specs}
    for llm in llms.values():                                 # warm-up
        run(llm, prompts[:2], 4)
    rates = {s: [] for s in specs}
    most = {}
    loads = []
    for _ in range(args.repeat):
        for s, llm in llms.items():
            rate, most[s] = run(llm, prompts, args.new_tokens)
            rates[s].append(rate)
            loads.append(os.getloadavg()[0])
    ops = {s: decode_ops(llm)["num_ops_per_step"] for s, llm in llms.items()}
    base = statistics.median(rates[specs[0]])
    print(f"\nload average during the runs: {min(loads):.1f}-{max(loads):.1f}")
    print(f"{'kv':<28} {'running':>7} {'out tok/s':>10} {'ratio':>6} {'ops/step':>9}")
    rows = {}
    for s in specs:
        m = statistics.median(rates[s])
        rows[s] = {"max_running": most[s], "output_tokens_per_s": rates[s],
                   "median": m, "ratio": m / base, "num_ops_per_step": ops[s]}
        print(f"{s:<28} {most[s]:>7} {m:>10.1f} {m / base:>6.2f} {ops[s]:>9}")
    path = write_record("memory_bound", vars(args), {"rows": rows, "load_average": loads})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
