"""``w8a8`` and ``int8`` with SmoothQuant migration (Xiao et al., 2023, "SmoothQuant: Accurate and
Efficient Post-Training Quantization for Large Language Models").

Per-token int8 activations lose the small channels of a token whose few outlier channels
set its scale. SmoothQuant moves part of each input channel's range into the weight: with
s_j = max|X_j|^alpha / max|W_:,j|^(1 - alpha) (alpha = ``SMOOTH_ALPHA``),

    y = X W^T = (X / s) (W * s)^T

exactly, and both X / s and W * s quantize better than X and W. ``max|X_j|`` is measured
on a few built-in corpus texts (``calibration_ids``) through the model's own dense
layers. Here the RMSNorm weights are already folded into the matrices (``llama.py``), so
X is the normalized residual and W the folded matrix, which gives the same s as the
paper's norm-weighted X and plain W; the 1 / s is applied inside the per-token
quantization of ``W8A8Linear`` (no extra operator).

Which matrices: q|k|v and gate|up are smoothed; for w8a8, o is plain W8A8 (its inputs have no
strong channel outliers); down stays W8A16 (``Int8Linear``): its input, silu(g) * u, has
channels thousands of times its median in some layers, beyond what migration with
per-output-channel weight scales absorbs (measured in docs/weights.md).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from kvmap.model.linear import Int8Linear, W8A8Linear
from kvmap.model.wquant import WEIGHT_FORMATS

SMOOTH_ALPHA = 0.5
SMOOTHED_FORMATS = tuple(name for name, fmt in WEIGHT_FORMATS.items() if fmt.smoothed)
SMOOTHED = ("qkv", "gate_up")
W8A16_IN_W8A8 = ("down",)
CALIBRATION_SEED = 1234          # not the eval tasks' default seed (0)
NUM_CALIBRATION_TEXTS = 4
CALIBRATION_TOKENS = 512


def smooth_scales(x_absmax: torch.Tensor, weight: torch.Tensor,
                  alpha: float = SMOOTH_ALPHA) -> torch.Tensor:
    """(in,) fp32 s = max|X|^alpha / max|W|^(1 - alpha), per input channel of ``weight``
    (out, in); channels never active (or all-zero weights) get s from a 1e-5 floor."""
    w_absmax = weight.float().abs().amax(0).clamp_min(1e-5)
    return (x_absmax.float().clamp_min(1e-5) ** alpha / w_absmax ** (1 - alpha)
            ).clamp_min(1e-5)


def calibration_ids(tokenizer, vocab_size: int) -> list[list[int]]:
    """``NUM_CALIBRATION_TEXTS`` token lists of ``CALIBRATION_TOKENS`` from the built-in
    corpus; seeded random ids for a model without a tokenizer (dummy weights)."""
    rng = np.random.default_rng(CALIBRATION_SEED)
    if tokenizer is None:
        return [rng.integers(0, vocab_size, CALIBRATION_TOKENS).tolist()
                for _ in range(NUM_CALIBRATION_TEXTS)]
    from kvmap.workloads.corpus import TextSource, encode_text
    source = TextSource(tokenizer, rng)
    return [encode_text(tokenizer, source.take(CALIBRATION_TOKENS + 16))[:CALIBRATION_TOKENS]
            for _ in range(NUM_CALIBRATION_TEXTS)]


@torch.inference_mode()
def input_absmax(model, ids_list: list[list[int]]) -> list[dict[str, torch.Tensor]]:
    """Per layer, the (in,) max |input| of each ``SMOOTHED`` matrix over all tokens of
    ``ids_list``, from a dense causal forward of the model's own (unquantized) layers."""
    cfg = model.config
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    stats = [dict() for _ in model.layers]
    for ids in ids_list:
        ids = ids[:cfg.max_position_embeddings]
        T = len(ids)
        x = model.embed[torch.as_tensor(ids, device=model.device)].float()      # (T, h)
        cos, sin = model.rotary.tables(torch.arange(T, device=model.device), model.dtype)
        for layer, seen in zip(model.layers, stats):
            n = model._normed(x)
            _keep_max(seen, "qkv", n)
            qkv = layer["qkv"](n)
            qk = model.rotary.apply(qkv[:, :(hq + hkv) * d].view(T, hq + hkv, d), cos, sin)
            q, k = qk[:, :hq].transpose(0, 1), qk[:, hq:].transpose(0, 1)     # (H, T, d)
            v = qkv[:, (hq + hkv) * d:].view(T, hkv, d).transpose(0, 1)
            k, v = (t.repeat_interleave(hq // hkv, 0) for t in (k, v))
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + layer["o"](attn.transpose(0, 1).reshape(T, hq * d))
            n = model._normed(x)
            _keep_max(seen, "gate_up", n)
            g, u = layer["gate_up"](n).chunk(2, dim=-1)
            x = x + layer["down"](F.silu(g) * u)
    return stats


def _keep_max(seen: dict, name: str, x: torch.Tensor) -> None:
    m = x.float().abs().amax(0)
    seen[name] = m if name not in seen else torch.maximum(seen[name], m)


def quantize_smoothed(model, ids_list: list[list[int]], quantization: str) -> None:
    """Turn the dense layers of ``model`` (built with ``PackedLinear``s) into
    ``quantization`` (``SMOOTHED_FORMATS``) in place: ``SMOOTHED`` matrices smoothed;
    for w8a8, ``W8A16_IN_W8A8`` in W8A16 and the rest plain W8A8; for int8 all W8A16."""
    if quantization not in SMOOTHED_FORMATS:
        raise ValueError(f"quantization={quantization!r} is not one of {SMOOTHED_FORMATS}")
    stats = input_absmax(model, ids_list)
    for layer, seen in zip(model.layers, stats):
        for name, lin in list(layer.items()):
            w = lin.weight
            kind = W8A8Linear if quantization == "w8a8" and name not in W8A16_IN_W8A8 \
                else Int8Linear
            if name in SMOOTHED:
                s = smooth_scales(seen[name], w)
                layer[name] = kind((w.float() * s).to(w.dtype), lin.bias, 1 / s)
            else:
                layer[name] = kind(w, lin.bias)
