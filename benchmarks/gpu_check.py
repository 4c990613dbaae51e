"""One prepared check for a machine with a GPU (at most ~5 minutes), writing one JSON record.

1. The ``gpu``-marked tests (``tests/gpu``: codec x policy x weight format on CUDA).
2. The engine on the embedded SmolLM2-135M: batch-1 and batch-32 decode tokens/s, bf16
   weights and int8 weights, bf16 KV.
3. Dummy ``llama-3-8b`` (all 32 layers, random bf16 weights) at batch 1 / 32 / 128 with
   bf16, fp8 and int8 KV: decode tokens/s, peak device memory.

It uses only the packages found on the machine (it never installs; such a machine has
no network). Each stage has its own time budget and is skipped, with the reason in the
record, when it does not fit or a package is missing.

    python benchmarks/gpu_check.py [--budget-s 290]     # record: benchmarks/results/gpu_check-*.json
    python benchmarks/gpu_check.py --dry-run     # CPU: the same stages on dummy:tiny
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def run_tests(budget_s: float) -> dict:
    cmd = [sys.executable, "-m", "pytest", "tests/gpu", "-m", "gpu", "-q", "-p",
           "no:cacheprovider"]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + str(ROOT))
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env,
                              timeout=budget_s)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "budget_s": budget_s}
    tail = proc.stdout.strip().splitlines()[-1:] or [""]
    return {"status": "ok" if proc.returncode == 0 else f"rc={proc.returncode}",
            "summary": tail[0], "stderr_tail": proc.stderr[-800:]}


def decode_rate(llm, batch: int, prompt_tokens: int, new_tokens: int) -> dict:
    """Output tokens/s of ``batch`` requests decoded together (after their prefill)."""
    from kvmap import SamplingParams
    vocab = llm.model_config.vocab_size
    g = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(3, vocab, (prompt_tokens,), generator=g).tolist()
               for _ in range(batch)]
    device = llm.engine.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    outs = llm.generate(prompts, SamplingParams(max_tokens=new_tokens, ignore_eos=True))
    spans = [o.metrics.token_times_s for o in outs]
    first = max(s[0] for s in spans)            # every request decoding from here on
    last = max(s[-1] for s in spans)
    steps = sum(sum(1 for t in s if t > first) for s in spans)
    out = {"batch": batch, "tokens_per_s": steps / max(last - first, 1e-9)}
    if device.type == "cuda":
        out["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
    return out


def stage(name: str, deadline: float, fn) -> dict:
    if time.perf_counter() > deadline:
        return {"status": "skipped", "why": "time budget spent"}
    t0 = time.perf_counter()
    try:
        result = fn()
    except Exception as e:  # noqa: BLE001 -- a stage's failure is a finding, not the end
        result = {"status": "error", "error": f"{type(e).__name__}: {e}"[:500]}
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print(f"[gpu_check] {name}: {result}", flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, dummy:tiny, small sizes")
    ap.add_argument("--budget-s", type=float, default=290.0)
    args = ap.parse_args()
    from kvmap import LLM
    dry = args.dry_run
    if not dry and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --dry-run for the CPU-safe parts")
    device = "cpu" if dry else "cuda"
    deadline = time.perf_counter() + args.budget_s
    record: dict = {"device": device, "dry_run": dry,
                    "device_name": None if dry else torch.cuda.get_device_name(0)}
    record["tests"] = stage("tests", deadline,
                            lambda: run_tests(max(10.0, min(120.0, deadline - time.perf_counter()))))
    small = "dummy:tiny" if dry else None
    sizes = (4, 8) if dry else (64, 64)

    def embedded():
        rows = {}
        for q in (None, "int8"):
            llm = LLM(model=small, device=device, quantization=q, kv_memory="512MiB")
            rows[str(q)] = [decode_rate(llm, b, *sizes) for b in (1, 32)]
            rows[str(q) + "_weight_bytes"] = llm.weight_bytes()
            del llm
        return {"status": "ok", "rows": rows}
    record["embedded"] = stage("embedded", deadline, embedded)

    def llama8b():
        rows = []
        model = "dummy:tiny" if dry else "dummy:llama-3-8b"
        for kv in ("bf16", "fp8", "int8"):
            llm = LLM(model=model, device=device, kv=kv, dtype="bf16",
                      kv_memory="64MiB" if dry else "48GiB", max_num_seqs=128,
                      max_num_batched_tokens=2048 if not dry else 512)
            for batch in ((1, 4) if dry else (1, 32, 128)):
                if time.perf_counter() > deadline:
                    break
                rows.append({"kv": kv, **decode_rate(llm, batch, *(sizes if dry else (256, 32)))})
            del llm
            if not dry:
                torch.cuda.empty_cache()
        return {"status": "ok", "rows": rows}
    record["llama-3-8b"] = stage("llama-3-8b", deadline, llama8b)
    path = write_record("gpu_check", {"dry_run": dry, "budget_s": args.budget_s}, record)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
