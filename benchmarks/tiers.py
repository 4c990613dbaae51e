"""Multi-turn reuse through the tiers: TTFT with ``tiers(host=...)`` against ``recompute``
on the embedded SmolLM2-135M (weights and KV at the machine's ``auto`` dtype by default: fp32 without native bf16; ``--dtype``), at the
same small pool.

Workload: ``--conversations`` chats of ``--turns`` turns, sent round-robin (every first
turn, then every second turn, ...), one request at a time, so TTFT is prefill (and fetch)
time, not queueing. Turn 1 is a ``--first-tokens`` user message of corpus text; every
later turn's prompt is token for token the previous prompt, the model's own reply
(``--reply-tokens``, greedy) and a ``--message-tokens`` follow-up, in the ChatML
template -- so the whole history, replies included, is a reusable prefix. The pool
(``--num-blocks``) holds about one conversation, so by its next turn a conversation's
blocks have left the pool: ``recompute`` prefills the history again, ``tiers`` fetches
it.

Each configuration runs in its own engine; the engines take turns request by request so
that all see the same machine load. For every configuration: TTFT per turn (mean),
turns 2+ mean and median, prefill tokens computed, and per tier hits, misses, hit rate,
bytes, read P50/P99, plus the store's fetch/recompute decisions and IO wait. Greedy
replies are compared across configurations: a fetched block holds, bit for bit, the KV
computed when the history was first seen (a reply's KV one decode step at a time); a
recomputed one is computed again in one prefill chunk, and in bf16 a matmul over another
number of rows may round differently, so a near tie may flip a token. ``--dtype fp32``
shows the difference is rounding.

    .venv/bin/python benchmarks/tiers.py            # 6 conversations x 4 turns
    .venv/bin/python benchmarks/tiers.py --quick    # 3 x 4, shorter messages
    .venv/bin/python benchmarks/tiers.py --quick --dtype fp32 --no-disk
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402

from kvmap import LLM, SamplingParams  # noqa: E402
from kvmap.workloads.corpus import TextSource  # noqa: E402


def configs(args, disk_dir: str) -> dict[str, str]:
    kv = args.dtype        # the KV cache in the compute dtype
    out = {"recompute": f"{kv}+recompute", "host": f"{kv}+tiers(host={args.host})"}
    if not args.no_disk:
        out["host+disk"] = (f"{kv}+tiers(host={args.small_host},disk={args.disk},"
                            f"disk_path={disk_dir})")
    return out


def conversations(tokenizer, args) -> list[list[list[int]]]:
    """Per conversation, the new tokens of each turn: turn 0 the templated first message,
    turn k the end of the previous reply and the templated follow-up."""
    source = TextSource(tokenizer, np.random.default_rng(args.seed))
    out = []
    for _ in range(args.conversations):
        turns = [tokenizer.encode(tokenizer.apply_chat_template(
            [{"role": "user", "content": source.take(args.first_tokens)}]))]
        for _ in range(args.turns - 1):
            follow_up = source.take(args.message_tokens)
            turns.append(tokenizer.encode(
                f"<|im_end|>\n<|im_start|>user\n{follow_up}<|im_end|>\n"
                f"<|im_start|>assistant\n", add_bos=False))
        out.append(turns)
    return out


def run(args) -> dict:
    disk_dir = tempfile.mkdtemp(prefix="kvmap-bench-tiers-")
    specs = configs(args, disk_dir)
    llms = {name: LLM(dtype=args.dtype, kv=spec, num_blocks=args.num_blocks,
                      max_num_batched_tokens=args.chunk_tokens, device="cpu",
                      num_threads=args.threads)
            for name, spec in specs.items()}
    tok = next(iter(llms.values())).tokenizer
    convs = conversations(tok, args)
    params = SamplingParams(max_tokens=args.reply_tokens, ignore_eos=True)
    history = {name: [[] for _ in convs] for name in llms}
    ttft = {name: [[] for _ in range(args.turns)] for name in llms}
    replies = {name: [] for name in llms}
    for turn in range(args.turns):
        for c, conv in enumerate(convs):
            for name, llm in llms.items():
                prompt = history[name][c] + conv[turn]
                out = llm.generate([prompt], params)[0]
                ttft[name][turn].append(out.metrics.ttft_s)
                replies[name].append(out.token_ids)
                history[name][c] = prompt + out.token_ids
            line = "  ".join(f"{name} {ttft[name][turn][-1]:6.2f}s" for name in llms)
            print(f"turn {turn + 1} conversation {c + 1}: {len(prompt):4d} prompt tokens  "
                  f"TTFT {line}", flush=True)

    results = {}
    for name, llm in llms.items():
        usage = llm.kv_usage()
        later = [t for turn in ttft[name][1:] for t in turn]
        results[name] = {
            "kv": specs[name],
            "ttft_s_by_turn": [statistics.mean(t) for t in ttft[name]],
            "ttft_s_turns_2plus_mean": statistics.mean(later),
            "ttft_s_turns_2plus_median": statistics.median(later),
            "prefill_tokens_computed": llm.engine.num_prefill_tokens,
            "pool_blocks": usage["num_blocks_total"],
            "pool_prefix_hits": usage["prefix_cache_hits"],
            "tiers": usage.get("tiers", {}),
            "tier_store": usage.get("tier_store", {}),
            "replies_equal": {other: sum(a == b for a, b in zip(replies[name], replies[other]))
                              for other in llms if other != name},
            "num_replies": len(replies[name]),
        }
        llm.engine.close()
    base = results["recompute"]["ttft_s_turns_2plus_mean"]
    for r in results.values():
        r["ttft_ratio_recompute_over_this"] = base / r["ttft_s_turns_2plus_mean"]
    return results


def print_results(results: dict, args) -> None:
    print(f"\nMulti-turn TTFT, SmolLM2-135M {args.dtype} on CPU, pool {args.num_blocks} "
          f"blocks x 16 tokens, {args.conversations} conversations x {args.turns} turns")
    turns = " ".join(f"{'turn ' + str(t + 1):>8s}" for t in range(args.turns))
    print(f"{'config':10s} {turns} {'2+ mean':>8s} {'2+ med':>8s} {'ratio':>6s} "
          f"{'prefill tok':>11s} {'replies = recompute':>19s}")
    for name, r in results.items():
        by_turn = " ".join(f"{t:7.2f}s" for t in r["ttft_s_by_turn"])
        print(f"{name:10s} {by_turn} {r['ttft_s_turns_2plus_mean']:7.2f}s "
              f"{r['ttft_s_turns_2plus_median']:7.2f}s "
              f"{r['ttft_ratio_recompute_over_this']:5.1f}x {r['prefill_tokens_computed']:11d} "
              f"{r['replies_equal'].get('recompute', r['num_replies']):12d}/{r['num_replies']}")
    print(f"\n{'config':10s} {'tier':5s} {'hits':>5s} {'misses':>6s} {'hit rate':>8s} "
          f"{'MiB read':>8s} {'MiB written':>11s} {'read P50':>9s} {'read P99':>9s} "
          f"{'resident MiB':>12s}")
    for name, r in results.items():
        for tier, t in r["tiers"].items():
            print(f"{name:10s} {tier:5s} {t['num_hits']:5d} {t['num_misses']:6d} "
                  f"{t['hit_rate']:8.1%} {t['bytes_read'] / 2**20:8.1f} "
                  f"{t['bytes_written'] / 2**20:11.1f} {t['read_p50_s'] * 1e3:7.2f}ms "
                  f"{t['read_p99_s'] * 1e3:7.2f}ms {t['resident_bytes'] / 2**20:12.1f}")
        s = r["tier_store"]
        print(f"{name:10s} greedy replies equal to: " + ", ".join(
            f"{other} {n}/{r['num_replies']}" for other, n in r["replies_equal"].items()))
        if s:
            print(f"{name:10s} store: decisions {s['cost']['decisions']}, fetched "
                  f"{s['num_fetched_tokens']} tokens, recomputed {s['num_recomputed_tokens']}, "
                  f"IO wait {s['io_wait_s']:.3f}s, demote {s['demote_s']:.3f}s, "
                  f"errors {s['errors'] or 'none'}; measured compute "
                  f"{s['cost']['compute_flops_per_s'] / 1e9:.1f} GFLOP/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conversations", type=int, default=6)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--first-tokens", type=int, default=160)
    ap.add_argument("--message-tokens", type=int, default=24)
    ap.add_argument("--reply-tokens", type=int, default=48)
    ap.add_argument("--num-blocks", type=int, default=40, help="pool size (16-token blocks)")
    ap.add_argument("--host", default="256MiB")
    ap.add_argument("--small-host", default="8MiB", help="host size beside the disk tier")
    ap.add_argument("--disk", default="1GiB")
    ap.add_argument("--no-disk", action="store_true", help="skip the host+disk config")
    ap.add_argument("--chunk-tokens", type=int, default=512)
    ap.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"],
                    help="weights, activations and KV cache")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: on a shared 2-core machine, OpenMP threads "
                         "spinning against other processes make every step several "
                         "times slower)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    from kvmap.hardware import resolve_dtype
    args.dtype = resolve_dtype(args.dtype)   # auto: this machine's fastest exact dtype
    if args.quick:
        args.conversations, args.first_tokens, args.reply_tokens = 3, 96, 24
        args.num_blocks = 24
    results = run(args)
    print_results(results, args)
    config = {k: v for k, v in vars(args).items()}
    config["configs"] = {name: r["kv"] for name, r in results.items()}
    path = write_record("tiers", config, results)
    print(f"record: {path}")


if __name__ == "__main__":
    main()
