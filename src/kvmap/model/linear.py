"""Matrix products with weights prepacked for the CPU's oneDNN kernels.

On the CPU, ``F.linear`` with a plain (out, in) weight re-lays the weight out at every
call in the small-batch (decode) shapes; a weight reordered once into oneDNN's blocked
layout runs the same product 1.3-2.3x faster at 1-32 rows (measured here, bf16 and fp32,
identical results) and no slower for prefill. On CUDA, or where oneDNN is missing, the
weight stays as it is and ``F.linear`` runs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class PackedLinear:
    """y = x @ W.T + b for a fixed weight W (out, in). ``weight`` keeps the plain tensor
    (for byte counts and inspection); ``packed`` is what the product uses."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight = weight
        self.bias = bias
        self.packed = None
        if weight.device.type == "cpu" and torch.backends.mkldnn.is_available() \
                and weight.dtype in (torch.float32, torch.bfloat16):
            try:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
            except (RuntimeError, AttributeError):
                self.packed = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (T, in) -> (T, out)."""
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none",
                                                      [], "")
        return F.linear(x, self.weight, self.bias)

    @property
    def num_bytes(self) -> int:
        n = self.weight.numel() * self.weight.element_size()
        return n + (0 if self.bias is None else self.bias.numel() * self.bias.element_size())


def kernel_dtype(fmt: str, dtype: torch.dtype, device: torch.device | str) -> torch.dtype:
    """The activation dtype ``fmt``'s kernel (int8 W8A16, int4) runs in: the compute
    dtype, except an fp32 model on a CPU whose profile (``kvmap.hardware``, measured once
    per machine) timed the kernel faster with bf16 activations -- on an Ice Lake without
    native bf16 the int8 and int4 kernels ran 7-60x faster so, prefill and decode alike
    (docs/hardware.md). One choice per model, never per batch size: a sequence's tokens
    must not depend on what it is batched with."""
    if dtype != torch.float32 or torch.device(device).type != "cpu":
        return dtype
    from kvmap.hardware import profile
    from kvmap.hardware.probes import bf16_activation_speedup
    speedup = bf16_activation_speedup(profile().rates, fmt)
    return torch.bfloat16 if speedup is not None and speedup > 1.0 else dtype


class Int8Linear:
    """W8A16: y = ((x * in_scale) @ q.T) * scale (+ b); q (out, in) int8, scale (out,)
    per channel; ``in_scale`` (in,) optional (SmoothQuant's 1 / s, ``smoothquant.py``).
    The kernel takes x in ``kernel_dtype`` (bf16 for an fp32 model where that is faster)
    and y returns in x's dtype."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 in_scale: torch.Tensor | None = None):
        from kvmap.model.wquant import int8_per_channel
        self.q, scale = int8_per_channel(weight)
        self.dtype = weight.dtype
        self.kernel_dtype = kernel_dtype("int8", weight.dtype, weight.device)
        self.scale = scale.to(self.kernel_dtype)          # the kernel wants x's dtype
        self.bias = bias
        self.in_scale = None if in_scale is None else in_scale.to(weight.dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.in_scale is not None:
            x = x * self.in_scale
        y = torch._weight_int8pack_mm(x.to(self.kernel_dtype).contiguous(), self.q,
                                      self.scale).to(x.dtype)
        return y if self.bias is None else y + self.bias

    def dequantized(self) -> torch.Tensor:
        """The weight this layer multiplies x by, (out, in) in the compute dtype."""
        w = self.q.float() * self.scale.float()[:, None]
        return (w if self.in_scale is None else w * self.in_scale.float()).to(self.dtype)

    @property
    def num_bytes(self) -> int:
        return _bytes(self.q, self.scale, self.bias, self.in_scale)


class W8A8Linear(Int8Linear):
    """W8A8: activations quantized per token (int8, absmax), one int8 x int8 -> int32
    product, then y = acc * x_scale * w_scale. ``in_scale`` (in,) fp32, when given,
    multiplies x inside the quantization (SmoothQuant's 1 / s, ``smoothquant.py``)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 in_scale: torch.Tensor | None = None):
        super().__init__(weight, bias)
        self.scale = self.scale.float()
        self.qt = self.q.t()                          # (in, out) view for _int_mm
        self.in_scale = None if in_scale is None else in_scale.float()

    @property
    def num_bytes(self) -> int:
        return _bytes(self.q, self.scale, self.bias, self.in_scale)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from kvmap.model.wquant import int8_per_token
        xq, xs = int8_per_token(x, self.in_scale)
        y = (torch._int_mm(xq, self.qt) * (xs * self.scale)).to(x.dtype)
        return y if self.bias is None else y + self.bias


class Int4Linear:
    """Group-wise int4 (``wquant.int4_groups``) through the CPU int4 kernel; the packed
    weight holds two codes a byte, scales and zeros (in/group, out, 2) in bf16.
    ``in_scale`` (in,), when given, multiplies x first: the RMSNorm weight of a matrix
    whose groups came from a GGUF as they are (``from_groups``), where folding it into
    the columns would break the groups."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        from kvmap.model.wquant import Int4Groups, int4_groups
        self._init(Int4Groups(*int4_groups(weight)), weight.dtype, bias, None)

    @classmethod
    def from_groups(cls, groups, dtype: torch.dtype, bias: torch.Tensor | None = None,
                    in_scale: torch.Tensor | None = None) -> "Int4Linear":
        """The layer of ready ``wquant.Int4Groups`` (no requantization)."""
        lin = cls.__new__(cls)
        lin._init(groups, dtype, bias, in_scale)
        return lin

    def _init(self, groups, dtype, bias, in_scale) -> None:
        self.group_size = groups.group_size
        self.dtype = dtype
        self.kernel_dtype = kernel_dtype("int4", dtype, groups.codes.device)
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(groups.codes, 1)
        self.scales_zeros = torch.stack([groups.scale.t(), groups.zero.t()],
                                        -1).to(self.kernel_dtype).contiguous()
        self.bias = bias
        self.in_scale = None if in_scale is None else in_scale.to(dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (T, in) in the compute dtype -> (T, out) in it; the kernel runs in
        ``kernel_dtype`` (see :func:`kernel_dtype`)."""
        if self.in_scale is not None:
            x = x * self.in_scale
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(self.kernel_dtype).contiguous(), self.packed, self.group_size,
            self.scales_zeros).to(x.dtype)
        return y if self.bias is None else y + self.bias

    @property
    def num_bytes(self) -> int:
        return _bytes(self.packed, self.scales_zeros, self.bias, self.in_scale)


def _bytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


LINEARS = {None: PackedLinear, "int8": Int8Linear, "w8a8": W8A8Linear, "int4": Int4Linear}


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None = None,
                quantization: str | None = None):
    """The layer for ``quantization`` (``wquant.QUANTIZATIONS``); checked by the caller."""
    return LINEARS[quantization](weight, bias)


def int4_layer(groups: dict, prefix: str, in_norm: torch.Tensor, post_norm: torch.Tensor,
               bqkv: torch.Tensor | None, dtype: torch.dtype) -> dict:
    """A decoder layer's four int4 matrices from GGUF groups (``gguf_loader.read_int4_groups``,
    HF names under ``prefix``), the RMSNorm weights as the fused matrices' ``in_scale``."""
    from kvmap.model.wquant import Int4Groups
    a, m = prefix + "self_attn.", prefix + "mlp."
    return {
        "qkv": Int4Linear.from_groups(Int4Groups.cat([groups[a + f"{n}_proj.weight"]
                                                      for n in "qkv"]), dtype, bqkv, in_norm),
        "o": Int4Linear.from_groups(groups[a + "o_proj.weight"], dtype),
        "gate_up": Int4Linear.from_groups(Int4Groups.cat([groups[m + "gate_proj.weight"],
                                                          groups[m + "up_proj.weight"]]),
                                          dtype, None, post_norm),
        "down": Int4Linear.from_groups(groups[m + "down_proj.weight"], dtype),
    }
