"""Weight quantization of the model's matrices (``LLM(quantization=...)``, vLLM's name).

    None    the compute dtype (bf16 / fp32), prepacked for oneDNN (``linear.PackedLinear``)
    int8    W8A16: int8 weights, one symmetric scale per output channel;
            ``torch._weight_int8pack_mm`` (x in the compute dtype)
    w8a8    int8 weights as above and activations quantized per token at every product
            (symmetric absmax); ``torch._int_mm`` (int8 x int8 -> int32), then both scales;
            q|k|v and gate|up smoothed (SmoothQuant), down kept W8A16 (``smoothquant.py``)
    int4    int4 weights, asymmetric, one (scale, zero) per group of ``INT4_GROUP_SIZE``
            input channels of each output channel; ``_weight_int4pack_mm_for_cpu``
            (CPU only), w = (q - 8) * scale + zero

Only the four matrices of each layer are quantized (q|k|v, o, gate|up, down; after the
RMSNorm weights are folded into them, ``llama.py``); the output head is int8 per channel
under every format (its 49,152 rows are the largest single matrix of a small model, and
int4 there costs the most accuracy), the embedding stays in the compute dtype (a lookup).

Math in pure functions (gpt-fast ``quantize.py`` style); the layers are in ``linear.py``.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from kvmap.registry import Registry

INT4_GROUP_SIZE = 32


@dataclass(frozen=True)
class WeightFormat:
    """A weight format of ``LLM(quantization=NAME)``: the torch kernel per device type
    and whether SmoothQuant calibrates it at load (``smoothquant.py``). Its layer is
    ``linear.LINEARS[NAME]``; a test holds that every format has one, and a test row."""

    name: str
    kernels: Mapping[str, str]
    smoothed: bool = False


WEIGHT_FORMATS: Registry[WeightFormat] = Registry("weight format")
for _format in (WeightFormat("int8", {"cpu": "_weight_int8pack_mm",
                                      "cuda": "_weight_int8pack_mm"}, smoothed=True),
                WeightFormat("w8a8", {"cpu": "_int_mm", "cuda": "_int_mm"}, smoothed=True),
                WeightFormat("int4", {"cpu": "_weight_int4pack_mm_for_cpu"})):
    WEIGHT_FORMATS.register(_format)
QUANTIZATIONS = (None, *WEIGHT_FORMATS)          # None: dense
KERNELS = {name: fmt.kernels for name, fmt in WEIGHT_FORMATS.items()}


def check_quantization(name: str | None, device: torch.device | str = "cpu",
                       in_features: tuple[int, ...] = ()) -> None:
    """Raise ValueError (naming the bad value and the valid choices) for an unknown
    name, a device with no kernel for it, or a group size that does not divide one of
    the matrices' ``in_features``. Cheap: run it before any weight is converted."""
    if name not in QUANTIZATIONS:
        raise ValueError(f"quantization={name!r} is not one of "
                         f"{', '.join(repr(q) for q in QUANTIZATIONS)}")
    if name is None:
        return
    dev = torch.device(device).type
    kernels = KERNELS[name]
    if dev not in kernels or not _has_kernel(kernels[dev]):
        valid = [q for q in QUANTIZATIONS[1:] if dev in KERNELS[q]]
        raise ValueError(f"quantization={name!r} has no kernel on device {dev!r}; "
                         f"valid there: None, {', '.join(repr(q) for q in valid)}")
    if name == "int4":
        bad = [n for n in in_features if n % INT4_GROUP_SIZE]
        if bad:
            raise ValueError(f"quantization='int4': group size {INT4_GROUP_SIZE} does not "
                             f"divide in_features={bad[0]}; choose None, 'int8' or 'w8a8'")


def _has_kernel(name: str) -> bool:
    return hasattr(torch, name) or hasattr(torch.ops.aten, name)


def int8_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (out, in) float -> (q (out, in) int8, scale (out,) fp32), w ~ q * scale[:, None];
    symmetric absmax, codes in -127 .. 127."""
    scale = w.float().abs().amax(1).clamp_min(1e-12) / 127
    q = (w.float() / scale[:, None]).round_().clamp_(-127, 127).to(torch.int8)
    return q, scale


def int8_per_token(x: torch.Tensor, in_scale: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations x (T, in) -> (q (T, in) int8, scale (T, 1) fp32), per-row absmax of
    x, or of x * in_scale ((in,) fp32, SmoothQuant's 1 / s) when given."""
    xf = x.float() if in_scale is None else x * in_scale          # fp32 either way
    scale = xf.abs().amax(1, keepdim=True).clamp_min(1e-12) / 127
    return (xf / scale).round_().clamp_(-127, 127).to(torch.int8), scale


def int4_groups(w: torch.Tensor, group_size: int = INT4_GROUP_SIZE
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w (out, in) -> (q (out, in) int32 in 0..15, scale, zero (out, in / group_size)
    fp32), min/max per group, w ~ (q - 8) * scale + zero."""
    n, k = w.shape
    wg = w.float().view(n, k // group_size, group_size)
    lo, hi = wg.amin(-1), wg.amax(-1)
    scale = ((hi - lo) / 15).clamp_min(1e-12)
    zero = lo + 8 * scale
    q = ((wg - lo[..., None]) / scale[..., None]).round_().clamp_(0, 15)
    return q.view(n, k).to(torch.int32), scale, zero


def dequantize_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                    group_size: int = INT4_GROUP_SIZE) -> torch.Tensor:
    """Inverse of :func:`int4_groups`, fp32 (out, in)."""
    s = scale.repeat_interleave(group_size, 1)
    z = zero.repeat_interleave(group_size, 1)
    return (q.float() - 8) * s + z


@dataclass(frozen=True)
class Int4Groups:
    """A matrix in the engine's int4 format before packing: ``codes`` (out, in) int32 in
    0..15, ``scale`` and ``zero`` (out, in / group_size) fp32, w = (q - 8) * scale + zero
    per group of ``group_size`` input channels (:func:`dequantize_int4`)."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    group_size: int = INT4_GROUP_SIZE

    @staticmethod
    def cat(parts: list["Int4Groups"]) -> "Int4Groups":
        """Rows of ``parts`` stacked (the fused q|k|v and gate|up matrices)."""
        sizes = {p.group_size for p in parts}
        if len(sizes) != 1:
            raise ValueError(f"int4 group sizes differ: {sorted(sizes)}")
        return Int4Groups(torch.cat([p.codes for p in parts]),
                          torch.cat([p.scale for p in parts]),
                          torch.cat([p.zero for p in parts]), sizes.pop())

    def dequantized(self) -> torch.Tensor:
        return dequantize_int4(self.codes, self.scale, self.zero, self.group_size)


def int4_from_affine_blocks(d: torch.Tensor, m: torch.Tensor, codes: torch.Tensor
                            ) -> Int4Groups:
    """llama.cpp's affine 4-bit blocks, w = d * q + m with q in 0..15 (Q4_1; Q4_0 is the
    case m = -8 d), in the engine's convention w = (q - 8) * scale + zero: the same
    codes, scale = d, zero = m + 8 d. Exact in fp32 (d and m are fp16); the layer's
    only rounding is of scale and zero to its compute dtype. ``d``, ``m``: (out, G);
    ``codes``: (out, G * 32)."""
    d32, m32 = d.float(), m.float()
    if codes.shape[1] != d.shape[1] * INT4_GROUP_SIZE:
        raise ValueError(f"{codes.shape[1]} codes a row for {d.shape[1]} blocks of "
                         f"{INT4_GROUP_SIZE}")
    return Int4Groups(codes.to(torch.int32), d32, m32 + 8 * d32)
