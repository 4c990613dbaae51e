"""W8A8's integer product on this CPU, side by side: what the engine runs
(``torch._int_mm``, int8 x int8 -> int32) against oneDNN's quantized linear
(``torch.ops.onednn.qlinear_pointwise``, weights prepacked once, fp32 out) on the same
int8 codes, and the dense fp32 product (``linear.PackedLinear``) as the yardstick.

Why: on x86-avx2 (AMD EPYC Zen 3) the hardware profile timed W8A8 at ~3 GFLOP/s against
fp32's ~115, so the default run left W8A8 out over its cell timeout. A verdict from that
path is a finding about kvmap's kernel, not about W8A8. oneDNN is fast, but a CPU
without VNNI multiplies u8 x s8 pairs with ``vpmaddubsw``, whose int16 sums saturate:
the product is exact only when the weights fit 7 bits. So each oneDNN row is checked
against the exact int32 product (``max_abs_err``): 8-bit weights as they are, 7-bit
weights (|w| <= 63), and the 8-bit weights split as w = 2a + b (a = w >> 1 in 7 bits,
b in {0, 1}: two exact products, twice the work).

    .venv/bin/python benchmarks/w8a8_kernels.py [--rows 512,64,8,1] [--repeats 7]

Kernels: ``fp32_dense``, ``onednn_w8``, ``onednn_w7``, ``onednn_split``, ``int_mm_engine``.
Per product shape (SmolLM2's q|k|v, gate|up and down) and row count: median seconds of
``--repeats`` timings (each of several calls), GFLOP/s and the error. The load average
is recorded before and after.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402

from kvmap.model.linear import PackedLinear  # noqa: E402

# SmolLM2-135M: hidden 576, 9 query + 2x3 KV heads of 64, MLP 1536
SHAPES = {"qkv": (576, 960), "gate_up": (576, 3072), "down": (1536, 576)}


def timed(fn, repeats: int, calls: int) -> float:
    for _ in range(2):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls)
    return statistics.median(out)


def onednn(packed, n: int):
    ones, zeros = torch.ones(n), torch.zeros(n, dtype=torch.int64)

    def run(xq: torch.Tensor) -> torch.Tensor:
        return torch.ops.onednn.qlinear_pointwise(xq, 1.0, 0, packed, ones, zeros, None,
                                                  1.0, 0, torch.float32, "none", [], "")
    return run


def rows_of(k: int, n: int, m: int, repeats: int) -> dict:
    g = torch.Generator().manual_seed(m * 7 + k)
    w8 = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    w7 = (w8.to(torch.int16) // 2).to(torch.int8)              # |w| <= 64
    hi = (w8.to(torch.int16) >> 1).to(torch.int8)              # w = 2 hi + lo
    lo = (w8.to(torch.int16) - 2 * hi.to(torch.int16)).to(torch.int8)
    x = torch.randn(m, k, generator=g)
    xq = (x / (x.abs().amax(1, keepdim=True) / 127)).round().clamp(-127, 127).to(torch.int8)
    exact8 = xq.long() @ w8.long().t()
    exact7 = xq.long() @ w7.long().t()
    dense = PackedLinear(torch.randn(n, k, generator=g))
    one8 = onednn(torch.ops.onednn.qlinear_prepack(w8, None), n)
    one7 = onednn(torch.ops.onednn.qlinear_prepack(w7, None), n)
    p_hi = onednn(torch.ops.onednn.qlinear_prepack(hi, None), n)
    p_lo = onednn(torch.ops.onednn.qlinear_prepack(lo, None), n)

    def split(q):
        return 2 * p_hi(q) + p_lo(q)

    w8_t = w8.t()
    calls = max(1, int(2e8 / (2 * m * k * n)))
    flops = 2 * m * k * n
    kernels = {"fp32_dense": (lambda: dense(x), None),
               "onednn_w8": (lambda: one8(xq), (one8(xq).double() - exact8).abs().max()),
               "onednn_w7": (lambda: one7(xq), (one7(xq).double() - exact7).abs().max()),
               "onednn_split": (lambda: split(xq),
                                     (split(xq).double() - exact8).abs().max())}
    if m > 16:          # _int_mm needs more than 16 rows on the CPU
        kernels["int_mm_engine"] = (lambda: torch._int_mm(xq, w8_t),
                                       (torch._int_mm(xq, w8_t).long() - exact8).abs().max())
    out = {}
    for name, (fn, err) in kernels.items():
        s = timed(fn, repeats, calls)
        out[name] = {"seconds": s, "gflop_per_s": flops / s / 1e9,
                     "max_abs_err": None if err is None else float(err),
                     "max_abs_exact": float(exact8.abs().max())}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="512,64,8,1")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    load_before = os.getloadavg()
    metrics: dict = {}
    print(f"{'shape':8} {'rows':>5} {'kernel':20} {'GFLOP/s':>9} {'max abs err':>12}")
    for shape, (k, n) in SHAPES.items():
        for m in rows:
            res = rows_of(k, n, m, args.repeats)
            metrics.setdefault(shape, {})[str(m)] = res
            for name, r in res.items():
                err = "-" if r["max_abs_err"] is None else f"{r['max_abs_err']:.0f}"
                print(f"{shape:8} {m:>5} {name:20} {r['gflop_per_s']:>9.1f} {err:>12}")
    metrics["load_average_before"] = load_before
    metrics["load_average_after"] = os.getloadavg()
    path = write_record("w8a8_kernels", {"rows": rows, "repeats": args.repeats,
                                         "threads": torch.get_num_threads(),
                                         "dtype": "fp32"}, metrics)
    print(f"record: {path}")


if __name__ == "__main__":
    main()
