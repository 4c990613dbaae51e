"""What the simulator measures of this machine with the engine itself: the overheads of a
step, and a speed probe that follows the machine's load.

The rates (matrix products, the weight stream) are the machine's hardware profile
(:mod:`kvmap.plan.sim.machine`); what only the engine can show is here:

- the overheads: the time of a decode step of kvmap's own engine on random-weight models
  so small (hidden 64) that FLOPs and bytes are nothing, at two layer counts and two
  batch sizes, solved for ``step = step_overhead + layers x layer_overhead + batch x
  (seq_overhead + layers x seq_layer_overhead)``. This is the per-operator dispatch and
  the scheduler, input-building and sampler work a CPU step pays whatever the model.

- the activations: prefill chunks of 256 and 512 tokens through one and through three
  decoder layers of the model's own shape (random weights, :func:`activation_s`), the
  difference is one layer; what it takes beyond its matrix products at the profile's
  rate is the layer's elementwise work, per token (norms, rotary, SiLU, residual adds)
  and per causal pair of the chunk's attention (masks, softmax, copies), which a tiny
  model cannot show (it scales with the hidden size and the chunk).

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


def layer_prefill_s(shape: str, num_layers: int, num_tokens: int, dtype: str,
                    repeats: int = 5) -> float:
    """Fastest of ``repeats`` prefills of one ``num_tokens``-token prompt through random
    weights of catalogued ``shape`` cut to ``num_layers`` layers (and a 256-token
    vocabulary: the output head is not what is measured)."""
    from kvmap import LLM, SamplingParams
    llm = LLM(model=f"dummy:{shape}?layers={num_layers}&vocab=256", dtype=dtype, kv=dtype,
              num_blocks=num_tokens // 16 + 4, block_size=16, max_num_seqs=1,
              max_num_batched_tokens=num_tokens, device="cpu", enable_prefix_caching=False)
    prompt = [1 + i % 250 for i in range(num_tokens)]
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    llm.generate([prompt], params)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        llm.generate([prompt], params)
        times.append(time.perf_counter() - t0)
    return min(times)


def activation_s(shape: str, hw: Hardware, dtype: str, tokens: tuple = (256, 512)
                 ) -> dict[str, float]:
    """A prefill chunk's seconds per layer beyond its matrix products and its attention's
    FLOPs on ``hw`` (the module docstring), split by two chunk lengths into a part per
    token (``token_s``: norms, rotary, activations, residual adds) and a part per causal
    (query, key) pair (``pair_s``: the chunk attention's masks, softmax and copies), each
    at least 0."""
    from kvmap.model.shapes import get_shape
    c = get_shape(shape)
    weights = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads) \
        + 3 * c.hidden_size * c.intermediate_size
    rest = {}
    for n in tokens:
        per_layer_s = (layer_prefill_s(shape, 3, n, dtype)
                       - layer_prefill_s(shape, 1, n, dtype)) / 2
        products_s = max(2 * n * weights / (hw.effective_flops * hw.curve_efficiency(n)),
                         weights * {"fp32": 4}.get(dtype, 2) / hw.effective_bandwidth)
        attention_s = n * (n + 1) / 2 * 4 * c.num_heads * c.head_dim / hw.effective_flops
        rest[n] = per_layer_s - products_s - attention_s
    (n0, n1), pairs = tokens, {n: n * (n + 1) // 2 for n in tokens}
    # rest(n) = token_s n + pair_s pairs(n), two equations
    pair_s = max(0.0, (rest[n1] * n0 - rest[n0] * n1) / (pairs[n1] * n0 - pairs[n0] * n1))
    token_s = max(0.0, (rest[n0] - pair_s * pairs[n0]) / n0)
    return {"token_s": token_s, "pair_s": pair_s}


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
