"""A Llama layer's work outside attention as two native calls: ``pre_attn`` (RMSNorm,
the q|k|v product, RoPE, q scaled) and ``post_attn`` (o product into the residual,
RMSNorm, gate|up product, SiLU-gated, down product into the residual).

Why: a batch-1 decode step of a small model is mostly dispatch, not arithmetic. Each
layer ran ~25 tensor operators from Python outside attention (norms, casts, four
products, slices, the rotary's four passes, the gate), each paying the interpreter
and the binding (~5-10 us) before the dispatcher; SmolLM2's 30 layers made ~13 ms of a
28 ms step that way (``benchmarks/native_decode_ab.py`` and ``docs/performance.md``).
The same ATen operators called from C++ pay the dispatcher only.

Arithmetic: the very ATen operators of ``LlamaModel.forward`` in the same order with
the same arguments (``rms_norm`` in fp32, the cast, oneDNN's ``_linear_pointwise`` on
the prepacked weight, ``x * cos + roll(x) * sin``, ``q * scale``, ``silu(g).mul_(u)``,
the fp32 residual's in-place adds), so the result is bit for bit the Python path's
(``tests/model/test_native_layer.py`` holds them equal at both dtypes).

Scope: layers whose four matrices are ``PackedLinear`` with a prepacked weight (the
dense formats on a CPU with oneDNN); a quantized weight format, a bias on o / gate_up /
down, or ``KVMAP_NATIVE=0`` runs the Python path.
"""
from __future__ import annotations

import torch

from kvmap.model.linear import PackedLinear
from kvmap.native_build import ENABLED, ISA, ISA_FLAGS, NativeLibrary

SOURCE = r"""
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

namespace {

at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed,
                  const std::optional<at::Tensor>& bias) {
  static auto op = c10::Dispatcher::singleton()
      .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
      .typed<at::Tensor(const at::Tensor&, const at::Tensor&,
                        const std::optional<at::Tensor>&, std::string_view,
                        c10::List<std::optional<at::Scalar>>,
                        std::optional<std::string_view>)>();
  return op.call(x, packed, bias, "none", c10::List<std::optional<at::Scalar>>(), "");
}

// float <-> the compute dtype, branch-free where c10's conversions branch (so that the
// loops vectorize): bf16 rounds to nearest even, a NaN stays a NaN
template <typename S> inline float to_float(S x) { return static_cast<float>(x); }
template <> inline float to_float<c10::BFloat16>(c10::BFloat16 x) {
  uint32_t u = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
template <typename S> inline S from_float(float f) { return static_cast<S>(f); }
template <> inline c10::BFloat16 from_float<c10::BFloat16>(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  c10::BFloat16 out;
  out.x = static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : r);
  return out;
}

// RMSNorm of fp32 rows (T, h), no weight (it lives in the next matrix), rounded once to
// the compute dtype: sum of squares in 16 fixed lanes, then x * (1 / sqrt(ms + eps))
template <typename O>
void rms_rows(const float* x, O* y, int64_t T, int64_t h, float eps) {
  for (int64_t t = 0; t < T; ++t) {
    const float* r = x + t * h;
    float lanes[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= h; i += 16)
      for (int j = 0; j < 16; ++j) lanes[j] += r[i + j] * r[i + j];
    for (; i < h; ++i) lanes[i % 16] += r[i] * r[i];
    for (int w = 8; w > 0; w /= 2)
      for (int j = 0; j < w; ++j) lanes[j] += lanes[j + w];
    const float inv = 1.0f / std::sqrt(lanes[0] / static_cast<float>(h) + eps);
    for (i = 0; i < h; ++i) y[t * h + i] = from_float<O>(r[i] * inv);
  }
}

at::Tensor normed(const at::Tensor& x, double eps, at::ScalarType dtype) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.dim() == 2,
              "the residual must be contiguous fp32 (T, h)");
  at::Tensor y = at::empty(x.sizes(), x.options().dtype(dtype));
  const int64_t T = x.size(0), h = x.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "rms_rows", [&] {
    at::parallel_for(0, T, std::max<int64_t>(1, 65536 / h), [&](int64_t a, int64_t b) {
      rms_rows<scalar_t>(x.data_ptr<float>() + a * h, y.data_ptr<scalar_t>() + a * h,
                         b - a, h, static_cast<float>(eps));
    });
  });
  return y;
}

// RoPE of head rows (rotate-half layout: out[j] = x[j] cos[j] + x[(j + D/2) % D] sin[j],
// sin signed) in fp32, times `scale`, rounded once. src rows: (T, H, D) at row stride
// `stride` (the q|k|v product); cos, sin: (T, D) in the compute dtype.
template <typename S>
void rope_rows(const S* src, int64_t stride, const S* cos, const S* sin, S* dst, int64_t T,
               int64_t H, int64_t D, float scale) {
  const int64_t half = D / 2;
  for (int64_t t = 0; t < T; ++t) {
    const S* __restrict c = cos + t * D;
    const S* __restrict s = sin + t * D;
    for (int64_t hd = 0; hd < H; ++hd) {
      const S* __restrict x = src + t * stride + hd * D;
      S* __restrict y = dst + (t * H + hd) * D;
#pragma GCC ivdep
      for (int64_t j = 0; j < half; ++j) {     // the two halves: no index wraps
        const float a = to_float(x[j]), b = to_float(x[j + half]);
        y[j] = from_float<S>((a * to_float(c[j]) + b * to_float(s[j])) * scale);
        y[j + half] = from_float<S>((b * to_float(c[j + half]) + a * to_float(s[j + half])) * scale);
      }
    }
  }
}

at::Tensor rope(const at::Tensor& qkv, int64_t first, int64_t H, int64_t D,
                const at::Tensor& cos, const at::Tensor& sin, double scale) {
  const int64_t T = qkv.size(0);
  at::Tensor out = at::empty({T, H, D}, qkv.options());
  at::Tensor c = cos.reshape({T, D}).contiguous(), s = sin.reshape({T, D}).contiguous();
  TORCH_CHECK(qkv.is_contiguous() && c.scalar_type() == qkv.scalar_type(),
              "rope wants a contiguous q|k|v and tables in its dtype");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qkv.scalar_type(), "rope", [&] {
    at::parallel_for(0, T, std::max<int64_t>(1, 8192 / (H * D)), [&](int64_t a, int64_t b) {
      rope_rows<scalar_t>(qkv.data_ptr<scalar_t>() + a * qkv.size(1) + first * D,
                          qkv.size(1), c.data_ptr<scalar_t>() + a * D,
                          s.data_ptr<scalar_t>() + a * D, out.data_ptr<scalar_t>() + a * H * D,
                          b - a, H, D, static_cast<float>(scale));
    });
  });
  return out;
}

// x (T, h) fp32 -> q (T, hq, D) RoPE'd and scaled, k (T, hkv, D) RoPE'd, v (T, hkv, D).
std::vector<at::Tensor> pre_attn(const at::Tensor& x, const at::Tensor& w_qkv,
                                 const std::optional<at::Tensor>& b_qkv,
                                 const at::Tensor& cos, const at::Tensor& sin,
                                 int64_t hq, int64_t hkv, int64_t d, double eps,
                                 double scale, at::ScalarType dtype) {
  const int64_t T = x.size(0);
  at::Tensor qkv = packed_linear(normed(x, eps, dtype), w_qkv, b_qkv);
  at::Tensor q = rope(qkv, 0, hq, d, cos, sin, scale);
  at::Tensor k = rope(qkv, hq, hkv, d, cos, sin, 1.0);
  at::Tensor v = qkv.slice(1, (hq + hkv) * d).view({T, hkv, d});
  return {q, k, v};
}

// x += attn Wo; x += down(silu(g) * u), [g|u] = norm(x) Wgu; in place on x (T, h) fp32.
void post_attn(at::Tensor x, const at::Tensor& attn, const at::Tensor& w_o,
               const at::Tensor& w_gu, const at::Tensor& w_down, double eps,
               at::ScalarType dtype) {
  x.add_(packed_linear(attn, w_o, std::nullopt));
  at::Tensor gu = packed_linear(normed(x, eps, dtype), w_gu, std::nullopt);
  auto parts = gu.chunk(2, -1);
  x.add_(packed_linear(at::silu(parts[0]).mul_(parts[1]), w_down, std::nullopt));
}

}  // namespace

TORCH_LIBRARY(kvmap_layer, m) {
  m.def("pre_attn(Tensor x, Tensor w_qkv, Tensor? b_qkv, Tensor cos, Tensor sin, int hq, "
        "int hkv, int d, float eps, float scale, ScalarType dtype) -> Tensor[]");
  m.def("post_attn(Tensor(a!) x, Tensor attn, Tensor w_o, Tensor w_gu, Tensor w_down, "
        "float eps, ScalarType dtype) -> ()");
}

// the prepacked weights are oneDNN tensors: dispatch may key on either backend
TORCH_LIBRARY_IMPL(kvmap_layer, CPU, m) {
  m.impl("pre_attn", &pre_attn);
  m.impl("post_attn", &post_attn);
}

TORCH_LIBRARY_IMPL(kvmap_layer, MkldnnCPU, m) {
  m.impl("pre_attn", &pre_attn);
  m.impl("post_attn", &post_attn);
}
"""

LIBRARY = NativeLibrary(f"kvmap_layer_{ISA.lower()}", SOURCE, "kvmap_layer", "native layer",
                        ISA_FLAGS)


def ops():
    """``torch.ops.kvmap_layer`` (``pre_attn``, ``post_attn``), built on first use, or
    None (the Python path then)."""
    return LIBRARY.ops() if ENABLED else None


def usable(layer: dict) -> bool:
    """Whether this layer's matrices are all prepacked dense products (bias on qkv only)."""
    lins = [layer[n] for n in ("qkv", "o", "gate_up", "down")]
    return all(isinstance(lin, PackedLinear) and lin.packed is not None for lin in lins) \
        and all(layer[n].bias is None for n in ("o", "gate_up", "down"))
