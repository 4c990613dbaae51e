"""Hugging Face ``config.json`` of the families whose KV is not (only) Llama-shaped, read
for the planner: each gives a :class:`PlanModel` with its layer kinds
(:class:`kvmap.kv.layer_kinds.KVLayout`), its parameter count from its own shapes, and a
``ModelConfig`` that is the KV pool's equivalent shape (the paged layers as K+V heads):

| architecture | layers | KV pool shape (``config``) |
|---|---|---|
| Gemma3ForCausalLM / ...ConditionalGeneration | sliding (``layer_types`` or every layer but each 6th) + global | as the model |
| GptOssForCausalLM | sliding (128) / global alternating (``layer_types``) | as the model |
| Qwen3ForCausalLM, Qwen3MoeForCausalLM | global | as the model (qk-norm holds no KV) |
| Qwen3NextForCausalLM | linear (gated DeltaNet) + global each ``full_attention_interval``-th | the global layers only |
| DeepseekV3ForCausalLM | mla | 1 "head" of (kv_lora_rank + qk_rope_head_dim) / 2 for K and for V |
| Llama4ForConditionalGeneration / ...CausalLM | chunked (``attention_chunk_size``) + global (the NoPE layers) | chunked as a window of the chunk (its peak) |

A key the published config leaves out takes the transformers default of that config
class (Gemma 3's 4B/27B ``text_config`` omit ``max_position_embeddings``: 131,072). A
multimodal model's vision tower is not counted in its weights.
"""
from __future__ import annotations

from typing import Any, Callable

from kvmap.config import ModelConfig
from kvmap.kv.layer_kinds import (ChunkedLocal, GlobalAttention, KVLayout, LinearState,
                                  MLALatent, SlidingWindow)
from kvmap.plan.plan_model import PlanModel

GEMMA3_TEXT_DEFAULTS = {"vocab_size": 262208, "num_attention_heads": 8, "num_key_value_heads": 4,
                        "head_dim": 256, "max_position_embeddings": 131072,
                        "sliding_window": 4096, "sliding_window_pattern": 6,
                        "tie_word_embeddings": True, "rope_theta": 1e6}
LLAMA4_NO_ROPE_INTERVAL = 4          # Llama4TextConfig: every 4th layer is NoPE (global)


def _get(hf: dict, key: str, defaults: dict | None = None) -> Any:
    if key in hf and hf[key] is not None:
        return hf[key]
    if defaults and key in defaults:
        return defaults[key]
    raise KeyError(key)


def _attention_params(h: int, num_heads: int, num_kv_heads: int, head_dim: int) -> int:
    return 2 * h * num_heads * head_dim + 2 * h * num_kv_heads * head_dim      # q, o + k, v


def _embedding_params(hf: dict, h: int, tied: bool) -> int:
    return hf["vocab_size"] * h * (1 if tied else 2)


def _pool_config(name: str, hf: dict, *, num_layers: int, num_heads: int, num_kv_heads: int,
                 head_dim: int, intermediate: int, max_pos: int, window: int | None = None,
                 sliding: tuple[int, ...] | None = None, architecture: str = "llama"
                 ) -> ModelConfig:
    return ModelConfig(name=name, num_layers=num_layers, hidden_size=hf["hidden_size"],
                       num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                       intermediate_size=intermediate, vocab_size=hf["vocab_size"],
                       max_position_embeddings=max_pos, sliding_window=window,
                       sliding_layers=sliding, architecture=architecture)


def _typed_layers(hf: dict, num_layers: int, is_sliding: Callable[[int], bool]
                  ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(sliding, global)`` layers from ``layer_types`` when given, else by rule."""
    types = hf.get("layer_types")
    if types:
        if len(types) != num_layers:
            raise ValueError(f"layer_types has {len(types)} entries for {num_layers} layers")
        flags = [t != "full_attention" for t in types]
    else:
        flags = [is_sliding(i) for i in range(num_layers)]
    return (tuple(i for i, f in enumerate(flags) if f),
            tuple(i for i, f in enumerate(flags) if not f))


def _hybrid(name: str, hf: dict, defaults: dict, experts: tuple[int, int, int] | None,
            architecture: str, period: int) -> PlanModel:
    """Sliding + global layers of one K+V shape (Gemma 3, GPT-OSS)."""
    g = lambda k: _get(hf, k, defaults)           # noqa: E731
    n, h, heads, kv, d = (g("num_hidden_layers"), g("hidden_size"), g("num_attention_heads"),
                          g("num_key_value_heads"), g("head_dim"))
    window = g("sliding_window")
    sliding, glob = _typed_layers(hf, n, lambda i: bool(period) and (i + 1) % period != 0)
    num_experts, per_tok, inter = experts or (1, 1, g("intermediate_size"))
    mlp = num_experts * 3 * h * inter
    config = _pool_config(name, {**defaults, **hf}, num_layers=n, num_heads=heads,
                          num_kv_heads=kv, head_dim=d, intermediate=inter,
                          max_pos=g("max_position_embeddings"), window=window,
                          sliding=sliding, architecture=architecture)
    layout = KVLayout(((GlobalAttention(glob, kv, d),) if glob else ()) +
                      (SlidingWindow(sliding, kv, d, window),), n)
    return PlanModel(config, num_experts, per_tok, layout=layout,
                     linear_params=n * (_attention_params(h, heads, kv, d) + mlp),
                     other_params=_embedding_params({**defaults, **hf}, h,
                                                    bool(g("tie_word_embeddings")))
                     + n * h * num_experts * (num_experts > 1))


def _gemma3(hf: dict, name: str) -> PlanModel:
    text = hf.get("text_config") or hf
    return _hybrid(name, text, GEMMA3_TEXT_DEFAULTS, None, "gemma3",
                   _get(text, "sliding_window_pattern", GEMMA3_TEXT_DEFAULTS))


def _gpt_oss(hf: dict, name: str) -> PlanModel:
    experts = (hf["num_local_experts"], hf.get("num_experts_per_tok")
               or hf["experts_per_token"], hf["intermediate_size"])
    return _hybrid(name, hf, {"tie_word_embeddings": False}, experts, "llama", 2)


def _qwen3(hf: dict, name: str) -> PlanModel:
    from kvmap.model.hf_loader import config_from_hf
    # Qwen3's attention is Llama's plus q/k RMSNorm, which holds no KV
    window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
    config = config_from_hf({**hf, "architectures": ["LlamaForCausalLM"],
                             "sliding_window": window}, name)
    return PlanModel(config, layout=KVLayout.of_config(config))


def _qwen3_moe(hf: dict, name: str) -> PlanModel:
    """Qwen3's attention on every layer, each MLP ``num_experts`` experts of
    ``moe_intermediate_size`` (Qwen3-30B-A3B, Qwen3-235B-A22B)."""
    n, h = hf["num_hidden_layers"], hf["hidden_size"]
    heads, kv, d = hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]
    num_experts, inter = hf["num_experts"], hf["moe_intermediate_size"]
    config = _pool_config(name, hf, num_layers=n, num_heads=heads, num_kv_heads=kv,
                          head_dim=d, intermediate=inter, max_pos=hf["max_position_embeddings"])
    return PlanModel(config, num_experts, hf["num_experts_per_tok"],
                     layout=KVLayout.of_config(config),
                     linear_params=n * (_attention_params(h, heads, kv, d)
                                        + num_experts * 3 * h * inter),
                     other_params=_embedding_params(hf, h, hf.get("tie_word_embeddings", False))
                     + n * h * num_experts)


def _qwen3_next(hf: dict, name: str) -> PlanModel:
    """Gated DeltaNet layers, and full attention every ``full_attention_interval``-th.
    A linear layer's state per sequence: the recurrent matrix (v_heads x k_dim x v_dim)
    and the causal conv's last kernel - 1 inputs of (2 x k_heads x k_dim + v_heads x
    v_dim) channels."""
    n, h = hf["num_hidden_layers"], hf["hidden_size"]
    heads, kv, d = hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]
    interval = hf.get("full_attention_interval", 4)
    linear, glob = _typed_layers(hf, n, lambda i: (i + 1) % interval != 0)
    kh, vh = hf["linear_num_key_heads"], hf["linear_num_value_heads"]
    kd, vd = hf["linear_key_head_dim"], hf["linear_value_head_dim"]
    conv_channels = 2 * kh * kd + vh * vd
    state = vh * kd * vd + (hf["linear_conv_kernel_dim"] - 1) * conv_channels
    layout = KVLayout((GlobalAttention(glob, kv, d), LinearState(linear, state)), n)
    num_experts, inter = hf["num_experts"], hf["moe_intermediate_size"]
    moe = (num_experts * inter + hf.get("shared_expert_intermediate_size", 0)) * 3 * h
    gated_attention = 3 * h * heads * d + 2 * h * kv * d            # q doubled: its gate
    deltanet = h * (2 * kh * kd + 2 * vh * vd) + h * 2 * vh + vh * vd * h
    config = _pool_config(name, hf, num_layers=len(glob), num_heads=heads, num_kv_heads=kv,
                          head_dim=d, intermediate=inter, max_pos=hf["max_position_embeddings"])
    return PlanModel(config, num_experts, hf["num_experts_per_tok"], layout=layout,
                     linear_params=len(glob) * gated_attention + len(linear) * deltanet
                     + n * moe,
                     other_params=_embedding_params(hf, h, hf.get("tie_word_embeddings", False))
                     + n * h * num_experts + len(linear) * conv_channels
                     * hf["linear_conv_kernel_dim"])


def _deepseek_v3(hf: dict, name: str) -> PlanModel:
    """MLA on every layer; the first ``first_k_dense_replace`` layers dense, the rest
    ``n_routed_experts`` + ``n_shared_experts`` experts (the MTP module not counted)."""
    n, h, heads = hf["num_hidden_layers"], hf["hidden_size"], hf["num_attention_heads"]
    rank, rope = hf["kv_lora_rank"], hf["qk_rope_head_dim"]
    nope, vd, q_rank = hf["qk_nope_head_dim"], hf["v_head_dim"], hf.get("q_lora_rank")
    q = h * heads * (nope + rope) if not q_rank else h * q_rank + q_rank * heads * (nope + rope)
    mla = q + h * (rank + rope) + rank * heads * (nope + vd) + heads * vd * h
    dense = hf.get("first_k_dense_replace", 0)
    num_experts, inter = hf["n_routed_experts"], hf["moe_intermediate_size"]
    mlp = dense * 3 * h * hf["intermediate_size"] + (n - dense) * 3 * h * inter * (
        num_experts + hf.get("n_shared_experts", 0))
    layout = KVLayout((MLALatent(tuple(range(n)), rank, rope),), n)
    config = _pool_config(name, hf, num_layers=n, num_heads=heads, num_kv_heads=1,
                          head_dim=(rank + rope) // 2, intermediate=inter,
                          max_pos=hf["max_position_embeddings"])
    return PlanModel(config, num_experts, hf["num_experts_per_tok"], layout=layout,
                     linear_params=n * mla + mlp,
                     other_params=_embedding_params(hf, h, hf.get("tie_word_embeddings", False))
                     + (n - dense) * h * num_experts)


def _llama4(hf: dict, name: str) -> PlanModel:
    """Chunked local attention on the RoPE layers, global on the NoPE ones
    (``no_rope_layers``: 1 = RoPE; empty: every 4th layer NoPE); every
    ``interleave_moe_layer_step``-th layer a MoE of routed experts + one shared."""
    t = hf.get("text_config") or hf
    n, h, heads, kv, d = (t["num_hidden_layers"], t["hidden_size"], t["num_attention_heads"],
                          t["num_key_value_heads"], t["head_dim"])
    flags = t.get("no_rope_layers") or [int((i + 1) % LLAMA4_NO_ROPE_INTERVAL != 0)
                                        for i in range(n)]
    chunk = t.get("attention_chunk_size")
    chunked = tuple(i for i in range(n) if flags[i]) if chunk else ()
    glob = tuple(i for i in range(n) if i not in chunked)
    layout = KVLayout(((GlobalAttention(glob, kv, d),) if glob else ()) +
                      ((ChunkedLocal(chunked, kv, d, chunk),) if chunked else ()), n)
    step, num_experts = t.get("interleave_moe_layer_step", 1), t["num_local_experts"]
    num_moe = len(range(step - 1, n, step))
    mlp = num_moe * 3 * h * t["intermediate_size"] * (num_experts + 1) + \
        (n - num_moe) * 3 * h * t["intermediate_size_mlp"]
    config = _pool_config(name, t, num_layers=n, num_heads=heads, num_kv_heads=kv, head_dim=d,
                          intermediate=t["intermediate_size"],
                          max_pos=t["max_position_embeddings"], window=chunk,
                          sliding=chunked or None)
    return PlanModel(config, num_experts, t["num_experts_per_tok"], layout=layout,
                     linear_params=n * _attention_params(h, heads, kv, d) + mlp,
                     other_params=_embedding_params(t, h, t.get("tie_word_embeddings", False))
                     + num_moe * h * num_experts)


FAMILIES: dict[str, Callable[[dict, str], PlanModel]] = {
    "Gemma3ForCausalLM": _gemma3, "Gemma3ForConditionalGeneration": _gemma3,
    "GptOssForCausalLM": _gpt_oss, "Qwen3ForCausalLM": _qwen3, "Qwen3MoeForCausalLM": _qwen3_moe,
    "Qwen3NextForCausalLM": _qwen3_next, "DeepseekV3ForCausalLM": _deepseek_v3,
    "Llama4ForConditionalGeneration": _llama4, "Llama4ForCausalLM": _llama4}


def read_family(hf: dict, name: str) -> PlanModel | None:
    """The planner's model of a config of one of ``FAMILIES``; None for another
    architecture. ValueError names a missing key."""
    arch = next((a for a in hf.get("architectures") or [] if a in FAMILIES), None)
    if arch is None:
        return None
    try:
        return FAMILIES[arch](hf, name)
    except KeyError as e:
        raise ValueError(f"{arch} config {name!r} lacks the key {e.args[0]!r}") from None
