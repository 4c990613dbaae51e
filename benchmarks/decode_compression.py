"""Decoding-time compression (``decode_every``) on the embedded SmolLM2-135M, bf16 KV.

One sequence: a ``--context`` token prompt of natural text, then ``--continuation``
more tokens of the same text fed one decode step at a time (teacher forcing, as the
``ppl`` task does): every configuration decodes the very same tokens, so the memory
curves and the accuracy are paired. Per configuration:

  resident   KV bytes resident in the pool (``PagedKVCache.usage``) every ``--every``
             decode steps, its peak over the decode, and the bound the option promises:
             ceil((budget + decode_every - 1) / block) blocks
  accuracy   NLL of each continuation token under the configuration, and against the
             full cache on the same tokens: ppl, the paired mean NLL delta (nats) and
             top-1 agreement (argmax equal to the full cache's)
  time       wall seconds of the decode (noisy on a shared machine)

The full cache is scored by one chunked prefill of all the tokens (``score_full``: the
same attention as decoding with every token kept, up to bf16 rounding, at a fraction of
the time), and its resident bytes are the pool's rule, ceil(n / block) blocks.

The prompt is shorter than the budget, so nothing is compressed until the generation
outgrows the budget: what is measured is compression during decode alone.

    nice -n 10 .venv/bin/python benchmarks/decode_compression.py              # 256 + 2048
    nice -n 10 .venv/bin/python benchmarks/decode_compression.py --continuation 256
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402

from kvmap import LLM, SamplingParams  # noqa: E402
from kvmap.workloads.corpus import encode_text, take_tokens  # noqa: E402

CONFIGS = ["bf16", "h2o(budget=512,decode_every=64)", "h2o(budget=512)",
           "streaming_llm(sinks=4,budget=512,decode_every=64)"]


def decode_through(llm: LLM, ids: list[int], num_context: int, sample_every: int,
                   keep_logits: bool = False) -> dict:
    """Teacher-forced decode of ids[num_context:] after prefilling ids[:num_context];
    per position the NLL and argmax (and the logits, with ``keep_logits``), and every
    ``sample_every`` steps [step, resident bytes, the sequence's KV slots]."""
    engine = llm.engine
    req = engine.add_request(ids[:num_context], SamplingParams(
        max_tokens=len(ids) - num_context, ignore_eos=True))
    req.forced_token_ids = list(ids[num_context:])
    nll, top1, series, kept = [], [], [], []
    peak_bytes, step, t0 = 0, 0, time.perf_counter()
    while not req.status.finished:
        engine.step()
        for logits in req.recorded_logits:      # one per decode step: predicts ids[c + j]
            logp = torch.log_softmax(logits.float(), dim=-1)
            nll.append(-logp[ids[num_context + len(nll)]].item())
            top1.append(int(logp.argmax()))
            if keep_logits:
                kept.append(logits.float())
        req.recorded_logits.clear()
        resident = engine.kv.usage().resident_bytes
        peak_bytes = max(peak_bytes, resident)
        if step % sample_every == 0:
            series.append([step, resident, req.num_kv_slots])
        step += 1
    wall_s = time.perf_counter() - t0
    engine.requests.pop(req.request_id, None)
    out = {"logits": torch.stack(kept)} if keep_logits else {}
    return {**out, "nll": nll, "top1": top1, "series": series,
            "peak_resident_bytes": peak_bytes, "wall_s": wall_s,
            "num_compressions": engine.policy_runner.num_compressions
            if engine.policy_runner is not None else 0}


def score_full(llm: LLM, ids: list[int], num_context: int, sample_every: int) -> dict:
    """The full cache on the same positions, from one chunked prefill of all the tokens
    (``Engine.score``): with every token kept, teacher-forced decoding computes the same
    attention (up to bf16 rounding) at a small fraction of the time on this machine. Its
    resident bytes are every token's, ceil(n / bs) blocks at n slots (the pool's rule;
    not sampled from a decode)."""
    t0, seen = time.perf_counter(), [0]

    def per_chunk(logits: torch.Tensor) -> torch.Tensor:      # (n, V) -> (n, 2)
        logp = torch.log_softmax(logits.float(), dim=-1)
        p0, n = seen[0], logits.shape[0]
        seen[0] += n
        nxt = torch.tensor([ids[min(p + 1, len(ids) - 1)] for p in range(p0, p0 + n)])
        return torch.stack([-logp.gather(1, nxt[:, None])[:, 0], logp.argmax(-1).float()], 1)

    out = llm.engine.score(ids, per_chunk=per_chunk)[num_context - 1:len(ids) - 1]
    kv = llm.engine.kv
    series = [[step, math.ceil((num_context + step) / kv.block_size) * kv.bytes_per_block,
               num_context + step] for step in range(0, len(ids) - num_context, sample_every)]
    return {"nll": out[:, 0].tolist(), "top1": out[:, 1].long().tolist(), "series": series,
            "peak_resident_bytes": math.ceil(len(ids) / kv.block_size) * kv.bytes_per_block,
            "wall_s": time.perf_counter() - t0, "num_compressions": 0,
            "measured_as": "prefill scoring (Engine.score), bytes by the pool's rule"}


def bound_bytes(llm: LLM, spec: str) -> int | None:
    """Resident bytes the option promises during decode: ceil((B + N - 1) / bs) blocks."""
    policy = llm.engine.policy
    if policy is None:
        return None
    bs = llm.engine.kv.block_size
    slots = policy.budget_tokens(1) + policy.decode_every_steps(bs) - 1
    return math.ceil(slots / bs) * llm.engine.kv.bytes_per_block


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--continuation", type=int, default=2048)
    ap.add_argument("--every", type=int, default=32, help="sample resident bytes every N steps")
    ap.add_argument("--configs", nargs="+", default=CONFIGS)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    results, full, path = {}, None, None
    for spec in args.configs:
        llm = LLM(dtype="bf16", kv=spec, kv_memory="256MiB", device="cpu",
                  max_num_batched_tokens=512, num_threads=args.threads)
        n = args.context + args.continuation
        ids = encode_text(llm.tokenizer, take_tokens(llm.tokenizer, n + 8))[:n]
        r = score_full(llm, ids, args.context, args.every) if spec == "bf16" else \
            decode_through(llm, ids, args.context, args.every)
        r["bound_bytes"] = bound_bytes(llm, spec)
        nll = torch.tensor(r["nll"])
        r["ppl"] = math.exp(nll.mean().item())
        if full is None:
            full = r
        r["nll_delta_mean"] = (nll - torch.tensor(full["nll"])).mean().item()
        r["top1_agreement"] = sum(a == b for a, b in zip(r["top1"], full["top1"])) / len(nll)
        r["peak_ratio_to_full"] = r["peak_resident_bytes"] / full["peak_resident_bytes"]
        results[spec] = r
        path = save(args, results, path)
        print(f"{spec:52s} peak {r['peak_resident_bytes'] / 2**20:7.2f} MiB "
              f"({r['peak_ratio_to_full']:.3f}x full; bound {r['bound_bytes']}) "
              f"ppl {r['ppl']:.3f} dNLL {r['nll_delta_mean']:+.4f} "
              f"top1 {r['top1_agreement']:.3f} compressions {r['num_compressions']} "
              f"{r['wall_s']:.0f} s", flush=True)
    print(f"record: {path}")


def save(args, results: dict, old_path):
    """The record so far (rewritten after each configuration: a long run interrupted
    still leaves its finished configurations)."""
    slim = {spec: {k: ([round(x, 4) for x in v] if k == "nll" else v)
                   for k, v in r.items() if k != "top1"} for spec, r in results.items()}
    if old_path is not None:
        old_path.unlink()
    return write_record("decode_compression", vars(args), slim)


if __name__ == "__main__":
    main()
