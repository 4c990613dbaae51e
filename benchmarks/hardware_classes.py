"""This machine as itself and as the AVX2 class, side by side in one run: the hardware
profile (``kvmap hw``: class, native bf16, probe rates) and the engine at ``dtype: auto``
(prefill of --prefill tokens, batch-1 decode of --decode tokens) against the engine
forced to bf16, each in a fresh process per setting, the settings alternating over
--repeats rounds.

The AVX2 class is emulated with ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``:
torch dispatches its AVX2 kernels and oneDNN stops at AVX2, so the bf16 products lose
their AVX-512 paths. It does not emulate the other machine's memory bandwidth, clock,
caches or core count (docs/hardware.md).

    .venv/bin/python benchmarks/hardware_classes.py [--repeats 2] [--prefill 2000]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402

SETTINGS = {"native": {}, "avx2": {"ATEN_CPU_CAPABILITY": "avx2",
                                   "ONEDNN_MAX_CPU_ISA": "AVX2"}}
CHILD = r"""
import json, sys, time
from kvmap import LLM, SamplingParams
from kvmap.hardware import measure, detect
dtype, n_prefill, n_decode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
hw = measure(detect())
llm = LLM(dtype=dtype, kv="auto", max_num_batched_tokens=2048, enable_prefix_caching=False)
ids = list(range(1000, 1000 + n_prefill))
llm.generate([ids[:64]], SamplingParams(max_tokens=2))        # warm-up
t0 = time.perf_counter()
llm.generate([ids], SamplingParams(max_tokens=1))
prefill_s = time.perf_counter() - t0
m = llm.generate([ids[:16]], SamplingParams(max_tokens=n_decode + 1, ignore_eos=True))[0].metrics
decode = (m.num_output_tokens - 1) / (m.token_times_s[-1] - m.token_times_s[0])
print(json.dumps({"summary": hw.summary(), "dtype": llm.config.dtype,
                  "prefill_tokens_per_s": n_prefill / prefill_s,
                  "decode_tokens_per_s_batch1": decode}))
"""


def one(setting: str, dtype: str, n_prefill: int, n_decode: int) -> dict:
    env = {**os.environ, **SETTINGS[setting]}
    out = subprocess.run([sys.executable, "-c", CHILD, dtype, str(n_prefill), str(n_decode)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=2000)
    ap.add_argument("--decode", type=int, default=64)
    args = ap.parse_args()
    runs: dict = {(s, d): [] for s in SETTINGS for d in ("auto", "bf16")}
    loads = []
    for _ in range(args.repeats):
        for key in runs:
            loads.append(os.getloadavg()[0])
            runs[key].append(one(*key, args.prefill, args.decode))
    metrics = {}
    print(f"{'setting':8s} {'dtype':6s} {'class':18s} {'bf16 native':>11s} "
          f"{'prefill tok/s':>13s} {'decode tok/s':>12s}")
    for (setting, dtype), rs in runs.items():
        s = rs[-1]["summary"]
        row = {"machine_class": s["machine_class"], "native_bf16": s["native_bf16"],
               "dtype": rs[-1]["dtype"], "rates": s.get("rates"),
               "prefill_tokens_per_s": statistics.median(r["prefill_tokens_per_s"] for r in rs),
               "decode_tokens_per_s_batch1": statistics.median(
                   r["decode_tokens_per_s_batch1"] for r in rs)}
        metrics[f"{setting}/{dtype}"] = row
        print(f"{setting:8s} {row['dtype']:6s} {row['machine_class']:18s} "
              f"{str(row['native_bf16']):>11s} {row['prefill_tokens_per_s']:13.1f} "
              f"{row['decode_tokens_per_s_batch1']:12.1f}")
    for setting in SETTINGS:
        a, b = metrics[f"{setting}/auto"], metrics[f"{setting}/bf16"]
        print(f"{setting}: auto ({a['dtype']}) / bf16 = prefill "
              f"{a['prefill_tokens_per_s'] / b['prefill_tokens_per_s']:.2f}x, decode "
              f"{a['decode_tokens_per_s_batch1'] / b['decode_tokens_per_s_batch1']:.2f}x")
    metrics["load_avg_1m"] = {"min": min(loads), "max": max(loads)}
    path = write_record("hardware_classes", vars(args), metrics)
    print(f"load average {min(loads):.1f}-{max(loads):.1f}; record: {path}")


if __name__ == "__main__":
    main()
