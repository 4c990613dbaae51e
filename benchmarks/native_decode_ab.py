"""A native path against the Python / eager one it replaces, in one process: the decode
attention (``--part decode``: ``kvmap.model.native_decode`` against gathers, batched
products, softmax) or the layer outside attention (``--part layer``:
``kvmap.model.native_layer`` against the Python layer). Both on the embedded model at its default
compute dtype, B sequences of ~264 tokens, one decode step at a time with the two paths
alternating step by step (so load changes fall on both), per KV spec.

Per spec and batch: median ms of a decode step with each path, eager / native, and
each path's ratio to the plain cache's step with the same path. The load average is
recorded before and after.

    .venv/bin/python benchmarks/native_decode_ab.py [--kv bf16,int8,int4]
        [--batch 1,32] [--steps 24] [--part decode|layer]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402
from decode_step import finish, start_batch  # noqa: E402

from kvmap import LLM  # noqa: E402
from kvmap.model import native_decode, native_layer  # noqa: E402

PARTS = {"decode": native_decode, "layer": native_layer}


def measure(kv: str, batch: int, steps: int, part) -> dict:
    llm = LLM(kv=kv, kv_memory=(72 if batch < 16 else 400) << 20)
    reqs = start_batch(llm, batch, 264, 2 * steps + 8, 0)
    times = {True: [], False: []}
    for i in range(2 * steps):
        native = i % 2 == 0
        part.ENABLED = native
        t = time.perf_counter()
        llm.engine.step()
        times[native].append(time.perf_counter() - t)
    part.ENABLED = True
    finish(llm, reqs)
    return {"native_ms": statistics.median(times[True]) * 1e3,
            "eager_ms": statistics.median(times[False]) * 1e3,
            "dtype": str(llm.engine.model.dtype).removeprefix("torch.")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", default="bf16,int8,int4")
    ap.add_argument("--batch", default="1,32")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--part", choices=sorted(PARTS), default="decode")
    args = ap.parse_args()
    part = PARTS[args.part]
    if part.ops() is None:
        raise SystemExit(f"{part.LIBRARY.what} does not build here: {part.LIBRARY.broken}")
    specs, batches = args.kv.split(","), [int(b) for b in args.batch.split(",")]
    load_before = os.getloadavg()
    rows = []
    for batch in batches:
        base = None
        for kv in specs:
            m = measure(kv, batch, args.steps, part)
            base = base or m
            m.update(kv=kv, batch=batch, speedup=m["eager_ms"] / m["native_ms"],
                     native_vs_base=base["native_ms"] / m["native_ms"],
                     eager_vs_base=base["eager_ms"] / m["eager_ms"])
            rows.append(m)
            print(f"B={batch:3d} {kv:6s} native {m['native_ms']:7.1f} ms  eager "
                  f"{m['eager_ms']:7.1f} ms  eager/native {m['speedup']:.2f}  "
                  f"speed vs {specs[0]}: native {m['native_vs_base']:.2f} eager "
                  f"{m['eager_vs_base']:.2f}", flush=True)
    path = write_record("native_decode_ab", {"kv": specs, "batch": batches, "steps": args.steps,
                                             "context": 264, "part": args.part},
                        {"rows": rows, "load_before": load_before, "load_after": os.getloadavg()})
    print(f"record: {path}")


if __name__ == "__main__":
    main()
