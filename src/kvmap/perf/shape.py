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
    # the layers by the window they attend through: ((window or None: global, their
    # share of ``attn_flop_per_pair``), ...); a sliding layer's pairs stop at its window
    attn_windows: tuple[tuple[int | None, float], ...] = ((None, 1.0),)

    def prefill_attention_flop(self, pairs: float, tokens: float, prompts: float) -> float:
        """FLOPs of a prefill's ``pairs`` over ``tokens`` prompt tokens of ``prompts``
        prompts, a sliding layer's capped at its window (``prefill_pairs_within``)."""
        return self._attention_flop(pairs, lambda w: prefill_pairs_within(pairs, tokens,
                                                                           prompts, w))

    def decode_attention_flop(self, pairs: float, tokens: float) -> float:
        """FLOPs of ``tokens`` decoded tokens reading ``pairs`` cached tokens in all, a
        sliding layer's at most its window per token."""
        return self._attention_flop(pairs, lambda w: min(pairs, tokens * w))

    def _attention_flop(self, pairs: float, within) -> float:
        return self.attn_flop_per_pair * sum(
            share * (pairs if window is None else within(window))
            for window, share in self.attn_windows)

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
        windows = config.layer_windows
        shares = tuple((w, windows.count(w) / len(windows)) for w in dict.fromkeys(windows))
        return cls(prefill_flop=2.0 * per_layer * config.num_layers,
                   decode_flop=2.0 * (per_layer * config.num_layers + head),
                   attn_flop_per_pair=4.0 * config.num_heads * hd * config.num_layers,
                   weight_bytes=float(streamed_weight_bytes(config, quantization or None,
                                                            DENSE_BYTES[dtype])),
                   num_layers=config.num_layers, attn_windows=shares)


def prefill_pairs_within(pairs: float, tokens: float, prompts: float, window: int) -> float:
    """Of ``pairs`` (P^2/2 a prompt of P tokens), those a layer attending through a
    ``window``-token sliding window computes: P x W - W^2/2 a prompt longer than W, from
    the prompts' mean length."""
    if prompts <= 0 or tokens / prompts <= window:
        return pairs
    length = tokens / prompts
    return min(pairs, prompts * (length * window - window * window / 2))
