"""Two sequences paged at once vs one after the other, on the embedded SmolLM2-135M.

Two distinct prompts of ``--prompt-tokens`` tokens each (random token ids, seeded, so no
prefix is shared) go to an engine whose device pool holds
``--pool-tokens`` tokens, fewer than either prompt, with ``tiers(host=...)`` below it
large enough for both; a fresh engine per run (the tiers need prefix caching, so a reused
engine would serve a later run from its cache; ``prefix_cache_hits`` is recorded). Each request decodes ``--decode-tokens`` greedy tokens.

- ``together``: both submitted at once, so both are paged at the same time;
- ``one by one``: the second submitted when the first has finished.

``--rounds`` rounds, each running both modes (the order alternates, the order of the two
prompts inside ``one by one`` too); medians over rounds of: total wall time, each
request's TTFT and E2E (from its own submission), peak device KV bytes (pool blocks in
use, sampled after every step), bytes paged out (written to the tiers) and in (read back
by attention). ``same_tokens``: every request's tokens are equal across modes and rounds.

    .venv/bin/python benchmarks/multi_sequence_paging.py               # 2,048 / 1,024
    .venv/bin/python benchmarks/multi_sequence_paging.py --quick       # 1,536 / 768
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402

from kvmap import LLM, SamplingParams  # noqa: E402

MODES = ("together", "one by one")


def load_average() -> dict:
    return {"uptime": subprocess.check_output(["uptime"], text=True).strip(),
            "loadavg": list(os.getloadavg())}


def make_prompts(args, vocab_size: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(args.seed)
    return [torch.randint(100, vocab_size - 100, (args.prompt_tokens,), generator=g).tolist()
            for _ in range(2)]


def paging_counters(llm) -> dict:
    p = llm.kv_usage()["tier_store"]["paging"]
    return {k: p[k] for k in ("bytes_written", "bytes_read", "num_pages_out",
                              "num_frames_read", "io_wait_s", "page_out_s",
                              "num_page_faults")}


def drive(llm, prompts: list[list[int]], stagger: bool, decode_tokens: int) -> dict:
    """Run the prompts (all at once, or each when the one before has finished); per
    request TTFT and E2E from its own submission, and the peak pool bytes in use."""
    engine = llm.engine
    params = SamplingParams(max_tokens=decode_tokens, ignore_eos=True)
    before, preempt0 = paging_counters(llm), engine.stats().num_preemptions
    start = time.perf_counter()
    pending = list(enumerate(prompts))
    live, timing, peak, most_paged = {}, {}, 0, 0
    pager = engine.offload.pager

    def submit():
        i, p = pending.pop(0)
        live[i] = engine.add_request(p, params)
        timing[i] = {"submit": time.perf_counter()}

    submit()
    while pending and not stagger:
        submit()
    while live:
        engine.step()
        now, stats = time.perf_counter(), engine.stats()
        peak = max(peak, stats.resident_bytes)
        most_paged = max(most_paged, sum(pager.is_paged(r.request_id) for r in live.values()
                                         if not r.status.finished))
        for i, req in list(live.items()):
            if req.output_token_ids and "first" not in timing[i]:
                timing[i]["first"] = now
            if req.status.finished:
                timing[i]["end"] = now
                timing[i]["preemptions"] = req.metrics.num_preemptions
                timing[i]["tokens"] = engine.pop_finished(req.request_id).token_ids
                del live[i]
        if stagger and not live and pending:
            submit()
    total_s = time.perf_counter() - start
    engine.check_integrity()
    after = paging_counters(llm)
    return {"total_s": total_s, "peak_device_kv_bytes": peak, "max_paged_at_once": most_paged,
            "num_preemptions": engine.stats().num_preemptions - preempt0,
            "prefix_cache_hits": engine.stats().prefix_cache_hits,
            "paging": {k: after[k] - before[k] for k in after},
            "requests": {i: {"ttft_s": t["first"] - t["submit"], "e2e_s": t["end"] - t["submit"],
                             "num_preemptions": t["preemptions"], "token_ids": t["tokens"]} for i, t in sorted(timing.items())}}


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    pool_blocks = args.pool_tokens // 16
    probe = LLM(dtype=args.dtype, kv=args.dtype, num_blocks=8, device="cpu",
                enable_prefix_caching=False)
    c = probe.model_config
    kv_bytes_per_token = (2 * c.num_layers * c.num_kv_heads * c.head_dim
                          * (2 if args.dtype == "bf16" else 4))             # K and V
    vocab = c.vocab_size
    del probe
    # host: both sequences whole, twice over (pages of a finished one are freed anyway)
    total_tokens = 2 * (args.prompt_tokens + args.decode_tokens)
    host_mib = int(2 * total_tokens * kv_bytes_per_token / 2**20) + 16
    spec = (f"{args.dtype}+tiers(host={host_mib}MiB,prefetch={args.prefetch},"
            f"page_blocks={args.page_blocks})")
    prompts = make_prompts(args, vocab)
    print(f"2 prompts x {args.prompt_tokens} tokens, pool {pool_blocks * 16} tokens, "
          f"kv {spec}", flush=True)
    runs = {m: [] for m in MODES}
    for rnd in range(args.rounds):
        order = MODES if rnd % 2 == 0 else MODES[::-1]
        for mode in order:
            ps = prompts if rnd % 2 == 0 else prompts[::-1]
            # a fresh engine per run: the tiers keep blocks by prefix hash (they need
            # prefix caching), so a reused one would serve a later run from its cache
            llm = LLM(dtype=args.dtype, kv=spec, num_blocks=pool_blocks,
                      max_num_batched_tokens=args.chunk_tokens, device="cpu")
            r = drive(llm, ps, stagger=(mode == "one by one"), decode_tokens=args.decode_tokens)
            if rnd % 2:                              # back to prompt order
                r["requests"] = {0: r["requests"][1], 1: r["requests"][0]}
            llm.engine.close()
            runs[mode].append(r)
            print(f"round {rnd} {mode}: {r['total_s']:.1f}s, peak "
                  f"{r['peak_device_kv_bytes'] / 2**20:.1f} MiB, out "
                  f"{r['paging']['bytes_written'] / 2**20:.0f} MiB, in "
                  f"{r['paging']['bytes_read'] / 2**20:.0f} MiB", flush=True)
    ref = [runs[MODES[1]][0]["requests"][i]["token_ids"] for i in (0, 1)]
    same = all([r["requests"][i]["token_ids"] for i in (0, 1)] == ref
               for m in MODES for r in runs[m])
    summary = {"same_tokens": same, "prompt_tokens": args.prompt_tokens,
               "pool_tokens": pool_blocks * 16, "kv": spec,
               "kv_bytes_per_token": kv_bytes_per_token}
    for m in MODES:
        rs, key = runs[m], m.replace(" ", "_")
        med = statistics.median
        summary[key] = {
            "total_s": med(r["total_s"] for r in rs),
            "peak_device_kv_bytes": med(r["peak_device_kv_bytes"] for r in rs),
            "bytes_paged_out": med(r["paging"]["bytes_written"] for r in rs),
            "bytes_paged_in": med(r["paging"]["bytes_read"] for r in rs),
            "io_wait_s": med(r["paging"]["io_wait_s"] for r in rs),
            "num_preemptions": max(r["num_preemptions"] for r in rs),
            "max_paged_at_once": max(r["max_paged_at_once"] for r in rs),
            **{f"req{i}_num_preemptions": max(r["requests"][i]["num_preemptions"] for r in rs)
               for i in (0, 1)},
            "num_page_faults": max(r["paging"]["num_page_faults"] for r in rs),
            "prefix_cache_hits": max(r["prefix_cache_hits"] for r in rs),
            **{f"req{i}_{k}": med(r["requests"][i][k] for r in rs)
               for i in (0, 1) for k in ("ttft_s", "e2e_s")}}
    summary["together_over_one_by_one_total"] = (summary["together"]["total_s"]
                                                 / summary["one_by_one"]["total_s"])
    for r in (r for m in MODES for r in runs[m]):
        for q in r["requests"].values():
            q["token_ids"] = list(q["token_ids"])
    return {"summary": summary, "runs": runs}


def print_table(out: dict, args) -> None:
    s = out["summary"]
    print(f"\nMulti-sequence paging, SmolLM2-135M {args.dtype} on CPU ({args.threads} "
          f"thread(s), shared machine): 2 x {s['prompt_tokens']}-token prompts, pool "
          f"{s['pool_tokens']} tokens, {args.decode_tokens} greedy tokens each, medians of "
          f"{args.rounds} rounds")
    print(f"{'mode':11s} {'total':>7s} {'TTFT 0':>7s} {'TTFT 1':>7s} {'E2E 0':>7s} "
          f"{'E2E 1':>7s} {'peak KV':>9s} {'paged out':>9s} {'paged in':>9s} {'IO wait':>7s} "
          f"{'preempt 0/1':>11s} {'paged at once':>13s}")
    for m in MODES:
        d = s[m.replace(" ", "_")]
        print(f"{m:11s} {d['total_s']:6.1f}s {d['req0_ttft_s']:6.1f}s {d['req1_ttft_s']:6.1f}s "
              f"{d['req0_e2e_s']:6.1f}s {d['req1_e2e_s']:6.1f}s "
              f"{d['peak_device_kv_bytes'] / 2**20:6.1f}MiB "
              f"{d['bytes_paged_out'] / 2**20:6.0f}MiB {d['bytes_paged_in'] / 2**20:6.0f}MiB "
              f"{d['io_wait_s']:6.2f}s "
              f"{str(d['req0_num_preemptions']) + '/' + str(d['req1_num_preemptions']):>11s} "
              f"{d['max_paged_at_once']:13d}")
    print(f"together / one by one, total wall: {s['together_over_one_by_one_total']:.2f}; "
          f"same_tokens: {s['same_tokens']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--pool-tokens", type=int, default=1024)
    ap.add_argument("--decode-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefetch", default="window")
    ap.add_argument("--page-blocks", type=int, default=16)
    ap.add_argument("--chunk-tokens", type=int, default=512)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="1,536-token prompts, 768-token pool, 256-token chunks")
    args = ap.parse_args()
    if args.quick:
        # the pool must hold a page, a prefill chunk and one block more (engine check)
        args.prompt_tokens, args.pool_tokens, args.chunk_tokens = 1536, 768, 256
    load_start = load_average()
    out = run(args)
    out["load_start"], out["load_end"] = load_start, load_average()
    print_table(out, args)
    print(f"load: start {load_start['uptime']}\n      end   {out['load_end']['uptime']}")
    path = write_record("multi_sequence_paging", vars(args), out)
    print(f"\nrecord: {path}")


if __name__ == "__main__":
    main()
