"""A context larger than the pool, paged through the tiers, on the embedded SmolLM2-135M.

One passkey prompt of ``--context`` tokens (default 6,000; the key at ``--depth`` of the
text, so it lives in the paged-out front) is decoded greedily for ``--decode-tokens``:

- ``unpaged``: a pool that holds everything (the reference);
- ``paged none`` / ``paged window`` (and ``paged attention`` with ``--attention``):
  a pool of ``--pool-fraction`` of the context, ``tiers(host=..., disk=...)`` below it,
  the host level holding about ``--host-fraction`` of the paged-out pages, so the rest
  are read from disk at every layer of every step.

Reported per configuration: greedy tokens equal to ``unpaged`` (and the first position
where they differ), passkey retrieved, prefill time, per-token decode time (median), the
model's IO wait (time attention waited for pages) in prefill and in decode, prefetch
hits / wasted reads, and per tier bytes read, read P50 / P99. The headline: the share
of the disk read time that prefetching hides,

    hidden = 1 - io_wait(window) / io_wait(none)      (decode steps)

next to the disk tier's P99 frame read latency and the per-token decode time. Disk reads
go through the OS page cache (files written seconds earlier), so "disk" latencies here
are the kernel's, not a device's.

    .venv/bin/python benchmarks/long_context.py                  # 6,000 tokens, bf16
    .venv/bin/python benchmarks/long_context.py --quick          # 2,000 tokens
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402

from kvmap import LLM, SamplingParams  # noqa: E402
from kvmap.evals.passkey import contains_key, make_cases  # noqa: E402


def tier_spec(args, num_tokens: int, disk_dir: str, prefetch: str, config) -> str:
    """Host for about host_fraction of the paged-out part, disk for all of it."""
    kv_bytes_per_token = (2 * config.num_layers * config.num_kv_heads * config.head_dim
                          * (2 if args.dtype == "bf16" else 4))            # K and V
    paged_tokens = num_tokens * (1 - args.pool_fraction)
    host = max(1, int(paged_tokens * args.host_fraction * kv_bytes_per_token / 2**20))
    disk = int(num_tokens * kv_bytes_per_token * 2 / 2**20) + 16
    return (f"{args.dtype}+tiers(host={host}MiB,disk={disk}MiB,disk_path={disk_dir},"
            f"prefetch={prefetch},page_blocks={args.page_blocks},"
            f"prefetch_depth={args.prefetch_depth})")


def decode(llm, prompt: list[int], max_tokens: int) -> dict:
    """Prefill, then decode one token per step; timings and paging counters split into
    the prefill part (up to the first token) and the decode part."""
    engine = llm.engine
    req = engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    start = time.perf_counter()
    while not req.output_token_ids and engine.has_unfinished():
        engine.step()
    prefill_s = time.perf_counter() - start
    at_first = snapshot(llm)
    step_s = []
    while engine.has_unfinished():
        t0 = time.perf_counter()
        engine.step()
        step_s.append(time.perf_counter() - t0)
    at_end = snapshot(llm)
    out = engine.pop_finished(req.request_id)
    return {"token_ids": out.token_ids, "text": out.text, "finish_reason": out.finish_reason,
            "prefill_s": prefill_s, "decode_step_s": step_s,
            "decode_s_per_token_median": statistics.median(step_s) if step_s else None,
            "prefill": at_first, "decode": diff(at_end, at_first), "total": at_end}


def snapshot(llm) -> dict:
    usage = llm.kv_usage()
    if "tier_store" not in usage:
        return {}
    p = usage["tier_store"]["paging"]
    out = {k: p[k] for k in ("io_wait_s", "read_s", "num_frames_read", "bytes_read",
                             "num_prefetch_hits", "num_sync_reads", "num_wasted_prefetches",
                             "num_pages_out", "page_out_s", "num_page_faults")}
    for tier, t in usage["tiers"].items():
        out[f"{tier}_bytes_read"] = t["bytes_read"]
        out[f"{tier}_read_s"] = t["read_s"]
        out[f"{tier}_hits"] = t["num_hits"]
        out[f"{tier}_read_p50_s"] = t["read_p50_s"]
        out[f"{tier}_read_p99_s"] = t["read_p99_s"]
    return out


def diff(end: dict, start: dict) -> dict:
    """Counters of the decode part; percentiles are over the whole run (the tiers keep
    one latency window), so they are copied from the end."""
    return {k: (v if k.endswith(("_p50_s", "_p99_s")) else v - start.get(k, 0))
            for k, v in end.items()}


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    llm_ref = LLM(dtype=args.dtype, kv=args.dtype, num_blocks=args.context // 16 + 64,
                  max_num_batched_tokens=args.chunk_tokens, device="cpu",
                  enable_prefix_caching=False)
    tok, config = llm_ref.tokenizer, llm_ref.model_config
    case = make_cases(tok, [args.context], [args.depth], 1, args.seed)[0]
    prompt = tok.encode(case.prompt)
    n = len(prompt)
    pool_blocks = int(n * args.pool_fraction) // 16
    print(f"prompt {n} tokens, key {case.key} at token {case.key_position_tokens}; paged "
          f"pool {pool_blocks} blocks = {pool_blocks * 16} tokens "
          f"({pool_blocks * 16 / n:.0%} of the context)", flush=True)
    results = {}
    ref = decode(llm_ref, prompt, args.decode_tokens)
    results["unpaged"] = ref
    print(f"unpaged: prefill {ref['prefill_s']:.1f}s, decode "
          f"{ref['decode_s_per_token_median'] * 1e3:.0f} ms/token: {ref['text']!r}", flush=True)
    del llm_ref
    modes = ["none", "window"] + (["attention"] if args.attention else [])
    disk_root = tempfile.mkdtemp(prefix="kvmap-bench-long-")
    for mode in modes:
        spec = tier_spec(args, n, disk_root, mode, config)
        llm = LLM(dtype=args.dtype, kv=spec, num_blocks=pool_blocks,
                  max_num_batched_tokens=args.chunk_tokens, device="cpu")
        r = decode(llm, prompt, args.decode_tokens)
        r["kv"] = spec
        r["pool_blocks"] = pool_blocks
        r["paging"] = llm.kv_usage()["tier_store"]["paging"]
        r["tiers"] = llm.kv_usage()["tiers"]
        llm.engine.check_integrity()
        llm.engine.close()
        results[f"paged {mode}"] = r
        print(f"paged {mode}: prefill {r['prefill_s']:.1f}s, decode "
              f"{r['decode_s_per_token_median'] * 1e3:.0f} ms/token, decode IO wait "
              f"{r['decode']['io_wait_s']:.2f}s: {r['text']!r}", flush=True)
    for name, r in results.items():
        r["tokens_equal_unpaged"] = r["token_ids"] == ref["token_ids"]
        r["first_difference"] = next((i for i, (a, b) in enumerate(
            zip(r["token_ids"], ref["token_ids"])) if a != b), None)
        r["passkey_retrieved"] = contains_key(r["text"], case.key)
    summary = {"prompt_tokens": n, "pool_tokens": pool_blocks * 16, "key": case.key,
               "key_position_tokens": case.key_position_tokens}
    none, window = results["paged none"]["decode"], results["paged window"]["decode"]
    if none["io_wait_s"] > 0:
        summary["decode_io_wait_hidden"] = 1 - window["io_wait_s"] / none["io_wait_s"]
    if none.get("disk_read_s"):
        summary["decode_disk_read_s_none"] = none["disk_read_s"]
        summary["decode_io_wait_s_window"] = window["io_wait_s"]
        summary["decode_disk_read_hidden"] = 1 - window["io_wait_s"] / none["disk_read_s"]
    return {"summary": summary, "results": results}


def print_table(out: dict, args) -> None:
    s, results = out["summary"], out["results"]
    print(f"\nLong context, SmolLM2-135M {args.dtype} on CPU ({args.threads} torch thread(s), "
          f"shared machine): {s['prompt_tokens']}-token passkey prompt, pool "
          f"{s['pool_tokens']} tokens, {args.decode_tokens} greedy tokens")
    print(f"{'config':16s} {'= unpaged':>9s} {'passkey':>7s} {'prefill':>8s} {'ms/token':>8s} "
          f"{'IO wait':>8s} {'disk read':>9s} {'disk P50':>8s} {'disk P99':>8s} "
          f"{'host P99':>8s} {'prefetch hit':>12s} {'wasted':>6s}")
    for name, r in results.items():
        d = r.get("decode") or {}
        equal = "yes" if r["tokens_equal_unpaged"] else f"@{r['first_difference']}"

        def ms(key):
            v = d.get(key)
            return f"{v * 1e3:7.3f}m" if v is not None else f"{'-':>8s}"

        used = d.get("num_prefetch_hits", 0) + d.get("num_sync_reads", 0)
        hit = f"{d['num_prefetch_hits'] / used:.0%}" if used else "-"
        print(f"{name:16s} {equal:>9s} {str(r['passkey_retrieved']):>7s} "
              f"{r['prefill_s']:7.1f}s {r['decode_s_per_token_median'] * 1e3:7.0f}m "
              f"{d.get('io_wait_s', 0):7.2f}s {d.get('disk_read_s', 0):8.2f}s "
              f"{ms('disk_read_p50_s')} {ms('disk_read_p99_s')} {ms('host_read_p99_s')} "
              f"{hit:>12s} {d.get('num_wasted_prefetches', 0):6d}")
    print("(IO wait, disk read, hits: decode steps only; P50/P99: every frame read in the "
          "run)")
    if "decode_io_wait_hidden" in s:
        print(f"prefetch=window hides {s['decode_io_wait_hidden']:.1%} of the decode IO wait "
              f"of prefetch=none")
    if "decode_disk_read_hidden" in s:
        print(f"... and its remaining IO wait is {1 - s['decode_disk_read_hidden']:.1%} of "
              f"the disk read time of prefetch=none ({s['decode_disk_read_s_none']:.2f}s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=6000)
    ap.add_argument("--depth", type=float, default=0.25)
    ap.add_argument("--decode-tokens", type=int, default=24)
    ap.add_argument("--pool-fraction", type=float, default=1 / 3)
    ap.add_argument("--host-fraction", type=float, default=0.5)
    ap.add_argument("--page-blocks", type=int, default=16)
    ap.add_argument("--prefetch-depth", type=int, default=2)
    ap.add_argument("--chunk-tokens", type=int, default=512)
    ap.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--attention", action="store_true", help="also prefetch=attention")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="2,000 tokens, 8 decode tokens")
    args = ap.parse_args()
    from kvmap.hardware import resolve_dtype
    args.dtype = resolve_dtype(args.dtype)   # auto: this machine's fastest exact dtype
    if args.quick:
        args.context, args.decode_tokens = 2000, 8
    out = run(args)
    print_table(out, args)
    path = write_record("long_context", vars(args), out)
    print(f"\nrecord: {path}")


if __name__ == "__main__":
    main()
