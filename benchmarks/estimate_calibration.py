"""The bench estimator's constants (``kvmap.bench.estimate.Calibration``), fitted on this
machine from timed engine work, against the machine's rates measured in the same run
(``kvmap.hardware.probes.measure_rates``; the cached profile was taken under another
load, and the constants are ratios to the rates).

In a child process with the bench cells' OpenMP wait policy (``--wait-policy``), on the
embedded SmolLM2-135M in the profile's ``auto`` dtype:

- prefill: one request of P prompt tokens and one output token, P in --prefill; fitted
  ``t = P x a + P^2/2 x b + chunks x overhead`` -> ``e_prefill``, ``e_attn``;
- decode: B requests of P prompt tokens and 32 output tokens (EOS ignored) started
  together; the step time is the median gap between tokens while all B decode. Fitted
  per codec ``step = s0 + B x c + B x context x k`` over B in --batches and two prompt
  lengths -> the step overhead (``s0`` less the weights' read time), ``e_batch``,
  ``e_kv[codec]``;
- the decode-step proxy (``kvmap.hardware.threads.step_time_s``) before and after: how
  fast the machine ran meanwhile (``reference_step_s``; a run's estimate scales by the
  proxy measured at its start over this);
- fixed costs: a fresh interpreter importing what a cell imports (``start_s``), the
  weights read from the cache (``load_bytes_per_s``), an engine built on loaded weights
  (``build_bytes_per_s``), the checklist probes (``probes_measured_s``, for reference:
  ``probes_s`` holds their fixed part, the profiler's start).

Writes ``benchmarks/results/estimate_calibration-<time>.json`` with the fitted constants
and the profile rates they are relative to; ``kvmap.bench.estimate.Calibration`` holds
the values of the record it names. The load average is recorded: a fit on a busy machine
estimates a busy machine.

    PYTHONPATH=src .venv/bin/python benchmarks/estimate_calibration.py
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402

CHILD = r"""
import json, statistics, sys, time
import numpy as np, torch
from kvmap import LLM, SamplingParams
from kvmap.model.loader import load_model
cfg = json.loads(sys.argv[1])
out = {"prefill": [], "decode": [], "fixed": {}}
t = time.perf_counter(); loaded = load_model(None, getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[cfg["dtype"]]))
out["fixed"]["load_s"] = time.perf_counter() - t
rng = np.random.default_rng(0)
def prompts(n, p):
    return [rng.integers(100, 40000, p).tolist() for _ in range(n)]
def llm_for(kv):
    t = time.perf_counter()
    llm = LLM(dtype=cfg["dtype"], kv=kv, kv_memory="512MiB", max_num_seqs=64, max_num_batched_tokens=512)
    return llm, time.perf_counter() - t
llm, build = llm_for(cfg["dtype"])
out["fixed"]["build_s"] = build
llm.generate(prompts(1, 64), SamplingParams(max_tokens=4, ignore_eos=True))   # warm-up
for p in cfg["prefill"]:
    ts = []
    for _ in range(cfg["repeat"]):
        ids = prompts(1, p)
        t = time.perf_counter(); llm.generate(ids, SamplingParams(max_tokens=1, ignore_eos=True))
        ts.append(time.perf_counter() - t)
    out["prefill"].append({"tokens": p, "s": statistics.median(ts)})
for kv in cfg["codecs"]:
    llm, _ = llm_for(kv)
    llm.generate(prompts(2, 64), SamplingParams(max_tokens=4, ignore_eos=True))
    for p in cfg["contexts"]:
        for b in cfg["batches"]:
            gaps = []
            for _ in range(cfg["repeat"]):
                outs = llm.generate(prompts(b, p), SamplingParams(max_tokens=33, ignore_eos=True))
                # steps while all b decode: the last request's gaps (prefilled last)
                mine = outs[-1].metrics.token_times_s
                g = [y - x for x, y in zip(mine[1:], mine[2:])]
                gaps.append(statistics.median(g))
            out["decode"].append({"kv": kv, "batch": b, "context": p + 17, "step_s": statistics.median(gaps)})
from kvmap.bench.probes import run_probes, stability, decode_ops
t = time.perf_counter(); run_probes(llm, 0); out["fixed"]["probes_s"] = time.perf_counter() - t
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

    Robust to a busy machine rather than exact: prefill is a least-squares fit of two
    terms; a decode step is read at batch 1 and at the largest batch, each averaged over
    the contexts. The per-sequence cost splits into its linear part and its attention
    part by taking decode attention per (query, cached key) pair at twice prefill's
    (it reads the cache from blocks); each codec's own cost is the factor on the step
    overhead that its batch-1 step needs (a quantized cache adds operators a step)."""
    from kvmap.bench.estimate import ModelCost
    from kvmap.model.loader import model_config_of
    config = model_config_of(None, dtype)
    cost = ModelCost.of(config, dtype)
    flops = rates["matmul_flops"][dtype]["prefill"]
    bw = rates["read_bandwidth_bytes_per_s"]
    pre = measured["prefill"]
    a, b = _lstsq([[p["tokens"], p["tokens"] ** 2 / 2] for p in pre], [p["s"] for p in pre])
    k = 2 * b
    steps: dict[str, dict[int, float]] = {}
    contexts = []
    for d in measured["decode"]:
        steps.setdefault(d["kv"], {}).setdefault(d["batch"], []).append(d["step_s"])
        contexts.append(d["context"])
    ctx = _mean(contexts)
    base = {batch: _mean(v) for batch, v in steps[dtype].items()}
    b1, bn = min(base), max(base)
    per_seq = max((base[bn] - base[b1]) / (bn - b1), 1e-6)
    c = max(per_seq - k * ctx, 0.1 * per_seq)
    s0 = base[b1] - b1 * (c + k * ctx)
    overhead = max(s0 - cost.weight_bytes / bw, 0.1 * s0)
    factors = {"fp": 1.0}
    for kv, by_batch in steps.items():
        if kv != dtype:
            s_kv = _mean(by_batch[min(by_batch)]) - min(by_batch) * (c + k * ctx)
            factors[kv] = max(0.5, (s_kv - cost.weight_bytes / bw) / overhead)
    fixed = measured["fixed"]
    return {"e_prefill": cost.prefill_flop / (flops * a),
            "e_attn": cost.attn_flop_per_pair / (flops * b),
            "e_batch": cost.decode_flop / (flops * c),
            "e_kv": cost.attn_flop_per_pair / (flops * k),
            "step_overhead_s_per_layer": overhead / cost.num_layers,
            "step_factor": factors,
            "load_bytes_per_s": cost.weight_bytes / fixed["load_s"],
            "build_bytes_per_s": cost.weight_bytes / fixed["build_s"],
            "start_s": measured["start_s"],
            "reference_step_s": _mean(measured["step_proxy_s"]),
            "reference_cpu": cpu_model,
            "reference_fp32_flops": rates["matmul_flops"]["fp32"]["prefill"],
            "reference_bandwidth": bw,
            "probes_measured_s": fixed["probes_s"],
            "fit": {"step_s0": s0, "step_per_seq_s": c, "step_per_pair_s": k,
                    "prefill_per_token_s": a, "prefill_per_pair_s": b}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refit", help="a record of this script: fit its measurements again "
                    "(print only)")
    ap.add_argument("--wait-policy", default="PASSIVE")
    ap.add_argument("--prefill", default="128,1024,2048")
    ap.add_argument("--contexts", default="128,512")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--codecs", default="int8,int4")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    if args.refit:
        record = json.loads(open(args.refit).read())
        m = record["metrics"]
        print(json.dumps(fit(m["measured"], m["profile_rates"], record["config"]["dtype"],
                             record["environment"]["hardware"]["cpu_model"]), indent=1))
        return
    from kvmap.hardware import profile
    hw = profile()
    dtype = hw.auto_dtype("cpu")
    config = {"dtype": dtype, "prefill": [int(x) for x in args.prefill.split(",")],
              "contexts": [int(x) for x in args.contexts.split(",")],
              "batches": [int(x) for x in args.batches.split(",")],
              "codecs": [dtype, *args.codecs.split(",")], "repeat": args.repeat,
              "wait_policy": args.wait_policy}
    env = {**os.environ, "OMP_WAIT_POLICY": args.wait_policy}
    load_start = os.getloadavg()[0]
    from kvmap.hardware.threads import step_time_s
    proxy = [step_time_s(args.wait_policy)]
    starts = []
    for _ in range(3):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", START], env=env, check=True, capture_output=True)
        starts.append(time.perf_counter() - t)
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(config)], env=env,
                          check=True, capture_output=True, text=True)
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    measured["start_s"] = sorted(starts)[1]
    proxy.append(step_time_s(args.wait_policy))
    measured["step_proxy_s"] = proxy
    # the rates now, beside the timings (the cached profile was taken under another load)
    from kvmap.hardware.probes import measure_rates
    rates = measure_rates(hw)
    constants = fit(measured, rates, dtype, hw.cpu.model_name)
    path = write_record("estimate_calibration", config,
                        {"measured": measured, "constants": constants,
                         "profile_rates": rates, "cached_profile_rates": hw.rates, "load_avg_1m_start": load_start,
                         "load_avg_1m_end": os.getloadavg()[0]})
    print(json.dumps(constants, indent=1))
    print(f"record: {path}")


if __name__ == "__main__":
    main()
