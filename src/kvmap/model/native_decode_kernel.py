"""The C++ source of the native decode attention (``kvmap.model.native_decode`` builds
it and states its arithmetic): one operator per layer and decode step, over plain rows
(``decode_plain``) or stacked per-slot codes (``decode_codes``)."""

SOURCE = r"""
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

// 16 lanes in GCC's vector extension: lowered to whatever the build's instruction set
// has (one AVX-512 register, two AVX2 ones, four SSE ones), the same arithmetic in the
// same order on each.
constexpr int kW = 16;
typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

template <typename V, typename P> inline V load(const P* p) { V v; std::memcpy(&v, p, sizeof(V)); return v; }
inline void store(float* p, v16 v) { std::memcpy(p, &v, sizeof(v)); }

// 16 bytes / 16 two-byte words -> 16 int32 lanes (zero-extended); GCC's own vector
// conversion goes through the general registers one byte at a time
inline v16i widen_bytes(const uint8_t* p) {
#if defined(__AVX512F__)
  __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return load<v16i>(&x);
#elif defined(__AVX2__)
  __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)));
  v16i v; std::memcpy(&v, &a, 32); std::memcpy(reinterpret_cast<char*>(&v) + 32, &b, 32);
  return v;
#else
  v16i v; for (int j = 0; j < 16; ++j) v[j] = p[j]; return v;
#endif
}
inline v16i widen_words(const uint16_t* p) {
#if defined(__AVX512F__)
  __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return load<v16i>(&x);
#elif defined(__AVX2__)
  __m256i a = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  __m256i b = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  v16i v; std::memcpy(&v, &a, 32); std::memcpy(reinterpret_cast<char*>(&v) + 32, &b, 32);
  return v;
#else
  v16i v; for (int j = 0; j < 16; ++j) v[j] = p[j]; return v;
#endif
}

inline float hsum(v16 a) {         // a fixed tree: 16 -> 8 -> 4 -> 1
  v8 b = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) +
         __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
  v4 c = __builtin_shufflevector(b, b, 0, 1, 2, 3) + __builtin_shufflevector(b, b, 4, 5, 6, 7);
  return (c[0] + c[1]) + (c[2] + c[3]);
}

// exp(x) for x <= 0 (scores minus their maximum), Cephes' expf: relative error ~1e-7
inline v16 exp16(v16 x) {
  x = x < -87.0f ? (v16){} - 87.0f : x;
  v16 t = x * 1.44269504088896341f;
  v16i n = __builtin_convertvector(t + (t >= 0.0f ? (v16){} + 0.5f : (v16){} - 0.5f), v16i);
  v16 fn = __builtin_convertvector(n, v16);
  v16 r = x - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  v16 p = (v16){} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  v16i e = (n + 127) << 23;
  return p * (v16)e;
}

// float -> the compute dtype's value, back in float (bf16: round to nearest even)
template <typename T> inline v16 as_compute(v16 x) { return x; }
template <> inline v16 as_compute<c10::BFloat16>(v16 x) {
  v16u u = (v16u)x;
  v16u r = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  return (v16)((u & 0x7FFFFFFFu) > 0x7F800000u ? (v16u){} + 0x7FC00000u : r);
}
template <> inline v16 as_compute<c10::Half>(v16 x) {
  for (int j = 0; j < kW; ++j) x[j] = static_cast<float>(c10::Half(x[j]));
  return x;
}

template <typename S> inline v16 widen(const S* p) {
  v16 v;
  for (int j = 0; j < kW; ++j) v[j] = static_cast<float>(p[j]);
  return v;
}
template <> inline v16 widen<float>(const float* p) { return load<v16>(p); }
template <> inline v16 widen<c10::BFloat16>(const c10::BFloat16* p) {
  return (v16)(widen_words(reinterpret_cast<const uint16_t*>(p)) << 16);
}

// Plain rows: pool (nblk, bs, H, D) of S, K and V apart, as the compute dtype T has them
// (codec.read casts: a no-op when S is T, exact widening under fp32 compute)
template <typename S, typename T>
struct PlainRows {
  const S* k; const S* v; int64_t H, D;
  void prefetch(int kv, int64_t slot, int64_t h) const {
    const char* p = reinterpret_cast<const char*>((kv ? v : k) + (slot * H + h) * D);
    for (int64_t o = 0; o < D * static_cast<int64_t>(sizeof(S)); o += 64) __builtin_prefetch(p + o);
  }
  void operator()(int kv, int64_t slot, int64_t h, v16* dst) const {
    const S* src = (kv ? v : k) + (slot * H + h) * D;
    for (int64_t c = 0; c < D / kW; ++c) {
      const v16 x = widen<S>(src + c * kW);
      dst[c] = std::is_same<S, T>::value ? x : as_compute<T>(x);
    }
  }
};

// Codes of a stacked per-slot quantizer (paired.py): q (2, nblk, bs, H, Ds) uint8,
// r / z (2, nblk, bs, Hp, G) fp16; integer codes in bit planes (quant.pack), or fp8
// bit patterns through a 256-value table. Decoded as quant.dequantize does (code *
// step + shift in fp32), then rounded to the compute dtype T.
template <typename T, int Bits, bool Fp8>
struct CodeRows {
  const uint8_t* q; const c10::Half* r; const c10::Half* z; const float* lut;
  int64_t num_slots, H, Hp, D, G; float amp, offset;
  void prefetch(int kv, int64_t slot, int64_t h) const {
    const uint8_t* row = q + ((kv * num_slots + slot) * H + h) * (D * Bits / 8);
    for (int64_t o = 0; o < D * Bits / 8; o += 64) __builtin_prefetch(row + o);
    __builtin_prefetch(r + ((kv * num_slots + slot) * Hp + (Hp == 1 ? 0 : h)) * G);
  }
  void operator()(int kv, int64_t slot, int64_t h, v16* dst) const {
    constexpr int per = 8 / Bits;
    const int64_t Ds = D / per, chunks = D / kW, per_group = chunks / G;
    const uint8_t* row = q + ((kv * num_slots + slot) * H + h) * Ds;
    const int64_t p = ((kv * num_slots + slot) * Hp + (Hp == 1 ? 0 : h)) * G;
    if (Fp8) {
      for (int64_t d = 0; d < D; ++d) dst[d / kW][d % kW] = lut[row[d]];
    } else {
      for (int j = 0; j < per; ++j)
        for (int64_t c = 0; c < Ds / kW; ++c) {
          v16i b = widen_bytes(row + c * kW);
          if (Bits < 8) b = (b >> (Bits * j)) & ((1 << Bits) - 1);
          dst[(j * Ds) / kW + c] = __builtin_convertvector(b, v16);
        }
    }
    for (int64_t gi = 0; gi < G; ++gi) {
      const float step = static_cast<float>(r[p + gi]) / amp;
      float shift;
      if (Fp8) shift = z ? static_cast<float>(z[p + gi]) : 0.0f;
      else {
        shift = step * -offset;
        if (z) shift = shift + static_cast<float>(z[p + gi]);
      }
      for (int64_t c = gi * per_group; c < (gi + 1) * per_group; ++c)
        dst[c] = as_compute<T>(dst[c] * step + shift);
    }
  }
};

// One (sequence b, KV head h): its G query heads over keys lo .. hi-1 of its table.
template <typename T, int CC, typename Rows>      // CC: D / 16 when fixed at build, else 0
void attend(const Rows& rows, const T* q, int64_t q_sb, int64_t q_sh, T* out, int64_t o_sb,
            const int64_t* tab, int64_t nb, int64_t bs, int64_t b, int64_t h, int64_t G,
            int64_t D, int64_t lo, int64_t hi) {
  const int64_t n = hi - lo, C = CC ? CC : D / kW, np = (n + kW - 1) / kW * kW;
  std::vector<v16> qf(G * C), acc(G * C, v16{}), row(C);
  std::vector<float> s(G * np);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t c = 0; c < C; ++c) qf[g * C + c] = widen<T>(q + b * q_sb + (h * G + g) * q_sh + c * kW);
  std::vector<int64_t> slots(n);          // key i's slot: the block walk, once
  for (int64_t i = 0; i < n;) {
    const int64_t l = lo + i, first = tab[b * nb + l / bs] * bs;
    for (int64_t o = l % bs; o < bs && i < n; ++o, ++i) slots[i] = first + o;
  }
  constexpr int64_t ahead = 8;          // rows in flight: the pool's rows are scattered
  for (int64_t i = 0; i < n; ++i) {
    if (i + ahead < n) rows.prefetch(0, slots[i + ahead], h);
    rows(0, slots[i], h, row.data());
    for (int64_t g = 0; g < G; ++g) {
      v16 a = qf[g * C] * row[0];
      for (int64_t c = 1; c < C; ++c) a += qf[g * C + c] * row[c];
      s[g * np + i] = hsum(a);
    }
  }
  std::vector<float> total(G);
  for (int64_t g = 0; g < G; ++g) {
    float* sg = s.data() + g * np;
    for (int64_t i = n; i < np; ++i) sg[i] = -std::numeric_limits<float>::infinity();
    v16 mv = load<v16>(sg);
    for (int64_t i = kW; i < np; i += kW) {
      const v16 x = load<v16>(sg + i);
      mv = x > mv ? x : mv;
    }
    float m = mv[0];
    for (int j = 1; j < kW; ++j) m = std::max(m, mv[j]);
    v16 t{};
    for (int64_t i = 0; i < np; i += kW) {
      v16 e = exp16(load<v16>(sg + i) - m);
      for (int j = 0; j < kW; ++j) if (i + j >= n) e[j] = 0.0f;    // the padded tail
      store(sg + i, e);
      t += e;
    }
    total[g] = hsum(t);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (i + ahead < n) rows.prefetch(1, slots[i + ahead], h);
    rows(1, slots[i], h, row.data());
    for (int64_t g = 0; g < G; ++g) {
      const float p = s[g * np + i];
      for (int64_t c = 0; c < C; ++c) acc[g * C + c] += p * row[c];
    }
  }
  for (int64_t g = 0; g < G; ++g)
    for (int64_t c = 0; c < C; ++c) {
      const v16 o = acc[g * C + c] / total[g];
      T* dst = out + b * o_sb + (h * G + g) * D + c * kW;
      for (int j = 0; j < kW; ++j) dst[j] = static_cast<T>(o[j]);
    }
}

template <typename T, typename Rows>
void attend_all(const Rows& rows, const at::Tensor& q, at::Tensor& out, const at::Tensor& table,
                const at::Tensor& lens, int64_t window, int64_t H, int64_t bs) {
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2), G = Hq / H, nb = table.size(1);
  TORCH_CHECK(Hq % H == 0 && D % kW == 0 && q.stride(2) == 1 && out.stride(1) == 1 &&
              out.size(1) == Hq * D);
  TORCH_CHECK(table.is_contiguous() && lens.is_contiguous() && lens.size(0) == B);
  const int64_t* tab = table.data_ptr<int64_t>();
  const int64_t* len = lens.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(len[b] >= 1 && len[b] <= nb * bs, "paged_decode: row ", b, " has ", len[b],
                " keys, its table ", nb * bs, " slots");
  const T* qp = q.data_ptr<T>();
  T* op = out.data_ptr<T>();
  at::parallel_for(0, B * H, 1, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / H, h = u % H, hi = len[b];
      const int64_t lo = window > 0 ? std::max<int64_t>(0, hi - window) : 0;
      auto run = [&](auto cc) {
        attend<T, decltype(cc)::value>(rows, qp, q.stride(0), q.stride(1), op, out.stride(0),
                                       tab, nb, bs, b, h, G, D, lo, hi);
      };
      if (D == 64) run(std::integral_constant<int, 4>{});            // unrolled head sizes
      else if (D == 128) run(std::integral_constant<int, 8>{});
      else run(std::integral_constant<int, 0>{});
    }
  });
}

void decode_plain(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& table, const at::Tensor& lens, int64_t window,
                  at::Tensor out) {
  TORCH_CHECK(k.dim() == 4 && k.is_contiguous() && v.is_contiguous() && k.sizes() == v.sizes());
  TORCH_CHECK(k.scalar_type() == v.scalar_type() && out.scalar_type() == q.scalar_type());
  const int64_t H = k.size(2), D = k.size(3);
  TORCH_CHECK(q.size(2) == D);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "decode_plain", [&] {
    using T = scalar_t;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, k.scalar_type(), "decode_plain_rows", [&] {
      PlainRows<scalar_t, T> rows{k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(), H, D};
      attend_all<T>(rows, q, out, table, lens, window, H, k.size(1));
    });
  });
}

template <typename T, int Bits, bool Fp8>
void codes_with(const at::Tensor& q, const at::Tensor& codes, const at::Tensor& r,
                const c10::Half* zp, const float* lut, const at::Tensor& table,
                const at::Tensor& lens, int64_t window, double amp, double offset, at::Tensor& out) {
  const int64_t H = codes.size(3), bs = codes.size(2);
  CodeRows<T, Bits, Fp8> rows{codes.data_ptr<uint8_t>(), r.data_ptr<c10::Half>(), zp, lut,
                              codes.size(1) * bs, H, r.size(3), q.size(2), r.size(4),
                              static_cast<float>(amp), static_cast<float>(offset)};
  attend_all<T>(rows, q, out, table, lens, window, H, bs);
}

void decode_codes(const at::Tensor& q, const at::Tensor& codes, const at::Tensor& r,
                  const std::optional<at::Tensor>& z, const std::optional<at::Tensor>& lut,
                  const at::Tensor& table, const at::Tensor& lens, int64_t window, int64_t bits,
                  double amp, double offset, at::Tensor out) {
  TORCH_CHECK(codes.dim() == 5 && codes.size(0) == 2 && codes.is_contiguous());
  TORCH_CHECK(r.dim() == 5 && r.is_contiguous() && r.scalar_type() == at::kHalf);
  TORCH_CHECK(r.size(1) == codes.size(1) && r.size(2) == codes.size(2));
  TORCH_CHECK(r.size(3) == 1 || r.size(3) == codes.size(3));
  TORCH_CHECK(!z.has_value() || (z->sizes() == r.sizes() && z->is_contiguous()));
  TORCH_CHECK(bits == 8 || bits == 4 || bits == 2);
  const int64_t D = q.size(2);
  TORCH_CHECK(codes.size(4) * 8 == D * bits && codes.size(4) % kW == 0,
              "decode_codes: ", codes.size(4), " code bytes a row");
  TORCH_CHECK(D % (kW * r.size(4)) == 0, "decode_codes: ", r.size(4), " groups of ", D);
  TORCH_CHECK(out.scalar_type() == q.scalar_type());
  const c10::Half* zp = z.has_value() ? z->data_ptr<c10::Half>() : nullptr;
  const float* lp = nullptr;
  if (lut.has_value()) {
    TORCH_CHECK(bits == 8 && lut->numel() == 256 && lut->scalar_type() == at::kFloat);
    lp = lut->data_ptr<float>();
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "decode_codes", [&] {
    if (lp) codes_with<scalar_t, 8, true>(q, codes, r, zp, lp, table, lens, window, amp, offset, out);
    else if (bits == 8) codes_with<scalar_t, 8, false>(q, codes, r, zp, lp, table, lens, window, amp, offset, out);
    else if (bits == 4) codes_with<scalar_t, 4, false>(q, codes, r, zp, lp, table, lens, window, amp, offset, out);
    else codes_with<scalar_t, 2, false>(q, codes, r, zp, lp, table, lens, window, amp, offset, out);
  });
}

// The threads one at::parallel_for runs on: 1 when the library was built without OpenMP
// (the header's parallel_for then runs the whole range on the caller, silently).
int64_t team_size() {
  std::atomic<uint64_t> seen{0};
  at::parallel_for(0, 4096, 1, [&](int64_t, int64_t) {
    seen.fetch_or(uint64_t{1} << (at::get_thread_num() & 63));
  });
  return __builtin_popcountll(seen.load());
}

}  // namespace

TORCH_LIBRARY(kvmap_attn, m) {
  m.def("team_size() -> int", &team_size);
  m.def("decode_plain(Tensor q, Tensor k, Tensor v, Tensor table, Tensor lens, int window, "
        "Tensor(a!) out) -> ()");
  m.def("decode_codes(Tensor q, Tensor codes, Tensor r, Tensor? z, Tensor? lut, Tensor table, "
        "Tensor lens, int window, int bits, float amplitude, float offset, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(kvmap_attn, CPU, m) {
  m.impl("decode_plain", &decode_plain);
  m.impl("decode_codes", &decode_codes);
}
"""
