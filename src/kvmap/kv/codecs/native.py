"""A native encode + write of stacked K and V (``paired.write_pair``) for per-slot
ranges (int8 / int4 / int2 and fp8 e4m3 / e5m2, granularity token or group, symmetric
or not): one operator, ``torch.ops.kvmap.quant_write``, where the eager encode runs ~11
(fp8) to ~35 (int4) small operators per layer and step.

Why: a batch-1 decode step is mostly such small operators (each a few microseconds of
dispatch for a few hundred bytes of work), and a quantized cache's encode ran once per
layer and step. The kernel is the arithmetic of ``quant.call_params`` /
``quant.quantize`` / ``IntGrid.encode`` / ``pack`` (``FP8Grid.encode``: the clamp and
torch's own float8 rounding) in that order, in fp32, so its bytes equal the eager path's
(``tests/kv/test_paired.py`` holds them equal at both dtypes).

Built on first use with the system's C++ compiler (``torch.utils.cpp_extension``,
cached under ``~/.cache/torch_extensions``); ``KVMAP_NATIVE=0``, or a machine where it
cannot build, keeps the eager path (a warning says why, once).
"""
from __future__ import annotations

from kvmap.native_build import ENABLED, NativeLibrary

SOURCE = r"""
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Dispatch.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Half.h>
#include <torch/library.h>
#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <vector>

namespace {

constexpr float kFp16Max = 65504.0f;
constexpr float kTiny = 1e-12f;

// fp16 (r, z) of a range: quant.range_params / fp16_params (sym: lo = 0, hi = max|x|)
inline void range16(float lo, float hi, bool sym, at::Half& r16, at::Half& z16) {
  float rr = hi;
  if (!sym) {
    rr = (hi - lo) / 2.0f;
    float zc = (hi + lo) / 2.0f;
    z16 = at::Half(std::min(std::max(zc, -kFp16Max), kFp16Max));
    rr = rr + std::fabs(zc - static_cast<float>(z16));
  }
  r16 = at::Half(std::min(rr * (1.0f + 1.0f / 1024.0f), kFp16Max));
}

// One (kv, token, head) row of D values: ranges per group of g (or the call's range
// `fixed` / `fixed_z` when given: granularity head or tensor), codes, packed planes.
template <typename T>
void encode_row(const T* x, int64_t sd, int64_t D, int64_t g, int64_t bits, bool sym,
                float amp, float off, int64_t fp8, uint8_t* q, at::Half* r, at::Half* z,
                const at::Half* fixed, const at::Half* fixed_z,
                std::vector<float>& xs, std::vector<uint8_t>& c) {
  for (int64_t d = 0; d < D; ++d) xs[d] = static_cast<float>(x[d * sd]);
  for (int64_t g0 = 0, gi = 0; g0 < D; g0 += g, ++gi) {
    at::Half r16, z16;
    if (fixed != nullptr) {
      r16 = *fixed;
      if (!sym) z16 = *fixed_z;
    } else if (sym) {
      float m = 0.0f;
      for (int64_t d = g0; d < g0 + g; ++d) m = std::max(m, std::fabs(xs[d]));
      range16(0.0f, m, true, r16, z16);
    } else {
      float lo = xs[g0], hi = xs[g0];
      for (int64_t d = g0; d < g0 + g; ++d) { lo = std::min(lo, xs[d]); hi = std::max(hi, xs[d]); }
      range16(lo, hi, false, r16, z16);
    }
    float zf = sym ? 0.0f : static_cast<float>(z16);
    if (!sym) z[gi] = z16;
    r[gi] = r16;
    float inv = (1.0f / std::max(static_cast<float>(r16), kTiny)) * amp;
    for (int64_t d = g0; d < g0 + g; ++d) {
      float y = sym ? xs[d] * inv : (xs[d] - zf) * inv;
      y = std::min(std::max(y, -amp), amp);
      if (fp8 == 1) c[d] = c10::Float8_e4m3fn(y).x;        // torch's own rounding (RNE)
      else if (fp8 == 2) c[d] = c10::Float8_e5m2(y).x;
      else c[d] = static_cast<uint8_t>(std::nearbyint(y + off));
    }
  }
  int64_t per = 8 / bits, Db = D / per;
  for (int64_t i = 0; i < Db; ++i) {
    uint8_t b = c[i];
    for (int64_t j = 1; j < per; ++j) b |= static_cast<uint8_t>(c[i + j * Db] << (bits * j));
    q[i] = b;
  }
}

void quant_write(const at::Tensor& k, const at::Tensor& v, const at::Tensor& slot_ids,
                 at::Tensor q, at::Tensor r, const std::optional<at::Tensor>& z,
                 int64_t bits, bool sym, int64_t group, double amplitude, double offset,
                 int64_t fp8, int64_t span) {
  TORCH_CHECK(k.dim() == 3 && k.sizes() == v.sizes() && k.scalar_type() == v.scalar_type());
  TORCH_CHECK(q.is_contiguous() && r.is_contiguous() && slot_ids.scalar_type() == at::kLong);
  TORCH_CHECK(sym || (z.has_value() && z->is_contiguous()));
  const int64_t T = k.size(0), H = k.size(1), D = k.size(2), S = q.size(1);
  const int64_t Ds = q.size(3), G = r.size(3);
  TORCH_CHECK(q.size(2) == H && G * group == D && Ds * 8 == D * bits);
  auto ids = slot_ids.contiguous();
  const int64_t* sl = ids.data_ptr<int64_t>();
  uint8_t* qp = q.data_ptr<uint8_t>();
  at::Half* rp = r.data_ptr<at::Half>();
  at::Half* zp = sym ? nullptr : z->data_ptr<at::Half>();
  const int64_t Hp = r.size(2);           // H, or 1: one range for all heads (tensor)
  TORCH_CHECK(span == 0 || G == 1, "a call-wide range covers whole rows");
  TORCH_CHECK(Hp == H || (span == 2 && Hp == 1));
  std::vector<float> xs(D);
  std::vector<uint8_t> c(D);
  std::vector<at::Half> fr(Hp), fz(Hp);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, k.scalar_type(), "quant_write", [&] {
    for (int64_t kv = 0; kv < 2; ++kv) {
      const at::Tensor& x = kv ? v : k;
      const scalar_t* xp = x.data_ptr<scalar_t>();
      if (span > 0) {   // the call's range per head (span 1) or over all heads (span 2)
        for (int64_t p = 0; p < Hp; ++p) {
          float lo = std::numeric_limits<float>::infinity(), hi = -lo, m = 0.0f;
          for (int64_t t = 0; t < T; ++t)
            for (int64_t h = (span == 2 ? 0 : p); h < (span == 2 ? H : p + 1); ++h)
              for (int64_t d = 0; d < D; ++d) {
                float e = static_cast<float>(xp[t * x.stride(0) + h * x.stride(1) + d * x.stride(2)]);
                lo = std::min(lo, e); hi = std::max(hi, e); m = std::max(m, std::fabs(e));
              }
          if (sym) range16(0.0f, m, true, fr[p], fz[p]);
          else range16(lo, hi, false, fr[p], fz[p]);
        }
      }
      for (int64_t t = 0; t < T; ++t) {
        const int64_t s = sl[t];
        TORCH_CHECK(s >= 0 && s < S, "quant_write: slot ", s, " outside 0..", S - 1);
        for (int64_t h = 0; h < H; ++h) {
          const int64_t row = (kv * S + s) * H + h;
          const int64_t p = Hp == 1 ? 0 : h, prow = (kv * S + s) * Hp + p;
          encode_row(xp + t * x.stride(0) + h * x.stride(1), x.stride(2), D, group, bits,
                     sym, float(amplitude), float(offset), fp8, qp + row * Ds, rp + prow * G,
                     sym ? nullptr : zp + prow * G, span ? &fr[p] : nullptr,
                     span ? &fz[p] : nullptr, xs, c);
        }
      }
    }
  });
}

// Rows of a decode batch, heads first, from a stacked pool tensor (2, nblk, bs, Hp, R):
// out[kv, h, b * L + l, :] = t[kv, table[b, l / bs], l % bs, h or 0, :], one row copy
// each (the eager read's gather, blocks-first copy and re-layout in one pass).
void gather_rows(const uint8_t* src, uint8_t* dst, const int64_t* tab, int64_t nblk,
                 int64_t bs, int64_t Hp, int64_t H, int64_t B, int64_t nb, int64_t row_bytes) {
  const int64_t L = nb * bs;
  for (int64_t kv = 0; kv < 2; ++kv)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t l = 0; l < L; ++l) {
          const int64_t slot = kv * nblk * bs + tab[b * nb + l / bs] * bs + l % bs;
          const int64_t row = slot * Hp + (Hp == 1 ? 0 : h);
          std::memcpy(dst + (((kv * H + h) * B + b) * L + l) * row_bytes,
                      src + row * row_bytes, row_bytes);
        }
}

std::vector<at::Tensor> pair_rows(at::TensorList ts, const at::Tensor& table, int64_t H) {
  TORCH_CHECK(table.scalar_type() == at::kLong && table.dim() == 2);
  auto tab = table.contiguous();
  const int64_t B = tab.size(0), nb = tab.size(1);
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : ts) {
    TORCH_CHECK(t.dim() == 5 && t.size(0) == 2 && t.is_contiguous());
    const int64_t nblk = t.size(1), bs = t.size(2), Hp = t.size(3), R = t.size(4);
    TORCH_CHECK(Hp == 1 || Hp == H);
    const int64_t* ids = tab.data_ptr<int64_t>();
    for (int64_t i = 0; i < B * nb; ++i)
      TORCH_CHECK(ids[i] >= 0 && ids[i] < nblk, "pair_rows: block ", ids[i], " outside 0..", nblk - 1);
    at::Tensor o = at::empty({2, H, B * nb * bs, R}, t.options());
    gather_rows(static_cast<const uint8_t*>(t.data_ptr()), static_cast<uint8_t*>(o.data_ptr()),
                tab.data_ptr<int64_t>(), nblk, bs, Hp, H, B, nb, R * t.element_size());
    out.push_back(o);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(kvmap, m) {
  m.def("pair_rows(Tensor[] stacked, Tensor table, int num_heads) -> Tensor[]");
  m.def("quant_write(Tensor k, Tensor v, Tensor slot_ids, Tensor(a!) q, Tensor(b!) r, "
        "Tensor(c!)? z, int bits, bool symmetric, int group, float amplitude, "
        "float offset, int fp8=0, int span=0) -> ()");
}

TORCH_LIBRARY_IMPL(kvmap, CPU, m) {
  m.impl("quant_write", &quant_write);
  m.impl("pair_rows", &pair_rows);
}
"""


LIBRARY = NativeLibrary("kvmap_native", SOURCE, "kvmap", "native KV encode")


def ops():
    """``torch.ops.kvmap`` (``quant_write``, ``pair_rows``), built on first use, or None
    (eager then)."""
    return LIBRARY.ops() if ENABLED else None
