"""bf16 prefill through torch's fused CPU attention kernel (``fused_prefill.BF16_FLASH``)
against the tiled products, in one run: what it buys (a long prompt's prefill time) and
what it changes in generation (the chat task's natural-stop rate and answer length, the
quantity the real-model baseline test holds).

The two forms compute the same attention and differ in rounding only (the fused kernel
keeps an online softmax in fp32, the tiled form rounds scores to bf16 before the
softmax); greedy decoding amplifies any rounding into different tokens, so the
generation figures are compared by their Wilson intervals, not per sample.

    .venv/bin/python benchmarks/flash_prefill_ab.py [--samples 32] [--prefill-tokens 2000]
        [--repeats 3]

Arms run in separate processes, tiled first, so neither inherits the other's warm state
beyond the page cache. Writes ``flash_prefill_ab-*.json`` (class, dtype, load average).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ARMS = ("tiled", "flash")


def one_arm(arm: str, samples: int, prefill_tokens: int, repeats: int) -> dict:
    """Run in a child process: the chat task and ``repeats`` prefills of distinct text."""
    import time

    import kvmap.model.fused_prefill as fused_prefill
    from kvmap import LLM, SamplingParams
    from kvmap.bench.probes import _prompt_ids
    from kvmap.evals import EvalOptions, get_task
    fused_prefill.BF16_FLASH = arm == "flash"
    llm = LLM(device="cpu")
    task = get_task("chat_generation", EvalOptions(num_samples=samples))
    run = task.run(llm, task.prepare(llm.tokenizer))
    times = []
    for i in range(repeats):               # distinct text each time: no prefix-cache hit
        ids = _prompt_ids(llm, prefill_tokens, 7 + 11 * i)
        t0 = time.perf_counter()
        llm.generate([ids], SamplingParams(max_tokens=1))
        times.append(time.perf_counter() - t0)
    m = run.metrics
    return {"arm": arm, "dtype": str(llm.engine.dtype).removeprefix("torch."),
            "natural_stop_rate": m["natural_stop_rate"],
            "natural_stop_rate_ci95": m["natural_stop_rate_ci95"],
            "output_tokens_mean": m["output_tokens_mean"], "num_samples": m["num_samples"],
            "finish_reasons": [r["finish_reason"] for r in run.per_sample],
            "prefill_s": times, "prefill_s_median": statistics.median(times),
            "load_average": list(os.getloadavg())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--prefill-tokens", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)   # the child's side
    args = ap.parse_args()
    if args.samples < 1 or args.repeats < 1 or args.prefill_tokens < 1:
        ap.error(f"--samples={args.samples}, --repeats={args.repeats} and "
                 f"--prefill-tokens={args.prefill_tokens} must be >= 1")
    if args.arm:
        print(json.dumps(one_arm(args.arm, args.samples, args.prefill_tokens, args.repeats)))
        return
    sys.path.insert(0, os.path.dirname(__file__))
    from common import write_record
    from kvmap.hardware import detect
    hw = detect()
    rows = {}
    for arm in ARMS:
        out = subprocess.run([sys.executable, __file__, "--arm", arm, "--samples",
                              str(args.samples), "--prefill-tokens", str(args.prefill_tokens),
                              "--repeats", str(args.repeats)],
                             check=True, capture_output=True, text=True).stdout
        rows[arm] = json.loads(out.strip().splitlines()[-1])
    speedup = rows["tiled"]["prefill_s_median"] / rows["flash"]["prefill_s_median"]
    print(f"{'arm':6s} {'prefill s':>9s} {'stopped':>8s} {'95% interval':>14s} {'out tok':>8s}")
    for arm, r in rows.items():
        lo, hi = r["natural_stop_rate_ci95"]
        print(f"{arm:6s} {r['prefill_s_median']:9.2f} {r['natural_stop_rate']:8.0%} "
              f"[{lo:.2f}, {hi:.2f}] {r['output_tokens_mean']:8.1f}")
    print(f"flash prefill: {speedup:.2f}x the tiled form ({args.prefill_tokens} tokens, "
          f"{hw.machine_class}, {rows['tiled']['dtype']})")
    path = write_record("flash_prefill_ab", {
        "samples": args.samples, "prefill_tokens": args.prefill_tokens,
        "repeats": args.repeats, "dtype": rows["tiled"]["dtype"],
        "machine_class": hw.machine_class}, {"arms": rows, "prefill_speedup": speedup})
    print(f"record: {path}")


if __name__ == "__main__":
    main()
