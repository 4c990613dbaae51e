"""What a Gemma 3 GGUF says about its layers, and what llama.cpp assumes where it is silent.

A ``gemma3`` GGUF written by llama.cpp's converter carries the window
(``gemma3.attention.sliding_window``) but not which layers slide, the RoPE base of the
sliding layers, nor the attention scale. llama.cpp (``llama-model.cpp``, ``LLM_ARCH_GEMMA3``)
fills them in by rule, and so does transformers from ``Gemma3TextConfig``'s defaults;
kvmap reads the keys when a file has them and applies the same rule when it has not:

| field | key read when present | rule otherwise |
|---|---|---|
| sliding layers | ``attention.sliding_window_pattern`` (a period n, or one flag per layer) | period 6: layer i slides unless (i + 1) % 6 == 0 |
| RoPE base of sliding layers | ``rope.freq_base_swa`` | 10,000 |
| attention scale | ``attention.scale`` (the factor itself) | 1 / sqrt(key_length) (the 62-layer 27B: 1 / sqrt(hidden / heads)) |

No window (key absent or 0) means every layer is global. A final-logit soft cap
(``final_logit_softcapping``, Gemma 2's) is not implemented: a file that sets one is a
ValueError naming the key.
"""
from __future__ import annotations

from typing import Any

SWA_PERIOD = 6                 # llama.cpp's set_swa_pattern(6) for gemma3
LOCAL_ROPE_THETA = 10000.0     # llama.cpp's rope_freq_base_train_swa for gemma3
_27B_LAYERS = 62


def gemma3_fields(metadata: dict[str, Any], tensor_shapes: dict[str, tuple[int, ...]],
                  name: str) -> dict[str, Any]:
    """The ``ModelConfig`` fields of a Gemma 3 GGUF beyond the Llama ones: sliding
    window and layers, local RoPE base, ``query_pre_attn_scalar``."""
    def meta(key: str, default: Any = None) -> Any:
        return metadata.get(f"gemma3.{key}", default)

    cap = meta("final_logit_softcapping")
    if cap:
        raise ValueError(f"GGUF {name!r} sets gemma3.final_logit_softcapping={cap}, which "
                         f"kvmap's gemma3 decoder does not implement")
    num_layers = int(meta("block_count"))
    hidden, heads = int(meta("embedding_length")), int(meta("attention.head_count"))
    head_dim = int(meta("attention.key_length", hidden // heads))
    scale = meta("attention.scale")
    if scale:
        scalar = 1.0 / float(scale) ** 2
    else:
        scalar = float(hidden // heads if num_layers == _27B_LAYERS else head_dim)
    window = int(meta("attention.sliding_window", 0) or 0)
    if not window:
        return {"query_pre_attn_scalar": scalar}
    pattern = meta("attention.sliding_window_pattern", SWA_PERIOD)
    if isinstance(pattern, (list, tuple)):
        if len(pattern) != num_layers:
            raise ValueError(f"GGUF {name!r}: gemma3.attention.sliding_window_pattern has "
                             f"{len(pattern)} flags for {num_layers} layers")
        sliding = tuple(i for i, flag in enumerate(pattern) if flag)
    else:
        period = int(pattern)
        sliding = tuple(i for i in range(num_layers) if period and (i + 1) % period)
    return {"sliding_window": window, "sliding_layers": sliding,
            "rope_local_theta": float(meta("rope.freq_base_swa", LOCAL_ROPE_THETA)),
            "query_pre_attn_scalar": scalar}
