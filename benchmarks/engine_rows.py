"""Two rows of ``engine_vs_hf.py`` about kvmap's own settings, measured in the same run:

- KV codecs at batch-1 decode: the decode rate with each quantized cache (``--kv-codecs``,
  default int8,int4) against the compute dtype's own cache, rounds alternating over the
  caches (the first a warm-up), and the operators one decode step launches with each
  (``kvmap.bench.probes.decode_ops``: the checklist's count), each as a ratio to the
  baseline cache's. Targets: decode >= 0.95x the baseline, operators <= 1.2x.
- The step budget (``max_num_batched_tokens``): the 2,000-token prefill at each budget
  of ``BUDGETS`` (TTFT rate, one chunk of up to the budget per step), and what the budget
  costs a sequence already decoding: its largest gap between two tokens while the long
  prompt is prefilled beside it (one request decoding, the long prompt arriving after
  its first token) -- the TBT price of a larger chunk.

Run alone (``engine_vs_hf.py`` runs both beside the peers), kvmap only, at the
profile's ``auto`` dtype, writing the record ``engine_rows-*.json``:

    .venv/bin/python benchmarks/engine_rows.py [--repeats 1] [--kv-codecs int8,int4]
        [--decode-tokens 64] [--no-budgets] [--threads 2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

from kvmap import LLM, SamplingParams
from kvmap.bench.probes import decode_ops

BUDGETS = (512, 2048)
KV_DECODE_TARGET = 0.95
KV_OPS_TARGET = 1.2


def _decode_rate(llm, prompt, num_tokens: int) -> float:
    m = llm.generate([prompt], SamplingParams(max_tokens=num_tokens + 1,
                                              ignore_eos=True))[0].metrics
    return (m.num_output_tokens - 1) / (m.token_times_s[-1] - m.token_times_s[0])


def kv_codec_rows(engine_args: dict, dtype: str, codecs: list[str], prompt,
                  num_tokens: int, repeats: int) -> dict:
    """Batch-1 decode and operators per step for each KV codec and the baseline cache."""
    base_args = {**engine_args, "kv_memory": "64MiB"}
    llms = {dtype: LLM(**{**base_args, "kv": dtype})}
    for c in codecs:
        llms[c] = LLM(**{**base_args, "kv": c})
    rates = {c: [] for c in llms}
    for _ in range(repeats + 1):
        for c, llm in llms.items():
            rates[c].append(_decode_rate(llm, prompt, num_tokens))
    ops = {c: decode_ops(llm)["num_ops_per_step"] for c, llm in llms.items()}
    base_rate, base_ops = statistics.median(rates[dtype][1:]), ops[dtype]
    print(f"\nbatch-1 decode by KV cache (weights dense {dtype}; baseline cache {dtype})")
    print(f"{'kv':6s} {'tok/s':>8s} {'vs base':>8s} {'ops/step':>9s} {'vs base':>8s}")
    out = {}
    for c in llms:
        rate = statistics.median(rates[c][1:])
        row = {"tokens_per_s": rate, "ratio_to_baseline": rate / base_rate,
               "ops_per_step": ops[c], "ops_ratio_to_baseline": ops[c] / base_ops,
               "target_ratio": KV_DECODE_TARGET, "target_ops_ratio": KV_OPS_TARGET}
        row["met"] = row["ratio_to_baseline"] >= KV_DECODE_TARGET
        row["met_ops"] = row["ops_ratio_to_baseline"] <= KV_OPS_TARGET
        out[c] = row
        print(f"{c:6s} {rate:8.1f} {row['ratio_to_baseline']:7.2f}x {ops[c]:9.0f} "
              f"{row['ops_ratio_to_baseline']:7.2f}x")
    return out


def _largest_gap_s(llm, short_prompt, long_prompt) -> float:
    """The decoding request's largest inter-token gap while the long prompt prefills."""
    engine = llm.engine
    params = SamplingParams(max_tokens=64, ignore_eos=True)
    short = engine.add_request(short_prompt, params)
    while len(short.metrics.token_times_s) < 2:
        engine.step()
    long = engine.add_request(long_prompt, SamplingParams(max_tokens=1, ignore_eos=True))
    while not long.status.finished:
        engine.step()
    engine.step()                                 # the token after the last chunk
    times = short.metrics.token_times_s
    if not short.status.finished:
        engine.abort(short.request_id)
    for r in (short, long):
        engine.pop_finished(r.request_id)
    return max(b - a for a, b in zip(times[1:], times[2:]))


def budget_rows(engine_args: dict, long_prompt, short_prompt, repeats: int) -> dict:
    """Prefill rate and the decoding neighbour's worst gap at each step budget."""
    out = {}
    print(f"\nstep budget (max_num_batched_tokens): {len(long_prompt)}-token prefill and "
          "a decoding neighbour's largest inter-token gap")
    print(f"{'budget':>7s} {'prefill tok/s':>14s} {'worst TBT ms':>13s}")
    for budget in BUDGETS:
        llm = LLM(**{**engine_args, "max_num_batched_tokens": budget})
        ttft, gaps = [], []
        for i in range(repeats + 1):
            m = llm.generate([long_prompt], SamplingParams(max_tokens=1,
                                                           ignore_eos=True))[0].metrics
            gap = _largest_gap_s(llm, short_prompt, long_prompt)
            if i:                                 # the first round is a warm-up
                ttft.append(m.ttft_s)
                gaps.append(gap)
        rate = len(long_prompt) / statistics.median(ttft)
        worst = statistics.median(gaps)
        out[str(budget)] = {"prefill_tokens_per_s": rate, "worst_tbt_s": worst}
        print(f"{budget:7d} {rate:14.1f} {worst * 1e3:13.1f}")
        del llm
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--kv-codecs", default="int8,int4")
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--prefill-tokens", type=int, default=2000)
    ap.add_argument("--no-budgets", action="store_true")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    import torch
    sys.path.insert(0, os.path.dirname(__file__))
    from common import write_record
    from engine_vs_hf import prompts_of
    from kvmap.hardware import detect
    torch.set_num_threads(args.threads)
    hw = detect()
    dtype = hw.auto_dtype("cpu")
    engine_args = dict(dtype=dtype, kv=dtype, enable_prefix_caching=False,
                       max_num_batched_tokens=2048, max_num_seqs=64)
    codecs = [c for c in args.kv_codecs.split(",") if c]
    tok = LLM(**engine_args, kv_memory="64MiB").tokenizer
    short_prompt = prompts_of(tok, 1, 16)[0]
    metrics = {"kv_codecs_decode_batch1": kv_codec_rows(
        engine_args, dtype, codecs, short_prompt, args.decode_tokens, args.repeats)}
    if not args.no_budgets:
        long_prompt = prompts_of(tok, 1, args.prefill_tokens)[0]
        metrics["step_budget_prefill"] = budget_rows(
            {**engine_args, "kv_memory": "512MiB"}, long_prompt, short_prompt, args.repeats)
    path = write_record("engine_rows", {
        "repeats": args.repeats, "kv_codecs": codecs, "decode_tokens": args.decode_tokens,
        "prefill_tokens": args.prefill_tokens, "budgets": list(BUDGETS), "dtype": dtype,
        "threads": args.threads,
        "machine_class": hw.machine_class}, metrics)
    print(f"record: {path}")


if __name__ == "__main__":
    main()
