"""Selection policies on the embedded SmolLM2-135M (bf16 weights, bf16 KV), in one run:

  passkey   the passkey grid (kvmap.evals.passkey: a 5-digit key at a depth of natural
            text) per policy: full, streaming_llm / snapkv (kernel 11 and 7, final-only
            and chunked) / h2o / tova / knorm / random at a 25% budget, over context
            lengths x depths
  bytes     resident KV bytes of one 4k-token request (prompt + 64 decoded tokens) at a
            25% budget vs full, at prefill chunks of 128 and 512 tokens: the peak over the
            whole request (a chunked policy compresses after every chunk, so its peak is
            the budget plus one chunk; a final-only one holds the whole prompt first) and
            the peak while decoding
  breakdown where a decode step goes (ms per step by function), full vs streaming_llm
  decode    decode tokens/s at 4,096 tokens of context, streaming_llm(window=1024) vs
            full, at batch 1 and 4: after one prefill per engine, --repeats timed windows
            of 32 decode steps, alternating between the two engines so both see the same
            machine load; the median window

Prints a table per part and writes one JSON record under benchmarks/results/.

    .venv/bin/python benchmarks/policies.py --quick          # 1k/2k x 3 depths
    .venv/bin/python benchmarks/policies.py                  # 1k/2k/4k x 5 depths
    .venv/bin/python benchmarks/policies.py --parts decode   # one part
    .venv/bin/python benchmarks/policies.py --parts breakdown  # where a decode step goes
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
from kvmap.evals.kv_peak import track_peak_kv_bytes  # noqa: E402
from kvmap.workloads.corpus import encode_text, take_tokens  # noqa: E402

POLICIES = ["bf16", "streaming_llm(sinks=4,budget=0.25)", "snapkv(budget=0.25)",
            "snapkv(budget=0.25,kernel=7)", "snapkv(budget=0.25,chunked=true)",
            "h2o(budget=0.25)", "tova(budget=0.25)", "tova(budget=0.25,chunked=true)",
            "knorm(budget=0.25)", "random(budget=0.25)"]
DECODE_STEPS = 32


def make_llm(kv: str, args) -> LLM:
    # --chunk-tokens is the prefill chunk (max_num_batched_tokens). The default, above the
    # longest prompt, prefills each prompt in one chunk, so a chunked policy compresses
    # once, like a final-only one; pass e.g. 256 to compare the chunked forms.
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
BYTES_SPECS = ["bf16", "snapkv(budget=0.25)", "snapkv(budget=0.25,chunked=true)",
               "streaming_llm(sinks=4,budget=0.25)", "h2o(budget=0.25)",
               "tova(budget=0.25,chunked=true)"]


def resident_bytes(spec: str, prompt: str, chunk_tokens: int, args) -> dict:
    """One request stepped through with prefill chunks of ``chunk_tokens``: the peak over
    the whole request (sampled at every block allocation, so a chunk's blocks count
    before the policy frees some), the peak while decoding (after each decode step),
    and the prefill's wall time (the price of small chunks)."""
    llm = LLM(dtype="bf16", kv=spec, kv_memory=args.kv_memory, device="cpu",
              max_num_batched_tokens=chunk_tokens, num_threads=args.threads)
    engine = llm.engine
    req = engine.add_request(llm.encode(prompt), SamplingParams(max_tokens=64, ignore_eos=True))
    decode_peak, t0, prefill_s = 0, time.perf_counter(), None
    with track_peak_kv_bytes(engine) as peak:
        while engine.has_unfinished():
            engine.step()
            if req.output_token_ids and prefill_s is None:
                prefill_s = time.perf_counter() - t0
            if req.output_token_ids and not req.status.finished:
                decode_peak = max(decode_peak, engine.kv_usage()["resident_bytes"])
    return {"spec": spec, "chunk_tokens": chunk_tokens, "peak_bytes": peak[0],
            "decode_peak_bytes": decode_peak, "prefill_s": prefill_s,
            "num_prompt_tokens": req.num_prompt_tokens,
            "num_compressions": engine.kv_usage().get("num_compressions", 0),
            "budget_tokens": None if engine.policy is None
            else engine.policy.budget_tokens(req.num_prompt_tokens)}


def run_bytes(args, tokenizer) -> dict:
    """Every spec at every chunk size; the full cache once, at the largest chunk (its peak
    is the whole request whatever the chunking)."""
    prompt = make_cases(tokenizer, [4096], [0.5], 1, args.seed)[0].prompt
    full = resident_bytes("bf16", prompt, max(args.bytes_chunks), args)
    rows = [full] + [resident_bytes(spec, prompt, c, args)
                     for c in args.bytes_chunks for spec in args.bytes_specs if spec != "bf16"]
    print("\nresident KV bytes, one 4k-token request + 64 decoded tokens")
    print(f"{'kv':38s} {'chunk':>5s} {'peak MiB':>9s} {'% full':>7s} "
          f"{'decode peak MiB':>16s} {'% full':>7s} {'prefill s':>9s}")
    for r in rows:
        r["peak_fraction_of_full"] = r["peak_bytes"] / full["peak_bytes"]
        r["decode_peak_fraction_of_full"] = r["decode_peak_bytes"] / full["decode_peak_bytes"]
        print(f"{r['spec']:38s} {r['chunk_tokens']:5d} {r['peak_bytes'] / 2**20:9.1f} "
              f"{r['peak_fraction_of_full']:7.1%} {r['decode_peak_bytes'] / 2**20:16.1f} "
              f"{r['decode_peak_fraction_of_full']:7.1%} {r['prefill_s']:9.1f}")
    return {"rows": rows}


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


# ---- breakdown -----------------------------------------------------------------------
def run_breakdown(args, tokenizer) -> dict:
    """Where a decode step's time goes, full vs streaming_llm(window=1024), batch 1 at
    ``--decode-context``: the functions of one step are wrapped with timers for
    ``--repeats`` windows of 32 steps (alternating engines). ``attention`` is
    paged_attention (its codec reads included), ``other forward`` the rest of the model
    (matmuls, norms, rotary), ``policy`` the compression after a step (amortized)."""
    import kvmap.engine.engine as engine_mod
    import kvmap.model.llama as llama_mod
    from kvmap.engine.policy_runner import PolicyRunner
    from kvmap.engine.runner import ModelRunner
    from kvmap.engine.scheduler import Scheduler
    from kvmap.model.llama import LlamaModel

    totals: dict[str, float] = {}
    current = {"name": None}

    def timed(key, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                name = current["name"]
                if name is not None:
                    totals[(name, key)] = totals.get((name, key), 0.0) + time.perf_counter() - t0
        return wrapper

    patches = [(llama_mod, "paged_attention"), (LlamaModel, "forward"), (LlamaModel, "logits"),
               (ModelRunner, "build"), (PolicyRunner, "after_step"), (Scheduler, "schedule"),
               (engine_mod, "sample")]
    saved = [(obj, attr, getattr(obj, attr)) for obj, attr in patches]
    for obj, attr, fn in saved:
        setattr(obj, attr, timed(attr, fn))
    specs = {"full": "bf16", "streaming_llm": "streaming_llm(sinks=4,window=1024)"}
    prompt = encode_text(tokenizer, take_tokens(tokenizer, args.decode_context))
    try:
        runs = {name: DecodeRun(spec, [prompt], args) for name, spec in specs.items()}
        steps = {name: 0 for name in specs}
        for _ in range(args.repeats):
            for name, run in runs.items():
                current["name"] = name
                t0 = time.perf_counter()
                run.window_tokens_per_s(DECODE_STEPS)
                totals[(name, "step")] = totals.get((name, "step"), 0.0) + \
                    time.perf_counter() - t0
                current["name"] = None
                steps[name] += DECODE_STEPS
        for run in runs.values():
            run.close()
    finally:
        for obj, attr, fn in saved:
            setattr(obj, attr, fn)
    out = {}
    for name in specs:
        ms = {key: 1000 * v / steps[name] for (n, key), v in totals.items() if n == name}
        ms["other forward"] = ms["forward"] - ms["paged_attention"]
        ms["engine overhead"] = ms["step"] - ms["forward"] - ms.get("logits", 0) - \
            ms.get("build", 0) - ms.get("after_step", 0) - ms.get("schedule", 0) - \
            ms.get("sample", 0)
        out[name] = ms
    rows = ["step", "forward", "paged_attention", "other forward", "logits", "build",
            "after_step", "schedule", "sample", "engine overhead"]
    print(f"\ndecode step breakdown, batch 1, {args.decode_context} tokens of context "
          f"(ms per step, {args.repeats} x {DECODE_STEPS} steps)")
    print(f"{'part':18s} {'full':>8s} {'streaming_llm':>14s}")
    for r in rows:
        print(f"{r:18s} {out['full'].get(r, 0):8.2f} {out['streaming_llm'].get(r, 0):14.2f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1k/2k x 3 depths")
    ap.add_argument("--parts", nargs="+", default=["passkey", "bytes", "decode"],
                    choices=["passkey", "bytes", "decode", "breakdown"])
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
    ap.add_argument("--bytes-specs", nargs="+", default=BYTES_SPECS)
    ap.add_argument("--bytes-chunks", type=int, nargs="+", default=[128, 512],
                    help="prefill chunk sizes (max_num_batched_tokens) of the bytes part")
    args = ap.parse_args()
    args.contexts = args.contexts or ([1024, 2048] if args.quick else [1024, 2048, 4096])
    args.depths = args.depths or ([0.1, 0.5, 0.9] if args.quick
                                  else [0.1, 0.3, 0.5, 0.7, 0.9])
    metrics, t0 = {}, time.perf_counter()
    if "passkey" in args.parts:
        metrics["passkey"] = run_passkey_grid(args)
    if {"bytes", "decode", "breakdown"} & set(args.parts):
        tokenizer = make_llm("bf16", args).tokenizer
    if "bytes" in args.parts:
        metrics["resident_bytes"] = run_bytes(args, tokenizer)
    if "decode" in args.parts:
        metrics["decode"] = run_decode(args, tokenizer)
    if "breakdown" in args.parts:
        metrics["breakdown"] = run_breakdown(args, tokenizer)
    metrics["wall_s"] = time.perf_counter() - t0
    path = write_record("policies", vars(args), metrics)
    print(f"\nrecord: {path}")


if __name__ == "__main__":
    main()
