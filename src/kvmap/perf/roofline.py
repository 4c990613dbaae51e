"""Seconds of prefill and decode work on this machine: shape x rates x calibration.

    prefill  = tokens x FLOP/token / (R x e_prefill) + pairs x attention FLOP/pair / (R x e_attn)
               (a sliding-window layer's pairs capped at its window: ``StepShape``)
               + chunks x step overhead
    decode   = f[codec] x (steps x (weights / (bandwidth x e_stream) + step overhead)
               + tokens x FLOP/token / (R x e_batch) + pairs x attention FLOP/pair / (R x e_kv))

(f[codec]: what a quantized cache's quantize and dequantize operators add to a decode
step.) The step overhead (Python, operator dispatch) is the calibration's, in seconds:
it does not follow the matrix rate.
"""
from __future__ import annotations

from typing import NamedTuple

from kvmap.perf.calibration import CALIBRATION, Calibration
from kvmap.perf.rates import Rates
from kvmap.perf.shape import StepShape


def seconds_of(work, shape: StepShape, rates: Rates, codec: str, chunk_tokens: int,
               cal: Calibration = CALIBRATION) -> tuple[float, float]:
    """``(prefill_s, decode_s)`` of one pass of ``work``: anything with the token counts
        ``prefill_tokens``, ``prefill_pairs``, ``decode_steps``, ``decode_tokens``,
        ``decode_pairs`` and ``num_requests`` (``kvmap.bench.estimate_work.Work``)."""
    overhead = cal.step_overhead_s_per_layer * shape.num_layers
    chunks = work.prefill_tokens / max(1, chunk_tokens) + work.num_requests
    prefill = (work.prefill_tokens * shape.prefill_flop / (rates.flops * cal.e_prefill)
               + shape.prefill_attention_flop(work.prefill_pairs, work.prefill_tokens,
                                              work.num_requests) / (rates.flops * cal.e_attn)
               + chunks * overhead)
    decode = cal.decode_factor_of(codec) * (
        work.decode_steps * (shape.weight_bytes / (rates.read_bytes_per_s * cal.e_stream)
                             + overhead)
        + work.decode_tokens * shape.decode_flop / (rates.flops * cal.e_batch)
        + shape.decode_attention_flop(work.decode_pairs, work.decode_tokens)
        / (rates.flops * cal.e_kv))
    return prefill, decode


class StepTime(NamedTuple):
    """One engine step's seconds by part (``step_time``); ``total_s`` is their sum."""

    compute_s: float                 # products and attention at the calibrated rates
    stream_s: float                  # the weights read once by a step that decodes
    overhead_s: float                # dispatch of every layer's operators, once a step

    @property
    def total_s(self) -> float:
        return self.compute_s + self.stream_s + self.overhead_s


def step_time(shape: StepShape, rates: Rates, codec: str, cal: Calibration, *,
              prefill_tokens: int, prefill_pairs: int, decode_tokens: int,
              decode_pairs: int) -> StepTime:
    """One step of the engine (the simulator's, ``kvmap.plan.sim.costmodel``) by the terms of
    :func:`seconds_of`: a step's ``prefill_tokens`` of prompt chunks over ``prefill_pairs``
    causal pairs and ``decode_tokens`` decoding rows over ``decode_pairs`` cached keys. It
    pays the step overhead once; a step that decodes streams the weights, and its decode
    terms and overhead take the codec's factor -- so a pure decode step is exactly
    ``seconds_of``'s decode of one step, a pure prefill chunk its prefill of one chunk."""
    r, f = rates.flops, cal.decode_factor_of(codec)
    # a sliding layer's query sees at most its window (``StepShape``): a chunk's pairs are
    # capped per query, as a decoding row's are
    prefill_s = (prefill_tokens * shape.prefill_flop / (r * cal.e_prefill)
                 + shape.decode_attention_flop(prefill_pairs, prefill_tokens)
                 / (r * cal.e_attn))
    overhead_s = cal.step_overhead_s_per_layer * shape.num_layers
    if not decode_tokens:
        return StepTime(prefill_s, 0.0, overhead_s)
    decode_s = (decode_tokens * shape.decode_flop / (r * cal.e_batch)
                + shape.decode_attention_flop(decode_pairs, decode_tokens) / (r * cal.e_kv))
    stream_s = shape.weight_bytes / (rates.read_bytes_per_s * cal.e_stream)
    return StepTime(prefill_s + f * decode_s, f * stream_s, f * overhead_s)
