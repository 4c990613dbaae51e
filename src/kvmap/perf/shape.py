"""The shape of a step: what one token, one attention pair, one decode step moves and
computes in a model, from its config alone (``StepShape.of``)."""
from __future__ import annotations

from dataclasses import dataclass

from kvmap.perf.weights import ENGINE_RULES, streamed_weight_bytes

DENSE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}        # a compute dtype's value


@dataclass(frozen=True)
class StepShape:
    """FLOPs and bytes of one model (per prompt token, decoded token, attention pair)."""

    prefill_flop: float              # per prompt token (no output head: last position only)
    decode_flop: float               # per decoded token (with the output head)
    attn_flop_per_pair: float        # QK^T and AV of one (query, cached key) pair, all layers
    weight_bytes: float              # streamed once per decode step (``perf.weights``)
    num_layers: int

    @classmethod
    def of(cls, config, dtype: str, quantization: str | None = None) -> StepShape:
        """ValueError naming ``quantization`` or ``dtype`` when it has no byte rule."""
        if quantization not in ENGINE_RULES:
            raise ValueError(f"quantization={quantization!r} has no byte rule in "
                             f"kvmap.perf.weights (known: {', '.join(map(repr, ENGINE_RULES))})")
        if dtype not in DENSE_BYTES:
            raise ValueError(f"dtype={dtype!r} has no byte rule in kvmap.perf.shape "
                             f"(known: {', '.join(DENSE_BYTES)})")
        h, hd = config.hidden_size, config.head_dim
        per_layer = (h * config.num_heads * hd * 2 + h * config.num_kv_heads * hd * 2
                     + 3 * h * config.intermediate_size)
        head = h * config.vocab_size
        return cls(prefill_flop=2.0 * per_layer * config.num_layers,
                   decode_flop=2.0 * (per_layer * config.num_layers + head),
                   attn_flop_per_pair=4.0 * config.num_heads * hd * config.num_layers,
                   weight_bytes=float(streamed_weight_bytes(config, quantization or None,
                                                            DENSE_BYTES[dtype])),
                   num_layers=config.num_layers)
