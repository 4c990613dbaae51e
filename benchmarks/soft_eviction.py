"""Soft vs hard eviction over a multi-turn conversation (SmolLM2-135M, bf16 weights,
int8 KV, a host tier): later-turn passkey accuracy and TTFT, against the full cache.

Each conversation is one document (~``--context`` tokens) holding one needle ("The
special magic number for <city> is <5 digits>.", RULER wording) at a random depth. Turn
0 asks something else ("what is the text above about?"); turns 1.. ask for the number.
The layout is ``kvmap.workloads``' multi-turn one -- turn t's prompt is turn t-1's prompt
+ its reply + the next user message -- with the model's own replies (what a chat client
sends back), so a turn's prompt starts with every token the last one computed.
Configurations, side by side (each conversation runs on every engine in turn,
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

    .venv/bin/python benchmarks/soft_eviction.py                   # 2k tokens, 8 conversations x 3 turns
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
from kvmap.evals.retrieval import (  # noqa: E402
    ANSWER_TOKENS, insert_sentences, needle_sentence)
from kvmap.evals.stats import wilson_interval  # noqa: E402
from kvmap.workloads.builders import CITIES  # noqa: E402
from kvmap.workloads.corpus import encode_text, paragraphs, take_tokens  # noqa: E402

import numpy as np  # noqa: E402

DISTRACTOR_TOKENS = 16        # turn 0's reply: a short sentence


def configs(budget: float, host: str) -> dict[str, dict]:
    tiers = f"tiers(host={host})"
    return {
        "full": {"kv": f"int8+{tiers}"},
        "hard": {"kv": f"snapkv(budget={budget})+int8+{tiers}"},
        "soft": {"kv": f"snapkv(budget={budget},evict_to=host)+int8+{tiers}"},
        "hard-recompute": {"kv": f"snapkv(budget={budget})+int8",
                           "enable_prefix_caching": False},
    }


DISTRACTOR = "\n\nIn one short sentence, what is the text above about?"


def conversation(tokenizer, context: int, seed: int, index: int):
    """(turn 0's prompt ids, city, key): a document of about ``context`` tokens holding
    one needle at a random depth, and a first question about something else."""
    rng = np.random.default_rng([seed, index])
    city = CITIES[int(rng.integers(len(CITIES)))]
    key = str(int(rng.integers(10_000, 100_000)))
    depth = float(rng.uniform(0.1, 0.9))
    start = int(rng.integers(len(paragraphs(None))))
    intro = "A special magic number is hidden in the following text. Memorize it."
    overhead = len(encode_text(tokenizer, intro + needle_sentence(city, key) + DISTRACTOR)) + 4
    document = take_tokens(tokenizer, context - overhead, start_paragraph=start)
    body = insert_sentences(document, [(depth, needle_sentence(city, key))])
    return encode_text(tokenizer, f"{intro}\n\n{body}{DISTRACTOR}"), city, key


def question_ids(tokenizer, city: str) -> list[int]:
    return encode_text(tokenizer, f"\n\nWhat is the special magic number for {city}? "
                                  f"The special magic number for {city} is")


def run_conversation(llm, first_ids, city, key, turns, tokenizer) -> list[dict]:
    """Every turn of one conversation on ``llm``, one row per turn: turn 0 asks the
    distractor (its reply is not scored), turns 1.. ask for the key."""
    ids, rows = list(first_ids), []
    for turn in range(turns):
        if turn:
            ids = ids + question_ids(tokenizer, city)
        params = (SamplingParams(max_tokens=ANSWER_TOKENS) if turn else
                  SamplingParams(max_tokens=DISTRACTOR_TOKENS, ignore_eos=True))
        engine = llm.engine
        before = engine.num_prefill_tokens
        out = llm.generate([ids], params)[0]
        # an answer that is EOS at once has no first token: its time to finish instead
        ttft_s = out.metrics.ttft_s if out.metrics.ttft_s is not None else out.metrics.e2e_s
        rows.append({"turn": turn, "prompt_tokens": len(ids), "ttft_s": ttft_s,
                     "cached_tokens": out.metrics.num_cached_prompt_tokens,
                     "computed_tokens": engine.num_prefill_tokens - before,
                     "correct": key in out.text if turn else None, "output": out.text})
        ids = ids + out.token_ids                       # the model's own reply
    return rows


def summarize(rows: list[dict], turns: int) -> list[dict]:
    out = []
    for t in range(turns):
        r = [x for x in rows if x["turn"] == t]
        k = sum(bool(x["correct"]) for x in r)
        scored = t > 0                                  # turn 0 is the distractor
        out.append({"turn": t, "accuracy": k / len(r) if scored else None,
                    "accuracy_ci95": wilson_interval(k, len(r)) if scored else None,
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
        first_ids, city, key = conversation(tokenizer, args.context, args.seed, c)
        for name, llm in llms.items():
            with track_peak_kv_bytes(llm.engine) as peak:
                got = run_conversation(llm, first_ids, city, key, args.turns, tokenizer)
            peaks[name] = max(peaks[name], peak[0])
            rows[name] += [{**r, "conversation": c} for r in got]
            print(f"conv {c} {name:15s} " + " ".join(
                f"t{r['turn']}:{'..' if r['correct'] is None else 'ok' if r['correct'] else '--'}"
                f" {r['ttft_s']:.2f}s"
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
            lo, hi = t["accuracy_ci95"] or (float("nan"), float("nan"))
            acc = t["accuracy"] if t["accuracy"] is not None else float("nan")
            print(f"{name:15s} {t['turn']:4d} {acc:9.2f} [{lo:.2f}, {hi:.2f}] "
                  f"{t['ttft_s_median']:6.2f}s {t['cached_tokens_mean']:7.0f} "
                  f"{m['peak_device_kv_vs_full']:7.2f}x")
    config = {**vars(args), "model": "SmolLM2-135M (embedded)", "dtype": "bf16",
              "specs": specs}
    print("record:", write_record("soft_eviction", config, metrics))


if __name__ == "__main__":
    main()
