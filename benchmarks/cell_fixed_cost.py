"""What a bench cell costs before it measures anything: the per-cell fixed cost of
``kvmap bench``, before and after warm workers and probes once per configuration.

Each variant runs ``kvmap bench`` (a fresh process, as a user would) on a scenario of N
trivial cells -- SmolLM2-135M, one KV spec, N workloads of one request of 16 prompt
tokens and 2 output tokens -- for N = --small and N = --large; the per-cell fixed cost is
the slope ``(T(large) - T(small)) / (large - small)`` of the command's wall time, which
cancels what a run pays once (the thread-policy probe, the report) and leaves what
every cell pays (its process or fork, imports, weights, engine build, probes) plus its
one tiny request. Variants:

- ``before``: another checkout's code (``--before-src``, e.g. main before this change):
  a fresh process per cell, probes in every cell;
- ``cold``: this code with ``KVMAP_BENCH_WARM=0`` (fresh processes, probes once);
- ``after``: this code (warm worker, probes once).

The variants alternate size by size; the load average is recorded.

    PYTHONPATH=src python benchmarks/cell_fixed_cost.py --before-src /path/to/main/src
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402


def scenario_text(n: int) -> str:
    workloads = "\n".join(f"  - {{name: w{i}, kind: synthetic, num_requests: 1, "
                          f"prompt_len: 16, output_len: 2}}" for i in range(n))
    return (f"name: fixed{n}\nmodels: [smollm2]\nkv: [auto]\n"
            f"engine: {{kv_memory: 64MiB}}\nworkloads:\n{workloads}\n")


def run(src: str, n: int, env_extra: dict, work: Path) -> float:
    path = work / f"s{n}.yaml"
    path.write_text(scenario_text(n))
    out = work / f"run-{n}-{time.monotonic_ns()}"
    env = {**os.environ, "PYTHONPATH": src, **env_extra}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "kvmap.cli", "bench", str(path), "--out",
                           str(out), "--json"], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    shutil.rmtree(out, ignore_errors=True)
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before-src", required=True)
    ap.add_argument("--small", type=int, default=2)
    ap.add_argument("--large", type=int, default=6)
    args = ap.parse_args()
    here = str(Path(__file__).resolve().parents[1] / "src")
    variants = {"before": (args.before_src, {}), "cold": (here, {"KVMAP_BENCH_WARM": "0"}),
                "after": (here, {})}
    # the same wait policy for every variant (no measurement differences between them)
    fixed_env = {"KVMAP_CELL_OMP_WAIT_POLICY": "PASSIVE", "KVMAP_BENCH_SLOWDOWN": "1"}
    load_start = os.getloadavg()[0]
    walls: dict = {name: {} for name in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (args.small, args.large):
            for name, (src, env) in variants.items():
                walls[name][n] = run(src, n, {**fixed_env, **env}, Path(tmp))
                print(f"{name} n={n}: {walls[name][n]:.1f} s", flush=True)
    per_cell = {name: (w[args.large] - w[args.small]) / (args.large - args.small)
                for name, w in walls.items()}
    path = write_record("cell_fixed_cost", vars(args),
                        {"wall_s": walls, "per_cell_s": per_cell,
                         "load_avg_1m_start": load_start,
                         "load_avg_1m_end": os.getloadavg()[0]})
    for name, s in per_cell.items():
        print(f"{name}: {s:.1f} s a cell")
    print(f"record: {path}")


if __name__ == "__main__":
    main()
