"""``cpu-this-machine``: simulator hardware measured on this machine by microbenchmarks.

Three measurements, each a mean of repeats, with ``torch.set_num_threads(num_threads)``
(restored afterwards) so that they match an engine run with the same thread count:

- ``compute_flops`` and ``compute_curve``: the engine's own matrix product
  (``kvmap.model.linear.PackedLinear``, oneDNN with a prepacked weight) by ``M`` = 1 ...
  1024 rows, cycling through 64 MiB of random weights of ``matmul_shapes`` (default one
  4096 x 1024 matrix; :func:`layer_shapes` gives a model's, to measure at its shapes) in
  the engine's dtype, so weights stream from memory as in a forward pass: the best rate is
  the peak, and each ``M``'s share of it is the curve (a decode step multiplies a few
  rows at a time, far below the peak rate), made non-decreasing in ``M``;
- ``memory_bandwidth``: bytes read plus written per second by a tensor copy larger than
  the caches (the convention of ``/work/shared/CALIBRATION.md``);
- the overheads: the time of a decode step of kvmap's own engine on random-weight models
  so small (hidden 64) that FLOPs and bytes are nothing, at two layer counts and two
  batch sizes, solved for ``step = step_overhead + layers x layer_overhead + batch x
  (seq_overhead + layers x seq_layer_overhead)``. This is the per-operator dispatch and
  the scheduler, input-building and sampler work a CPU step pays whatever the model.

Efficiencies are 1: the rates are what the machine achieved, not spec-sheet peaks.

On a shared machine the speed drifts within seconds. :func:`speed_probe_s` times a
fixed mix of about half a second on an idle machine (matrix products streaming weights, a large copy, small-operator
dispatch) and :func:`scaled` rescales a profile by the ratio of two probes: one taken
with the full measurement, one around the run being predicted.
Nothing here looks at the model being simulated, so a calibration run that compares the
simulator with the engine on SmolLM2-135M is a prediction, not a fit.
"""
from __future__ import annotations

import functools
import statistics
import time

import psutil
import torch

from kvmap.plan.sim.hardware import Hardware

THIS_MACHINE = "cpu-this-machine"
OVERHEAD_LAYERS = (1, 8)
OVERHEAD_BATCHES = (1, 16)
CURVE_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def _mean_s(fn, repeats: int) -> float:
    """Mean seconds of ``fn`` after a warm-up. A mean, not a median or a minimum: on a
    shared machine a long run sees the bursts of load too, and so must its prediction."""
    fn()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def matmul_curve(dtype: torch.dtype = torch.bfloat16,
                 shapes: tuple[tuple[int, int], ...] = ((4096, 1024),),
                 rows: tuple[int, ...] = CURVE_ROWS, repeats: int = 5,
                 stream_bytes: int = 64 * 2**20) -> dict[int, float]:
    """FLOP/s of the engine's ``PackedLinear`` over weights of ``shapes`` ((out, in) each,
    as a model's layer holds them) for each number of ``rows``.

    As in a forward pass, every call multiplies by another weight: the calls cycle through
    copies of the shapes, ``stream_bytes`` in all, so the weights come from memory, not
    from the caches, and the small-``rows`` rates include reading them. A call's fixed
    cost stays in: small matrices pay it at every call (the tiny-model overheads count
    it again, a few microseconds per matrix)."""
    from kvmap.model.linear import PackedLinear

    def per_call_s(linears: list, inputs: list) -> float:
        def run() -> None:
            for linear, x in zip(linears, inputs):
                linear(x)
        return _mean_s(run, 1) / len(linears)

    bytes_per_set = sum(n * k for n, k in shapes) * torch.finfo(dtype).bits // 8
    num_sets = max(1, stream_bytes // bytes_per_set)
    linears = [PackedLinear(torch.randn(n, k, dtype=dtype))
               for _ in range(num_sets) for n, k in shapes]
    flops_per_row = 2 * sum(n * k for n, k in shapes) * num_sets
    inputs = {m: [torch.randn(m, linear.weight.shape[1], dtype=dtype) for linear in linears]
              for m in rows}
    # Passes over all row counts, interleaved, and the median per row count: a burst of
    # the machine's other load then hits one pass of every row count, not one row count.
    samples: dict[int, list[float]] = {m: [] for m in rows}
    for _ in range(repeats):
        for m in rows:
            seconds = per_call_s(linears, inputs[m]) * len(linears)
            samples[m].append(m * flops_per_row / seconds)
    return {m: statistics.median(rates) for m, rates in samples.items()}


def layer_shapes(config) -> tuple[tuple[int, int], ...]:
    """The (out, in) shapes of one decoder layer's matrices (``kvmap.model.shapes``)."""
    from kvmap.model.shapes import weight_shapes
    return tuple(shape for name, shape in weight_shapes(config).items()
                 if name.startswith("model.layers.0.") and name.endswith("_proj.weight"))


def copy_bandwidth(num_bytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Bytes read + written per second by ``dst.copy_(src)``."""
    src = torch.ones(num_bytes // 2, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    return 2 * num_bytes / _mean_s(lambda: dst.copy_(src), repeats)


def read_bandwidth(num_bytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Bytes read per second by a sum over ``num_bytes`` of int64 (a stream of reads with
    no writes, as a decode step's matrix products read their weights); the median of
    ``repeats`` after a warm-up."""
    x = torch.ones(num_bytes // 8, dtype=torch.int64)
    x.sum()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - t0)
    return num_bytes / statistics.median(times)


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


def measure_this_machine(dtype: str = "bf16", num_threads: int = 1,
                         matmul_shapes: tuple[tuple[int, int], ...] = ((4096, 1024),)
                         ) -> Hardware:
    """Measure this machine (about ten seconds); see the module docstring."""
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16,
                       "fp32": torch.float32}[dtype]
        rates = matmul_curve(torch_dtype, shapes=matmul_shapes)
        bandwidth = copy_bandwidth()
        overheads = measure_overheads(dtype)
    finally:
        torch.set_num_threads(previous)
    peak = max(rates.values())
    # Non-decreasing: more rows never multiply slower in steady state; a dip is a burst of
    # load from the machine's other users during that one measurement.
    curve, best = [], 0.0
    for m, rate in sorted(rates.items()):
        best = max(best, rate)
        curve.append((m, min(1.0, best / peak)))
    curve = tuple(curve)
    return Hardware(name=THIS_MACHINE, memory_bytes=psutil.virtual_memory().total,
                    compute_flops=peak, memory_bandwidth=bandwidth, compute_efficiency=1.0,
                    bandwidth_efficiency=1.0, compute_curve=curve, gpu_memory_utilization=1.0,
                    reserve_bytes=0, **overheads)


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
    from dataclasses import replace
    return replace(hw, compute_flops=hw.compute_flops * factor,
                   memory_bandwidth=hw.memory_bandwidth * factor,
                   step_overhead_s=hw.step_overhead_s / factor,
                   layer_overhead_s=hw.layer_overhead_s / factor,
                   seq_overhead_s=hw.seq_overhead_s / factor,
                   seq_layer_overhead_s=hw.seq_layer_overhead_s / factor)


@functools.lru_cache(maxsize=4)
def this_machine(dtype: str = "bf16", num_threads: int = 1) -> Hardware:
    """:func:`measure_this_machine`, measured once per process."""
    return measure_this_machine(dtype, num_threads)
