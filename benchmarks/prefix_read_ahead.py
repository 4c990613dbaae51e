"""Prefix read-ahead: how much of a tier prefix fetch is hidden behind other work
(SmolLM2-135M, bf16 weights, int8 KV, a host or disk tier).

A ``--context``-token document is served once and pushed out of a small pool into the
tier; then request A (another prompt) decodes ``--decode`` tokens while request B
(document + a question) waits for a sequence slot (``max_num_seqs=1``). B's prefix
frames are read on the store's background thread during A's steps
(``TieredStore.read_ahead``); B's admission then copies them into the pool. Reported:
the tier read time of B's prefix (``tier_fetch_read_s``), how much of it ran while the
engine did other work (``tier_fetch_hidden_s``), and B's TTFT counted from its admission.

    PYTHONPATH=src .venv/bin/python benchmarks/prefix_read_ahead.py --tier host
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402

from kvmap import LLM, SamplingParams  # noqa: E402
from kvmap.workloads.corpus import encode_text, take_tokens  # noqa: E402


def int8_tier_spec(tier: str) -> str:
    """int8 KV over one host or disk tier (a fresh directory) that always fetches."""
    tiers = ("tiers(host=1GiB,fetch=always)" if tier == "host" else
             f"tiers(disk=1GiB,disk_path={tempfile.mkdtemp()},fetch=always)")
    return f"int8+{tiers}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--tier", choices=("host", "disk"), default="host")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    kv = int8_tier_spec(args.tier)
    # a pool of about context + 600 int8 tokens (a token budget counts bf16 tokens, and
    # an int8 token is about half of one): the document fits, document + flush does not
    llm = LLM(dtype="bf16", kv=kv, kv_memory=f"{(args.context + 600) // 2 + 64} tokens",
              max_num_seqs=1,
              num_threads=args.threads)
    tok = llm.tokenizer
    document = encode_text(tok, take_tokens(tok, args.context))
    other = encode_text(tok, take_tokens(tok, 400, start_paragraph=50))
    flush = encode_text(tok, take_tokens(tok, args.context, start_paragraph=100))
    one = SamplingParams(max_tokens=1)
    llm.generate([document], one)
    llm.generate([flush], one)                  # the pool reuses the document's blocks
    engine = llm.engine
    stats = engine.offload.store.stats
    before = (stats.tier_fetch_read_s, stats.tier_fetch_hidden_s, stats.io_wait_s)
    a = engine.add_request(other, SamplingParams(max_tokens=args.decode, ignore_eos=True))
    engine.step()
    b = engine.add_request(document + encode_text(tok, "\n\nWhat is this text about?"),
                           SamplingParams(max_tokens=4))
    while engine.has_unfinished():
        engine.step()
    read_s = stats.tier_fetch_read_s - before[0]
    hidden_s = stats.tier_fetch_hidden_s - before[1]
    metrics = {"tier_fetch_read_s": read_s, "tier_fetch_hidden_s": hidden_s,
               "hidden_fraction": hidden_s / read_s if read_s else None,
               "io_wait_s": stats.io_wait_s - before[2],
               "num_read_ahead_blocks": stats.num_read_ahead_blocks,
               "num_read_ahead_used": stats.num_read_ahead_used,
               "b_cached_prompt_tokens": b.metrics.num_cached_prompt_tokens,
               "b_ttft_from_admission_s": b.metrics.token_times_s[0] - b.metrics.first_scheduled_s,
               "a_num_output_tokens": len(a.output_token_ids)}
    for k, v in metrics.items():
        print(f"{k:28s} {v}")
    config = {**vars(args), "kv": kv, "model": "SmolLM2-135M (embedded)", "dtype": "bf16"}
    print("record:", write_record("prefix_read_ahead", config, metrics))
    engine.close()


if __name__ == "__main__":
    main()
