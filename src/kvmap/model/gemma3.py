"""The Gemma 3 decoder (text) over the paged KV cache: the hybrid kind, where most layers
attend through a sliding window and every few layers one attends to the whole context.

What differs from ``llama.py`` (Gemma 3 technical report; HF ``Gemma3TextModel``):

    x = embed(ids) * sqrt(hidden)
    x ─ norm ─ [q|k|v] ─ q_norm(q), k_norm(k) per head ─ RoPE ─ attention ─ Wo ─ norm ─ + ─┐
    x ─ norm ─ [g|u] ─ gelu_tanh(g) * u ─ Wdown ─ norm ─ + ── next layer                   │

- four RMSNorms a layer (before and after attention, before and after the MLP) and one
  on each query and key head; every norm scales by ``1 + w`` (HF keeps ``w``; a GGUF
  stores ``1 + w``, which the loader turns back into HF's ``w``);
- a sliding layer (``config.layer_window(i)``) attends to the last ``sliding_window``
  positions, itself included, with RoPE base ``rope_local_theta``; a global layer to the
  whole context with ``rope_theta``;
- scores are scaled by ``query_pre_attn_scalar ** -0.5``;
- the activation is GELU with the tanh approximation; the head is the tied embedding.

As in ``llama.py``, the residual stream is fp32, each norm normalizes in fp32, and the
weight of a norm that precedes a matrix is folded into that matrix; the norms after
attention and after the MLP, and the q/k norms, are applied as they are.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from kvmap.config import ModelConfig
from kvmap.kv.cache import PagedKVCache
from kvmap.model.attention import AttentionMetadata, paged_attention
from kvmap.model.decoders import DECODERS
from kvmap.model.linear import make_linear
from kvmap.model.llama import Rotary, fold_norm


def gemma3_weight_names(config: ModelConfig) -> list[str]:
    """HF names of a Gemma 3 text model's weights (tied head: no ``lm_head``)."""
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        names += [p + n + ".weight" for n in (
            "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
            "post_feedforward_layernorm", "self_attn.q_norm", "self_attn.k_norm")]
        names += [p + f"self_attn.{n}_proj.weight" for n in "qkvo"]
        names += [p + f"mlp.{n}_proj.weight" for n in ("gate", "up", "down")]
    return names


@DECODERS.register("gemma3")
class Gemma3Model(torch.nn.Module):
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor],
                 dtype: torch.dtype, device: torch.device | str = "cpu",
                 quantization: str | None = None, int4_groups: dict | None = None,
                 calibration_ids: list[list[int]] | None = None):
        """``weights`` in HF names and values (norm weights ``w``, used as ``1 + w``).
        Weight quantization is not implemented for this decoder: ``quantization`` must be
        None (ValueError naming it otherwise)."""
        super().__init__()
        if quantization is not None:
            raise ValueError(f"quantization={quantization!r} is not implemented for the "
                             f"gemma3 decoder; leave it unset")
        if not config.tie_word_embeddings:
            raise ValueError(f"{config.name!r}: the gemma3 decoder needs tied embeddings")
        self.quantization = None
        self.config = config
        self.dtype = dtype
        self.device = torch.device(device)
        missing = [n for n in gemma3_weight_names(config) if n not in weights]
        if missing:
            raise ValueError(f"weights are missing {len(missing)} tensors, e.g. {missing[:3]}")

        def scale(name: str) -> torch.Tensor:      # a norm's multiplier 1 + w, fp32
            return 1.0 + weights[name].to(device=self.device, dtype=torch.float32)

        self.embed = weights["model.embed_tokens.weight"].to(self.device, dtype)    # (V, h)
        # HF multiplies by sqrt(hidden) cast to the embedding's dtype
        self.embed_scale = torch.tensor(config.hidden_size ** 0.5, dtype=dtype).item()
        self.norm = scale("model.norm.weight")
        self.layers = []
        for i in range(config.num_layers):
            p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
            w = {n: weights[p + n + ".weight"] for n in (
                "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
            self.layers.append({
                "qkv": make_linear(fold_norm(torch.cat([w["self_attn.q_proj"],
                                                        w["self_attn.k_proj"],
                                                        w["self_attn.v_proj"]]),
                                             scale(p + "input_layernorm.weight"), dtype,
                                             self.device)),
                "o": make_linear(w["self_attn.o_proj"].to(self.device, dtype)),
                "gate_up": make_linear(fold_norm(torch.cat([w["mlp.gate_proj"],
                                                            w["mlp.up_proj"]]),
                                                 scale(p + "pre_feedforward_layernorm.weight"),
                                                 dtype, self.device)),
                "down": make_linear(w["mlp.down_proj"].to(self.device, dtype)),
            })
            self.layers[-1]["norms"] = {
                "q": scale(a + "q_norm.weight"), "k": scale(a + "k_norm.weight"),
                "post_attn": scale(p + "post_attention_layernorm.weight"),
                "post_ffn": scale(p + "post_feedforward_layernorm.weight")}
        self.head = make_linear(self.embed)                                       # (V, h)
        self.rotary = Rotary(config, self.device)                  # global layers
        local = dataclasses.replace(config, rope_theta=config.rope_local_theta
                                    or config.rope_theta, rope_scaling=None)
        self.local_rotary = Rotary(local, self.device)             # sliding layers
        self.windows = config.layer_windows
        self.scale = (config.query_pre_attn_scalar or config.head_dim) ** -0.5

    @property
    def weight_bytes(self) -> int:
        """Resident bytes of the weights as they run: the tied embedding counted once."""
        norms = [self.norm] + [t for layer in self.layers for t in layer["norms"].values()]
        total = sum(t.numel() * t.element_size() for t in [self.embed, *norms])
        return total + sum(lin.num_bytes for layer in self.layers
                           for name, lin in layer.items() if name != "norms")

    def _rms(self, x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """RMS-normalize the last axis in fp32 (times ``weight``, already ``1 + w``)."""
        return F.rms_norm(x.float(), (x.shape[-1],), weight, self.config.rms_norm_eps)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata, kv: PagedKVCache) -> torch.Tensor:
        """input_ids, positions: (T,). Writes the new tokens' K/V into ``kv`` and returns
        the final normed hidden states (T, hidden) in the compute dtype."""
        cfg = self.config
        hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        T = input_ids.shape[0]
        x = (self.embed[input_ids] * self.embed_scale).float()              # (T, h) fp32
        tables = {False: self.rotary.tables(positions, self.dtype),
                  True: self.local_rotary.tables(positions, self.dtype)}
        for i, layer in enumerate(self.layers):
            norms = layer["norms"]
            qkv = layer["qkv"](self._rms(x).to(self.dtype))                 # (T, (hq+2hkv)d)
            q = self._rms(qkv[:, :hq * d].view(T, hq, d), norms["q"]).to(self.dtype)
            k = self._rms(qkv[:, hq * d:(hq + hkv) * d].view(T, hkv, d),
                          norms["k"]).to(self.dtype)
            v = qkv[:, (hq + hkv) * d:].view(T, hkv, d)
            sliding = self.windows[i] is not None
            rotary = self.local_rotary if sliding else self.rotary
            cos, sin = tables[sliding]
            q, k = rotary.apply(q, cos, sin), rotary.apply(k, cos, sin)
            attn = paged_attention(q, k, v, kv.layers[i], kv.codec, meta, hkv, i, self.scale)
            x += self._rms(layer["o"](attn), norms["post_attn"])
            gu = layer["gate_up"](self._rms(x).to(self.dtype))                       # (T, 2F)
            g, u = gu.chunk(2, dim=-1)
            mlp = layer["down"](F.gelu(g, approximate="tanh").mul_(u))
            x += self._rms(mlp, norms["post_ffn"])
        return self._rms(x, self.norm).to(self.dtype)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (N, h) -> logits (N, V) in fp32."""
        return self.head(hidden).float()

