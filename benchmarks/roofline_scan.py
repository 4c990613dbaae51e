"""Where can a KV saving become speed on this machine? The simulator's answer, scanned.

For the embedded SmolLM2-135M on ``cpu-this-machine`` (the hardware profile and the
calibration record of its class and dtype, :mod:`kvmap.plan.sim.machine`), a closed loop
of requests that keeps a KV pool full, over pool sizes (in tokens of the compute dtype's
plain cache) and request shapes (prompt, output): the predicted output throughput of
int8 and int4 over the plain cache's, beside the decode step's weight bytes and the
pool's KV bytes, and the same on a spec-sheet GPU (``--gpu``). Prints the table, the best
cell for int8, and writes a record (the machine class named, the load average noted).

    .venv/bin/python benchmarks/roofline_scan.py [--threads 2] [--gpu h100-80gb]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402

from kvmap.kv.config import KVConfig  # noqa: E402
from kvmap.kv.spec import KVGeometry  # noqa: E402
from kvmap.model.shapes import get_shape  # noqa: E402
from kvmap.plan.catalogue import PlanModel  # noqa: E402
from kvmap.plan.capacity import COMPUTE_DTYPE  # noqa: E402
from kvmap.plan.sim import EngineSettings, SimConfig, SimRequest, simulate  # noqa: E402
from kvmap.plan.sim import machine  # noqa: E402
from kvmap.plan.sim.costmodel import model_cost  # noqa: E402
from kvmap.plan.sim.hardware import gpu_hardware  # noqa: E402
from kvmap.plan.sim.kvcost import bytes_only  # noqa: E402

POOL_TOKENS = (1024, 2048, 4096, 8192, 16384)
SHAPES = ((64, 256), (200, 64), (512, 128), (2048, 128))      # (prompt, output) tokens
CODECS = ("int8", "int4")


def rate(model, kv: str, dtype: str, hw, costs, pool_bytes: int, shape, num: int) -> dict:
    config = SimConfig(name=kv, model=model, hardware=hw, kv=KVConfig.parse(kv, dtype=dtype),
                       workload=None, weights=dtype, kv_costs=costs,
                       engine=EngineSettings(block_size=16, max_num_seqs=256,
                                             max_num_batched_tokens=512,
                                             kv_memory_bytes=pool_bytes))
    prompt, output = shape
    result = simulate(config, [SimRequest(f"r{i}", prompt, output, arrival_s=0.0)
                               for i in range(num)])
    return {"output_tokens_per_s": result.metrics["output_tokens_per_s"],
            "max_running": result.kv["max_running"], "bound_share": dict(result.bound_share)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu", default="h100-80gb")
    args = ap.parse_args()
    config = get_shape("smollm2-135m")
    model = PlanModel(config)
    hw = machine.this_machine("auto", args.threads)
    dtype = hw.compute_dtype
    gpu = gpu_hardware(args.gpu)
    plain_block = KVConfig.parse(dtype).codec.block_bytes(KVGeometry.of(config, 16),
                                                          COMPUTE_DTYPE)
    weight_bytes = model_cost(model, KVConfig.parse(dtype), hw, weights=dtype).weight_bytes
    print(f"{hw.label}\nweights {weight_bytes / 1e6:.0f} MB a decode step; plain KV "
          f"{plain_block / 16:.0f} B a token; {args.gpu}: {gpu.label}\n")
    print(f"{'pool tokens':>11} {'prompt+out':>10} {'KV MB':>6} {'run':>4} {'tok/s':>7} "
          + " ".join(f"{c + ' x':>7} {c + ' ' + args.gpu:>16}" for c in CODECS))
    rows = []
    for pool in POOL_TOKENS:
        pool_bytes = pool // 16 * plain_block
        for shape in SHAPES:
            if sum(shape) > pool:
                continue
            num = max(8, 6 * pool // sum(shape))       # enough to keep int4's pool full
            row = {"pool_tokens": pool, "pool_bytes": pool_bytes, "prompt_tokens": shape[0],
                   "output_tokens": shape[1], "num_requests": num, "weight_bytes": weight_bytes,
                   "cpu": {}, "gpu": {}}
            for kv in (dtype, *CODECS):
                row["cpu"][kv] = rate(model, kv, dtype, hw, None, pool_bytes, shape, num)
                row["gpu"][kv] = rate(model, kv, "bf16", gpu, bytes_only(kv), pool_bytes,
                                      shape, num)
            base, gbase = row["cpu"][dtype], row["gpu"][dtype]
            for c in CODECS:
                row[f"{c}_ratio"] = row["cpu"][c]["output_tokens_per_s"] / \
                    base["output_tokens_per_s"]
                row[f"{c}_ratio_gpu"] = row["gpu"][c]["output_tokens_per_s"] / \
                    gbase["output_tokens_per_s"]
            rows.append(row)
            print(f"{pool:>11} {shape[0]:>5}+{shape[1]:<4} {pool_bytes / 1e6:>6.0f} "
                  f"{base['max_running']:>4} {base['output_tokens_per_s']:>7.1f} "
                  + " ".join(f"{row[c + '_ratio']:>6.2f}x {row[c + '_ratio_gpu']:>15.2f}x"
                             for c in CODECS), flush=True)
    best = max(rows, key=lambda r: r["int8_ratio"])
    print(f"\nbest int8 cell on this machine: pool {best['pool_tokens']} tokens, "
          f"{best['prompt_tokens']}+{best['output_tokens']}: int8 {best['int8_ratio']:.2f}x, "
          f"int4 {best['int4_ratio']:.2f}x (load {os.getloadavg()[0]:.1f})")
    path = write_record("roofline_scan", {"threads": args.threads, "gpu": args.gpu,
                                          "hardware": hw.label, "gpu_hardware": gpu.label,
                                          "calibration": hw.calibration.to_dict()},
                        {"rows": rows, "best_int8": best,
                         "load_average": os.getloadavg()[0]})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
