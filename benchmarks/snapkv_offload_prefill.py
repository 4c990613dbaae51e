"""Query-aware selection with a small peak (issue 17, point 2): SnapKV prefilled through
the host tier against end-of-prefill and per-chunk SnapKV and the full cache
(SmolLM2-135M, bf16 weights and KV, passkey at one context length).

Configurations, side by side (each trial runs on every engine in turn, one request at
a time, so all see the same machine load):

  full          bf16 + tiers(host): the whole cache
  snapkv-final  snapkv(budget=B) + tiers(host): scores once the prompt is done; the
                whole prompt is resident until then
  snapkv-chunk  snapkv(budget=B, chunked=true) + tiers(host): scores after every chunk
  snapkv-offload snapkv(budget=B, prefill=offload) + tiers(host): each chunk's pages go
                to the host tier as they are written, the window scores every key at
                the end, only the kept tokens come back (``kvmap.kv.offload.prefill``)

Per configuration: passkey accuracy with its Wilson interval, the paired difference
against snapkv-final (bootstrap interval), peak device KV (the pool's peak blocks,
``track_peak_kv_bytes``) as a fraction of the full cache's, and the prefill time
(TTFT of a lone request: every chunk, the page-outs and the compression) as a ratio to
snapkv-final's, median over trials. Each trial is its own document (distinct seeds),
depths cycle over 0.1 .. 0.9.

    .venv/bin/python benchmarks/snapkv_offload_prefill.py --context 4096 --trials 20 --threads 1
    .venv/bin/python benchmarks/snapkv_offload_prefill.py --context 1024 --trials 3   # quick
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402

from kvmap import LLM, SamplingParams  # noqa: E402
from kvmap.evals.kv_peak import track_peak_kv_bytes  # noqa: E402
from kvmap.evals.passkey import contains_key, make_cases  # noqa: E402
from kvmap.evals.retrieval import ANSWER_TOKENS  # noqa: E402
from kvmap.evals.stats import paired_delta, wilson_interval  # noqa: E402

DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
BASELINE = "snapkv-final"


def configs(budget: float, host: str) -> dict[str, str]:
    tiers = f"tiers(host={host})"
    return {
        "full": f"bf16+{tiers}",
        "snapkv-final": f"snapkv(budget={budget})+bf16+{tiers}",
        "snapkv-chunk": f"snapkv(budget={budget},chunked=true)+bf16+{tiers}",
        "snapkv-offload": f"snapkv(budget={budget},prefill=offload)+bf16+{tiers}",
    }


def run_trial(llm: LLM, prompt: str, key: str) -> dict:
    params = SamplingParams(max_tokens=ANSWER_TOKENS, stop=(".",))
    with track_peak_kv_bytes(llm.engine) as peak:
        out = llm.generate([prompt], params)[0]
    return {"output": out.text, "correct": contains_key(out.text, key),
            "peak_bytes": peak[0], "prefill_s": out.metrics.ttft_s}


def summarize(name: str, rows: list[dict], base_rows: list[dict], full_rows: list[dict]) -> dict:
    correct = [r["correct"] for r in rows]
    k, n = sum(correct), len(correct)
    peak_ratio = [r["peak_bytes"] / f["peak_bytes"] for r, f in zip(rows, full_rows)]
    time_ratio = [r["prefill_s"] / b["prefill_s"] for r, b in zip(rows, base_rows)]
    return {"config": name, "accuracy": k / n, "num_correct": k, "num_trials": n,
            "accuracy_ci95": wilson_interval(k, n),
            "delta_accuracy_vs_final": paired_delta(
                [float(c) for c in correct], [float(b["correct"]) for b in base_rows]),
            "peak_kv_fraction_of_full": max(peak_ratio),
            "peak_kv_bytes": max(r["peak_bytes"] for r in rows),
            "prefill_s_median": statistics.median(r["prefill_s"] for r in rows),
            "prefill_time_ratio_vs_final": statistics.median(time_ratio)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--budget", type=float, default=0.25)
    ap.add_argument("--chunk", type=int, default=512, help="max_num_batched_tokens")
    ap.add_argument("--host", default="1GiB")
    ap.add_argument("--kv-memory", default="256MiB")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    specs = configs(args.budget, args.host)
    llms = {name: LLM(dtype="bf16", kv=kv, kv_memory=args.kv_memory,
                      max_num_batched_tokens=args.chunk, num_threads=args.threads,
                      device="cpu") for name, kv in specs.items()}
    tokenizer = next(iter(llms.values())).tokenizer
    cases = [make_cases(tokenizer, [args.context], [DEPTHS[i % len(DEPTHS)]], 1,
                        args.seed + i)[0] for i in range(args.trials)]
    rows: dict[str, list[dict]] = {name: [] for name in specs}
    for i, case in enumerate(cases):
        for name, llm in llms.items():
            r = run_trial(llm, case.prompt, case.key)
            rows[name].append({"trial": i, "depth": case.depth, "key": case.key,
                               "num_prompt_tokens": case.num_prompt_tokens, **r})
            print(f"trial {i:2d} depth {case.depth:.1f} {name:15s} "
                  f"{'ok ' if r['correct'] else 'MISS'} peak {r['peak_bytes'] / 2**20:6.1f} MiB "
                  f"prefill {r['prefill_s']:6.2f} s  {r['output']!r}", flush=True)
    summary = [summarize(name, rows[name], rows[BASELINE], rows["full"]) for name in specs]
    print(f"\npasskey at {args.context} tokens, budget {args.budget}, {args.trials} trials, "
          f"load average {os.getloadavg()}")
    print(f"{'config':15s} {'accuracy':>9s} {'Wilson 95%':>14s} {'paired vs final':>22s} "
          f"{'peak/full':>9s} {'prefill s':>9s} {'time/final':>10s}")
    for s in summary:
        d = s["delta_accuracy_vs_final"]
        print(f"{s['config']:15s} {s['num_correct']:3d}/{s['num_trials']:<5d} "
              f"[{s['accuracy_ci95'][0]:.2f}, {s['accuracy_ci95'][1]:.2f}] "
              f"{d['mean']:+.2f} [{d['ci_low']:+.2f}, {d['ci_high']:+.2f}]      "
              f"{s['peak_kv_fraction_of_full']:9.3f} {s['prefill_s_median']:9.2f} "
              f"{s['prefill_time_ratio_vs_final']:10.2f}")
    config = {**vars(args), "specs": specs, "model": "SmolLM2-135M-Instruct (embedded)",
              "dtype": "bf16", "depths": DEPTHS}
    path = write_record("snapkv_offload_prefill", config,
                        {"summary": summary, "trials": rows,
                         "load_average_end": os.getloadavg()})
    print(f"record: {path}")


if __name__ == "__main__":
    main()
