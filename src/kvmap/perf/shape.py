"""The shape of a step: what one token, one attention pair, one decode step moves and
computes in a model, from its config alone (``StepShape.of``)."""
from __future__ import annotations

from dataclasses import dataclass

# bytes a weight takes in each weight format (``kvmap.model.wquant.WEIGHT_FORMATS``; a
# test holds that every registered format has a row) and each dense compute dtype
WEIGHT_BYTES = {"int8": 1.0, "w8a8": 1.0, "int4": 0.5}
DENSE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0}


@dataclass(frozen=True)
class StepShape:
    """FLOPs and bytes of one model (per prompt token, decoded token, attention pair)."""

    prefill_flop: float              # per prompt token (no output head: last position only)
    decode_flop: float               # per decoded token (with the output head)
    attn_flop_per_pair: float        # QK^T and AV of one (query, cached key) pair, all layers
    weight_bytes: float              # streamed once per decode step
    num_layers: int

    @classmethod
    def of(cls, config, dtype: str, quantization: str | None = None) -> StepShape:
        """ValueError naming ``quantization`` or ``dtype`` when it has no byte rule."""
        if quantization and quantization not in WEIGHT_BYTES:
            raise ValueError(f"quantization={quantization!r} has no byte rule in "
                             f"kvmap.perf.shape (known: {', '.join(WEIGHT_BYTES)})")
        if not quantization and dtype not in DENSE_BYTES:
            raise ValueError(f"dtype={dtype!r} has no byte rule in kvmap.perf.shape "
                             f"(known: {', '.join(DENSE_BYTES)})")
        h, hd = config.hidden_size, config.head_dim
        per_layer = (h * config.num_heads * hd * 2 + h * config.num_kv_heads * hd * 2
                     + 3 * h * config.intermediate_size)
        head = h * config.vocab_size
        width = WEIGHT_BYTES[quantization] if quantization else DENSE_BYTES[dtype]
        return cls(prefill_flop=2.0 * per_layer * config.num_layers,
                   decode_flop=2.0 * (per_layer * config.num_layers + head),
                   attn_flop_per_pair=4.0 * config.num_heads * hd * config.num_layers,
                   weight_bytes=(per_layer * config.num_layers + head) * width,
                   num_layers=config.num_layers)
