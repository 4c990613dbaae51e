"""Calibrate ``kvmap simulate`` against the real engine on this machine.

1. This machine as the simulator sees it: its hardware profile and the calibration
   record of its class and dtype (``kvmap.plan.sim.machine.this_machine``: the record
   the budget estimate uses, ``kvmap.perf.calibration``; the codec's cost is its factor).
2. Run small workloads through the engine (``LLM()``, the embedded SmolLM2-135M in the
   machine's auto dtype, ``--threads``) and through the simulator on the measured
   ``cpu-this-machine``, with the same requests (exact prompt token counts), pool, block
   size, token budget and sequence limit. Nothing of the SmolLM2 runs feeds the
   simulator.
3. Print prediction errors (simulated / measured - 1) of output throughput, P50 TBT,
   P50 TTFT and mean E2E, and write a JSON record under ``benchmarks/results/``.
4. The memory-bound scenario (issues 15 and 26: a 72 MiB pool, about 16 bf16 requests;
   64 requests of 180-220 prompt and 64 output tokens in a closed loop of 64), per KV
   configuration (bf16, int8, int4 and one policy), the KV specs alternating over
   ``--repeats``: the engine's output tokens/s beside what ``kvmap simulate`` on
   ``cpu-this-machine`` predicts for the same
   requests and pool, the machine slowed to the share of its threads' time the engine
   ran (its process CPU time over its wall time x threads: on a machine others load, a
   run of minutes gets that share; the probes, short and repeated, measure the machine
   unloaded) -- the error of each prediction, and of each configuration's throughput
   relative to bf16 (the question "is int8 a speed gain here?"), target within 20%. Each
   step is timed and its load counted, so the cost model is also checked on the
   engine's own steps (decode-only ones and ones with a prefill chunk), apart from the
   scheduling.

In steps 1-3 the estimate's slowdown (``bench.estimate.current_slowdown``: the decode-step
proxy now over the calibration's) taken around each engine run rescales the calibrated
machine to its speed during the run (``hardware.scaled``; the unscaled prediction is
reported too); in step 4 it is printed beside the CPU share. The reported error is the median of the per-repeat errors. The record names the machine class and the load average of every
run: figures from a loaded machine (load above ~2.5 on two cores) are not speed claims.

    .venv/bin/python benchmarks/sim_calibration.py            # three workloads
    .venv/bin/python benchmarks/sim_calibration.py --quick    # smaller
    .venv/bin/python benchmarks/sim_calibration.py --sections bound --threads 2
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402
from memory_bound import run as run_bound  # noqa: E402

from kvmap import LLM, SamplingParams  # noqa: E402
from kvmap.metrics import aggregate  # noqa: E402
from kvmap.config import parse_size  # noqa: E402
from kvmap.kv.config import KVConfig  # noqa: E402
from kvmap.plan.catalogue import PlanModel  # noqa: E402
from kvmap.plan.sim import EngineSettings, SimConfig, simulate  # noqa: E402
from kvmap.plan.sim import machine  # noqa: E402
from kvmap.plan.sim.hardware import scaled  # noqa: E402
from kvmap.plan.sim.costmodel import (KVWork, StepLoad, causal_pairs, model_cost,  # noqa: E402
                                      step_cost)
from kvmap.plan.sim.workload import requests_from_workload  # noqa: E402
from kvmap.workloads.presets import build_requests, get_preset  # noqa: E402
from kvmap.workloads.arrivals import ClosedLoop  # noqa: E402
from kvmap.workloads.lengths import Uniform  # noqa: E402

KV_MEMORY = "256MiB"
BOUND_KV_MEMORY = "72MiB"                # the memory-bound scenario of issue 15
BOUND_SPECS = ("bf16", "int8", "int4", "streaming_llm(budget=0.25)")
ERROR_TARGET = 0.2
BOUND_OUTPUT_TOKENS = 64
METRICS = (("output_tokens_per_s", None, "out tok/s"), ("tbt_s", "p50", "TBT p50"),
           ("ttft_s", "p50", "TTFT p50"), ("e2e_s", "mean", "E2E mean"))


def workloads(quick: bool) -> list[tuple[str, object, int]]:
    """(label, WorkloadSpec, max_num_seqs): all requests are sent at once; the engine's
    sequence limit is the concurrency."""
    base = get_preset("throughput")
    scale = 2 if quick else 1
    return [
        ("batch-1", replace(base, name="cal-b1", num_requests=4 // scale,
                            prompt_len=Uniform(96, 160), output_len=Uniform(48, 80),
                            arrival=ClosedLoop(1)), 1),
        ("batch-8", replace(base, name="cal-b8", num_requests=16 // scale,
                            prompt_len=Uniform(96, 160), output_len=Uniform(24, 40),
                            arrival=ClosedLoop(8)), 8),
        ("batch-16", replace(base, name="cal-b16", num_requests=32 // scale,
                             prompt_len=Uniform(48, 80), output_len=Uniform(24, 40),
                             arrival=ClosedLoop(16)), 16),
    ]


def value(metrics: dict, key: str, stat: str | None) -> float:
    return metrics[key] if stat is None else metrics[key][stat]


def run_engine(llm: LLM, requests) -> dict:
    params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True) for r in requests]
    t0 = time.perf_counter()
    outs = llm.generate([r.prompt for r in requests], params)
    return aggregate(outs, duration_s=time.perf_counter() - t0)


def timed_run(llm: LLM, prompts: list[list[int]], new_tokens: int) -> dict:
    """The memory-bound run (``memory_bound.run``'s loop) with each step timed and told
    apart -- decodes only, or with a prefill chunk -- and its load counted as the
    simulator counts one (``loads``: :class:`StepLoad` per step), so the cost model can be
    checked step by step, apart from the scheduling."""
    engine, most, schedule = llm.engine, 0, llm.engine.scheduler.schedule
    policy = llm.engine.kv_config.policy
    loads: list[StepLoad] = []

    def spy():
        batch = schedule()
        work = KVWork(policy, llm.engine.kv.block_size)
        tokens = pairs = read = 0
        for r, n in batch.items:
            start, held = r.num_computed_tokens, r.num_kv_slots
            tokens += n
            pairs += causal_pairs(start, start + n) if policy is None else \
                n * held + n * (n + 1) // 2
            read += held + n
            work.add(start >= r.num_prompt_tokens, start + n == r.num_prompt_tokens, held + n)
        sampled = sum(r.num_computed_tokens + n >= r.num_prompt_tokens for r, n in batch.items)
        loads.append(StepLoad(tokens, sampled, pairs, read, tokens, {}, len(batch.items),
                              **work.counts()))
        return batch
    engine.scheduler.schedule = spy
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    reqs = [engine.add_request(p, params) for p in prompts]
    times = []
    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        while engine.has_unfinished():
            t = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - t)
            most = max(most, len(engine.scheduler.running))
    finally:
        engine.scheduler.schedule = schedule
    elapsed, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    for r in reqs:
        engine.pop_finished(r.request_id)
    decode = [t for t, load in zip(times, loads) if load.num_decode == load.num_seqs]
    share = min(1.0, cpu_s / (elapsed * torch.get_num_threads()))
    return {"tok_s": len(prompts) * new_tokens / elapsed, "most": most, "times": times,
            "cpu_share": share,
            "loads": loads, "decode_s": sum(decode), "prefill_s": sum(times) - sum(decode)}


def slowdown(hw, threads: int) -> float:
    """The estimate's slowdown now (``current_slowdown``: above 1 on a machine busier than
    at calibration; 1 off the calibration's class)."""
    from types import SimpleNamespace

    from kvmap.bench.estimate import current_slowdown
    return current_slowdown(SimpleNamespace(step_s=None, num_threads=threads), hw.calibration)


def step_errors(measured: dict, config: SimConfig) -> dict:
    """The cost model on the engine's own steps: predicted over measured seconds of the
    decode-only steps and of the steps with a prefill chunk (the scheduling left out)."""
    mc = model_cost(config.model, config.kv, config.hardware, 16, config.weights)
    sums = {"decode": [0.0, 0.0], "prefill": [0.0, 0.0]}
    for t, load in zip(measured["times"], measured["loads"]):
        if load.num_tokens:
            kind = "decode" if load.num_decode == load.num_seqs else "prefill"
            sums[kind][0] += step_cost(mc, config.hardware, load).total_s
            sums[kind][1] += t
    return {f"{k}_step_model_error": (p / m - 1 if m else None) for k, (p, m) in sums.items()}


def sim_phases(config: SimConfig, requests) -> tuple:
    """(result, seconds of decode-only steps, of steps with a prefill chunk) simulated."""
    from kvmap.plan.sim.engine import Simulator
    sim = Simulator(config, requests)
    result = sim.run()
    steps = sim.steps
    decode = sum(t for t, n, d in zip(steps.total_s, steps.num_seqs, steps.num_decode)
                 if n == d)
    return result, decode, sum(steps.total_s) - decode


def bound(args) -> list[dict]:
    """Section 4 of the module docstring: one row per KV spec."""
    num = 32 if args.quick else 64
    spec = replace(get_preset("throughput"), name="bound", num_requests=num,
                   prompt_len=Uniform(180, 220),
                   output_len=Uniform(BOUND_OUTPUT_TOKENS, BOUND_OUTPUT_TOKENS),
                   arrival=ClosedLoop(num))
    # no prefix caching: the repeats send the same prompts, and a pool that kept them
    # (int4's holds them all) would skip their prefill on the next repeat
    llms = {kv: LLM(dtype="auto", kv=kv, kv_memory=BOUND_KV_MEMORY, max_num_seqs=num,
                    max_num_batched_tokens=512, num_threads=args.threads, device="cpu",
                    enable_prefix_caching=False)
            for kv in args.kv.split(",")}
    specs = list(llms)
    first = next(iter(llms.values()))
    requests = build_requests(spec, first.tokenizer)
    prompts = [first.encode(r.prompt) for r in requests]
    sim_requests = [replace(r, arrival_s=0.0)
                    for r in requests_from_workload(requests, first.tokenizer)]
    for llm in llms.values():                                 # warm-up
        run_bound(llm, prompts[:2], 4)
    hw = machine.this_machine("auto", args.threads)
    runs: dict[str, list[dict]] = {kv: [] for kv in specs}
    for _ in range(args.repeats):
        for kv, llm in llms.items():
            before = slowdown(hw, args.threads)
            load = os.getloadavg()[0]
            measured = timed_run(llm, prompts, BOUND_OUTPUT_TOKENS)
            tok_s, most = measured["tok_s"], measured["most"]
            probe_factor = 2 / (before + slowdown(hw, args.threads))
            # the share of its threads' time the engine ran: on a machine others load,
            # the simulated machine is that much slower (the probes, short and repeated,
            # measure it unloaded)
            factor = measured["cpu_share"]
            config = SimConfig(name=f"bound-{kv}", model=PlanModel(llm.model_config),
                               hardware=scaled(hw, factor),
                               kv=KVConfig.parse(kv, dtype=hw.compute_dtype), workload=None, weights=hw.compute_dtype,
                               engine=EngineSettings(block_size=16, max_num_seqs=num,
                                                     max_num_batched_tokens=512,
                                                     enable_prefix_caching=False,
                                                     kv_memory_bytes=parse_size(BOUND_KV_MEMORY)))
            sim, sim_decode_s, sim_prefill_s = sim_phases(config, sim_requests)
            unscaled = simulate(replace(config, hardware=hw), sim_requests)
            runs[kv].append({"engine": tok_s, "simulated": sim.metrics["output_tokens_per_s"],
                             **step_errors(measured, config),
                             "engine_decode_s": measured["decode_s"],
                             "engine_prefill_s": measured["prefill_s"],
                             "simulated_decode_s": sim_decode_s,
                             "simulated_prefill_s": sim_prefill_s,
                             "simulated_unscaled": unscaled.metrics["output_tokens_per_s"],
                             "engine_max_running": most,
                             "simulated_max_running": sim.kv["max_running"],
                             "simulated_time_s": dict(sim.time_s), "cpu_share": factor,
                             "estimate_speed_factor": probe_factor,
                             "load_average": (load, os.getloadavg()[0])})
            print(f"bound {kv}: engine {tok_s:.1f} tok/s ({most} running; decode steps "
                  f"{measured['decode_s']:.1f} s, steps with prefill "
                  f"{measured['prefill_s']:.1f} s), simulated "
                  f"{runs[kv][-1]['simulated']:.1f} ({sim.kv['max_running']} running; "
                  f"{sim_decode_s:.1f} s, {sim_prefill_s:.1f} s; the cost model on the "
                  f"engine's steps: decode {runs[kv][-1]['decode_step_model_error']:+.0%}, "
                  f"with prefill {runs[kv][-1]['prefill_step_model_error']:+.0%}), load "
                  f"{load:.1f}, CPU share {factor:.2f} (the estimate's speed factor "
                  f"{probe_factor:.2f})",
                  flush=True)
    base = specs[0]
    rows = []
    for kv in specs:
        per = runs[kv]
        errors = [r["simulated"] / r["engine"] - 1 for r in per]
        ratio_errors = [(r["simulated"] / b["simulated"]) / (r["engine"] / b["engine"]) - 1
                        for r, b in zip(per, runs[base])]
        rows.append({"kv": kv, "runs": per, "calibration": hw.calibration.source,
                     "engine_output_tokens_per_s": statistics.median(r["engine"] for r in per),
                     "simulated_output_tokens_per_s":
                         statistics.median(r["simulated"] for r in per),
                     "error": statistics.median(errors),
                     "ratio_to_bf16_engine": statistics.median(
                         r["engine"] / b["engine"] for r, b in zip(per, runs[base])),
                     "ratio_to_bf16_simulated": statistics.median(
                         r["simulated"] / b["simulated"] for r, b in zip(per, runs[base])),
                     "ratio_error": statistics.median(ratio_errors), "target": ERROR_TARGET,
                     "decode_steps_error": statistics.median(
                         r["simulated_decode_s"] / r["engine_decode_s"] - 1 for r in per),
                     "prefill_steps_error": statistics.median(
                         r["simulated_prefill_s"] / r["engine_prefill_s"] - 1 for r in per),
                     **{key: statistics.median(r[key] for r in per) for key in (
                         "decode_step_model_error", "prefill_step_model_error")},
                     "met": abs(statistics.median(errors)) <= ERROR_TARGET,
                     "engine_max_running": per[-1]["engine_max_running"],
                     "simulated_max_running": per[-1]["simulated_max_running"]})
    return rows


def print_bound(rows: list[dict]) -> None:
    print(f"\nmemory-bound scenario (72 MiB pool, closed loop): predicted against measured "
          f"(target within {ERROR_TARGET:.0%})")
    print(f"{'kv':<28} {'engine':>8} {'simulated':>10} {'error':>7} {'x bf16 meas':>12} "
          f"{'x bf16 pred':>12} {'running':>10} {'decode steps':>13} {'prefill steps':>14}")
    for r in rows:
        print(f"{r['kv']:<28} {r['engine_output_tokens_per_s']:>8.1f} "
              f"{r['simulated_output_tokens_per_s']:>10.1f} {r['error']:>+7.1%} "
              f"{r['ratio_to_bf16_engine']:>12.2f} {r['ratio_to_bf16_simulated']:>12.2f} "
              f"{r['engine_max_running']:>4} / {r['simulated_max_running']:<4} "
              f"{r['decode_steps_error']:>+13.0%} {r['prefill_steps_error']:>+14.0%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kv", default=",".join(BOUND_SPECS),
                    help="the bound section's KV specs, the first the base of the ratios")
    ap.add_argument("--sections", default="calibration,bound",
                    help="comma-separated: calibration (steps 1-3), bound (step 4)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sections = set(args.sections.split(","))
    if not sections <= {"calibration", "bound"}:
        ap.error(f"--sections {args.sections!r}: choose from calibration, bound")
    record = calibration(args) if "calibration" in sections else []
    rows = bound(args) if "bound" in sections else []
    if rows:
        print_bound(rows)
    path = write_record("sim_calibration", {
        "model": "embedded SmolLM2-135M (dtype auto)", "kv": "bf16", "kv_memory": KV_MEMORY,
        "max_num_batched_tokens": 512, "threads": args.threads, "repeats": args.repeats,
        "quick": args.quick, "sections": sorted(sections),
        "bound_kv_memory": BOUND_KV_MEMORY},
        {"workloads": record, "memory_bound": rows})
    print(f"\nwrote {path}")


def calibration(args) -> list[dict]:
    """Steps 1-3 of the module docstring; the per-workload entries of the record."""
    max_seqs = max(n for _, _, n in workloads(args.quick))
    llm = LLM(dtype="auto", kv="bf16", kv_memory=KV_MEMORY, max_num_seqs=max_seqs,
              max_num_batched_tokens=512, num_threads=args.threads, device="cpu",
              enable_prefix_caching=False)         # the repeats send the same prompts
    model = PlanModel(llm.model_config)
    rows, record = [], []
    for label, spec, num_seqs in workloads(args.quick):
        llm.engine.scheduler.config = replace(llm.engine.scheduler.config,
                                              max_num_seqs=num_seqs)
        requests = build_requests(spec, llm.tokenizer)
        sim_requests = [replace(r, arrival_s=0.0)
                        for r in requests_from_workload(requests, llm.tokenizer)]
        run_engine(llm, requests[:2])                          # warm-up
        pairs = []
        # The machine is shared and its speed drifts within seconds: every repeat measures
        # the hardware (then a speed probe), runs the engine between two more probes, and
        # simulates on the measured profile scaled by the probes' ratio.
        for repeat in range(args.repeats):
            t0 = time.perf_counter()
            hw = machine.this_machine("auto", args.threads)
            before = slowdown(hw, args.threads)
            probe_s = time.perf_counter() - t0
            real = run_engine(llm, requests)
            factor = 2 / (before + slowdown(hw, args.threads))
            config = SimConfig(name=label, model=model, hardware=scaled(hw, factor),
                               kv=KVConfig.parse("bf16"), workload=None,
                               weights=hw.compute_dtype,
                               engine=EngineSettings(block_size=16, max_num_seqs=num_seqs,
                                                     max_num_batched_tokens=512,
                                                     enable_prefix_caching=False,
                                                     kv_memory_bytes=parse_size(KV_MEMORY)))
            sim = simulate(config, sim_requests)
            unscaled = simulate(replace(config, hardware=hw), sim_requests)
            pairs.append((hw, sim, real, factor, unscaled))
            print(f"{label} #{repeat}: matmul peak {hw.compute_flops / 1e9:.0f} GFLOP/s "
                  f"({hw.curve_efficiency(1):.0%} at 1 row, {hw.curve_efficiency(num_seqs):.0%}"
                  f" at {num_seqs}), weight stream {hw.memory_bandwidth / 1e9:.1f} GB/s, "
                  f"calibration {hw.calibration.machine_class}/{hw.calibration.dtype} (probe "
                  f"{probe_s:.1f} s, load "
                  f"{os.getloadavg()[0]:.1f}, speed factor {factor:.2f}); TBT p50 simulated "
                  f"{sim.metrics['tbt_s']['p50'] * 1e3:.1f} ms (unscaled "
                  f"{unscaled.metrics['tbt_s']['p50'] * 1e3:.1f}), measured "
                  f"{real['tbt_s']['p50'] * 1e3:.1f} ms", flush=True)
        entry = {"workload": label, "num_requests": len(requests), "max_num_seqs": num_seqs,
                 "prompt_tokens": [r.prompt_tokens for r in sim_requests],
                 "output_tokens": [r.output_tokens for r in sim_requests],
                 "hardware": [p[0].label for p in pairs],
                 "calibration": pairs[0][0].calibration.to_dict(),
                 "speed_factors": [p[3] for p in pairs],
                 "bound_share": [p[1].bound_share for p in pairs], "metrics": {}}
        for key, stat, name in METRICS:
            measured = [value(p[2], key, stat) for p in pairs]
            simulated = [value(p[1].metrics, key, stat) for p in pairs]
            unscaled = [value(p[4].metrics, key, stat) for p in pairs]
            errors = [s / m - 1 for s, m in zip(simulated, measured)]
            unscaled_errors = [s / m - 1 for s, m in zip(unscaled, measured)]
            entry["metrics"][name] = {
                "measured": measured, "simulated": simulated, "errors": errors,
                "median_error": statistics.median(errors), "simulated_unscaled": unscaled,
                "unscaled_errors": unscaled_errors,
                "median_unscaled_error": statistics.median(unscaled_errors)}
            rows.append((label, name, statistics.median(measured), statistics.median(simulated),
                         statistics.median(errors), statistics.median(unscaled_errors)))
        record.append(entry)

    print("\nmedians over the repeats; error: median of the per-repeat errors")
    print(f"\n{'workload':<10} {'metric':<11} {'measured':>12} {'simulated':>12} {'error':>8}"
          f" {'unscaled':>9}")
    for label, name, real, predicted, error, unscaled_error in rows:
        scale, unit = (1, "") if name == "out tok/s" else (1e3, " ms")
        print(f"{label:<10} {name:<11} {real * scale:>10.2f}{unit:<3}"
              f"{predicted * scale:>9.2f}{unit:<3} {error:>+7.1%} {unscaled_error:>+8.1%}")
    return record


if __name__ == "__main__":
    main()
