"""A catalogue of named Llama-family shapes, and the tensor shapes a shape implies.

The hyper-parameters are the published ones (each model's Hugging Face ``config.json``),
so a ``dummy:<shape>`` model sizes KV memory exactly like the real one. Names are
lower-case and looked up case-insensitively::

    get_shape("Llama-3-8B").num_kv_heads          # 8
    with_layers(get_shape("llama-3-8b"), 2)       # same shape, 2 layers

Where a model has base and instruct configs that differ, the base config is used
(context length), with the instruct model's end-of-turn token added to ``eos_token_ids``.
"""
from __future__ import annotations

import dataclasses

from kvmap.config import ModelConfig

# Llama 3.1's "llama3" RoPE scaling (rope_theta 500000, 8k original context -> 128k).
_LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

_LLAMA2 = dict(head_dim=128, vocab_size=32000, rope_theta=10000.0, rms_norm_eps=1e-5,
               max_position_embeddings=4096, bos_token_id=1, eos_token_ids=(2,))
_LLAMA3 = dict(head_dim=128, vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5,
               max_position_embeddings=8192, bos_token_id=128000,
               eos_token_ids=(128001, 128009))
_LLAMA31 = dict(_LLAMA3, max_position_embeddings=131072, rope_scaling=_LLAMA31_ROPE,
                eos_token_ids=(128001, 128008, 128009))
_QWEN25 = dict(head_dim=128, vocab_size=152064, rope_theta=1000000.0,
               max_position_embeddings=131072, attention_bias=True, bos_token_id=None,
               eos_token_ids=(151643, 151645))
_MISTRAL = dict(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
                intermediate_size=14336, rms_norm_eps=1e-5, max_position_embeddings=32768,
                bos_token_id=1, eos_token_ids=(2,))


def _shape(name: str, **fields) -> ModelConfig:
    return ModelConfig(name=name, **fields)


SHAPES: dict[str, ModelConfig] = {c.name: c for c in (
    _shape("llama-2-7b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=32,
           intermediate_size=11008, **_LLAMA2),
    _shape("llama-2-13b", num_layers=40, hidden_size=5120, num_heads=40, num_kv_heads=40,
           intermediate_size=13824, **_LLAMA2),
    _shape("llama-2-70b", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
           intermediate_size=28672, **_LLAMA2),
    _shape("llama-3-8b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
           intermediate_size=14336, **_LLAMA3),
    _shape("llama-3-70b", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
           intermediate_size=28672, **_LLAMA3),
    _shape("llama-3.1-8b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
           intermediate_size=14336, **_LLAMA31),
    _shape("llama-3.1-70b", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
           intermediate_size=28672, **_LLAMA31),
    # 405B was only released as Llama 3.1, so it carries the 3.1 RoPE scaling.
    _shape("llama-3.1-405b", num_layers=126, hidden_size=16384, num_heads=128, num_kv_heads=8,
           intermediate_size=53248, **_LLAMA31),
    _shape("qwen2.5-7b", num_layers=28, hidden_size=3584, num_heads=28, num_kv_heads=4,
           intermediate_size=18944, rms_norm_eps=1e-6, **_QWEN25),
    _shape("qwen2.5-14b", num_layers=48, hidden_size=5120, num_heads=40, num_kv_heads=8,
           intermediate_size=13824, rms_norm_eps=1e-5, **_QWEN25),
    _shape("qwen2.5-72b", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
           intermediate_size=29568, rms_norm_eps=1e-5, **_QWEN25),
    # v0.1 attends through a 4096-token sliding window; v0.2 and v0.3 dropped it.
    _shape("mistral-7b-v0.1", vocab_size=32000, rope_theta=10000.0, sliding_window=4096,
           **_MISTRAL),
    _shape("mistral-7b-v0.3", vocab_size=32768, rope_theta=1000000.0, sliding_window=None,
           **_MISTRAL),
    _shape("smollm2-135m", num_layers=30, hidden_size=576, num_heads=9, num_kv_heads=3,
           head_dim=64, intermediate_size=1536, vocab_size=49152, rope_theta=100000.0,
           rms_norm_eps=1e-5, max_position_embeddings=8192, tie_word_embeddings=True,
           bos_token_id=1, eos_token_ids=(2,)),
    # Gemma 3 270M as its GGUF describes it (kvmap.model.gemma3_config): five sliding
    # layers of a 512-token window, then one global, three times.
    _shape("gemma3-270m", num_layers=18, hidden_size=640, num_heads=4, num_kv_heads=1,
           head_dim=256, intermediate_size=2048, vocab_size=262144, rope_theta=1000000.0,
           rms_norm_eps=1e-6, max_position_embeddings=32768, tie_word_embeddings=True,
           bos_token_id=2, eos_token_ids=(1, 106), architecture="gemma3", sliding_window=512,
           sliding_layers=tuple(i for i in range(18) if (i + 1) % 6),
           rope_local_theta=10000.0, query_pre_attn_scalar=256.0),
    # For unit tests: every code path (GQA, untied head) at a size that runs in milliseconds.
    _shape("tiny", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
           intermediate_size=128, vocab_size=256, rope_theta=10000.0, rms_norm_eps=1e-5,
           max_position_embeddings=512, bos_token_id=1, eos_token_ids=(2,)),
    # ... and the hybrid kind (gemma3 decoder): layers 0 and 2 slide over 8 tokens
    _shape("tiny-hybrid", num_layers=3, hidden_size=64, num_heads=4, num_kv_heads=2,
           head_dim=16, intermediate_size=128, vocab_size=256, rope_theta=10000.0,
           rms_norm_eps=1e-6, max_position_embeddings=512, tie_word_embeddings=True,
           bos_token_id=1, eos_token_ids=(2,), architecture="gemma3", sliding_window=8,
           sliding_layers=(0, 2), rope_local_theta=1000.0, query_pre_attn_scalar=16.0),
)}

ALIASES: dict[str, str] = {
    "llama-3-405b": "llama-3.1-405b",
    "mistral-7b": "mistral-7b-v0.1",
    "smollm2": "smollm2-135m",
    "gemma3": "gemma3-270m",
}


def shape_names() -> list[str]:
    """Every name ``get_shape`` accepts (canonical names and aliases), sorted."""
    return sorted([*SHAPES, *ALIASES])


def get_shape(name: str) -> ModelConfig:
    """The catalogued shape called ``name`` (case-insensitive); ValueError names the valid ones."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in SHAPES:
        raise ValueError(f"unknown model shape {name!r}; valid shapes: {', '.join(shape_names())}")
    return SHAPES[key]


def with_layers(config: ModelConfig, num_layers: int) -> ModelConfig:
    """``config`` with ``num_layers`` decoder layers; the name records the override."""
    if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers <= 0:
        raise ValueError(f"num_layers={num_layers!r} must be a positive integer")
    if num_layers == config.num_layers:
        return config
    sliding = None if config.sliding_layers is None else tuple(
        i for i in config.sliding_layers if i < num_layers)
    return dataclasses.replace(config, name=f"{config.name}?layers={num_layers}",
                               num_layers=num_layers, sliding_layers=sliding)


def with_vocab(config: ModelConfig, vocab_size: int) -> ModelConfig:
    """``config`` with a vocabulary of ``vocab_size`` tokens (special token ids outside it
    dropped); the name records the override. A dummy model's cut vocabulary keeps the
    output head from hiding the KV cache's effects on time and memory."""
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size <= 0:
        raise ValueError(f"vocab_size={vocab_size!r} must be a positive integer")
    if vocab_size == config.vocab_size:
        return config
    sep = "&" if "?" in config.name else "?"
    bos = config.bos_token_id if config.bos_token_id is not None \
        and config.bos_token_id < vocab_size else None
    return dataclasses.replace(config, name=f"{config.name}{sep}vocab={vocab_size}",
                               vocab_size=vocab_size, bos_token_id=bos,
                               eos_token_ids=tuple(t for t in config.eos_token_ids
                                                   if t < vocab_size))


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Hugging Face name -> tensor shape for every weight a model of this shape has.

    Linear weights are ``(out_features, in_features)`` as in ``nn.Linear``. ``lm_head.weight``
    is absent when the embeddings are tied; q/k/v biases are present when
    ``config.attention_bias``.
    """
    h, d, ffn = config.hidden_size, config.head_dim, config.intermediate_size
    q_dim, kv_dim = config.num_heads * d, config.num_kv_heads * d
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, h)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (q_dim, h)
        shapes[p + "self_attn.k_proj.weight"] = (kv_dim, h)
        shapes[p + "self_attn.v_proj.weight"] = (kv_dim, h)
        if config.attention_bias:
            shapes[p + "self_attn.q_proj.bias"] = (q_dim,)
            shapes[p + "self_attn.k_proj.bias"] = (kv_dim,)
            shapes[p + "self_attn.v_proj.bias"] = (kv_dim,)
        shapes[p + "self_attn.o_proj.weight"] = (h, q_dim)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (ffn, h)
        shapes[p + "mlp.up_proj.weight"] = (ffn, h)
        shapes[p + "mlp.down_proj.weight"] = (h, ffn)
        if config.architecture == "gemma3":
            shapes[p + "pre_feedforward_layernorm.weight"] = (h,)
            shapes[p + "post_feedforward_layernorm.weight"] = (h,)
            shapes[p + "self_attn.q_norm.weight"] = (d,)
            shapes[p + "self_attn.k_norm.weight"] = (d,)
    shapes["model.norm.weight"] = (h,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    return shapes


def check_weights(config: ModelConfig, weights: dict) -> None:
    """Raise ValueError naming the first missing, unexpected or mis-shaped weight."""
    expected = weight_shapes(config)
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    if missing or extra:
        raise ValueError(f"weights for {config.name!r} do not match its shape: "
                         f"missing {missing[:5]}, unexpected {extra[:5]}")
    for name, shape in expected.items():
        if tuple(weights[name].shape) != shape:
            raise ValueError(f"weight {name!r} has shape {tuple(weights[name].shape)}, "
                             f"expected {shape} for {config.name!r}")
