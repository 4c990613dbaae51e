"""The bench estimator's calibration (``kvmap.perf.calibration.Calibration``) for the
machine class and compute dtype that runs it, fitted from timed engine work against the
machine's rates measured in the same run (``kvmap.hardware.probes.measure_rates``; the
cached profile was taken under another load, and the constants are ratios to the rates).

In a child process with the bench cells' OpenMP wait policy (``--wait-policy``), on the
embedded SmolLM2-135M in the profile's ``auto`` dtype (``KVMAP_NATIVE_BF16=0|1`` forces
the other; the class it then reports names the record):

Every timing below and the decode-step proxy (``kvmap.hardware.threads``' own code,
in process) run round-robin, ``--repeat`` rounds, each keeping its median: a burst of
other load falls on one round of every measurement, and the proxy's median is the
``reference_step_s`` the constants belong to (a run scales its estimate by its own
proxy over this one, on this class only).

- prefill: one request of P prompt tokens and one output token, P in --prefill; fitted
  ``t = P x a + P^2/2 x b + chunks x overhead`` -> ``e_prefill``, ``e_attn``;
- decode: B requests of P prompt tokens and 16 output tokens (EOS ignored) started
  together; the step time is the median gap between tokens while all B decode. Fitted
  per codec ``step = s0 + B x c + B x context x k`` over B in --batches and two prompt
  lengths -> the step overhead (``s0`` less the weights' read time), ``e_batch``,
  ``e_kv``, the decode factor of each other codec;
- fixed costs, measured, not assumed: a fresh interpreter importing what a cell imports
  (``start_s``), the weights read from the cache (``load_bytes_per_s``), an engine built
  on loaded weights (``build_bytes_per_s``); and a real ``kvmap bench`` of a tiny
  scenario (three cells of one 16-token request): a cell forked from the warm worker
  (``cell_s``), the checklist probes (``probes_s``: the first cell less the others), the
  warm worker's start (``worker_s``), and the run's own (``run_s``: the wall time less
  the cells').

Writes ``benchmarks/results/estimate_calibration-<class>-<dtype>-<time>.json`` (the record)
and the calibration beside the hardware profile (this machine's own, used by ``kvmap
bench`` from now on); ``--ship`` also writes it under ``src/kvmap/perf/calibrations/``
(every machine of the class). The load average is recorded: a fit on a busy machine
estimates a busy machine.

    PYTHONPATH=src .venv/bin/python benchmarks/estimate_calibration.py [--ship]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, statistics, sys, time
import numpy as np, torch
from kvmap import LLM, SamplingParams
from kvmap.hardware.threads import _PROXY
from kvmap.model.loader import load_model
cfg = json.loads(sys.argv[1])
out = {"prefill": [], "decode": [], "fixed": {}, "proxy_s": []}
t = time.perf_counter(); load_model(None, getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[cfg["dtype"]]))
out["fixed"]["load_s"] = time.perf_counter() - t
proxy_src = _PROXY.split("step()\nbest")[0]          # the proxy's setup and step()
sys.argv = [sys.argv[0], str(torch.get_num_threads()), "4"]
space = {}
exec(proxy_src, space)
def proxy():
    t = time.perf_counter(); space["step"](); space["step"](); return (time.perf_counter() - t) / 2
rng = np.random.default_rng(0)
def prompts(n, p):
    return [rng.integers(100, 40000, p).tolist() for _ in range(n)]
llms = {}
for kv in cfg["codecs"]:
    t = time.perf_counter()
    llms[kv] = LLM(dtype=cfg["dtype"], kv=kv, kv_memory="512MiB", max_num_seqs=64, max_num_batched_tokens=512)
    out["fixed"].setdefault("build_s", time.perf_counter() - t)
    llms[kv].generate(prompts(2, 64), SamplingParams(max_tokens=4, ignore_eos=True))
base = llms[cfg["dtype"]]
def prefill(p):
    ids = prompts(1, p)
    t = time.perf_counter(); base.generate(ids, SamplingParams(max_tokens=1, ignore_eos=True))
    return time.perf_counter() - t
def decode(kv, b, p):
    outs = llms[kv].generate(prompts(b, p), SamplingParams(max_tokens=17, ignore_eos=True))
    mine = outs[-1].metrics.token_times_s           # the last prefilled: all b decode
    return statistics.median(y - x for x, y in zip(mine[1:], mine[2:]))
tasks = [("prefill", p) for p in cfg["prefill"]] + [
    ("decode", kv, b, p) for kv in cfg["codecs"] for p in cfg["contexts"] for b in cfg["batches"]]
times = {task: [] for task in tasks}
for _ in range(cfg["repeat"]):                        # round-robin: load falls on all alike
    for task in tasks:
        out["proxy_s"].append(proxy())
        times[task].append(prefill(task[1]) if task[0] == "prefill" else decode(*task[1:]))
for task, ts in times.items():
    if task[0] == "prefill":
        out["prefill"].append({"tokens": task[1], "s": statistics.median(ts)})
    else:
        out["decode"].append({"kv": task[1], "batch": task[2], "context": task[3] + 9,
                              "step_s": statistics.median(ts)})
from kvmap.bench.probes import run_probes
t = time.perf_counter(); run_probes(base, 0); out["fixed"]["probes_s"] = time.perf_counter() - t
print(json.dumps(out))
"""

START = ("import time; t = time.perf_counter(); import torch, kvmap.bench.cell, "
         "kvmap.bench.drive, kvmap.bench.probes, kvmap.engine.llm, kvmap.evals, "
         "kvmap.workloads; print(time.perf_counter() - t)")


def _lstsq(rows: list[list[float]], ys: list[float]) -> list[float]:
    import numpy as np
    coef, *_ = np.linalg.lstsq(np.array(rows), np.array(ys), rcond=None)
    return [float(c) for c in coef]


def _mean(xs) -> float:
    return sum(xs) / len(xs)


def fit(measured: dict, rates: dict, dtype: str, cpu_model: str) -> dict:
    """The ``Calibration`` fields from the child's timings and the profile's rates.

    Prefill is a least-squares fit of its two terms; the base cache's decode steps of
    ``s0 + B x c + B x context x k``; each other codec's factor on the whole decode time
    is the median ratio of its steps to the base cache's at the same batch and context
    (the timings ran round-robin, so the ratios hold when the load drifted)."""
    import statistics

    from kvmap.model.loader import model_config_of
    from kvmap.perf.shape import StepShape
    config = model_config_of(None, dtype)
    shape = StepShape.of(config, dtype)
    flops = rates["matmul_flops"][dtype]["prefill"]
    bw = rates["read_bandwidth_bytes_per_s"]
    pre = measured["prefill"]
    a, b = (max(x, 1e-9) for x in _lstsq([[p["tokens"], p["tokens"] ** 2 / 2] for p in pre],
                                          [p["s"] for p in pre]))
    base = {(d["batch"], d["context"]): d["step_s"] for d in measured["decode"]
            if d["kv"] == dtype}
    s0, c, k = (max(x, 1e-9) for x in _lstsq([[1.0, bt, bt * ctx] for bt, ctx in base],
                                              list(base.values())))
    # a batch-1 step is the weights streamed plus the operators' dispatch; where the
    # read probe's bandwidth leaves no room for the dispatch, the stream ran faster than
    # the probe (e_stream > 1) and the dispatch keeps a tenth of the step
    e_stream = max(1.0, shape.weight_bytes / bw / (0.9 * s0))
    overhead = s0 - shape.weight_bytes / (bw * e_stream)
    factors = {"fp": 1.0}
    for kv in sorted({d["kv"] for d in measured["decode"]} - {dtype}):
        factors[kv] = statistics.median(d["step_s"] / base[d["batch"], d["context"]]
                                        for d in measured["decode"] if d["kv"] == kv)
    factors["other"] = max(factors.values())
    fixed = measured["fixed"]
    bench = measured.get("bench") or {}
    out = {"e_prefill": shape.prefill_flop / (flops * a),
           "e_attn": shape.attn_flop_per_pair / (flops * b),
           "e_batch": shape.decode_flop / (flops * c),
           "e_kv": shape.attn_flop_per_pair / (flops * k),
           "e_stream": e_stream, "step_overhead_s_per_layer": overhead / shape.num_layers,
           "decode_factor": factors,
           "load_bytes_per_s": shape.weight_bytes / fixed["load_s"],
           "build_bytes_per_s": shape.weight_bytes / fixed["build_s"],
           "start_s": measured["start_s"],
           "reference_step_s": sorted(measured["proxy_s"])[len(measured["proxy_s"]) // 2],
           "reference_cpu": cpu_model,
           "reference_flops": {d: r["prefill"] for d, r in rates["matmul_flops"].items()},
           "reference_bandwidth": bw, "dtype": dtype}
    out.update({k: bench[k] for k in ("cell_s", "probes_s", "worker_s", "run_s") if k in bench})
    return out


TINY = """
name: fixed-costs
seed: 0
models: [smollm2]
engine: {{kv_memory: 64MiB, max_num_seqs: 8, max_num_batched_tokens: 512}}
kv: [{dtype}]
workloads:
{workloads}
"""


def measure_bench(env: dict, dtype: str, workdir: str) -> dict:
    """A real ``kvmap bench`` of a tiny scenario (module docstring): its fixed costs."""
    from kvmap.runs.store import RunStore
    lines = "\n".join(f"  - {{name: w{i}, kind: synthetic, num_requests: 1, prompt_len: 16, "
                      f"output_len: 1, arrival: 'closed:1'}}" for i in range(3))
    path = os.path.join(workdir, "tiny.yaml")
    with open(path, "w") as f:
        f.write(TINY.format(dtype=dtype, workloads=lines))
    out = os.path.join(workdir, "run")
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kvmap.cli", "bench", path, "--out", out],
                   env=env, check=True, capture_output=True)
    wall = time.perf_counter() - t
    cells = RunStore(out).cells()
    walls = [c.estimate["actual_s"] for c in cells]
    durations = [c.duration_s for c in cells]
    cell_s = statistics.median(walls[1:])
    return {"wall_s": wall, "cell_actual_s": walls, "cell_duration_s": durations,
            "cell_s": cell_s, "probes_s": max(0.0, durations[0] - statistics.median(durations[1:])),
            "worker_s": walls[0] - durations[0], "run_s": wall - sum(walls)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refit", help="a record of this script: fit its measurements again "
                    "(print only)")
    ap.add_argument("--wait-policy", default="PASSIVE")
    ap.add_argument("--prefill", default="128,1024,2048")
    ap.add_argument("--contexts", default="128,512")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--codecs", default="int8,int4")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ship", action="store_true", help="also write the calibration under "
                    "src/kvmap/perf/calibrations/ (every machine of this class)")
    args = ap.parse_args()
    if args.refit:
        record = json.loads(open(args.refit).read())
        m = record["metrics"]
        print(json.dumps(fit(m["measured"], m["profile_rates"], record["config"]["dtype"],
                             record["environment"]["hardware"]["cpu_model"]), indent=1))
        return
    from kvmap.hardware import profile
    from kvmap.perf.calibration import SHIPPED_DIR
    hw = profile()
    dtype = hw.auto_dtype("cpu")
    config = {"dtype": dtype, "prefill": [int(x) for x in args.prefill.split(",")],
              "contexts": [int(x) for x in args.contexts.split(",")],
              "batches": [int(x) for x in args.batches.split(",")],
              "codecs": [dtype, *args.codecs.split(",")], "repeat": args.repeat,
              "wait_policy": args.wait_policy}
    env = {**os.environ, "OMP_WAIT_POLICY": args.wait_policy}
    load_start = os.getloadavg()[0]
    starts = []
    for _ in range(3):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", START], env=env, check=True, capture_output=True)
        starts.append(time.perf_counter() - t)
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(config)], env=env,
                          check=True, capture_output=True, text=True)
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    measured["start_s"] = sorted(starts)[1]
    with tempfile.TemporaryDirectory() as workdir:
        measured["bench"] = measure_bench(dict(os.environ), dtype, workdir)
    # the rates now, beside the timings (the cached profile was taken under another load)
    from kvmap.hardware.probes import measure_rates
    from kvmap.perf.calibration import Calibration, store
    rates = measure_rates(hw)
    name = f"estimate_calibration-{hw.machine_class}-{dtype}"
    constants = fit(measured, rates, dtype, hw.cpu.model_name)
    path = write_record(name, config,
                        {"measured": measured, "constants": constants,
                         "machine_class": hw.machine_class, "dtype": dtype,
                         "profile_rates": rates, "cached_profile_rates": hw.rates,
                         "load_avg_1m_start": load_start,
                         "load_avg_1m_end": os.getloadavg()[0]})
    cal = Calibration.from_dict({**constants, "machine_class": hw.machine_class,
                                 "wait_policy": args.wait_policy,
                                 "source": os.path.relpath(path, ROOT)})
    print(json.dumps(constants, indent=1))
    print(f"record: {path}")
    print(f"beside the profile: {store(cal, hw)}")
    if args.ship:
        print(f"shipped: {store(cal, hw, SHIPPED_DIR)}")


if __name__ == "__main__":
    main()
