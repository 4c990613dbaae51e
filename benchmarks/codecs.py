"""KV codecs side by side on the embedded model, and against HF transformers'
QuantizedCache, in one run.

1. Bytes per token of each codec: what the pool really allocates (data + scales + zero
   points, from ``PagedKVCache.bytes_per_block``) against the bare payload
   (values x bits / 8).
2. Decode tokens/s at --context tokens of context, batch --batch, for each codec
   (prefill first, then --steps decode steps timed; median of --repeats windows).
3. Decode tokens/s at batch 4 and 2,048 tokens of context: our bf16 and fp8 against
   transformers' plain DynamicCache and its fp8 QuantizedCache, same weights (dense bf16).

    .venv/bin/python benchmarks/codecs.py [--quick] [--threads 2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import environment, write_record  # noqa: E402
from engine_vs_hf import load_hf, prompts_of  # noqa: E402

from kvmap import LLM, SamplingParams  # noqa: E402

CODECS = ["bf16", "int8", "fp8", "int4", "kivi(bits=4)", "kivi(bits=2)", "int2"]
BITS = {"bf16": 16, "int8": 8, "fp8": 8, "int4": 4, "kivi(bits=4)": 4, "kivi(bits=2)": 2,
        "int2": 2}


def decode_rate(llm, prompts: list[list[int]], steps: int, repeats: int) -> float:
    """Output tokens/s of the engine's decode steps once every prompt is prefilled."""
    engine = llm.engine
    reqs = [engine.add_request(p, SamplingParams(max_tokens=steps * repeats + 2,
                                                 ignore_eos=True)) for p in prompts]
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in reqs):
        engine.step()
    engine.step()
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        rates.append(len(prompts) * steps / (time.perf_counter() - t0))
    for r in reqs:
        engine.abort(r.request_id)
        engine.pop_finished(r.request_id)
    return statistics.median(rates)


def hf_decode_rate(model, prompts: list[list[int]], steps: int, cache_factory) -> float:
    """transformers: (generate steps+1 tokens) - (generate 1 token), batch of prompts."""
    ids = torch.tensor(prompts)

    def run(n):
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                           max_new_tokens=n, min_new_tokens=n, pad_token_id=0,
                           past_key_values=cache_factory())
        return time.perf_counter() - t0
    return len(prompts) * steps / (run(steps + 1) - run(1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.context, args.batch, args.steps, args.repeats = 512, 2, 4, 1
    torch.set_num_threads(args.threads)
    kv_memory = int(args.batch * (args.context + 4 * args.steps + 64) * 23040 * 1.1)
    metrics: dict = {"bytes_per_token": {}, "decode_tokens_per_s": {}}

    prompts = None
    print(f"{'codec':14s} {'B/token':>8s} {'payload':>8s} {'overhead':>8s} "
          f"{'decode tok/s':>12s} {'vs bf16':>7s}")
    for spec in CODECS:
        llm = LLM(kv=spec, kv_memory=kv_memory, enable_prefix_caching=False,
                  max_num_batched_tokens=2048, max_num_seqs=args.batch)
        if prompts is None:
            tokenizer = llm.tokenizer
            prompts = prompts_of(tokenizer, args.batch, args.context)
        per_token = llm.engine.kv.bytes_per_block / llm.engine.kv.block_size
        payload = llm.engine.geom.values_per_token * BITS[spec] / 8
        rate = decode_rate(llm, prompts, args.steps, args.repeats)
        metrics["bytes_per_token"][spec] = {"measured": per_token, "payload": payload}
        metrics["decode_tokens_per_s"][spec] = rate
        base = metrics["decode_tokens_per_s"]["bf16"]
        print(f"{spec:14s} {per_token:8.0f} {payload:8.0f} {per_token / payload - 1:7.1%} "
              f"{rate:12.1f} {rate / base:6.2f}x")
        del llm

    # against transformers' quantized cache, at its measured setting
    from transformers import DynamicCache, QuantizedCache
    hf = load_hf()
    b, ctx = (4, 2048) if not args.quick else (2, 256)
    small = prompts_of(tokenizer, b, ctx)
    hf_rates = {
        "transformers DynamicCache": hf_decode_rate(hf, small, args.steps, DynamicCache),
        "transformers QuantizedCache(fp8)": hf_decode_rate(
            hf, small, args.steps, lambda: QuantizedCache(backend="fp8", config=hf.config)),
    }
    ours = {}
    for spec in ("bf16", "fp8", "int8"):
        llm = LLM(kv=spec, kv_memory=int(b * (ctx + 4 * args.steps + 64) * 23040 * 1.1),
                  enable_prefix_caching=False, max_num_batched_tokens=2048, max_num_seqs=b)
        ours[f"kvmap {spec}"] = decode_rate(llm, small, args.steps, args.repeats)
        del llm
    print(f"\ndecode tokens/s at batch {b}, {ctx} tokens of context "
          f"(load average {environment()['load_average']})")
    for name, rate in {**hf_rates, **ours}.items():
        print(f"  {name:34s} {rate:8.1f}")
    ratio = ours["kvmap fp8"] / hf_rates["transformers QuantizedCache(fp8)"]
    print(f"kvmap fp8 / transformers fp8 QuantizedCache: {ratio:.2f}x (target >= 5x); "
          f"kvmap int8 / kvmap bf16 at batch {args.batch}, {args.context} context: "
          f"{metrics['decode_tokens_per_s']['int8'] / metrics['decode_tokens_per_s']['bf16']:.2f}x "
          f"(target >= 1.0x)")
    metrics["hf_comparison"] = {"batch": b, "context": ctx, **hf_rates, **ours,
                                "fp8_ratio": ratio}
    path = write_record("codecs", vars(args), metrics)
    print(f"record: {path}")


if __name__ == "__main__":
    main()
