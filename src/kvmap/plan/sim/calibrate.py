"""What the simulator measures of this machine with the engine itself: the overheads of a
step, and a speed probe that follows the machine's load.

The rates (matrix products, the weight stream) are the machine's hardware profile
(:mod:`kvmap.plan.sim.machine`); what only the engine can show is here:

- the overheads: the time of a decode step of kvmap's own engine on random-weight models
  so small (hidden 64) that FLOPs and bytes are nothing, at two layer counts and two
  batch sizes, solved for ``step = step_overhead + layers x layer_overhead + batch x
  (seq_overhead + layers x seq_layer_overhead)``. This is the per-operator dispatch and
  the scheduler, input-building and sampler work a CPU step pays whatever the model.

On a shared machine the speed drifts within seconds. :func:`speed_probe_s` times a
fixed mix of about half a second on an idle machine (matrix products streaming weights, a large copy, small-operator
dispatch) and :func:`scaled` rescales a profile by the ratio of two probes: one taken
with the full measurement, one around the run being predicted.
Nothing here looks at the model being simulated, so a calibration run that compares the
simulator with the engine on SmolLM2-135M is a prediction, not a fit.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import replace

import torch

from kvmap.plan.sim.hardware import Hardware
from kvmap.plan.sim.kvcost import FIXED, PER_TOKEN, KVCosts

OVERHEAD_LAYERS = (1, 8)
OVERHEAD_BATCHES = (1, 16)


def decode_step_s(num_layers: int, batch: int = 1, dtype: str = "bf16", num_tokens: int = 17,
                  repeats: int = 3) -> float:
    """Median decode step of the engine on a random tiny model with ``num_layers`` layers,
    ``batch`` sequences at once."""
    from kvmap import LLM, SamplingParams
    llm = LLM(model=f"dummy:tiny?layers={num_layers}", dtype=dtype, kv=dtype, num_blocks=256,
              block_size=16, max_num_seqs=batch, device="cpu", enable_prefix_caching=False)
    params = SamplingParams(max_tokens=num_tokens, ignore_eos=True)

    def one() -> float:
        out = llm.generate([list(range(1, 9))] * batch, params)[0]
        times = out.metrics.token_times_s
        return (times[-1] - times[1]) / (len(times) - 2)

    one()
    return statistics.mean(one() for _ in range(repeats))


def measure_overheads(dtype: str = "bf16") -> dict[str, float]:
    """Step, layer, sequence and sequence-layer overheads (seconds) from tiny models."""
    (l0, l1), (b0, b1) = OVERHEAD_LAYERS, OVERHEAD_BATCHES
    t = {(layers, batch): decode_step_s(layers, batch, dtype)
         for layers in (l0, l1) for batch in (b0, b1)}
    per_layer = {b: (t[l1, b] - t[l0, b]) / (l1 - l0) for b in (b0, b1)}
    per_step = {b: t[l0, b] - l0 * per_layer[b] for b in (b0, b1)}
    seq_layer = max(0.0, (per_layer[b1] - per_layer[b0]) / (b1 - b0))
    seq = max(0.0, (per_step[b1] - per_step[b0]) / (b1 - b0))
    return {"step_overhead_s": max(0.0, per_step[b0] - b0 * seq),
            "layer_overhead_s": max(0.0, per_layer[b0] - b0 * seq_layer),
            "seq_overhead_s": seq, "seq_layer_overhead_s": seq_layer}


def speed_probe_s(dtype: torch.dtype = torch.bfloat16) -> float:
    """Seconds of a fixed mix of the work a step does (lower: the machine is faster now)."""
    from kvmap.model.linear import PackedLinear
    linears = [PackedLinear(torch.randn(1536, 576, dtype=dtype)) for _ in range(16)]
    x = torch.randn(8, 576, dtype=dtype)
    src = torch.ones(16 * 2**20, dtype=dtype)
    dst = torch.empty_like(src)
    tiny = torch.ones(8, dtype=dtype)

    def mix() -> None:
        for linear in linears:
            linear(x)
        dst.copy_(src)
        for _ in range(200):
            tiny.add_(1)

    mix()
    t0 = time.perf_counter()
    for _ in range(20):          # a total, not a median: the average speed is wanted
        mix()
    return time.perf_counter() - t0


def scaled(hw: Hardware, factor: float) -> Hardware:
    """``hw`` on a machine ``factor`` times as fast (rates up, fixed costs down)."""
    return replace(hw, compute_flops=hw.compute_flops * factor,
                   memory_bandwidth=hw.memory_bandwidth * factor,
                   step_overhead_s=hw.step_overhead_s / factor,
                   layer_overhead_s=hw.layer_overhead_s / factor,
                   seq_overhead_s=hw.seq_overhead_s / factor,
                   seq_layer_overhead_s=hw.seq_layer_overhead_s / factor)


def scaled_costs(costs: KVCosts, factor: float) -> KVCosts:
    """``costs`` on a machine ``factor`` times as fast (every time divided by it)."""
    return replace(costs, **{k: getattr(costs, k) / factor for k in (*PER_TOKEN, *FIXED)})
