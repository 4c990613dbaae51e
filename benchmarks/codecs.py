"""KV codecs side by side on the embedded model, and against HF transformers'
QuantizedCache, in one run.

1. Bytes per token of each codec: what the pool really allocates (data + scales + zero
   points, from ``PagedKVCache.bytes_per_block``) against the bare payload
   (values x bits / 8).
2. Decode tokens/s at --context tokens of context, batch --batch, each codec against
   bf16 *side by side*: a bf16 engine stays prefilled for the whole run, each codec's
   engine is prefilled next to it, and --repeats windows of --steps decode steps
   alternate between the two (bf16, codec, bf16, codec, ...); the ratio is of the
   medians. A codec that folds its scales into attention (``quant_attention``) is also
   timed with the fold off (dequantize, then attend) in the same alternation: the
   "dequant" rows. The machine is shared; alternating keeps load changes out of ratios.
3. Decode tokens/s at batch 4 and 2,048 tokens of context: our bf16 and fp8 against
   transformers' plain DynamicCache and its fp8 QuantizedCache, same weights (dense bf16).

    .venv/bin/python benchmarks/codecs.py [--quick] [--threads 1] [--codecs bf16,int8]
        [--skip-hf]

``--quality`` runs instead teacher-forced scoring (``Engine.score``, as the ``ppl`` eval)
of --samples texts of --context + 128 tokens through bf16, an fp32 model with an fp32
cache (the precision floor), and --codecs (int8 both with and without the fold), and
reports perplexity change, mean KL, top-1 agreement, and the top-1 agreement once the
bf16 baseline's exact ties are accounted for: bf16 logits are coarse (one ulp is 0.125
at 16-32), so the baseline's two best tokens are exactly tied at a few percent of the
positions, and any perturbation flips an argmax there.
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
BF16_BYTES_PER_TOKEN = 23040      # the embedded model: 30 layers x 2 x 3 heads x 64 x 2


class Decoding:
    """``prompts`` prefilled in ``llm``'s engine and kept decoding; ``window(steps)``
    times ``steps`` engine steps and returns output tokens/s."""

    def __init__(self, llm, prompts: list[list[int]], max_steps: int):
        self.engine = engine = llm.engine
        self.batch = len(prompts)
        self.reqs = [engine.add_request(p, SamplingParams(max_tokens=max_steps + 2,
                                                          ignore_eos=True)) for p in prompts]
        t0 = time.perf_counter()
        while any(r.num_computed_tokens < r.num_prompt_tokens for r in self.reqs):
            engine.step()
        engine.step()
        self.prefill_s = time.perf_counter() - t0

    def window(self, steps: int, fused: bool = True) -> float:
        self.engine.runner.fused_reads = fused
        try:
            t0 = time.perf_counter()
            for _ in range(steps):
                self.engine.step()
            return self.batch * steps / (time.perf_counter() - t0)
        finally:
            self.engine.runner.fused_reads = True

    def close(self) -> None:
        for r in self.reqs:
            self.engine.abort(r.request_id)
            self.engine.pop_finished(r.request_id)


def offers_fused(llm) -> bool:
    kv = llm.engine.kv
    return kv.codec.read_scaled(kv.layers[0], torch.zeros(1, dtype=torch.long)) is not None


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
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--codecs", default=",".join(CODECS[1:]),
                    help="comma-separated specs timed against bf16 (top-level commas only)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--quality", action="store_true")
    ap.add_argument("--samples", type=int, default=6, help="--quality: texts")
    args = ap.parse_args()
    if args.quality:
        torch.set_num_threads(args.threads)
        if args.quick:
            args.context, args.samples = 256, 1
        return quality(args)
    if args.quick:
        args.context, args.batch, args.steps, args.repeats = 512, 2, 4, 3
    torch.set_num_threads(args.threads)
    specs = _split_specs(args.codecs)
    per_codec_steps = args.steps * args.repeats * 2        # codec windows (fused + dequant)
    bf16_steps = per_codec_steps * len(specs)
    kv_memory = int(args.batch * (args.context + bf16_steps + 64) * BF16_BYTES_PER_TOKEN * 1.1)
    metrics: dict = {"bytes_per_token": {}, "decode_tokens_per_s": {}, "vs_bf16": {},
                     "prefill_s": {}}

    base_llm = LLM(kv="bf16", kv_memory=kv_memory, enable_prefix_caching=False,
                   max_num_batched_tokens=2048, max_num_seqs=args.batch)
    tokenizer = base_llm.tokenizer
    prompts = prompts_of(tokenizer, args.batch, args.context)
    base = Decoding(base_llm, prompts, bf16_steps)
    metrics["prefill_s"]["bf16"] = base.prefill_s
    geom = base_llm.engine.geom
    print(f"decode at batch {args.batch}, {args.context} tokens of context; {args.repeats} "
          f"alternating windows of {args.steps} steps, medians "
          f"(load average {environment()['load_average']})")
    print(f"{'codec':16s} {'B/token':>8s} {'payload':>8s} {'overhead':>8s} "
          f"{'tok/s':>8s} {'bf16 tok/s':>10s} {'vs bf16':>7s}")
    bf16_per_token = base_llm.engine.kv.bytes_per_block / base_llm.engine.kv.block_size
    metrics["bytes_per_token"]["bf16"] = {"measured": bf16_per_token,
                                          "payload": geom.values_per_token * 2}
    for spec in specs:
        llm = LLM(kv=spec, kv_memory=kv_memory, enable_prefix_caching=False,
                  max_num_batched_tokens=2048, max_num_seqs=args.batch)
        per_token = llm.engine.kv.bytes_per_block / llm.engine.kv.block_size
        payload = geom.values_per_token * BITS.get(spec, 8) / 8
        metrics["bytes_per_token"][spec] = {"measured": per_token, "payload": payload}
        run = Decoding(llm, prompts, per_codec_steps)
        metrics["prefill_s"][spec] = run.prefill_s
        paths = [True, False] if offers_fused(llm) else [True]
        rates = {p: [] for p in paths}
        base_rates = []
        for _ in range(args.repeats):
            for fused in paths:
                base_rates.append(base.window(args.steps))
                rates[fused].append(run.window(args.steps, fused))
        run.close()
        del llm, run
        b = statistics.median(base_rates)
        for fused in paths:
            name = spec if fused else f"{spec} dequant"
            r = statistics.median(rates[fused])
            metrics["decode_tokens_per_s"][name] = r
            metrics["vs_bf16"][name] = {"bf16": b, "ratio": r / b}
            print(f"{name:16s} {per_token:8.0f} {payload:8.0f} {per_token / payload - 1:7.1%} "
                  f"{r:8.1f} {b:10.1f} {r / b:6.2f}x")
    base.close()
    del base_llm, base
    if args.skip_hf:
        path = write_record("codecs", vars(args), metrics)
        print(f"record: {path}")
        return

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
        llm = LLM(kv=spec, enable_prefix_caching=False, max_num_batched_tokens=2048,
                  max_num_seqs=b, kv_memory=int(
                      b * (ctx + args.steps * args.repeats + 64) * BF16_BYTES_PER_TOKEN * 1.1))
        run = Decoding(llm, small, args.steps * args.repeats)
        ours[f"kvmap {spec}"] = statistics.median(run.window(args.steps)
                                                  for _ in range(args.repeats))
        run.close()
        del llm, run
    print(f"\ndecode tokens/s at batch {b}, {ctx} tokens of context "
          f"(load average {environment()['load_average']})")
    for name, rate in {**hf_rates, **ours}.items():
        print(f"  {name:34s} {rate:8.1f}")
    ratio = ours["kvmap fp8"] / hf_rates["transformers QuantizedCache(fp8)"]
    print(f"kvmap fp8 / transformers fp8 QuantizedCache: {ratio:.2f}x (target >= 5x)")
    if "int8" in metrics["vs_bf16"]:
        print(f"kvmap int8 / kvmap bf16 at batch {args.batch}, {args.context} context: "
              f"{metrics['vs_bf16']['int8']['ratio']:.2f}x (target >= 1.0x)")
    metrics["hf_comparison"] = {"batch": b, "context": ctx, **hf_rates, **ours,
                                "fp8_ratio": ratio}
    path = write_record("codecs", vars(args), metrics)
    print(f"record: {path}")


def quality(args) -> None:
    from kvmap.evals.ppl import build_samples, kl_divergence, log_probs, token_nll
    specs = [("bf16", "bf16", True), ("fp32", "fp32", True)]
    for spec in _split_specs(args.codecs):
        specs.append(("bf16", spec, True))
        if spec.split("(")[0] in ("int8", "int4", "int2", "fp8"):
            specs.append(("bf16", spec, False))
    runs = {}
    for dtype, spec, fused in specs:
        name = spec if fused else f"{spec} dequant"
        name = "fp32 model+cache" if dtype == "fp32" else name
        llm = LLM(dtype=dtype, kv=spec, max_num_batched_tokens=512)
        samples = build_samples(llm.tokenizer, args.samples, args.context, 128, seed=0)
        llm.engine.runner.fused_reads = fused
        logp = torch.cat([log_probs(llm.engine.score(ids, num_context_tokens=args.context))
                          for ids in samples])
        targets = [t for ids in samples for t in ids[args.context:]]
        runs[name] = (logp, token_nll(logp, targets))
        del llm
    ref, ref_nll = runs["bf16"]
    top2 = ref.topk(2, dim=-1)
    tied = (top2.values[:, 0] - top2.values[:, 1]) == 0
    print(f"{args.samples} texts x 128 scored tokens after {args.context} of context; bf16 "
          f"baseline: {int(tied.sum())} of {len(tied)} positions have an exact top-1 tie")
    print(f"{'KV':24s} {'ppl':>8s} {'change':>8s} {'KL mean':>8s} {'top-1':>7s} "
          f"{'top-1 (ties: any max)':>22s}")
    metrics = {"ties": int(tied.sum()), "positions": len(tied)}
    for name, (logp, nll) in runs.items():
        arg = logp.argmax(-1)
        agree = float((arg == ref.argmax(-1)).float().mean())      # as the ppl eval
        tie_aware = float((ref.gather(1, arg[:, None]).squeeze(1) == top2.values[:, 0])
                          .float().mean())
        change = 100 * (float(nll.mean().exp()) / float(ref_nll.mean().exp()) - 1)
        kl = float(kl_divergence(ref, logp).mean())
        metrics[name] = {"ppl": float(nll.mean().exp()), "ppl_change_pct": change,
                         "kl_mean": kl, "top1": agree, "top1_tie_aware": tie_aware}
        print(f"{name:24s} {float(nll.mean().exp()):8.3f} {change:+7.2f}% {kl:8.4f} "
              f"{agree:7.2%} {tie_aware:22.2%}")
    path = write_record("codecs_quality", vars(args), metrics)
    print(f"record: {path}")


def _split_specs(text: str) -> list[str]:
    """'int8,kivi(bits=2,group_size=32)' -> ['int8', 'kivi(bits=2,group_size=32)']."""
    specs, depth, cur = [], 0, ""
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            specs.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [x for x in specs + [cur.strip()] if x]


if __name__ == "__main__":
    main()
