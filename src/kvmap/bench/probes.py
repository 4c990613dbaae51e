"""Cheap probes a workload cell runs after its workload, for the pre-launch checklist.

- ``stability``: the same prompt decoded greedily (temperature 0, EOS ignored) alone,
  then in the middle of a batch of prompts of other lengths; the two outputs should be
  identical token for token. Batching changes the shapes of every matrix product and
  the chunking of prefill, so a configuration whose numerics depend on the batch (e.g. a
  quantizer whose scale spans several requests) shows here.
- ``decode_ops``: operators launched in one decode step, counted by ``torch.profiler``
  over ``NUM_PROFILED_STEPS`` decode steps of one request (median): ``num_ops_per_step``
  counts the outermost ``aten::`` and ``kvmap::`` (native) calls (what Python
  dispatches: many small operators where one fused kernel would do show up here),
  ``num_ops_all`` every such call
  including nested ones, ``num_kernel_launches`` the CUDA kernel launches (GPU only).

Both run on the cell's own ``LLM`` and take a second or two on the CPU. They mutate the
engine (requests come and go, the prefix cache fills): run them after the workload.
"""
from __future__ import annotations

import statistics

import numpy as np

STABILITY_PROMPT_TOKENS = 96
STABILITY_NEIGHBOUR_TOKENS = (200, 32, 300)     # the mixed batch around the probe prompt
STABILITY_NEW_TOKENS = 12
OPS_PROMPT_TOKENS = 64
NUM_PROFILED_STEPS = 3


def _prompt_ids(llm, num_tokens: int, seed: int) -> list[int]:
    """About ``num_tokens`` ids of corpus text (random ids for a model without a tokenizer)."""
    if llm.tokenizer is not None:
        from kvmap.workloads.corpus import take_tokens
        ids = llm.encode(take_tokens(llm.tokenizer, num_tokens, start_paragraph=seed))
        return ids[:num_tokens]
    rng = np.random.default_rng(seed)
    return rng.integers(0, llm.model_config.vocab_size, size=num_tokens).tolist()


def stability(llm, seed: int = 0) -> dict:
    """``{"identical", "num_tokens", "num_identical_prefix", "batch_size"}``."""
    from kvmap.request import SamplingParams
    params = SamplingParams(max_tokens=STABILITY_NEW_TOKENS, temperature=0.0,
                            ignore_eos=True)
    probe = _prompt_ids(llm, STABILITY_PROMPT_TOKENS, seed + 101)
    alone = llm.generate([probe], params)[0].token_ids
    others = [_prompt_ids(llm, n, seed + 202 + i)
              for i, n in enumerate(STABILITY_NEIGHBOUR_TOKENS)]
    batch = [others[0], probe, *others[1:]]
    mixed = llm.generate(batch, params)[1].token_ids
    same = next((i for i, (a, b) in enumerate(zip(alone, mixed)) if a != b),
                min(len(alone), len(mixed)))
    return {"identical": list(alone) == list(mixed), "num_tokens": len(alone),
            "num_identical_prefix": same, "batch_size": len(batch)}


OP_NAMESPACES = ("aten::", "kvmap::")   # torch's operators and kvmap's native ones


def _count(events) -> tuple[int, int, int]:
    top = total = launches = 0
    for e in events:
        name = e.name
        if name.startswith(OP_NAMESPACES):
            total += 1
            parent = e.cpu_parent
            if parent is None or not parent.name.startswith(OP_NAMESPACES):
                top += 1
        elif name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"):
            launches += 1
    return top, total, launches


def decode_ops(llm, seed: int = 0) -> dict:
    """``{"num_ops_per_step", "num_ops_all", "num_kernel_launches", "num_steps"}``
    (medians over the profiled decode steps)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from kvmap.request import SamplingParams
    engine = llm.engine
    params = SamplingParams(max_tokens=NUM_PROFILED_STEPS + 3, ignore_eos=True)
    req = engine.add_request(_prompt_ids(llm, OPS_PROMPT_TOKENS, seed + 303), params)
    counts = []
    try:
        while len(req.metrics.token_times_s) < 2 and not req.status.finished:
            engine.step()                 # prefill, then one decode step as a warm-up
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        for _ in range(NUM_PROFILED_STEPS):
            if req.status.finished:
                break
            with profile(activities=activities) as prof:
                engine.step()
            counts.append(_count(prof.events()))
    finally:
        if not req.status.finished:
            engine.abort(req.request_id)
        engine.pop_finished(req.request_id)
    if not counts:
        return {"num_ops_per_step": None, "num_ops_all": None, "num_kernel_launches": None,
                "num_steps": 0}
    return {"num_ops_per_step": statistics.median(c[0] for c in counts),
            "num_ops_all": statistics.median(c[1] for c in counts),
            "num_kernel_launches": statistics.median(c[2] for c in counts),
            "num_steps": len(counts)}


def run_probes(llm, seed: int = 0) -> dict:
    """Both probes; a probe that raises is recorded as ``{"error": ...}``, not raised."""
    out = {}
    for name, probe in (("stability", stability), ("decode_ops", decode_ops)):
        try:
            out[name] = probe(llm, seed)
        except Exception as e:  # noqa: BLE001 -- a probe must not fail the cell's workload
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    return out
