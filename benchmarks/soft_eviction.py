"""Soft vs hard eviction over a multi-turn conversation (SmolLM2-135M, bf16 weights,
int8 KV, a host tier): later-turn passkey accuracy and TTFT, against the full cache.

Each conversation is one document (~``--context`` tokens) holding ``--turns`` needles
("The special magic number for <city> is <5 digits>.") at spread depths; turn t asks for
needle t. The layout is ``kvmap.workloads``' multi-turn one -- turn t's prompt is turn
t-1's prompt + its reply + the next user message -- with the model's own replies (what a
chat client sends back), so a turn's prompt starts with every token the last one
computed. Configurations, side by side (each conversation runs on every engine in turn,
so all see the same machine load):

  full            int8 + tiers(host): the whole cache, prefix-cached across turns
  hard            snapkv(budget=B) + int8 + tiers(host): the next turn continues from
                  the compacted state of the last (``kvmap.kv.compacted``): what SnapKV
                  dropped for turn t's question stays dropped for turn t+1
  soft            snapkv(budget=B, evict_to=host) + int8 + tiers(host): the dropped
                  prompt blocks wait in the host tier; the next turn fetches the whole
                  prefix back and SnapKV selects again for its own question
  hard-recompute  snapkv(budget=B) + int8, prefix caching off: every turn recomputes
                  its prompt (SnapKV sees each question over the whole context)

Prints a table and writes one JSON record under benchmarks/results/.

    .venv/bin/python benchmarks/soft_eviction.py                   # 2k tokens, 8 x 3 turns
    .venv/bin/python benchmarks/soft_eviction.py --conversations 2 --context 1024   # quick
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
from kvmap.evals.retrieval import ANSWER_TOKENS, needle_prompt  # noqa: E402
from kvmap.evals.stats import wilson_interval  # noqa: E402
from kvmap.workloads.builders import CITIES  # noqa: E402
from kvmap.workloads.corpus import encode_text, paragraphs, take_tokens  # noqa: E402

import numpy as np  # noqa: E402


def configs(budget: float, host: str) -> dict[str, dict]:
    tiers = f"tiers(host={host})"
    return {
        "full": {"kv": f"int8+{tiers}"},
        "hard": {"kv": f"snapkv(budget={budget})+int8+{tiers}"},
        "soft": {"kv": f"snapkv(budget={budget},evict_to=host)+int8+{tiers}"},
        "hard-recompute": {"kv": f"snapkv(budget={budget})+int8",
                           "enable_prefix_caching": False},
    }


def conversation(tokenizer, context: int, turns: int, seed: int, index: int):
    """(document prompt ids asking needle 0, [(city, key)] in asking order)."""
    rng = np.random.default_rng([seed, index])
    cities = [CITIES[i] for i in rng.choice(len(CITIES), turns, replace=False)]
    keys = [str(int(k)) for k in rng.integers(10_000, 100_000, turns)]
    depths = list(rng.permutation(np.linspace(0.15, 0.85, turns)))
    start = int(rng.integers(len(paragraphs(None))))
    needles = [(float(d), c, k) for d, c, k in zip(depths, cities, keys)]
    overhead = len(encode_text(tokenizer, needle_prompt("", needles))) + 4 * turns
    document = take_tokens(tokenizer, context - overhead, start_paragraph=start)
    return encode_text(tokenizer, needle_prompt(document, needles)), list(zip(cities, keys))


def question_ids(tokenizer, city: str) -> list[int]:
    return encode_text(tokenizer, f"\n\nWhat is the special magic number for {city}? "
                                  f"The special magic number for {city} is")


def run_conversation(llm, first_ids, asks, tokenizer) -> list[dict]:
    """Every turn of one conversation on ``llm``; one row per turn."""
    params = SamplingParams(max_tokens=ANSWER_TOKENS)
    ids, rows = list(first_ids), []
    for turn, (city, key) in enumerate(asks):
        if turn:
            ids = ids + question_ids(tokenizer, city)
        engine = llm.engine
        before = engine.num_prefill_tokens
        out = llm.generate([ids], params)[0]
        rows.append({"turn": turn, "prompt_tokens": len(ids), "ttft_s": out.metrics.ttft_s,
                     "cached_tokens": out.metrics.num_cached_prompt_tokens,
                     "computed_tokens": engine.num_prefill_tokens - before,
                     "correct": key in out.text, "output": out.text})
        ids = ids + out.token_ids                       # the model's own reply
    return rows


def summarize(rows: list[dict], turns: int) -> list[dict]:
    out = []
    for t in range(turns):
        r = [x for x in rows if x["turn"] == t]
        k = sum(x["correct"] for x in r)
        out.append({"turn": t, "accuracy": k / len(r), "accuracy_ci95": wilson_interval(k, len(r)),
                    "n": len(r), "ttft_s_median": statistics.median(x["ttft_s"] for x in r),
                    "cached_tokens_mean": statistics.mean(x["cached_tokens"] for x in r),
                    "computed_tokens_mean": statistics.mean(x["computed_tokens"] for x in r)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--budget", type=float, default=0.25)
    ap.add_argument("--host", default="1GiB")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    specs = configs(args.budget, args.host)
    llms = {name: LLM(dtype="bf16", num_threads=args.threads, **spec)
            for name, spec in specs.items()}
    tokenizer = next(iter(llms.values())).tokenizer
    rows = {name: [] for name in llms}
    peaks = {name: 0 for name in llms}
    for c in range(args.conversations):
        first_ids, asks = conversation(tokenizer, args.context, args.turns, args.seed, c)
        for name, llm in llms.items():
            with track_peak_kv_bytes(llm.engine) as peak:
                got = run_conversation(llm, first_ids, asks, tokenizer)
            peaks[name] = max(peaks[name], peak[0])
            rows[name] += [{**r, "conversation": c} for r in got]
            print(f"conv {c} {name:15s} " + " ".join(
                f"t{r['turn']}:{'ok' if r['correct'] else '--'} {r['ttft_s']:.2f}s"
                for r in got), flush=True)
    metrics = {}
    for name, llm in llms.items():
        usage = llm.kv_usage()
        compacted = llm.engine.scheduler.compacted
        metrics[name] = {
            "kv": specs[name]["kv"], "turns": summarize(rows[name], args.turns),
            "peak_device_kv_bytes": peaks[name],
            "host_resident_bytes": usage["tiers"].get("host", {}).get("resident_bytes", 0),
            "tier_store": usage.get("tier_store"),
            "compacted_states": compacted.as_dict() if compacted is not None else None,
            "rows": rows[name]}
        llm.engine.close()
    full_peak = metrics["full"]["peak_device_kv_bytes"]
    print(f"\n{'config':15s} {'turn':>4s} {'accuracy':>9s} {'95% CI':>13s} {'TTFT':>7s} "
          f"{'cached':>7s} {'peak KV':>8s}")
    for name, m in metrics.items():
        m["peak_device_kv_vs_full"] = m["peak_device_kv_bytes"] / full_peak
        for t in m["turns"]:
            lo, hi = t["accuracy_ci95"]
            print(f"{name:15s} {t['turn']:4d} {t['accuracy']:9.2f} [{lo:.2f}, {hi:.2f}] "
                  f"{t['ttft_s_median']:6.2f}s {t['cached_tokens_mean']:7.0f} "
                  f"{m['peak_device_kv_vs_full']:7.2f}x")
    config = {**vars(args), "model": "SmolLM2-135M (embedded)", "dtype": "bf16",
              "specs": specs}
    print("record:", write_record("soft_eviction", config, metrics))


if __name__ == "__main__":
    main()
