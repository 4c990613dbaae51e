"""Can the simulator run on the engine's own scheduler? (issue 34, measured, not done)

The simulator (``kvmap.plan.sim``) keeps its own copy of continuous batching: its queues,
its block store, its preemption. The alternative is the engine's real ``Scheduler`` and
``BlockPool`` driven with a tensor-free cache (the scheduler reads only ``pool`` and
``block_size`` of it) and a "runner" that computes nothing: each step's time is
``kvmap.perf.roofline.step_time`` of what the step computes, the tokens are counted
and a placeholder token is appended. This script times both over the same requests at
GPU-pool scale (``--blocks`` 50,000 blocks of 16 tokens, ``--requests`` 10,000, all
arriving at once, prefix caching off) and prints the ratio of their wall times, the
question being whether the real scheduler is fast enough (within ~10x of the copy).

Both loops see the same lengths (a seeded draw), the same pool (the simulator's KV
memory set to the engine pool's block count), ``max_num_seqs`` and the step's token
budget. ``--prefix`` turns prefix caching on in both (the real scheduler then hashes
every full block of synthetic token ids, as the engine does).

    PYTHONPATH=src python benchmarks/sim_on_scheduler.py                 # 50k blocks, 10k requests
    PYTHONPATH=src python benchmarks/sim_on_scheduler.py --requests 2000 # smaller
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402

from kvmap.config import SchedulerConfig  # noqa: E402
from kvmap.engine.scheduler import Scheduler  # noqa: E402
from kvmap.kv.config import KVConfig  # noqa: E402
from kvmap.kv.pool import BlockPool  # noqa: E402
from kvmap.kv.spec import KVGeometry  # noqa: E402
from kvmap.model.shapes import get_shape  # noqa: E402
from kvmap.perf.calibration import CALIBRATION  # noqa: E402
from kvmap.perf.rates import Rates  # noqa: E402
from kvmap.perf.roofline import step_time  # noqa: E402
from kvmap.perf.shape import StepShape  # noqa: E402
from kvmap.plan.capacity import COMPUTE_DTYPE  # noqa: E402
from kvmap.plan.catalogue import PlanModel  # noqa: E402
from kvmap.plan.sim import EngineSettings, SimConfig, SimRequest, simulate  # noqa: E402
from kvmap.plan.sim.hardware import gpu_hardware  # noqa: E402
from kvmap.request import Request, SamplingParams  # noqa: E402

MODEL = "llama-3-8b"
BLOCK_SIZE = 16


def lengths(num: int, seed: int = 0) -> list[tuple[int, int]]:
    """(prompt, output) tokens: prompts 256-2048, outputs 32-256, seeded."""
    rng = random.Random(seed)
    return [(rng.randint(256, 2048), rng.randint(32, 256)) for _ in range(num)]


def run_scheduler(work: list[tuple[int, int]], args) -> dict:
    """The engine's ``Scheduler`` + ``BlockPool`` with a tensor-free cache; each step timed
    by perf's roofline (simulated seconds) while the loop's own wall time is measured."""
    config = get_shape(MODEL)
    shape, cal = StepShape.of(config, "bf16"), CALIBRATION
    rates = Rates.of(None, "bf16", None, cal)
    cache = SimpleNamespace(pool=BlockPool(args.blocks, BLOCK_SIZE), block_size=BLOCK_SIZE)
    sched = Scheduler(SchedulerConfig(args.max_num_seqs, args.max_num_batched_tokens), cache,
                      prefix_salt=b"sim" if args.prefix else None)
    for i, (prompt, output) in enumerate(work):
        ids = [1 + (i * 7919 + t) % 30000 for t in range(prompt)]
        sched.add(Request(str(i), ids, SamplingParams(max_tokens=output, ignore_eos=True),
                          0.0))
    sim_s, steps, finished, most = 0.0, 0, 0, 0
    t0 = time.perf_counter()
    while sched.has_unfinished():
        batch = sched.schedule()
        if not batch.items:
            raise RuntimeError("the scheduler made no progress")
        counts = dict(prefill_tokens=0, prefill_pairs=0, decode_tokens=0, decode_pairs=0)
        for req, n in batch.items:
            start = req.num_computed_tokens
            if req.is_prefilling:
                counts["prefill_tokens"] += n
                counts["prefill_pairs"] += ((start + n) * (start + n + 1)
                                            - start * (start + 1)) // 2
            else:
                counts["decode_tokens"] += 1
                counts["decode_pairs"] += start + 1
        sim_s += step_time(shape, rates, "bf16", cal, **counts).total_s
        steps += 1
        most = max(most, len(batch.items))
        for req, n in batch.items:           # the "runner": count, append a token
            req.num_computed_tokens += n
            req.num_kv_slots += n
            sched.register_full_blocks(req)
            if req.num_computed_tokens == req.num_tokens:
                req.token_ids.append(1)
                req.metrics.token_times_s.append(sim_s)     # as the engine stamps them
                if len(req.token_ids) - len(req.prompt_token_ids) >= req.params.max_tokens:
                    sched.remove(req)
                    finished += 1
    wall_s = time.perf_counter() - t0
    return {"wall_s": wall_s, "steps": steps, "finished": finished,
            "preemptions": sched.num_preemptions, "simulated_s": sim_s,
            "most_running": most}


def run_plan_sim(work: list[tuple[int, int]], args) -> dict:
    """``kvmap.plan.sim`` over the same lengths and pool (its own loop and block store)."""
    config = get_shape(MODEL)
    kv = KVConfig.parse("bf16")
    block_bytes = kv.codec.block_bytes(KVGeometry.of(config, BLOCK_SIZE), COMPUTE_DTYPE)
    sim = SimConfig(name="copy", model=PlanModel(config), hardware=gpu_hardware("h100-80gb"),
                    kv=kv, workload=None, weights="bf16",
                    engine=EngineSettings(block_size=BLOCK_SIZE, max_num_seqs=args.max_num_seqs,
                                          max_num_batched_tokens=args.max_num_batched_tokens,
                                          enable_prefix_caching=args.prefix,
                                          kv_memory_bytes=args.blocks * block_bytes))
    requests = [SimRequest(str(i), p, o, arrival_s=0.0) for i, (p, o) in enumerate(work)]
    t0 = time.perf_counter()
    result = simulate(sim, requests)
    wall_s = time.perf_counter() - t0
    return {"wall_s": wall_s, "steps": result.num_steps, "finished": len(result.records),
            "preemptions": result.num_preemptions, "most_running": result.kv["max_running"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=50_000)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--max-num-seqs", type=int, default=512)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--prefix", action="store_true", help="prefix caching on in both")
    args = ap.parse_args()
    work = lengths(args.requests)
    load_before = os.getloadavg()[0]
    real = run_scheduler(work, args)
    copy = run_plan_sim(work, args)
    load_after = os.getloadavg()[0]
    ratio = real["wall_s"] / copy["wall_s"]
    print(f"{args.requests} requests, {args.blocks} blocks of {BLOCK_SIZE}, "
          f"max_num_seqs {args.max_num_seqs}, budget {args.max_num_batched_tokens}, "
          f"prefix caching {'on' if args.prefix else 'off'}")
    print(f"{'loop':<26} {'wall s':>8} {'steps':>7} {'finished':>9} {'preempt':>8} "
          f"{'most running':>13}")
    print(f"{'engine Scheduler+BlockPool':<26} {real['wall_s']:>8.1f} {real['steps']:>7} "
          f"{real['finished']:>9} {real['preemptions']:>8} {real['most_running']:>13}")
    print(f"{'plan/sim (its own copy)':<26} {copy['wall_s']:>8.1f} {copy['steps']:>7} "
          f"{copy['finished']:>9} {copy['preemptions']:>8} {copy['most_running']:>13}")
    print(f"the real scheduler's loop takes {ratio:.2f}x the copy's wall time "
          f"(load {load_before:.1f} -> {load_after:.1f})")
    path = write_record("sim_on_scheduler", {
        "model": MODEL, "blocks": args.blocks, "block_size": BLOCK_SIZE,
        "requests": args.requests, "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens, "prefix": args.prefix,
        "dtype": "bf16"},
        {"engine_scheduler": real, "plan_sim": copy, "wall_ratio": ratio,
         "load_average": [load_before, load_after]})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
