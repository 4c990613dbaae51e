"""A shared remote pool between two processes: the second process's TTFT on prompts the
first one served, against a cold start, on the embedded SmolLM2-135M (bf16).

Three processes, one after another, each a fresh Python with its own engine, send the
same ``--prompts`` prompts of ``--prompt-tokens`` tokens of corpus text, one request at a
time (TTFT is prefill, or fetch, time, not queueing), after one short warm-up request:

    cold     kv=bf16                         no tiers: every prompt is prefilled
    writer   bf16+tiers(redis=..., shared=true, shared_key=env:...)   an empty
             namespace: prefills, and publishes every block it names into Redis
    reader   the same spec in another process: finds the writer's blocks through the
             index in Redis and fetches them (the cost model decides, ``fetch=cost``)
    cold     again, to bracket load drift

Reported: per process the median TTFT, the ratio cold / reader (target >= 3x) and
cold / writer (what publishing costs), the reader's fetched tokens and hits, and whether
the reader's greedy tokens equal the cold run's. Redis is started with
``scripts/redis.sh start PORT`` (default port 6395, a server of this benchmark's own; its
db ``--db`` is flushed first). The record goes under ``benchmarks/results/``.

    .venv/bin/python benchmarks/shared_pool.py             # 5 prompts x 2,000 tokens
    .venv/bin/python benchmarks/shared_pool.py --quick     # 3 x 1,000
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from common import write_record  # noqa: E402

KEY_ENV, URL_ENV = "KVMAP_BENCH_SHARED_KEY", "KVMAP_BENCH_REDIS_URL"
SHARED_SPEC = f"bf16+tiers(redis=env:{URL_ENV},shared=true,shared_key=env:{KEY_ENV})"


def child(args) -> None:
    """One process: warm up, then each prompt alone; one JSON line on stdout."""
    import numpy as np
    import torch
    from kvmap import LLM, SamplingParams
    from kvmap.workloads.corpus import TextSource
    torch.set_num_threads(args.threads)
    llm = LLM(kv=args.kv, dtype="bf16", device="cpu", kv_memory="512MiB")
    source = TextSource(llm.tokenizer, np.random.default_rng(args.seed))
    prompts = [llm.encode(source.take(args.prompt_tokens)) for _ in range(args.prompts)]
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate(llm.encode(TextSource(llm.tokenizer, np.random.default_rng(999)).take(64)),
                 SamplingParams(max_tokens=2))
    outs = [llm.generate(p, params)[0] for p in prompts]
    store = llm.engine.offload
    print(json.dumps({
        "ttft_s": [o.metrics.ttft_s for o in outs],
        "prompt_tokens": [len(p) for p in prompts],
        "cached_tokens": [o.metrics.num_cached_prompt_tokens for o in outs],
        "tokens": [o.token_ids for o in outs],
        "store": store.as_dict() if store is not None else None,
        "redis": store.usage().get("redis") if store is not None else None}))
    llm.engine.close()


def run_child(args, role: str, kv: str, env: dict) -> dict:
    cmd = [sys.executable, __file__, "--child", "--kv", kv, "--prompts", str(args.prompts),
           "--prompt-tokens", str(args.prompt_tokens), "--max-tokens", str(args.max_tokens),
           "--seed", str(args.seed), "--threads", str(args.threads)]
    load_before = os.getloadavg()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{role} failed:\n{proc.stderr[-4000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out.update(role=role, kv=kv, load_average_before=load_before,
               load_average_after=os.getloadavg(),
               median_ttft_s=statistics.median(out["ttft_s"]))
    print(f"{role:7s} median TTFT {out['median_ttft_s'] * 1e3:8.1f} ms  "
          f"cached {sum(out['cached_tokens'])} tokens  load {load_before[0]:.1f}")
    return out


def start_redis(port: int, db: int) -> str:
    subprocess.run(["bash", str(ROOT / "scripts" / "redis.sh"), "start", str(port)], check=True)
    import redis
    url = f"redis://127.0.0.1:{port}/{db}"
    redis.Redis.from_url(url).flushdb()
    return url


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--kv", default=SHARED_SPEC, help=argparse.SUPPRESS)
    p.add_argument("--prompts", type=int, default=5)
    p.add_argument("--prompt-tokens", type=int, default=2000)
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)   # 2 spin under load
    p.add_argument("--port", type=int, default=6395)
    p.add_argument("--db", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="3 prompts x 1,000 tokens")
    args = p.parse_args()
    if args.quick:
        args.prompts, args.prompt_tokens = 3, 1000
    if args.child:
        return child(args)
    url = start_redis(args.port, args.db)
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}"
                                       f"{os.environ.get('PYTHONPATH', '')}",
           URL_ENV: url, KEY_ENV: os.environ.get(KEY_ENV) or os.urandom(32).hex()}
    runs = [run_child(args, "cold", "bf16", env), run_child(args, "writer", SHARED_SPEC, env),
            run_child(args, "reader", SHARED_SPEC, env), run_child(args, "cold", "bf16", env)]
    cold = statistics.median(runs[0]["ttft_s"] + runs[3]["ttft_s"])
    writer, reader = runs[1]["median_ttft_s"], runs[2]["median_ttft_s"]
    metrics = {
        "cold_ttft_p50_s": cold, "writer_ttft_p50_s": writer, "reader_ttft_p50_s": reader,
        "cold_over_reader": cold / reader, "writer_over_cold": writer / cold,
        "reader_fetched_tokens": runs[2]["store"]["num_fetched_tokens"],
        "reader_cached_tokens": sum(runs[2]["cached_tokens"]),
        "prompt_tokens": sum(runs[2]["prompt_tokens"]),
        "reader_redis_hits": runs[2]["redis"]["num_hits"],
        "reader_redis_errors": runs[2]["redis"]["errors"],
        "reader_tokens_equal_cold": runs[2]["tokens"] == runs[0]["tokens"],
        "writer_tokens_equal_cold": runs[1]["tokens"] == runs[0]["tokens"],
        "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in runs]}
    print(f"cold / reader TTFT: {cold / reader:.2f}x (target >= 3x); writer / cold: "
          f"{writer / cold:.2f}x; reader tokens equal cold: {metrics['reader_tokens_equal_cold']}")
    config = {"model": "smollm2", "dtype": "bf16", "kv": SHARED_SPEC, "prompts": args.prompts,
              "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
              "threads": args.threads, "seed": args.seed}
    print(f"record: {write_record('shared_pool', config, metrics)}")


if __name__ == "__main__":
    main()
