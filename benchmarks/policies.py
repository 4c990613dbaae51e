"""Selection policies on the embedded SmolLM2-135M (bf16 weights, bf16 KV), in one run:

  passkey   the passkey grid (kvmap.evals.passkey: a 5-digit key at a depth of natural
            text) per policy: full, streaming_llm / snapkv (kernel 7 and 11) / h2o / tova /
            knorm / random at a 25% budget, over context lengths x depths
  bytes     resident KV bytes of one 4k-token request (prompt + 64 decoded tokens) at a
            25% budget vs full: the peak over the whole request (the prompt is resident
            until the policy compresses it after prefill) and the peak while decoding
  decode    decode tokens/s at 4,096 tokens of context, streaming_llm(window=1024) vs
            full, at batch 1 and 4: after one prefill per engine, --repeats timed windows
            of 32 decode steps, alternating between the two engines so both see the same
            machine load; the median window

Prints a table per part and writes one JSON record under benchmarks/results/.

    .venv/bin/python benchmarks/policies.py --quick          # 1k/2k x 3 depths
    .venv/bin/python benchmarks/policies.py                  # 1k/2k/4k x 5 depths
    .venv/bin/python benchmarks/policies.py --parts decode   # one part
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402

from kvmap import LLM, SamplingParams  # noqa: E402
from kvmap.evals.passkey import make_cases, run_passkey  # noqa: E402
from kvmap.evals.ppl import track_peak_kv_bytes  # noqa: E402
from kvmap.workloads.corpus import encode_text, take_tokens  # noqa: E402

POLICIES = ["bf16", "streaming_llm(sinks=4,budget=0.25)", "snapkv(budget=0.25)",
            "snapkv(budget=0.25,kernel=11)", "h2o(budget=0.25)", "tova(budget=0.25)", "knorm(budget=0.25)",
            "random(budget=0.25)"]
DECODE_STEPS = 32


def make_llm(kv: str, args) -> LLM:
    # One prefill chunk per prompt (max_num_batched_tokens above the longest prompt): the
    # observation window of SnapKV must lie in the chunk that completes the prompt.
    return LLM(dtype="bf16", kv=kv, kv_memory=args.kv_memory, device="cpu",
               max_num_batched_tokens=args.chunk_tokens, num_threads=args.threads)


# ---- passkey -------------------------------------------------------------------------
def run_passkey_grid(args) -> dict:
    results = {}
    for spec in args.policies:
        llm = make_llm(spec, args)
        def progress(case, output, correct):
            print(f"  {spec:38s} {case.context_tokens:5d} tok  depth {case.depth:.2f} "
                  f"(key at token {case.key_position_tokens:4d} of {case.num_prompt_tokens})"
                  f"  {'hit ' if correct else 'MISS'} {output!r}", flush=True)
        results[spec] = run_passkey(llm, args.contexts, args.depths, args.samples, args.seed,
                                    progress=progress)
        del llm
    print_passkey(results, args)
    return results


def print_passkey(results: dict, args) -> None:
    print("\npasskey accuracy (rows: policy x context tokens; columns: depth)")
    print(f"{'policy':38s} {'ctx':>5s} " + " ".join(f"{d:>5.0%}" for d in args.depths)
          + "   all")
    for spec, res in results.items():
        for n in args.contexts:
            cells = {c["depth"]: c["accuracy"] for c in res["grid"] if c["context_tokens"] == n}
            row = [cells[d] for d in args.depths]
            print(f"{spec:38s} {n:5d} " + " ".join(f"{a:5.0%}" for a in row)
                  + f"  {sum(row) / len(row):4.0%}")
        print(f"{spec:38s}   all accuracy {res['accuracy']:.0%} of {res['n']}, "
              f"{res['wall_s']:.0f} s")


# ---- bytes ---------------------------------------------------------------------------
def resident_bytes(spec: str, prompt: str, args) -> dict:
    """One request stepped through: the peak over the whole request (sampled at every
    block allocation, so a prompt's blocks count before the policy frees some) and the
    peak while decoding (after each decode step)."""
    llm = make_llm(spec, args)
    engine = llm.engine
    req = engine.add_request(llm.encode(prompt), SamplingParams(max_tokens=64, ignore_eos=True))
    decode_peak = 0
    with track_peak_kv_bytes(engine) as peak:
        while engine.has_unfinished():
            engine.step()
            if req.output_token_ids and not req.status.finished:
                decode_peak = max(decode_peak, engine.kv_usage()["resident_bytes"])
    return {"peak_bytes": peak[0], "decode_peak_bytes": decode_peak,
            "num_prompt_tokens": req.num_prompt_tokens,
            "budget_tokens": None if engine.policy is None
            else engine.policy.budget_tokens(req.num_prompt_tokens)}


def run_bytes(args, tokenizer) -> dict:
    prompt = make_cases(tokenizer, [4096], [0.5], 1, args.seed)[0].prompt
    specs = ["bf16", "snapkv(budget=0.25)", "streaming_llm(sinks=4,budget=0.25)"]
    out = {spec: resident_bytes(spec, prompt, args) for spec in specs}
    full = out["bf16"]
    print("\nresident KV bytes, one 4k-token request + 64 decoded tokens")
    print(f"{'kv':38s} {'peak MiB':>9s} {'% full':>7s} {'decode peak MiB':>16s} {'% full':>7s}")
    for spec, r in out.items():
        r["peak_fraction_of_full"] = r["peak_bytes"] / full["peak_bytes"]
        r["decode_peak_fraction_of_full"] = r["decode_peak_bytes"] / full["decode_peak_bytes"]
        print(f"{spec:38s} {r['peak_bytes'] / 2**20:9.1f} {r['peak_fraction_of_full']:7.1%} "
              f"{r['decode_peak_bytes'] / 2**20:16.1f} {r['decode_peak_fraction_of_full']:7.1%}")
    return out


# ---- decode --------------------------------------------------------------------------
class DecodeRun:
    """One engine holding ``batch`` requests of ``context`` prompt tokens, prefilled."""

    def __init__(self, spec: str, prompts: list[list[int]], args):
        self.llm = make_llm(spec, args)
        self.engine = self.llm.engine
        self.reqs = [self.engine.add_request(p, SamplingParams(max_tokens=10_000,
                                                               ignore_eos=True))
                     for p in prompts]
        while not all(r.output_token_ids for r in self.reqs):
            self.engine.step()
        for _ in range(4):                # warm up: steady decode steps only
            self.engine.step()

    def window_tokens_per_s(self, num_steps: int) -> float:
        before = sum(len(r.output_token_ids) for r in self.reqs)
        t0 = time.perf_counter()
        for _ in range(num_steps):
            self.engine.step()
        dt = time.perf_counter() - t0
        return (sum(len(r.output_token_ids) for r in self.reqs) - before) / dt

    def close(self) -> None:
        for r in self.reqs:
            self.engine.abort(r.request_id)


def run_decode(args, tokenizer) -> dict:
    specs = {"full": "bf16", "streaming_llm": "streaming_llm(sinks=4,window=1024)"}
    out = {}
    for batch in args.batches:
        prompts = [encode_text(tokenizer, take_tokens(tokenizer, args.decode_context,
                                                      start_paragraph=97 * i))
                   for i in range(batch)]
        runs = {name: DecodeRun(spec, prompts, args) for name, spec in specs.items()}
        windows = {name: [] for name in specs}
        for _ in range(args.repeats):
            for name, run in runs.items():
                windows[name].append(run.window_tokens_per_s(DECODE_STEPS))
        slots = {name: [r.num_kv_slots for r in run.reqs] for name, run in runs.items()}
        for run in runs.values():
            run.close()
        med = {name: statistics.median(w) for name, w in windows.items()}
        out[f"batch{batch}"] = {"tokens_per_s": med, "windows_tokens_per_s": windows,
                                "kv_slots_per_request": slots,
                                "speedup": med["streaming_llm"] / med["full"]}
        del runs
    print(f"\ndecode tokens/s at {args.decode_context} tokens of context "
          f"(median of {args.repeats} windows of {DECODE_STEPS} steps)")
    print(f"{'batch':>5s} {'full':>8s} {'streaming_llm(window=1024)':>27s} {'speedup':>8s}")
    for key, r in out.items():
        t = r["tokens_per_s"]
        print(f"{key[5:]:>5s} {t['full']:8.1f} {t['streaming_llm']:27.1f} "
              f"{r['speedup']:7.2f}x")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1k/2k x 3 depths")
    ap.add_argument("--parts", nargs="+", default=["passkey", "bytes", "decode"],
                    choices=["passkey", "bytes", "decode"])
    ap.add_argument("--policies", nargs="+", default=POLICIES)
    ap.add_argument("--contexts", type=int, nargs="+", default=None)
    ap.add_argument("--depths", type=float, nargs="+", default=None)
    ap.add_argument("--samples", type=int, default=1, help="prompts per grid cell")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--decode-context", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kv-memory", default="1GiB")
    ap.add_argument("--chunk-tokens", type=int, default=4352)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    args.contexts = args.contexts or ([1024, 2048] if args.quick else [1024, 2048, 4096])
    args.depths = args.depths or ([0.1, 0.5, 0.9] if args.quick
                                  else [0.1, 0.3, 0.5, 0.7, 0.9])
    metrics, t0 = {}, time.perf_counter()
    if "passkey" in args.parts:
        metrics["passkey"] = run_passkey_grid(args)
    if "bytes" in args.parts or "decode" in args.parts:
        tokenizer = make_llm("bf16", args).tokenizer
    if "bytes" in args.parts:
        metrics["resident_bytes"] = run_bytes(args, tokenizer)
    if "decode" in args.parts:
        metrics["decode"] = run_decode(args, tokenizer)
    metrics["wall_s"] = time.perf_counter() - t0
    path = write_record("policies", vars(args), metrics)
    print(f"\nrecord: {path}")


if __name__ == "__main__":
    main()
