"""Batch-1 decode of the embedded model with each weight format side by side in one
run (``LLM(quantization=...)``), 128-token prompt, 32 decode steps, formats alternating
over --repeat rounds; prints tokens/s, the ratio to bf16 weights and resident weight
bytes, and writes a record under benchmarks/results/.

    .venv/bin/python benchmarks/weight_formats.py [--repeat 3] [--threads 2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402

from kvmap import LLM, SamplingParams  # noqa: E402

FORMATS = (None, "int8", "w8a8", "int4")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    llms = {q: LLM(quantization=q, kv_memory="64MiB") for q in FORMATS}
    rates = {q: [] for q in FORMATS}
    prompt = list(range(1000, 1128))
    for _ in range(args.repeat):
        for q, llm in llms.items():
            llm.generate([prompt], SamplingParams(max_tokens=2, ignore_eos=True))
            out = llm.generate([prompt], SamplingParams(max_tokens=33, ignore_eos=True))[0]
            times = out.metrics.token_times_s
            rates[q].append(32 / (times[-1] - times[0]))
    base = statistics.median(rates[None])
    rows = {}
    for q in FORMATS:
        m = statistics.median(rates[q])
        rows[str(q)] = {"tokens_per_s": rates[q], "ratio": m / base,
                        "weight_bytes": llms[q].weight_bytes()}
        print(f"{str(q):6s} batch-1 decode {m:6.1f} tok/s  x{m / base:.2f} vs bf16 weights"
              f"  weight_bytes {llms[q].weight_bytes() / 1e6:.1f} MB")
    print("load average", os.getloadavg())
    print("wrote", write_record("weight_formats", vars(args), {"rows": rows}))


if __name__ == "__main__":
    main()
