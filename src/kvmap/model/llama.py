"""A Llama-family decoder (Llama 2/3, Mistral, Qwen2, SmolLM2) over a paged KV cache.

Weights come in Hugging Face names (see ``kvmap.model.loader``); at construction the
q/k/v projections are fused into one matrix and gate/up into another, so a layer runs
four matrix products:

    x ─ RMSNorm ─ [q|k|v] = x Wqkv ─ RoPE(q, k) ─ paged attention ─ Wo ─ + ─┐
    │                                                                        │
    └────────────────────────────────────────────────────────────────────── h
    h ─ RMSNorm ─ [g|u] = h Wgu ─ silu(g) * u ─ Wdown ─ + ── next layer

Activations are flat over the batch: (T, hidden) for T tokens of all sequences, so
prefill chunks and decode tokens share every matrix product.

Two liberties with HF's arithmetic, both for fewer operators per layer: the residual
stream is kept in fp32 (HF keeps it in the compute dtype; fp32 is the more exact), and
each RMSNorm's weight is folded into the columns of the matrix that follows it
(norm(x) * w @ W.T == norm(x) @ (W * w).T), so a norm is two operators.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kvmap.config import ModelConfig
from kvmap.kv.cache import PagedKVCache
from kvmap.model.attention import AttentionMetadata, paged_attention
from kvmap.model.decoders import DECODERS
from kvmap.model import native_layer
from kvmap.model.linear import int4_layer, make_linear
from kvmap.model.smoothquant import calibration_ids as calibration_ids_of
from kvmap.model.smoothquant import SMOOTHED_FORMATS, quantize_smoothed
from kvmap.model.wquant import check_quantization


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies (D/2,) with optional Llama-3.1 style or linear scaling."""
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    rs = config.rope_scaling or {}
    if rs.get("rope_type", rs.get("type")) == "llama3":
        factor = rs["factor"]
        low, high = rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
        old_ctx = rs.get("original_max_position_embeddings", 8192)
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_ctx / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
        mid = (wavelen <= old_ctx / low) & (wavelen >= old_ctx / high)
        inv_freq = torch.where(mid, (1 - smooth) * inv_freq / factor + smooth * inv_freq,
                               scaled)
    elif rs.get("rope_type", rs.get("type")) == "linear":      # positions / factor
        inv_freq = inv_freq / rs["factor"]
    return inv_freq.float()


class Rotary:
    """cos/sin tables (max_pos, D) in fp32, HF's non-interleaved ("rotate_half") layout.

    rotate_half(x) = [-x2, x1] = roll(x, D/2) * [-1 .. -1, 1 .. 1], so with the sign
    folded into the sine table, RoPE(x) = x * cos + roll(x, D/2) * sin_signed.
    """

    def __init__(self, config: ModelConfig, device):
        inv_freq = rope_inv_freq(config).to(device)
        pos = torch.arange(config.max_position_embeddings, device=device, dtype=torch.float32)
        freqs = torch.outer(pos, inv_freq)                                  # (P, D/2)
        self.cos = torch.cat([freqs.cos(), freqs.cos()], dim=-1)            # (P, D)
        self.sin_signed = torch.cat([-freqs.sin(), freqs.sin()], dim=-1)
        self.half = config.head_dim // 2
        self._cast: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def tables(self, positions: torch.Tensor, dtype: torch.dtype):
        """(T, 1, D) cos and signed sin for these positions, once per forward: rows of
        tables cast to ``dtype`` once (the same values as casting the rows each step)."""
        if dtype not in self._cast:
            self._cast[dtype] = (self.cos.to(dtype), self.sin_signed.to(dtype))
        cos, sin = self._cast[dtype]
        return cos[positions][:, None, :], sin[positions][:, None, :]

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: (T, H, D) -> RoPE(x), same shape."""
        return x * cos + torch.roll(x, self.half, dims=-1) * sin


def fold_norm(matrix: torch.Tensor, norm_weight: torch.Tensor, dtype, device) -> torch.Tensor:
    """(out, in) matrix with the preceding RMSNorm's (in,) weight multiplied in, in fp32,
    then cast once to the compute dtype."""
    return (matrix.to(device=device, dtype=torch.float32) * norm_weight.to(device)).to(dtype)


_LAYER_MATRICES = tuple(f"self_attn.{n}_proj.weight" for n in "qkvo") + tuple(
    f"mlp.{n}_proj.weight" for n in ("gate", "up", "down"))


@DECODERS.register("llama")
class LlamaModel(torch.nn.Module):
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor],
                 dtype: torch.dtype, device: torch.device | str = "cpu",
                 quantization: str | None = None, int4_groups: dict | None = None,
                 calibration_ids: list[list[int]] | None = None):
        """``quantization``: the format of the layer matrices (``wquant.QUANTIZATIONS``),
        checked against the device and the shapes before any weight is converted.
        ``int4_groups`` (with ``"int4"``): HF name -> ``wquant.Int4Groups`` read from a
        GGUF's own 4-bit blocks; a layer whose seven matrices are all there is built
        from them (``linear.int4_layer``) instead of requantizing ``weights``.
        ``"int8"`` and ``"w8a8"`` build the layers dense, then calibrate SmoothQuant on
        ``calibration_ids`` (token lists; ``smoothquant.py``) and quantizes them."""
        super().__init__()
        q_in = (config.hidden_size, config.num_heads * config.head_dim,
                config.intermediate_size)
        check_quantization(quantization, device, q_in)
        self.quantization = quantization
        self.config = config
        self.dtype = dtype
        self.device = torch.device(device)
        w = {k: v.to(device=self.device, dtype=dtype) for k, v in weights.items()}
        missing = [n for n in self._required_names() if n not in w]
        if missing:
            raise ValueError(f"weights are missing {len(missing)} tensors, e.g. {missing[:3]}")
        self.embed = w["model.embed_tokens.weight"]                       # (V, h)
        self.lm_head = w.get("lm_head.weight", self.embed) \
            if not config.tie_word_embeddings else self.embed            # (V, h)
        self.norm = w["model.norm.weight"].float()
        self.layers = []
        if quantization in SMOOTHED_FORMATS:    # dense first: SmoothQuant calibrates on them
            quantization = None
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            in_norm = weights[p + "input_layernorm.weight"].float()
            post_norm = weights[p + "post_attention_layernorm.weight"].float()
            bqkv = None
            if config.attention_bias:
                bqkv = torch.cat([w[a + "q_proj.bias"], w[a + "k_proj.bias"],
                                  w[a + "v_proj.bias"]])
            from_groups = quantization == "int4" and int4_groups and all(
                p + n in int4_groups for n in _LAYER_MATRICES)
            self.layers.append(int4_layer(int4_groups, p, in_norm, post_norm, bqkv, dtype)
                               if from_groups else {
                "qkv": make_linear(fold_norm(torch.cat([weights[a + "q_proj.weight"],
                                                     weights[a + "k_proj.weight"],
                                                     weights[a + "v_proj.weight"]]),
                                          in_norm, dtype, self.device), bqkv, quantization),
                "o": make_linear(w[a + "o_proj.weight"], None, quantization),  # (h, Hq*D)
                "gate_up": make_linear(fold_norm(torch.cat([
                    weights[p + "mlp.gate_proj.weight"], weights[p + "mlp.up_proj.weight"]]),
                    post_norm, dtype, self.device), None, quantization),   # (2F, h)
                "down": make_linear(w[p + "mlp.down_proj.weight"], None, quantization),
            })
            for name in list(w):   # drop our references to the unfused copies early
                if name.startswith(p):
                    del w[name]
        # the output head: int8 per channel under every weight format (wquant.py)
        self.head = make_linear(self.lm_head, None, self.quantization and "int8")  # (V, h)
        self.rotary = Rotary(config, self.device)
        if self.quantization in SMOOTHED_FORMATS:
            quantize_smoothed(self, calibration_ids or calibration_ids_of(None, config.vocab_size),
                              self.quantization)

    def _required_names(self) -> list[str]:
        names = ["model.embed_tokens.weight", "model.norm.weight"]
        if not self.config.tie_word_embeddings:
            names.append("lm_head.weight")
        for i in range(self.config.num_layers):
            p = f"model.layers.{i}."
            names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
            names += [p + f"self_attn.{n}_proj.weight" for n in "qkvo"]
            names += [p + f"mlp.{n}_proj.weight" for n in ("gate", "up", "down")]
        return names

    @property
    def weight_bytes(self) -> int:
        """Resident bytes of the model's weights as they run: quantized codes, scales and
        zeros included; a tied embedding counted once, unless the head holds its own
        quantized copy (then both)."""
        tensors = [self.embed, self.norm]
        head = self.head.num_bytes if self.quantization or self.lm_head is not self.embed else 0
        total = sum(t.numel() * t.element_size() for t in tensors) + head
        return total + sum(lin.num_bytes for layer in self.layers for lin in layer.values())

    def _normed(self, x: torch.Tensor) -> torch.Tensor:
        """RMS-normalize the fp32 residual (T, h) in fp32 (a bf16 normalization flips
        SmolLM2's first answer token), return it in the compute dtype; the norm's weight
        lives in the next matrix."""
        return F.rms_norm(x, (x.shape[-1],), None, self.config.rms_norm_eps).to(self.dtype)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata, kv: PagedKVCache) -> torch.Tensor:
        """input_ids, positions: (T,). Writes the new tokens' K/V into ``kv`` and returns
        the final normed hidden states (T, hidden)."""
        cfg = self.config
        hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        T = input_ids.shape[0]
        x = self.embed[input_ids].float()                                 # (T, h) fp32
        cos, sin = self.rotary.tables(positions, self.dtype)
        native = native_layer.ops() if x.device.type == "cpu" else None
        eps = cfg.rms_norm_eps
        for i, layer in enumerate(self.layers):
            if native is not None and native_layer.usable(layer):   # same ops, in C++
                q, k, v = native.pre_attn(x, layer["qkv"].packed, layer["qkv"].bias, cos,
                                          sin, hq, hkv, d, eps, d ** -0.5, self.dtype)
                attn = paged_attention(q, k, v, kv.layers[i], kv.codec, meta, hkv, i,
                                       q_scaled=True)
                native.post_attn(x, attn, layer["o"].packed, layer["gate_up"].packed,
                                 layer["down"].packed, eps, self.dtype)
                continue
            qkv = layer["qkv"](self._normed(x))              # (T, (hq+2hkv)d)
            qk = self.rotary.apply(qkv[:, :(hq + hkv) * d].view(T, hq + hkv, d), cos, sin)
            q, k = qk[:, :hq], qk[:, hq:]                                # (T, hq|hkv, d)
            v = qkv[:, (hq + hkv) * d:].view(T, hkv, d)
            attn = paged_attention(q, k, v, kv.layers[i], kv.codec, meta, hkv, i)
            x += layer["o"](attn)            # in place: x is this forward's own fp32 copy
            gu = layer["gate_up"](self._normed(x))                                # (T, 2F)
            g, u = gu.chunk(2, dim=-1)
            x += layer["down"](F.silu(g).mul_(u))
        return (F.rms_norm(x, (x.shape[-1],), None, self.config.rms_norm_eps)
                * self.norm).to(self.dtype)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (N, h) -> logits (N, V) in fp32."""
        return self.head(hidden).float()
