"""Layer-wise prefix loads: how much of a lone request's own prefix fetch is hidden
behind the forward pass of the rest of its prompt (SmolLM2-135M, bf16 weights, int8 KV,
a host or disk tier).

A ``--context``-token document is in the tier (served once, then pushed out of a small
pool by another prompt); request B (document + ``--suffix-tokens`` of other text + a
question) arrives at an idle engine and is admitted at once, so nothing reads its prefix
ahead. Per round, B runs in four ways, in a rotating order:

  no-fetch    the document still in the pool (no fetch needed)
  per-block   fetched block by block before the forward pass (the store's original path)
  batched     fetched as ``layerwise`` does, but finished before the forward pass
  layerwise   copied in layer by layer while the forward pass runs

Reported (medians over ``--rounds``): B's TTFT in each way, the engine's fetch time
(``io_wait_s``), and hidden fraction = 1 - (TTFT_layerwise - TTFT_no-fetch) / fetch time,
with the fetch time of ``batched`` (the same work, synchronous) and of ``per-block``.

    PYTHONPATH=src .venv/bin/python benchmarks/prefix_layerwise_load.py --tier host
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402
from prefix_read_ahead import int8_tier_spec  # noqa: E402

from kvmap import LLM, SamplingParams  # noqa: E402
from kvmap.workloads.corpus import encode_text, take_tokens  # noqa: E402

MODES = ("no-fetch", "per-block", "batched", "layerwise")
STAT_KEYS = ("io_wait_s", "tier_fetch_read_s", "layerwise_copy_s", "layerwise_wait_s",
             "layerwise_hidden_s", "num_promoted_blocks")


def run_once(llm: LLM, mode: str, document, flush, prompt) -> dict:
    """Put the document where ``mode`` wants it, then time B from arrival to token 1."""
    engine, one = llm.engine, SamplingParams(max_tokens=1)
    first, second = (flush, document) if mode == "no-fetch" else (document, flush)
    llm.generate([first], one)
    llm.generate([second], one)
    store = engine.offload.store
    store.loads.prefix_load = "layerwise" if mode == "no-fetch" else mode
    before = {k: getattr(store.stats, k) for k in STAT_KEYS}
    b = engine.add_request(prompt, SamplingParams(max_tokens=1))
    while engine.has_unfinished():
        engine.step()
    out = {k: getattr(store.stats, k) - before[k] for k in STAT_KEYS}
    out["ttft_s"] = b.metrics.ttft_s
    out["cached_prompt_tokens"] = b.metrics.num_cached_prompt_tokens
    out["token_id"] = b.output_token_ids[0]
    engine.pop_finished(b.request_id)
    return out


def summarize(runs: dict[str, list[dict]]) -> dict:
    med = {m: {k: statistics.median(r[k] for r in rs) for k in ("ttft_s", *STAT_KEYS)}
           for m, rs in runs.items()}
    base, lw = med["no-fetch"]["ttft_s"], med["layerwise"]["ttft_s"]
    out = {"median": med}
    for ref in ("batched", "per-block"):
        fetch_s = med[ref]["io_wait_s"]
        out[f"fetch_s_{ref}"] = fetch_s
        out[f"hidden_fraction_vs_{ref}"] = 1 - (lw - base) / fetch_s if fetch_s else None
        out[f"ttft_added_{ref}_s"] = med[ref]["ttft_s"] - base
    out["ttft_added_layerwise_s"] = lw - base
    # one prompt for every run only without a suffix
    out["same_first_token"] = len({r["token_id"] for rs in runs.values() for r in rs}) == 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=2048,
                    help="document tokens (more than suffix + 600)")
    ap.add_argument("--suffix-tokens", type=int, default=0,
                    help="tokens of other text between the document and the question")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tier", choices=("host", "disk"), default="host")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    kv = int8_tier_spec(args.tier)
    # a pool of about context + suffix + 600 int8 tokens (a token budget counts bf16
    # tokens, an int8 token is about half of one): B fits, document + flush does not
    pool_tokens = (args.context + args.suffix_tokens + 600) // 2 + 64
    llm = LLM(dtype="bf16", kv=kv, kv_memory=f"{pool_tokens} tokens",
              max_num_seqs=1, num_threads=args.threads)
    tok = llm.tokenizer
    document = encode_text(tok, take_tokens(tok, args.context))
    flush = encode_text(tok, take_tokens(tok, args.context, start_paragraph=100))
    question = encode_text(tok, "\n\nWhat is this text about?")
    prompts = iter(range(10_000))

    def prompt() -> list[int]:
        """B's prompt; a suffix of its own each run (else the tier would hold it too)."""
        if not args.suffix_tokens:
            return document + question
        text = take_tokens(tok, args.suffix_tokens + 32, start_paragraph=200 + 3 * next(prompts))
        return document + encode_text(tok, text)[:args.suffix_tokens] + question
    loads = [os.getloadavg()]
    for mode in MODES:                          # warm-up, not counted
        run_once(llm, mode, document, flush, prompt())
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in MODES[r % 4:] + MODES[:r % 4]:
            runs[mode].append(run_once(llm, mode, document, flush, prompt()))
        loads.append(os.getloadavg())
        print(f"round {r}: " + "  ".join(f"{m} {runs[m][-1]['ttft_s']:.3f}s" for m in MODES),
              flush=True)
    metrics = {**summarize(runs), "runs": runs, "load_average": loads,
               "num_prompt_tokens": len(document) + args.suffix_tokens + len(question)}
    for k, v in metrics.items():
        if k not in ("runs", "load_average", "median"):
            print(f"{k:32s} {v}")
    for m, row in metrics["median"].items():
        print(f"{m:10s} " + " ".join(f"{k} {v:.4f}" for k, v in row.items()))
    config = {**vars(args), "kv": kv, "model": "SmolLM2-135M (embedded)", "dtype": "bf16"}
    print("record:", write_record("prefix_layerwise_load", config, metrics))
    llm.engine.close()


if __name__ == "__main__":
    main()
