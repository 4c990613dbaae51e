"""Faults in the tiers and the bench, measured (the fault suite in tests/faults asserts
correctness; this reports what the faults cost and counts what was detected).

1. Redis trouble: multi-turn chats on the tiny random model through
   ``tiers(redis=...)``, with Redis healthy, paused (SIGSTOP) for a third of the run,
   and answering slowly through a delaying proxy (below and above the tier's 0.2 s
   socket timeout). Reported per case: requests completed, greedy tokens equal to a
   run without tiers, tier errors, and how long the engine thread was blocked inside
   tier calls (total and the longest single call).
2. Tampering: every frame on disk and in Redis corrupted, truncated, replayed under
   another key or forged (valid CRC) mid-run: frames tampered, read again, detected,
   served (must be 0), tokens equal.
3. ``kill -9`` of ``kvmap bench`` at seeded random points, then resume: cells and
   tokens compared with an uninterrupted run; results lost and duplicated (must be 0).
4. The shared pool (``tiers(redis=..., shared=true)``, issue 28): a process reads the
   prompts' blocks another one published, with the pool healthy, poisoned by a key
   holder (NaN sealed into every frame), overwritten with garbage by a writer without the
   key, its frames' headers forged by a writer without the key to claim another layout
   (issue 38: refused for ever before the tag was checked first), and paused (SIGSTOP)
   for the whole run; then a third process reads again (does the pool heal?). A
   ``layout`` error in the forged case is a forged refusal (must be 0). Per case: tokens equal to a run without tiers, tokens fetched, the
   errors counted, and the engine thread's time inside the shared tier's calls
   (``get``, ``put``, ``discover``; its writes run on a thread of their own).

Needs ``redis-server`` on PATH (``scripts/redis.sh start`` installs it). One JSON record
goes to ``benchmarks/results/faults-<time>.json``.

    .venv/bin/python benchmarks/faults.py            # 3 kill seeds
    .venv/bin/python benchmarks/faults.py --seeds 1 --skip-kill
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402

from tests.conftest import make_tiny_llm  # noqa: E402
from tests.faults import test_bench_kill_resume as kill  # noqa: E402
from tests.faults import test_shared_pool_faults as shared  # noqa: E402
from tests.faults.slow_proxy import SlowProxy  # noqa: E402
from tests.faults.test_tampered_frames import TAMPERS, make_watch  # noqa: E402
from tests.kv.tiers.conftest import RedisServer  # noqa: E402
from tests.kv.tiers.test_store import NUM_BLOCKS, run_conversations  # noqa: E402


class Blocked:
    """Wall time the engine thread spends inside one tier's get and put."""

    def __init__(self, tier, names=("get", "put")) -> None:
        self.total_s, self.max_s, self.num_calls = 0.0, 0.0, 0
        for name in names:
            setattr(tier, name, self._timed(getattr(tier, name)))

    def _timed(self, fn):
        def call(*args):
            start_s = time.perf_counter()
            try:
                return fn(*args)
            finally:
                elapsed_s = time.perf_counter() - start_s
                self.total_s += elapsed_s
                self.max_s = max(self.max_s, elapsed_s)
                self.num_calls += 1
        return call


def redis_case(case: str, server: RedisServer, reference) -> dict:
    proxy = SlowProxy(server.port) if case.startswith("slow") else None
    url = proxy.url if proxy else server.url
    llm = make_tiny_llm(kv=f"fp32+tiers(redis={url},fetch=always)", num_blocks=NUM_BLOCKS)
    tier = llm.engine.offload.levels[0].tier
    blocked = Blocked(tier)
    delay_s = {"slow_20ms": 0.02, "slow_500ms": 0.5}.get(case, 0.0)

    def between(turn, conversation):
        if (turn, conversation) == (1, 0):
            if case == "paused":
                server.pause()
            elif proxy:
                proxy.delay_s = delay_s
        elif (turn, conversation) == (2, 0):
            if case == "paused":
                server.resume()
            elif proxy:
                proxy.delay_s = 0.0
    start_s = time.perf_counter()
    try:
        answers = run_conversations(llm, between)
    finally:
        if case == "paused":
            server.resume()
        if proxy:
            proxy.close()
    out = {"num_requests": len(answers), "tokens_equal": answers == reference,
           "tier_errors": dict(tier.stats.errors), "wall_s": time.perf_counter() - start_s,
           "engine_blocked_total_s": blocked.total_s,
           "engine_blocked_max_call_s": blocked.max_s, "num_tier_calls": blocked.num_calls}
    llm.engine.close()
    return out


def shared_case(case: str, server: RedisServer) -> dict:
    import redis as redis_py
    os.environ.update({"KVMAP_TEST_SHARED_URL": server.url, shared.KEY_ENV: shared.KEY})
    redis_py.Redis.from_url(server.url).flushall()
    reference = [o.token_ids for o in make_tiny_llm().generate(shared.PROMPTS,
                                                               shared.PARAMS)]
    _, _, writer, known = shared.run()
    num_tampered = (shared.poison(server, writer, known) if case == "poisoned" else
                    shared.garbage(server, writer) if case == "garbage" else
                    shared.forge(server, writer) if case == "forged" else 0)
    llm = make_tiny_llm(kv=shared.SPEC)
    store = llm.engine.offload.store
    tier = store.levels[-1].tier
    blocked = Blocked(tier, ("get", "put", "discover"))
    if case == "paused":
        server.pause()
    start_s = time.perf_counter()
    try:
        tokens = [o.token_ids for o in llm.generate(shared.PROMPTS, shared.PARAMS)]
    finally:
        if case == "paused":
            server.resume()
    wall_s = time.perf_counter() - start_s
    tier.flush()
    out = {"num_requests": len(tokens), "tokens_equal": tokens == reference,
           "num_tampered": num_tampered, "fetched_tokens": store.stats.num_fetched_tokens,
           "tier_errors": dict(tier.stats.errors), "store_errors": dict(store.stats.errors),
           "wall_s": wall_s, "engine_blocked_total_s": blocked.total_s,
           "engine_blocked_max_call_s": blocked.max_s, "num_tier_calls": blocked.num_calls}
    llm.engine.close()
    healed_tokens, healed, _, _ = shared.run()
    out.update(next_reader_fetched_tokens=healed.stats.num_fetched_tokens,
               next_reader_tokens_equal=healed_tokens == reference)
    return out


class _Request:
    """What ``make_watch`` asks of a pytest request, outside pytest."""

    def __init__(self, fixtures: dict) -> None:
        self.fixtures, self.finalizers = fixtures, []

    def getfixturevalue(self, name: str):
        return self.fixtures[name]

    def addfinalizer(self, fn) -> None:
        self.finalizers.append(fn)


def tamper_case(where: str, how: str, server: RedisServer, reference) -> dict:
    with tempfile.TemporaryDirectory() as d:
        request = _Request({"tmp_path": Path(d), "redis_server": server})
        llm, watch = make_watch(where, how, request)
        num_tampered = []

        def between(turn, conversation):
            if (turn, conversation) == (1, 0):
                watch.tamper()
                num_tampered.append(len(watch.tampered))
        answers = run_conversations(llm, between)
        e = watch.tier.stats.errors
        out = {"num_tampered": num_tampered[0], "num_read_again": watch.num_read_again,
               "num_detected": e.get("corrupt", 0) + e.get("auth", 0) - watch.errors_before,
               "num_served": watch.num_served, "tokens_equal": answers == reference}
        for fn in request.finalizers:
            fn()
        return out


def kill_runs(seeds: list[int]) -> dict:
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        (folder / "tasks.py").write_text(kill.TASKS_PY)
        (folder / "s.yaml").write_text(textwrap.dedent(kill.SCENARIO))
        start_s = time.monotonic()
        subprocess.run(kill.bench_cmd(folder, folder / "clean"), capture_output=True,
                       env=kill.env(), check=True, timeout=600)
        duration_s = time.monotonic() - start_s
        cells, tokens = kill.summary(folder / "clean")
        runs = []
        for seed in seeds:
            out = folder / f"k{seed}"
            run = kill.kill_at_a_random_point(folder, out, seed, len(cells))
            subprocess.run(kill.bench_cmd(folder, out), capture_output=True, env=kill.env(),
                           check=True, timeout=600)
            got_cells, got_tokens = kill.summary(out)   # asserts no duplicates
            runs.append({**run, "cells_lost": len(set(cells) - set(got_cells)),
                         "cells_differing": sum(got_cells.get(c) != v
                                                for c, v in cells.items()),
                         "tokens_equal": got_tokens == tokens})
        return {"uninterrupted_s": duration_s, "num_cells": len(cells), "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--skip-kill", action="store_true")
    args = ap.parse_args()
    reference = run_conversations(make_tiny_llm(kv="fp32+recompute", num_blocks=NUM_BLOCKS))
    server = RedisServer().start()
    try:
        redis = {case: redis_case(case, server, reference)
                 for case in ("healthy", "paused", "slow_20ms", "slow_500ms")}
        tamper = {f"{where}/{how}": tamper_case(where, how, server, reference)
                  for where in ("disk", "redis") for how in TAMPERS}
        pool = {case: shared_case(case, server)
                for case in ("healthy", "poisoned", "garbage", "forged", "paused")}
    finally:
        server.kill()
    kills = None if args.skip_kill else kill_runs(list(range(1, args.seeds + 1)))

    print(f"{'redis case':12} {'reqs':>5} {'tokens ok':>9} {'blocked s':>10} "
          f"{'max call s':>10}  errors")
    for case, r in redis.items():
        print(f"{case:12} {r['num_requests']:>5} {str(r['tokens_equal']):>9} "
              f"{r['engine_blocked_total_s']:>10.3f} {r['engine_blocked_max_call_s']:>10.3f}"
              f"  {r['tier_errors']}")
    print(f"\n{'tampering':16} {'tampered':>8} {'read':>5} {'detected':>8} {'served':>6} "
          f"{'tokens ok':>9}")
    for case, t in tamper.items():
        print(f"{case:16} {t['num_tampered']:>8} {t['num_read_again']:>5} "
              f"{t['num_detected']:>8} {t['num_served']:>6} {str(t['tokens_equal']):>9}")
    print(f"\n{'shared pool':12} {'tokens ok':>9} {'fetched':>7} {'blocked s':>10} "
          f"{'max call s':>10} {'next reader fetched':>19}  errors")
    for case, r in pool.items():
        print(f"{case:12} {str(r['tokens_equal']):>9} {r['fetched_tokens']:>7} "
              f"{r['engine_blocked_total_s']:>10.3f} {r['engine_blocked_max_call_s']:>10.3f}"
              f" {r['next_reader_fetched_tokens']:>19}  "
              f"{ {**r['tier_errors'], **r['store_errors']} }")
    if kills:
        print(f"\nkill -9 / resume ({kills['num_cells']} cells, uninterrupted "
              f"{kills['uninterrupted_s']:.1f} s)")
        for r in kills["runs"]:
            print(f"  seed {r['seed']}: killed {r['killed']} after {r['after_cells']} "
                  f"cells + {r['extra_s']:.2f} s ({r['cells_stored_at_kill']} stored); "
                  f"lost {r['cells_lost']}, differing {r['cells_differing']}, tokens "
                  f"equal {r['tokens_equal']}")
    forged = pool["forged"]["tier_errors"].get("layout", 0)
    print(f"\nforged refusals (layout errors from forged headers): {forged}")
    path = write_record("faults", {"seeds": args.seeds, "model": "dummy:tiny", "dtype": "fp32",
                                   "num_blocks": NUM_BLOCKS},
                        {"redis": redis, "tampering": tamper, "shared_pool": pool,
                         "kill_resume": kills, "num_forged_refusals": forged})
    print(f"\nrecord: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
