"""The hybrid saving of Gemma 3 270M measured on the engine: one long request through
the default (windowed) layout and through ``all_global`` (every sliding layer keeps
its whole history, attention still masked to the window), peak resident KV bytes per
layer kind of each, the greedy tokens of both (equal), and a next-turn request on the
default layout with prefix caching (hits, and the tokens of an engine without it).

    PYTHONPATH=src python benchmarks/hybrid_saving.py [--prompt-len 4096] [--turn-len 1024]

Prints a table and writes ``benchmarks/results/hybrid_saving-<time>.json``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_record  # noqa: E402

MODEL = "gemma3-270m"


def prompt_ids(llm, num_tokens: int, seed: int) -> list[int]:
    """``num_tokens`` ids of the workloads' corpus text (the bench's prompts)."""
    import numpy as np
    from kvmap.workloads.corpus import TextSource
    text = TextSource(llm.tokenizer, np.random.default_rng(seed)).take(num_tokens)
    return llm.encode(text)[:num_tokens]


def one_layout(spec: str, prompt: list[int], output_len: int, dtype: str) -> dict:
    from kvmap import LLM, SamplingParams
    from kvmap.evals.kv_peak import track_peak_kv_bytes
    from kvmap.kv.layer_kinds import LayerKindPeak
    llm = LLM(model=MODEL, dtype=dtype, kv=spec, kv_memory="16384 tokens",
              max_num_batched_tokens=512, device="cpu")
    t0 = time.perf_counter()
    with track_peak_kv_bytes(llm.engine) as peak, LayerKindPeak(llm.engine.kv) as kinds:
        out = llm.generate([prompt], SamplingParams(max_tokens=output_len, ignore_eos=True))
    return {"kv": spec, "per_layer_tables": llm.engine.kv.per_layer_tables,
            "peak_kv_resident_bytes": peak[0], "peak_kv_resident_bytes_by_kind": kinds.by_kind,
            "layer_kinds": {k: {"layers": v["layers"], "window": v["window"],
                                "bytes_per_token": v["bytes_per_token"]}
                            for k, v in llm.engine.kv.layer_kinds_usage().items()},
            "wall_s": time.perf_counter() - t0, "token_ids": out[0].token_ids}


def next_turn(prompt: list[int], extra: list[int], output_len: int, dtype: str) -> dict:
    """Turn 1, then turn 2 = turn 1 + its output + ``extra``, with and without prefix
    caching on the default layout."""
    from kvmap import LLM, SamplingParams
    params = SamplingParams(max_tokens=output_len, ignore_eos=True)
    out = {}
    for caching in (True, False):
        llm = LLM(model=MODEL, dtype=dtype, kv="auto", kv_memory="16384 tokens",
                  max_num_batched_tokens=512, device="cpu", enable_prefix_caching=caching)
        first = llm.generate([prompt], params)[0].token_ids
        t0 = time.perf_counter()
        second = llm.generate([prompt + first + extra], params)[0].token_ids
        out["cached" if caching else "uncached"] = {
            "turn2_wall_s": time.perf_counter() - t0, "turn2_token_ids": second,
            "prefix_cache_hits_blocks": llm.engine.stats().prefix_cache_hits,
            "turn2_prompt_tokens": len(prompt) + len(first) + len(extra)}
    out["same_tokens"] = out["cached"]["turn2_token_ids"] == out["uncached"]["turn2_token_ids"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt-len", type=int, default=4096)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--turn-len", type=int, default=1024)
    ap.add_argument("--dtype", default="auto")
    args = ap.parse_args()
    from kvmap import LLM
    from kvmap.config import format_bytes
    from kvmap.hardware import resolve_dtype
    dtype = resolve_dtype(args.dtype, "cpu")
    tok = LLM(model=MODEL, dtype=dtype, kv_memory="64MiB", device="cpu")
    prompt = prompt_ids(tok, args.prompt_len, seed=0)
    turn = prompt_ids(tok, args.turn_len, seed=1)
    extra = prompt_ids(tok, 48, seed=2)
    del tok
    rows = [one_layout(spec, prompt, args.output_len, dtype)
            for spec in ("auto", "auto+all_global")]
    windowed, flat = rows
    saving = flat["peak_kv_resident_bytes"] / windowed["peak_kv_resident_bytes"]
    print(f"{MODEL}, {args.prompt_len}-token prompt + {args.output_len} out, {dtype}")
    for r in rows:
        kinds = ", ".join(f"{k} {format_bytes(b)}"
                          for k, b in r["peak_kv_resident_bytes_by_kind"].items())
        print(f"  {r['kv']:16s} peak {format_bytes(r['peak_kv_resident_bytes']):>10s} "
              f"({kinds})  {r['wall_s']:.1f} s")
    same = windowed["token_ids"] == flat["token_ids"]
    print(f"  hybrid saving {saving:.2f}x; same greedy tokens: {same}")
    turns = next_turn(turn, extra, args.output_len, dtype)
    print(f"  next turn ({turns['cached']['turn2_prompt_tokens']} tokens): prefix hits "
          f"{turns['cached']['prefix_cache_hits_blocks']} blocks, "
          f"{turns['cached']['turn2_wall_s']:.1f} s vs {turns['uncached']['turn2_wall_s']:.1f} s "
          f"uncached; same tokens: {turns['same_tokens']}")
    path = write_record("hybrid_saving", {
        "model": MODEL, "dtype": dtype, "prompt_len": args.prompt_len,
        "output_len": args.output_len, "turn_len": args.turn_len,
        "kv_memory": "16384 tokens", "max_num_batched_tokens": 512}, {
        "layouts": rows, "hybrid_saving": saving, "same_tokens": same, "next_turn": turns})
    print(f"record: {path}")


if __name__ == "__main__":
    main()
