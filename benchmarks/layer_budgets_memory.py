"""Per-layer budgets that free memory: PyramidKV's split with per-layer block tables vs
the shared table (masked holes) vs a uniform budget, on the embedded SmolLM2-135M, bf16.

For each context length (natural text), one sequence: the prompt is prefilled in chunks
(the policy compresses after each), then ``--decode`` tokens of the same text are fed
one decode step at a time (teacher forcing). Per configuration:

  resident   KV bytes in the pool at the end of the decode, and the exact formula the
             per-layer tables promise: sum over layers of the blocks layer l holds,
             ceil(n / bs) - max(0, floor(B / bs) - ceil(b_l / bs)), times one layer's
             block bytes (n: the sequence's slots, b_l: layer l's budget, B: the largest)
  quality    the continuation's logits: per-layer tables against the shared table (the
             same tokens are kept, so they should be equal), and the NLL of every
             configuration against the full cache

    nice -n 10 .venv/bin/python benchmarks/layer_budgets_memory.py            # 2k, 4k
    nice -n 10 .venv/bin/python benchmarks/layer_budgets_memory.py --lengths 2048
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402
from decode_compression import decode_through  # noqa: E402

from kvmap import LLM  # noqa: E402
from kvmap.workloads.corpus import encode_text, take_tokens  # noqa: E402


def configs(budget: int) -> dict[str, str]:
    return {"full": "bf16",
            "uniform": f"h2o(budget={budget})",
            "pyramid shared": f"h2o(budget={budget},layer_budgets=pyramid,layer_tables=shared)",
            "pyramid per-layer": f"h2o(budget={budget},layer_budgets=pyramid)"}


def formula_bytes(llm: LLM, num_slots: int, num_prompt_tokens: int) -> int:
    """Resident bytes of one compressed sequence of ``num_slots`` slots with per-layer
    tables (``kvmap.kv.layer_pool``)."""
    kv, policy = llm.engine.kv, llm.engine.policy
    budgets = policy.layer_budget_tokens(num_prompt_tokens, kv.geom.num_layers)
    bs, top = kv.block_size, max(budgets)
    held = [math.ceil(num_slots / bs) - max(0, top // bs - math.ceil(b / bs)) for b in budgets]
    return sum(held) * kv.layer_block_bytes


def run_length(n_ctx: int, args) -> dict:
    out, full_nll, shared_logits = {}, None, None
    for name, spec in configs(args.budget).items():
        llm = LLM(dtype="bf16", kv=spec, kv_memory="512MiB", device="cpu",
                  max_num_batched_tokens=args.chunk, num_threads=args.threads)
        n = n_ctx + args.decode
        ids = encode_text(llm.tokenizer, take_tokens(llm.tokenizer, n + 8))[:n]
        r = decode_through(llm, ids, n_ctx, 1, keep_logits=True)
        logits = r.pop("logits")
        _, resident, slots = r["series"][-2]      # the last step with the sequence live
        row = {"spec": spec, "resident_bytes": resident, "num_kv_slots": slots,
               "layer_tables": llm.engine.kv.usage().layer_tables,
               "nll_mean": sum(r["nll"]) / len(r["nll"]),
               "peak_resident_bytes": r["peak_resident_bytes"]}
        if row["layer_tables"] == "per-layer":
            row["formula_bytes"] = formula_bytes(llm, slots, n_ctx)
        if full_nll is None:
            full_nll = r["nll"]
        row["nll_delta_vs_full"] = row["nll_mean"] - sum(full_nll) / len(full_nll)
        if name == "pyramid shared":
            shared_logits = logits
        if name == "pyramid per-layer":
            row["logits_max_abs_diff_vs_shared"] = (logits - shared_logits).abs().max().item()
            row["logits_equal_to_shared"] = bool(torch.equal(logits, shared_logits))
        out[name] = row
        extra = f" formula {row['formula_bytes']}" if "formula_bytes" in row else ""
        print(f"{n_ctx:5d} {name:18s} resident {resident / 2**20:7.2f} MiB ({slots} slots, "
              f"{row['layer_tables']}){extra} dNLL {row['nll_delta_vs_full']:+.4f}", flush=True)
    uniform = out["uniform"]["resident_bytes"]
    for row in out.values():
        row["resident_ratio_to_uniform"] = row["resident_bytes"] / uniform
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096])
    ap.add_argument("--budget", type=int, default=512, help="mean tokens kept per layer")
    ap.add_argument("--decode", type=int, default=16, help="teacher-forced decode steps")
    ap.add_argument("--chunk", type=int, default=512, help="prefill chunk tokens")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    results, path = {}, None
    for n in args.lengths:          # the record is rewritten after each length
        results[str(n)] = run_length(n, args)
        if path is not None:
            path.unlink()
        path = write_record("layer_budgets_memory", vars(args), results)
    print(f"record: {path}")


if __name__ == "__main__":
    main()
