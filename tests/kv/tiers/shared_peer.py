"""One kvmap process of the shared-pool tests: ``python shared_peer.py RUNS_JSON``.

RUNS_JSON is a list of runs, each ``{"model", "kv", "prompts", "max_tokens"}``; every
run builds its own ``LLM`` in this process, generates greedily for each prompt (token
ids) and reports, as one JSON line on stdout: the output token ids per prompt, the
prompt tokens served from the cache, the tokens fetched from tiers, and each redis
level's hits, misses and errors.
"""
from __future__ import annotations

import json
import sys

import torch

from kvmap import LLM, SamplingParams


def run_one(spec: dict) -> dict:
    llm = LLM(spec["model"], dtype="fp32", kv=spec["kv"], num_blocks=256, block_size=4,
              max_num_batched_tokens=64, device="cpu")
    params = SamplingParams(max_tokens=spec.get("max_tokens", 8), ignore_eos=True)
    outs = llm.generate(spec["prompts"], params)
    store = llm.engine.offload
    levels = store.usage() if store is not None else {}
    redis = levels.get("redis", {})
    result = {"tokens": [o.token_ids for o in outs],
              "cached_tokens": [o.metrics.num_cached_prompt_tokens for o in outs],
              "fetched_tokens": store.store.stats.num_fetched_tokens if store else 0,
              "redis_hits": redis.get("num_hits", 0),
              "redis_errors": redis.get("errors", {}),
              "namespace": (store.levels[-1].tier.key_prefix.decode()
                            if store is not None else None)}
    llm.engine.close()
    return result


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(json.dumps([run_one(spec) for spec in json.loads(sys.argv[1])]))
