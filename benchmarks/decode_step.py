"""One decode step of the engine at batch B and ~264 tokens of context, KV specs side by
side in one run: the embedded model, ``LLM(kv=spec, kv_memory=...)`` with a pool large
enough that all B sequences stay resident (72 MiB, or more when B does not fit in bf16).

Per spec and batch: median seconds of a decode step (>= 5 steps, the specs alternating
step by step so that load changes fall on all of them), its ratio to bf16's, and
operators per decode step (``bench.probes.decode_ops``: deterministic), and the mean
slots each sequence holds over the timed steps (a selection policy such as
``h2o(budget=256)`` holds fewer than the full cache: compare at equal resident tokens).
The load average is recorded before and after.

    .venv/bin/python benchmarks/decode_step.py [--kv "bf16,int8,int4,h2o(budget=256)"]
        [--batch 16,32] [--context 264] [--steps 7] [--threads 2]

Specs are separated by commas outside parentheses (``int8+h2o(budget=256,decode_every=8)``
is one spec).
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402

from kvmap import LLM, SamplingParams  # noqa: E402
from kvmap.bench.probes import decode_ops  # noqa: E402

BF16_BYTES_PER_TOKEN = 23_040        # the embedded model: 30 layers x K and V x 3 x 64 x 2


def start_batch(llm: LLM, batch: int, context: int, steps: int, seed: int) -> list:
    """Add ``batch`` requests of ``context - 8`` prompt tokens and step until every one
    of them decodes (prefills done), so that each later step is a pure decode step."""
    rng = np.random.default_rng(seed)
    params = SamplingParams(max_tokens=steps + 16, ignore_eos=True)
    reqs = [llm.engine.add_request(rng.integers(100, 40000, context - 8).tolist(), params)
            for _ in range(batch)]
    while min(len(r.metrics.token_times_s) for r in reqs) < 2:
        llm.engine.step()
    return reqs


def finish(llm: LLM, reqs: list) -> None:
    for r in reqs:
        llm.engine.abort(r.request_id)
    while llm.engine.has_unfinished():
        llm.engine.step()


def timed_step(llm: LLM, batch: int) -> float:
    running = len(llm.engine.scheduler.running)
    assert running == batch, f"{running} sequences running, not {batch}"
    t0 = time.perf_counter()
    llm.engine.step()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kv", default="bf16,int8,int4")
    ap.add_argument("--batch", default="16,32")
    ap.add_argument("--context", type=int, default=264)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    specs = [s.strip() for s in re.split(r",(?![^()]*\))", args.kv)]
    batches = [int(b) for b in args.batch.split(",")]
    load_before = os.getloadavg()
    metrics: dict = {}
    for batch in batches:
        tokens = batch * (args.context + args.steps + 32)
        mib = max(72, int(1.6 * tokens * BF16_BYTES_PER_TOKEN / 2 ** 20))
        llms = {s: LLM(kv=s, kv_memory=f"{mib}MiB", max_num_seqs=batch,
                    max_num_batched_tokens=1024) for s in specs}
        ops = {s: decode_ops(llm)["num_ops_per_step"] for s, llm in llms.items()}
        reqs = {s: start_batch(llm, batch, args.context, args.steps, seed=batch)
                for s, llm in llms.items()}
        times: dict[str, list[float]] = {s: [] for s in specs}
        slots: dict[str, list[float]] = {s: [] for s in specs}
        for i in range(args.steps + 1):               # the first round is a warm-up
            for s in specs:
                t = timed_step(llms[s], batch)
                if i:
                    times[s].append(t)
                    slots[s].append(statistics.mean(r.num_kv_slots for r in reqs[s]))
        for s in specs:
            finish(llms[s], reqs[s])
        base = statistics.median(times[specs[0]])
        for s in specs:
            med = statistics.median(times[s])
            metrics[f"b{batch}.{s}"] = {"step_s": med, "ratio_to_" + specs[0]: med / base,
                                        "num_ops_per_step": ops[s], "steps_s": times[s],
                                        "resident_slots_mean": statistics.mean(slots[s]),
                                        "kv_memory_mib": mib}
            print(f"batch {batch:3d}  {s:6s}  step {med * 1e3:7.1f} ms  "
                  f"x{med / base:.2f} {specs[0]}  ops/step {ops[s]}  "
                  f"slots/seq {statistics.mean(slots[s]):.0f}", flush=True)
        del llms
    load_after = os.getloadavg()
    print(f"load average before {load_before}, after {load_after}")
    path = write_record("decode_step", {"kv": specs, "batch": batches,
                                        "context": args.context, "steps": args.steps,
                                        "threads": args.threads, "label": args.label,
                                        "load_before": load_before,
                                        "load_after": load_after}, metrics)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
