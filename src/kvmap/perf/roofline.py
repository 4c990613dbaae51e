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
