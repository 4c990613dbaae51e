"""Batch-1 decode in the main thread and in an engine thread of its own, in one run: what
a second OpenMP pool costs (``kvmap.hardware.omp_team``) and that loading the model in a
thread that exits, as ``kvmap serve`` now does, takes the cost away.

Arms, each in a fresh process (no pool survives from another arm):

- ``main``: load and decode in the main thread (``LLM.generate`` in a script, a bench cell);
- ``thread_after_main_load``: load in the main thread, decode in a second thread (the
  server before this change);
- ``thread_after_thread_load``: load in a thread that exits (``in_own_thread``), decode in
  a second thread (the server now).

    .venv/bin/python benchmarks/engine_thread_ab.py [--tokens 64] [--repeats 5] [--rounds 2]

A figure is the median over ``repeats`` generations of (time of 1 + ``tokens`` tokens -
time of 1 token) / ``tokens``: decode only, prefill subtracted. Arms alternate for
``rounds`` rounds. Writes ``engine_thread_ab-*.json`` (class, dtype, load average, and
each arm's OS thread count, OpenMP's workers included).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ARMS = ("main", "thread_after_main_load", "thread_after_thread_load")


def one_arm(arm: str, tokens: int, repeats: int) -> dict:
    """Run in a child process."""
    import threading
    import time

    from kvmap import LLM, SamplingParams
    from kvmap.hardware.omp_team import in_own_thread, os_thread_count

    def load():
        llm = LLM()
        llm.generate(["warm up"], SamplingParams(max_tokens=4))
        return llm
    llm = in_own_thread(load) if arm == "thread_after_thread_load" else load()

    def once(n: int, i: int) -> float:
        p = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        t0 = time.perf_counter()
        llm.generate([f"[{i}] Tell me about the history of the city of Paris."], p)
        return time.perf_counter() - t0

    out: dict = {}

    def decode() -> None:
        once(8, -1)
        out["ms_per_token"] = [(once(tokens + 1, i) - once(1, 1000 + i)) / tokens * 1e3
                               for i in range(repeats)]
        out["os_threads"] = os_thread_count()
    if arm == "main":
        decode()
    else:
        thread = threading.Thread(target=decode, name="kvmap-engine")
        thread.start()
        thread.join()
    return {"arm": arm, "dtype": str(llm.engine.dtype).removeprefix("torch."),
            "ms_per_token": out["ms_per_token"],
            "ms_per_token_median": statistics.median(out["ms_per_token"]),
            "os_threads": out["os_threads"], "load_average": list(os.getloadavg())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)   # the child's side
    args = ap.parse_args()
    if min(args.tokens, args.repeats, args.rounds) < 1:
        ap.error(f"--tokens={args.tokens}, --repeats={args.repeats} and "
                 f"--rounds={args.rounds} must be >= 1")
    if args.arm:
        print(json.dumps(one_arm(args.arm, args.tokens, args.repeats)))
        return
    sys.path.insert(0, os.path.dirname(__file__))
    from common import write_record
    from kvmap.hardware import detect
    from kvmap.hardware.threads import policy_env
    hw = detect()
    env = policy_env("default")
    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    for k in range(args.rounds):
        for arm in (ARMS if k % 2 == 0 else ARMS[::-1]):
            out = subprocess.run([sys.executable, __file__, "--arm", arm, "--tokens",
                                  str(args.tokens), "--repeats", str(args.repeats)],
                                 check=True, capture_output=True, text=True, env=env).stdout
            runs[arm].append(json.loads(out.strip().splitlines()[-1]))
            print(f"round {k} {arm:26s} {runs[arm][-1]['ms_per_token_median']:6.1f} ms/token",
                  flush=True)
    medians = {arm: statistics.median(ms for r in rs for ms in r["ms_per_token"])
               for arm, rs in runs.items()}
    print(f"\n{'arm':26s} {'ms/token':>9s} {'x main':>7s} {'OS threads':>11s}")
    for arm in ARMS:
        print(f"{arm:26s} {medians[arm]:9.1f} {medians[arm] / medians['main']:7.2f} "
              f"{runs[arm][-1]['os_threads']:11d}")
    dtype = runs["main"][0]["dtype"]
    print(f"({hw.machine_class}, {dtype}, batch-1 decode of the embedded SmolLM2, "
          f"OMP_WAIT_POLICY unset)")
    path = write_record("engine_thread_ab", {
        "tokens": args.tokens, "repeats": args.repeats, "rounds": args.rounds,
        "dtype": dtype, "machine_class": hw.machine_class, "omp_wait_policy": None},
        {"runs": runs, "ms_per_token_median": medians,
         "ratio_to_main": {arm: medians[arm] / medians["main"] for arm in ARMS}})
    print(f"record: {path}")


if __name__ == "__main__":
    main()
