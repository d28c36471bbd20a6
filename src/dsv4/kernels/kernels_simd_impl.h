// AVX2 + FMA + F16C kernels, written once and compiled twice: in kernels_avx2.cc (the AVX2
// path) and in kernels_avx512.cc (the same code with EVEX encodings and 32 vector registers,
// under which that file replaces the integer kernels with AVX-512 VNNI ones). Include only from
// a translation unit built with at least -mavx2 -mfma -mf16c, inside its own namespace.
//
// Every function reproduces the canonical order of kernels_scalar.cc bit for bit:
//  - float products: 8 lanes (lane = column mod 8), each an FMA chain in column order over the
//    row zero-padded to a multiple of 8, then tree8 (= the 256-bit horizontal sum below);
//  - fast FP4: exact int32 block sums (any order), then one FMA chain per output over blocks.
#include <immintrin.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "dsv4/kernels/kernels_internal.h"

// Everything here has internal linkage (anonymous namespace) and avoids standard-library
// templates: an inline function instantiated in two translation units is merged by the linker,
// which could hand code compiled with -mavx512f to the AVX2 or scalar path.
namespace dsv4_simd {
namespace {

// Loops over register tiles must be fully unrolled so their arrays live in registers.
#define DSV4_UNROLL _Pragma("GCC unroll 16")

template <class T>
static inline T mn(T a, T b) { return a < b ? a : b; }

// A zero-initialized heap buffer (std::vector would be such a shared template instance).
template <class T>
class Buf {
 public:
  explicit Buf(int64_t n) : p_(static_cast<T*>(std::calloc(static_cast<size_t>(n > 0 ? n : 1), sizeof(T)))) {}
  ~Buf() { std::free(p_); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  T* data() { return p_; }
  const T* data() const { return p_; }
  T& operator[](int64_t i) { return p_[i]; }

 private:
  T* p_;
};

using dsv4::kernels::Matrix;
using dsv4::kernels::Numerics;
using dsv4::kernels::QuantizedInput;
using dsv4::kernels::WeightFormat;
using dsv4::kernels::detail::ceil_div;
using dsv4::kernels::detail::MatmulJob;
namespace kd = dsv4::kernels::detail;

// ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)): the canonical tree8.
static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  __m128 u = _mm_add_ss(t, _mm_shuffle_ps(t, t, 1));
  return _mm_cvtss_f32(u);
}

static inline __m256i mask_first(int k) {  // lanes < k all ones
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), idx);
}

// ---------------------------------------------------------------------------------------
// dot / axpy

static float dot(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  int64_t c = 0;
  for (; c + 32 <= n; c += 32) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + c), _mm256_loadu_ps(b + c), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + c + 8), _mm256_loadu_ps(b + c + 8), acc1);
    acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + c + 16), _mm256_loadu_ps(b + c + 16), acc2);
    acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + c + 24), _mm256_loadu_ps(b + c + 24), acc3);
  }
  if (c < n) {
    int rem = static_cast<int>(n - c);
    __m256 va[4], vb[4];
    for (int k = 0; k < 4; ++k) {
      __m256i m = mask_first(rem - 8 * k);
      va[k] = _mm256_maskload_ps(a + c + 8 * k, m);
      vb[k] = _mm256_maskload_ps(b + c + 8 * k, m);
    }
    acc0 = _mm256_fmadd_ps(va[0], vb[0], acc0);
    acc1 = _mm256_fmadd_ps(va[1], vb[1], acc1);
    acc2 = _mm256_fmadd_ps(va[2], vb[2], acc2);
    acc3 = _mm256_fmadd_ps(va[3], vb[3], acc3);
  }
  return hsum8(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
}

static void axpy(float a, const float* x, float* y, int64_t n) {
  __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);
}

// ---------------------------------------------------------------------------------------
// Fast-mode activation quantization (definition: kd::quantize_block_ref).

// Four int32 vectors (32 values in [-128, 127], in order) -> 32 int8 in order.
static inline __m256i pack_i32x4_i8(__m256i a, __m256i b, __m256i c, __m256i d) {
  __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));  // lane-interleaved
  // packs work per 128-bit lane: undo the interleave (dwords 0,4,1,5,2,6,3,7).
  return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static inline int32_t hsum_epi32(__m256i v) {
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
  return _mm_cvtsi128_si32(h);
}

static void quantize_rows(const float* xall, int64_t cols, int64_t pc, int64_t i0, int64_t i1,
                          const kd::QuantPlanes& out) {
  const int64_t nb = ceil_div(cols, kd::kQBlock);
  Buf<int8_t> nat(2 * pc);  // natural column order: high plane at [0, pc), low plane at [pc, 2 pc)
  Buf<int16_t> nat16(pc);   // Q, natural column order
  const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
  const __m256i lim = _mm256_set1_epi32(kd::kQMax), nlim = _mm256_set1_epi32(-kd::kQMax),
                half = _mm256_set1_epi32(128);
  for (int64_t i = i0; i < i1; ++i) {
    const float* x = xall + i * cols;
    float* d = out.d + i * nb;
    int32_t* q12 = out.qsum12 + i * nb;
    int8_t* nhi = nat.data();
    int8_t* nlo = nat.data() + pc;
    for (int64_t c = 0; c < 2 * pc; ++c) nat[c] = 0;
    for (int64_t c = 0; c < pc; ++c) nat16[c] = 0;
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + b * 32;
      q12[b] = 0;
      if ((b + 1) * 32 > cols) {
        const int len = static_cast<int>(cols - b * 32);
        int32_t blk[32];
        kd::quantize_block_ref(xb, len, blk, &d[b]);
        int32_t sum = 0;
        for (int k = 0; k < len; ++k) {
          nat16[b * 32 + k] = static_cast<int16_t>(blk[k]);
          nhi[b * 32 + k] = kd::q_hi(blk[k]);
          nlo[b * 32 + k] = kd::q_lo(blk[k]);
          sum += blk[k];
        }
        q12[b] = 12 * sum;
        continue;
      }
      __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8), v2 = _mm256_loadu_ps(xb + 16),
             v3 = _mm256_loadu_ps(xb + 24);
      __m256i m0 = _mm256_max_epu32(_mm256_and_si256(_mm256_castps_si256(v0), absmask),
                                    _mm256_and_si256(_mm256_castps_si256(v1), absmask));
      __m256i m1 = _mm256_max_epu32(_mm256_and_si256(_mm256_castps_si256(v2), absmask),
                                    _mm256_and_si256(_mm256_castps_si256(v3), absmask));
      __m256i m = _mm256_max_epu32(m0, m1);
      __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
      h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
      h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
      uint32_t amax_bits = static_cast<uint32_t>(_mm_cvtsi128_si32(h));
      float amax;
      std::memcpy(&amax, &amax_bits, 4);
      if (amax_bits >= 0x7f800000u) {
        d[b] = std::numeric_limits<float>::quiet_NaN();
        continue;  // Q stays 0
      }
      float dd = amax / static_cast<float>(kd::kQMax);
      d[b] = dd;
      if (dd == 0.0f) continue;
      const __m256 vd = _mm256_set1_ps(dd);
      __m256i qv[4] = {_mm256_cvtps_epi32(_mm256_div_ps(v0, vd)), _mm256_cvtps_epi32(_mm256_div_ps(v1, vd)),
                       _mm256_cvtps_epi32(_mm256_div_ps(v2, vd)), _mm256_cvtps_epi32(_mm256_div_ps(v3, vd))};
      __m256i hi[4], lo[4];
      for (int k = 0; k < 4; ++k) {
        qv[k] = _mm256_max_epi32(_mm256_min_epi32(qv[k], lim), nlim);
        hi[k] = _mm256_srai_epi32(_mm256_add_epi32(qv[k], half), 8);
        lo[k] = _mm256_sub_epi32(qv[k], _mm256_slli_epi32(hi[k], 8));
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(nhi + b * 32), pack_i32x4_i8(hi[0], hi[1], hi[2], hi[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(nlo + b * 32), pack_i32x4_i8(lo[0], lo[1], lo[2], lo[3]));
      // |Q| <= 32512: the int16 packs do not saturate; they interleave 64-bit quarters.
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(nat16.data() + b * 32),
                          _mm256_permute4x64_epi64(_mm256_packs_epi32(qv[0], qv[1]), 0xd8));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(nat16.data() + b * 32 + 16),
                          _mm256_permute4x64_epi64(_mm256_packs_epi32(qv[2], qv[3]), 0xd8));
      q12[b] = 12 * hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(qv[0], qv[1]), _mm256_add_epi32(qv[2], qv[3])));
    }
    // Natural order -> per 64-column span: 32 even columns, then 32 odd columns.
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8,
                                           10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    for (int plane = 0; plane < 2; ++plane) {
      const int8_t* src = plane ? nlo : nhi;
      int8_t* q = (plane ? out.ql : out.q) + i * pc;
      for (int64_t s = 0; s < pc; s += 64) {
        __m256i a = _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + s)), split);
        __m256i b = _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + s + 32)), split);
        a = _mm256_permute4x64_epi64(a, 0xd8);  // [E0-14, E16-30, O1-15, O17-31]
        b = _mm256_permute4x64_epi64(b, 0xd8);
        __m256i ev = _mm256_permute2x128_si256(a, b, 0x20), od = _mm256_permute2x128_si256(a, b, 0x31);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + s), ev);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + s + 32), od);
      }
    }
    kd::scatter_qg(nat16.data(), pc, i, out.qg);
  }
}

// ---------------------------------------------------------------------------------------
// Weight decoders for the float paths. decode(p, lo, hi) turns the bytes of 16 consecutive
// columns starting at p into 16 floats (columns 0-7 in lo, 8-15 in hi). `bytes16` is how many
// bytes 16 columns take (for the zero-padded tail copy).

struct DecF32 {
  static constexpr int bytes16 = 64;
  void set_block(int64_t /*r*/, int64_t /*c*/) {}
  void decode(const uint8_t* p, __m256& lo, __m256& hi) const {
    lo = _mm256_loadu_ps(reinterpret_cast<const float*>(p));
    hi = _mm256_loadu_ps(reinterpret_cast<const float*>(p) + 8);
  }
};

struct DecBF16 {
  static constexpr int bytes16 = 32;
  void set_block(int64_t, int64_t) {}
  void decode(const uint8_t* p, __m256& lo, __m256& hi) const {
    __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(w)), 16));
    hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(w, 1)), 16));
  }
};

// E4M3 bytes -> float32 bits (value * 2^-120): sign-extend the byte to 32 bits, shift left 20
// (sign to bit 31, exponent and mantissa to bits 26..20), clear the sign copies in bits 30..27.
// Exponent bias 7 vs 127 is the factor 2^-120; E4M3 subnormals become float32 denormals, exactly.
static inline void fp8_bits_scaled(const uint8_t* p, __m256& lo, __m256& hi) {
  const __m256i keep = _mm256_set1_epi32(static_cast<int>(0x87ffffffu));
  __m256i a = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  __m256i b = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)));
  lo = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(a, 20), keep));
  hi = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(b, 20), keep));
}

// Fast FP8: the weight value times 2^-120, unscaled (the scale goes onto the activations).
struct DecFP8Fast {
  static constexpr int bytes16 = 16;
  void set_block(int64_t, int64_t) {}
  void decode(const uint8_t* p, __m256& lo, __m256& hi) const { fp8_bits_scaled(p, lo, hi); }
};

// Reference FP8: exactly fp8 * 2^(e-127) per element, one rounding, as the scalar decode.
// (v * 2^-120) * (s * 2^120) is that single rounding whenever s * 2^120 is finite (e <= 134);
// above, multiply by 2^120 first (exact) and then by s.
struct DecFP8Ref {
  static constexpr int bytes16 = 16;
  const Matrix* w;
  __m256 mul1, mul2;
  bool two_step = false;
  void set_block(int64_t r, int64_t c) {
    uint8_t e = w->scales[(r / 128) * ceil_div(w->cols, 128) + c / 128];
    float s = dsv4::e8m0_to_f32(e);
    two_step = e > 134 && e != 255;
    mul1 = _mm256_set1_ps(two_step ? 0x1p120f : s * 0x1p120f);
    mul2 = _mm256_set1_ps(s);
  }
  void decode(const uint8_t* p, __m256& lo, __m256& hi) const {
    fp8_bits_scaled(p, lo, hi);
    lo = _mm256_mul_ps(lo, mul1);
    hi = _mm256_mul_ps(hi, mul1);
    if (two_step) {
      lo = _mm256_mul_ps(lo, mul2);
      hi = _mm256_mul_ps(hi, mul2);
    }
  }
};

// Reference FP4: E2M1 value (8-entry float table + sign bit) times the per-32 scale.
struct DecFP4Ref {
  static constexpr int bytes16 = 8;
  const Matrix* w;
  __m256 scale;
  void set_block(int64_t r, int64_t c) {
    scale = _mm256_set1_ps(dsv4::e8m0_to_f32(w->scales[r * ceil_div(w->cols, 32) + c / 32]));
  }
  void decode(const uint8_t* p, __m256& lo, __m256& hi) const {
    const __m256 lut = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(b, _mm_set1_epi8(15)),
                                    _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(15)));  // column order
    __m256i i0 = _mm256_cvtepu8_epi32(nib), i1 = _mm256_cvtepu8_epi32(_mm_srli_si128(nib, 8));
    auto one = [&](__m256i idx) {
      __m256 v = _mm256_permutevar8x32_ps(lut, idx);
      __m256i sign = _mm256_slli_epi32(_mm256_and_si256(idx, _mm256_set1_epi32(8)), 28);
      return _mm256_mul_ps(_mm256_xor_ps(v, _mm256_castsi256_ps(sign)), scale);
    };
    lo = one(i0);
    hi = one(i1);
  }
};

// ---------------------------------------------------------------------------------------
// Float matrix-vector product, one activation row: R rows at a time, each row one 8-lane
// accumulator (its canonical lanes). `xs` is the activation row zero-padded to a multiple of 16.

template <class Dec, int R>
static void matvec_group(const Matrix& w, const Dec& proto, const uint8_t* const* rows, const int64_t* rix,
                         const float* xs, float* out, const uint8_t* pf = nullptr, int64_t pf_bytes = 0) {
  const int64_t cols = w.cols;
  const int64_t full = cols / 16 * 16;
  // Prefetch the next row group (contiguous) linearly, a slice per 16 columns (see fp4_matvec).
  const int64_t steps = ceil_div(cols, 16);
  const int64_t pf_step = pf ? (pf_bytes / steps + 63) / 64 * 64 : 0;
  __m256 acc[R];
  Dec dec[R];
  DSV4_UNROLL for (int j = 0; j < R; ++j) {
    acc[j] = _mm256_setzero_ps();
    dec[j] = proto;
  }
  const int64_t blk = w.format == WeightFormat::kFP4 ? 32 : 128;
  for (int64_t c0 = 0; c0 < cols; c0 += blk) {
    DSV4_UNROLL for (int j = 0; j < R; ++j) dec[j].set_block(rix[j], c0);
    const int64_t cend = mn(full, c0 + blk);
    for (int64_t c = c0; c < cend; c += 16) {
      if (pf) {
        const int64_t o0 = c / 16 * pf_step;
        for (int64_t o = o0; o < o0 + pf_step && o < pf_bytes; o += 64)
          _mm_prefetch(reinterpret_cast<const char*>(pf + o), _MM_HINT_T0);
      }
      __m256 x0 = _mm256_loadu_ps(xs + c), x1 = _mm256_loadu_ps(xs + c + 8);
      DSV4_UNROLL for (int j = 0; j < R; ++j) {
        __m256 lo, hi;
        dec[j].decode(rows[j] + c / 16 * Dec::bytes16, lo, hi);
        acc[j] = _mm256_fmadd_ps(lo, x0, acc[j]);
        acc[j] = _mm256_fmadd_ps(hi, x1, acc[j]);
      }
    }
    if (cend < mn(cols, c0 + blk)) {  // the ragged last 16 columns (inside this block)
      const int64_t c = full, rem = cols - full;
      __m256 x0 = _mm256_loadu_ps(xs + c), x1 = _mm256_loadu_ps(xs + c + 8);
      DSV4_UNROLL for (int j = 0; j < R; ++j) {
        alignas(32) uint8_t tmp[64] = {};
        std::memcpy(tmp, rows[j] + c / 16 * Dec::bytes16, static_cast<size_t>(rem * Dec::bytes16 / 16));
        __m256 lo, hi;
        dec[j].decode(tmp, lo, hi);
        acc[j] = _mm256_fmadd_ps(lo, x0, acc[j]);
        if (rem > 8) acc[j] = _mm256_fmadd_ps(hi, x1, acc[j]);  // canonical padding is to 8
      }
    }
  }
  DSV4_UNROLL for (int j = 0; j < R; ++j) out[j] = hsum8(acc[j]);
}

static inline int64_t row_bytes(const Matrix& w) { return w.data_bytes() / w.rows; }

template <class Dec>
static void matvec_rows(const Matrix& w, const Dec& proto, const float* xs, int64_t r0, int64_t r1, float* y) {
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const int64_t rb = row_bytes(w);
  int64_t r = r0;
  for (; r + 8 <= r1; r += 8) {
    const uint8_t* rows[8];
    int64_t rix[8];
    for (int j = 0; j < 8; ++j) rows[j] = base + (r + j) * rb, rix[j] = r + j;
    const int64_t next = mn<int64_t>(r1 - (r + 8), 8);
    matvec_group<Dec, 8>(w, proto, rows, rix, xs, y + r, next > 0 ? base + (r + 8) * rb : nullptr, next * rb);
  }
  for (; r < r1; ++r) {
    const uint8_t* rows[1] = {base + r * rb};
    int64_t rix[1] = {r};
    matvec_group<Dec, 1>(w, proto, rows, rix, xs, y + r);
  }
}

// ---------------------------------------------------------------------------------------
// Float matrix-matrix product (n >= 2). Weights of a 16-row tile are decoded once per 512
// columns into a float buffer and reused for every activation row; a 2-row x 6-activation
// register tile keeps 12 accumulators (each one output's 8 canonical lanes) busy. Lane
// accumulators persist across column chunks in `accs`.

constexpr int kTileRows = 32;
constexpr int kChunk = 512;

template <int NA>
static void gemm_micro(const float* w0, const float* w1, const float* const* xa, int64_t len, float* acc0,
                       float* acc1, bool first) {
  __m256 a0[NA], a1[NA];
  DSV4_UNROLL for (int k = 0; k < NA; ++k) {
    a0[k] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc0 + 8 * k);
    a1[k] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc1 + 8 * k);
  }
  for (int64_t c = 0; c < len; c += 8) {
    __m256 v0 = _mm256_loadu_ps(w0 + c), v1 = _mm256_loadu_ps(w1 + c);
    DSV4_UNROLL for (int k = 0; k < NA; ++k) {
      __m256 xv = _mm256_loadu_ps(xa[k] + c);
      a0[k] = _mm256_fmadd_ps(v0, xv, a0[k]);
      a1[k] = _mm256_fmadd_ps(v1, xv, a1[k]);
    }
  }
  DSV4_UNROLL for (int k = 0; k < NA; ++k) _mm256_storeu_ps(acc0 + 8 * k, a0[k]), _mm256_storeu_ps(acc1 + 8 * k, a1[k]);
}

#if defined(DSV4_SIMD_AVX512)
// AVX-512: two rows share one 512-bit register ([row r lanes 0-7 | row r+1 lanes 0-7]) against
// the activation broadcast to both halves, so each half is still one output's 8 canonical lanes.
// 4 row pairs x 6 activations = 24 accumulators of the 32 registers.
template <int NA>
static void gemm_micro512(const float* w, int64_t ldw, const float* const* xa, int64_t len, float* acc,
                          int64_t ldacc, bool first) {
  __m512 a[4][NA];
  DSV4_UNROLL for (int p = 0; p < 4; ++p) DSV4_UNROLL for (int k = 0; k < NA; ++k) {
    a[p][k] = first ? _mm512_setzero_ps()
                    : _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(acc + ((2 * p) * ldacc + k) * 8)),
                                         _mm256_loadu_ps(acc + ((2 * p + 1) * ldacc + k) * 8), 1);
  }
  for (int64_t c = 0; c < len; c += 8) {
    __m512 wv[4];
    DSV4_UNROLL for (int p = 0; p < 4; ++p) {
      wv[p] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(w + (2 * p) * ldw + c)),
                                 _mm256_loadu_ps(w + (2 * p + 1) * ldw + c), 1);
    }
    DSV4_UNROLL for (int k = 0; k < NA; ++k) {
      __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(xa[k] + c));
      DSV4_UNROLL for (int p = 0; p < 4; ++p) a[p][k] = _mm512_fmadd_ps(wv[p], xv, a[p][k]);
    }
  }
  DSV4_UNROLL for (int p = 0; p < 4; ++p) DSV4_UNROLL for (int k = 0; k < NA; ++k) {
    _mm256_storeu_ps(acc + ((2 * p) * ldacc + k) * 8, _mm512_castps512_ps256(a[p][k]));
    // upper half via a masked store (the extract intrinsics trip a false -Wuninitialized in gcc 12)
    _mm512_mask_storeu_ps(acc + ((2 * p + 1) * ldacc + k) * 8 - 8, 0xff00, a[p][k]);
  }
}
#endif

constexpr int kActBlock = 128;  // activations per pass over a tile: bounds the accumulator scratch

template <class Dec>
static void gemm_rows(const MatmulJob& job, const Dec& proto, int64_t r0, int64_t r1) {
  const Matrix& w = job.w;
  const int64_t cols = w.cols, n = job.n;
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const int64_t rb = row_bytes(w);
  const bool fp8_fast = job.numerics == Numerics::kFast && w.format == WeightFormat::kFP8;
  const int64_t scale_cols = ceil_div(cols, 128);
  const int64_t blk = w.format == WeightFormat::kFP4 ? 32 : 128;
  // Scratch on the stack (~100 KB): heap blocks this large would be mmap'ed and page-faulted
  // on every call.
  alignas(32) float wt[kTileRows * kChunk];
  alignas(32) float accs[kTileRows * kActBlock * 8];
  alignas(32) float xbuf[6 * kChunk];
  for (int64_t t0 = r0; t0 < r1; t0 += kTileRows) {
    const int tr = static_cast<int>(mn<int64_t>(kTileRows, r1 - t0));
    for (int64_t ib = 0; ib < n; ib += kActBlock) {
      const int64_t nab = mn<int64_t>(kActBlock, n - ib);
      for (int64_t k0 = 0; k0 < cols; k0 += kChunk) {
        const int64_t len = mn<int64_t>(kChunk, cols - k0);
        const int64_t len8 = ceil_div(len, 8) * 8;
        // Decode the tile chunk (rows beyond the tile and columns beyond len are zero).
        for (int j = 0; j < kTileRows; ++j) {
          float* dst = wt + j * kChunk;
          if (j >= tr) {
            for (int64_t c = 0; c < len8; ++c) dst[c] = 0.0f;
            continue;
          }
          Dec dec = proto;
          const uint8_t* row = base + (t0 + j) * rb;
          for (int64_t c = 0; c < len; c += 16) {
            if ((k0 + c) % blk == 0) dec.set_block(t0 + j, k0 + c);
            __m256 lo, hi;
            if (len - c >= 16) {
              dec.decode(row + (k0 + c) / 16 * Dec::bytes16, lo, hi);
            } else {
              alignas(32) uint8_t tmp[64] = {};
              std::memcpy(tmp, row + (k0 + c) / 16 * Dec::bytes16, static_cast<size_t>((len - c) * Dec::bytes16 / 16));
              dec.decode(tmp, lo, hi);
            }
            _mm256_storeu_ps(dst + c, lo);
            if (c + 8 < len8) _mm256_storeu_ps(dst + c + 8, hi);
          }
        }
        for (int64_t i0 = ib; i0 < ib + nab; i0 += 6) {
          const int na = static_cast<int>(mn<int64_t>(6, ib + nab - i0));
          const float* xa[6];
          const bool copy = true;  // contiguous copies: activation rows 4 KiB apart alias in L1
          for (int k = 0; k < na; ++k) {
            const float* x = job.x + (i0 + k) * cols + k0;
            if (!copy) {
              xa[k] = x;
              continue;
            }
            float* dst = xbuf + k * kChunk;
            if (fp8_fast) {
              const uint8_t* sc = w.scales + (t0 / 128) * scale_cols;
              for (int64_t c = 0; c < len; c += 128) {
                const __m256 sv = _mm256_set1_ps(kd::fp8_fast_scale(sc[(k0 + c) / 128]));
                const int64_t e = mn<int64_t>(len, c + 128);
                int64_t cc = c;
                for (; cc + 8 <= e; cc += 8) _mm256_storeu_ps(dst + cc, _mm256_mul_ps(_mm256_loadu_ps(x + cc), sv));
                for (; cc < e; ++cc) dst[cc] = x[cc] * _mm256_cvtss_f32(sv);
              }
            } else {  // (a memcpy here compiles to rep movsq, several times slower)
              int64_t cc = 0;
              for (; cc + 8 <= len; cc += 8) _mm256_storeu_ps(dst + cc, _mm256_loadu_ps(x + cc));
              for (; cc < len; ++cc) dst[cc] = x[cc];
            }
            for (int64_t c = len; c < len8; ++c) dst[c] = 0.0f;
            xa[k] = dst;
          }
#if defined(DSV4_SIMD_AVX512)
          {  // all 32 tile rows (zero rows past the tile's end are computed and dropped)
            for (int j = 0; j < kTileRows; j += 8) {
              float* a0 = accs + (j * nab + (i0 - ib)) * 8;
              const float* w0 = wt + j * kChunk;
              switch (na) {
                case 6: gemm_micro512<6>(w0, kChunk, xa, len8, a0, nab, k0 == 0); break;
                case 5: gemm_micro512<5>(w0, kChunk, xa, len8, a0, nab, k0 == 0); break;
                case 4: gemm_micro512<4>(w0, kChunk, xa, len8, a0, nab, k0 == 0); break;
                case 3: gemm_micro512<3>(w0, kChunk, xa, len8, a0, nab, k0 == 0); break;
                case 2: gemm_micro512<2>(w0, kChunk, xa, len8, a0, nab, k0 == 0); break;
                default: gemm_micro512<1>(w0, kChunk, xa, len8, a0, nab, k0 == 0); break;
              }
            }
          }
#else
          for (int j = 0; j < tr; j += 2) {
            float* a0 = accs + (j * nab + (i0 - ib)) * 8;
            float* a1 = accs + ((j + 1) * nab + (i0 - ib)) * 8;
            const float* w0 = wt + j * kChunk;
            const float* w1 = wt + (j + 1) * kChunk;
            switch (na) {
              case 6: gemm_micro<6>(w0, w1, xa, len8, a0, a1, k0 == 0); break;
              case 5: gemm_micro<5>(w0, w1, xa, len8, a0, a1, k0 == 0); break;
              case 4: gemm_micro<4>(w0, w1, xa, len8, a0, a1, k0 == 0); break;
              case 3: gemm_micro<3>(w0, w1, xa, len8, a0, a1, k0 == 0); break;
              case 2: gemm_micro<2>(w0, w1, xa, len8, a0, a1, k0 == 0); break;
              default: gemm_micro<1>(w0, w1, xa, len8, a0, a1, k0 == 0); break;
            }
          }
#endif
        }
      }
      // Activation-major: each activation's 32 outputs are contiguous in y (row-major stores
      // would touch a new page per output).
      for (int64_t i = 0; i < nab; ++i)
        for (int j = 0; j < tr; ++j)
          job.y[(ib + i) * job.y_stride + t0 + j] = hsum8(_mm256_loadu_ps(accs + (j * nab + i) * 8));
    }
  }
}

// ---------------------------------------------------------------------------------------
// Float paths: matvec for one activation row, gemm for more.

template <class Dec>
static void float_rows(const MatmulJob& job, const Dec& proto, int64_t r0, int64_t r1) {
  const Matrix& w = job.w;
  const int64_t cols = w.cols, n = job.n;
  if (n >= 2) {
    gemm_rows(job, proto, r0, r1);
    return;
  }
  const int64_t padded = ceil_div(cols, 16) * 16;
  Buf<float> xs(padded);
  Buf<float> yt(r1 - r0);
  const bool fp8_fast = job.numerics == Numerics::kFast && w.format == WeightFormat::kFP8;
  const float* x = job.x;
  if (!fp8_fast) {
    std::memcpy(xs.data(), x, static_cast<size_t>(cols) * 4);
    matvec_rows(w, proto, xs.data(), r0, r1, yt.data() - r0);
  } else {
    // Pre-scale the activations once per 128-row block of weights.
    const int64_t scale_cols = ceil_div(cols, 128);
    for (int64_t b0 = r0; b0 < r1; b0 = (b0 / 128 + 1) * 128) {
      const int64_t b1 = mn(r1, (b0 / 128 + 1) * 128);
      const uint8_t* s = w.scales + (b0 / 128) * scale_cols;
      for (int64_t c = 0; c < cols; c += 128) {
        const __m256 sv = _mm256_set1_ps(kd::fp8_fast_scale(s[c / 128]));
        const int64_t e = mn(cols, c + 128);
        int64_t cc = c;
        for (; cc + 8 <= e; cc += 8) _mm256_storeu_ps(xs.data() + cc, _mm256_mul_ps(_mm256_loadu_ps(x + cc), sv));
        for (; cc < e; ++cc) xs[cc] = x[cc] * _mm256_cvtss_f32(sv);
      }
      matvec_rows(w, proto, xs.data(), b0, b1, yt.data() - r0);
    }
  }
  for (int64_t r = r0; r < r1; ++r) job.y[r] = yt[r - r0];
}

// Reference FP8 with NaN codes: the SIMD decode has no NaN, so rows holding a NaN code
// (0x7f / 0xff, never in real checkpoints) are recomputed by the scalar definition.
static void fix_fp8_nan_rows(const MatmulJob& job, int64_t r0, int64_t r1) {
  const Matrix& w = job.w;
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const __m256i ones = _mm256_set1_epi8(-1), top = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* p = base + r * w.cols;
    __m256i any = _mm256_setzero_si256();
    int64_t c = 0;
    for (; c + 32 <= w.cols; c += 32) {
      __m256i v = _mm256_or_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + c)), top);
      any = _mm256_or_si256(any, _mm256_cmpeq_epi8(v, ones));
    }
    bool nan = !_mm256_testz_si256(any, any);
    for (; c < w.cols && !nan; ++c) nan = (p[c] & 0x7f) == 0x7f;
    if (nan) kd::scalar_table().matmul_rows(job, r, r + 1);
  }
}

// ---------------------------------------------------------------------------------------
// Fast FP4, one activation row. 8 rows at a time; per 64-column span each row gives one
// int32 vector of partial sums (lanes 0-3: block 2s, 4-7: block 2s+1, exact); a horizontal-add
// transpose turns 8 of them into [rows 0-7 at block 2s] and [rows 0-7 at block 2s+1]; then
// acc = fma(float(sum), d * scale/2, acc) per block in order, lanes = rows.

static inline __m256i fp4_lut() {
  return _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12, 0, 1, 2, 3, 4, 6, 8, 12, 0,
                          -1, -2, -3, -4, -6, -8, -12);
}

// 8 E8M0 bytes per row for 8 rows (row j at src[j], 8 consecutive blocks), transposed: v[k]
// holds block 2k's 8 rows in bytes 0-7 and block 2k+1's in bytes 8-15.
static inline void scale_bytes_8x8(const uint8_t* const* src, __m128i* v) {
  __m128i q[8];
  DSV4_UNROLL for (int j = 0; j < 8; ++j) q[j] = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src[j]));
  __m128i t01 = _mm_unpacklo_epi8(q[0], q[1]), t23 = _mm_unpacklo_epi8(q[2], q[3]);
  __m128i t45 = _mm_unpacklo_epi8(q[4], q[5]), t67 = _mm_unpacklo_epi8(q[6], q[7]);
  __m128i u0 = _mm_unpacklo_epi16(t01, t23), u1 = _mm_unpackhi_epi16(t01, t23);
  __m128i u2 = _mm_unpacklo_epi16(t45, t67), u3 = _mm_unpackhi_epi16(t45, t67);
  v[0] = _mm_unpacklo_epi32(u0, u2), v[1] = _mm_unpackhi_epi32(u0, u2);
  v[2] = _mm_unpacklo_epi32(u1, u3), v[3] = _mm_unpackhi_epi32(u1, u3);
}

// Whether every byte of v[0..n) is in 2..254. There e8m0_half(e) = 2^(e-128) is a normal float
// whose bits are just (e - 1) << 23: no denormal below, no NaN at 255. Real checkpoints' scales
// all are (about 2^-10 .. 2^0), and the general conversion took ~3x the instructions: in the
// matrix-vector kernels it was a third of the time.
static inline bool scales_normal(const __m128i* v, int n) {
  __m128i m = _mm_set1_epi8(-1);  // min over (e + 1) mod 256, which is >= 3 exactly for 2..254
  DSV4_UNROLL for (int k = 0; k < n; ++k) m = _mm_min_epu8(m, _mm_add_epi8(v[k], _mm_set1_epi8(1)));
  return _mm_movemask_epi8(_mm_cmpeq_epi8(_mm_max_epu8(m, _mm_set1_epi8(3)), m)) == 0xffff;
}

// Zero-extended E8M0 exponents -> e8m0_half bit-exactly: 2^(e-128) (a denormal for e < 2),
// NaN at 255.
static inline __m256 e8m0_half8(__m256i e) {
  const __m256i one = _mm256_set1_epi32(1), two = _mm256_set1_epi32(2), tiny = _mm256_set1_epi32(0x00200000),
                ff = _mm256_set1_epi32(255), qnan = _mm256_set1_epi32(0x7fc00000);
  __m256i bits = _mm256_slli_epi32(_mm256_sub_epi32(e, one), 23);
  bits = _mm256_blendv_epi8(bits, _mm256_sllv_epi32(tiny, e), _mm256_cmpgt_epi32(two, e));
  bits = _mm256_or_si256(bits, _mm256_and_si256(_mm256_cmpeq_epi32(e, ff), qnan));
  return _mm256_castsi256_ps(bits);
}

// The transposed bytes of scale_bytes_8x8 -> for each of the 8 blocks, the 8 rows' halved
// scales as floats (e8m0_half bit-exactly).
static inline void scales_from_bytes(const __m128i* v, __m256* out) {
  const bool normal = scales_normal(v, 4);
  DSV4_UNROLL for (int k = 0; k < 8; ++k) {
    const __m256i e = _mm256_cvtepu8_epi32((k & 1) ? _mm_srli_si128(v[k / 2], 8) : v[k / 2]);
    out[k] = normal ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23))
                    : e8m0_half8(e);
  }
}

// 8 E8M0 bytes per row for 8 rows (row j at src[j], 8 consecutive blocks) -> for each of the
// 8 blocks, the 8 rows' halved scales as floats.
static inline void scales_8x8(const uint8_t* const* src, __m256* out) {
  __m128i v[4];
  scale_bytes_8x8(src, v);
  scales_from_bytes(v, out);
}

// Sums of 8 vectors' lanes 0-3 and 4-7: returns [v0..v7 lanes 0-3] and [v0..v7 lanes 4-7].
static inline void transpose_sums(const __m256i* v, __m256i& b0, __m256i& b1) {
  __m256i h01 = _mm256_hadd_epi32(v[0], v[1]), h23 = _mm256_hadd_epi32(v[2], v[3]);
  __m256i h45 = _mm256_hadd_epi32(v[4], v[5]), h67 = _mm256_hadd_epi32(v[6], v[7]);
  __m256i a = _mm256_hadd_epi32(h01, h23), b = _mm256_hadd_epi32(h45, h67);
  b0 = _mm256_permute2x128_si256(a, b, 0x20);
  b1 = _mm256_permute2x128_si256(a, b, 0x31);
}

static inline __m256i fp4_lut_offset() {  // doubled E2M1 value + 12: unsigned 0..24
  return _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12, 13, 14, 15, 16, 18, 20, 24,
                          12, 11, 10, 9, 8, 6, 4, 0);
}

// One row's 64-column span against the activations Q = 256 * hi + lo: per plane,
// vpmaddubsw(w + 12 (unsigned), plane (signed)) per nibble half, both added in int16
// (|.| <= 2 * 2 * 24 * 128 < 32768), then widened to int32 with the plane's weight (256 or 1).
// Lanes 0-3 hold block 2s, 4-7 block 2s+1; the +12 is taken out per block later (12 * sum Q).
// Activation vectors: [0] hi even, [1] hi odd, [2] lo even, [3] lo odd.
static inline __m256i fp4_span_offset(__m256i raw, const __m256i* x) {
  const __m256i m4 = _mm256_set1_epi8(15), lut = fp4_lut_offset();
  __m256i we = _mm256_shuffle_epi8(lut, _mm256_and_si256(raw, m4));
  __m256i wo = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4));
#if defined(DSV4_SIMD_VNNI)
  // vpdpbusd: the same exact sums, 4 products per int32 lane; the high plane's sum is shifted
  // by 8 before the low plane's products are added to it.
  __m256i h = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), we, x[0]), wo, x[1]);
  return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_slli_epi32(h, 8), we, x[2]), wo, x[3]);
#else
  __m256i ph = _mm256_add_epi16(_mm256_maddubs_epi16(we, x[0]), _mm256_maddubs_epi16(wo, x[1]));
  __m256i pl = _mm256_add_epi16(_mm256_maddubs_epi16(we, x[2]), _mm256_maddubs_epi16(wo, x[3]));
  return _mm256_add_epi32(_mm256_madd_epi16(ph, _mm256_set1_epi16(256)), _mm256_madd_epi16(pl, _mm256_set1_epi16(1)));
#endif
}

#if defined(DSV4_SIMD_AVX512)
// AVX-512 matrix-vector: two spans (128 columns) per row per step on 512-bit registers. The
// int32 lanes come out as [block 2s | 2s+1 | 2s+2 | 2s+3] x 4 partial sums; the two 256-bit
// halves then go through the same transpose as the AVX2 code (exact integer sums either way).
static inline __m512i fp4_2span_offset(__m512i raw, const __m512i* x) {
  const __m512i m4 = _mm512_set1_epi8(15);
  const __m512i lut = _mm512_broadcast_i32x4(_mm256_castsi256_si128(fp4_lut_offset()));
  __m512i we = _mm512_shuffle_epi8(lut, _mm512_and_si512(raw, m4));
  __m512i wo = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4));
  __m512i h = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), we, x[0]), wo, x[1]);
  return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_slli_epi32(h, 8), we, x[2]), wo, x[3]);
}
#endif

// Each row group of the matrix-vector kernels prefetches the next one; the first group of a
// task's range has nobody to do it, so start all of its weight and scale lines at once rather
// than leaving them to one demand-miss stream per row.
static inline void prefetch_first_group(const Matrix& w, int64_t r0, int64_t rows) {
  const int64_t rb = w.cols / 2, nb = ceil_div(w.cols, 32);
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  for (int64_t o = 0; o < rows * rb; o += 64) _mm_prefetch(reinterpret_cast<const char*>(base + r0 * rb + o), _MM_HINT_T0);
  for (int64_t o = 0; o < rows * nb; o += 64)
    _mm_prefetch(reinterpret_cast<const char*>(w.scales + r0 * nb + o), _MM_HINT_T0);
}

[[maybe_unused]] static void fp4_matvec(const MatmulJob& job, int64_t r0, int64_t r1) {
  const Matrix& w = job.w;
  const int64_t cols = w.cols, nb = ceil_div(cols, 32), pc = job.padded_cols, rb = cols / 2;
  const int64_t full_spans = cols / 64, spans = pc / 64;
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const int8_t* q = job.q;
  const int8_t* ql = job.ql;
  const float* d = job.d;
  const int32_t* q12 = job.qsum12;
  // Prefetch two groups ahead: one group (16 KiB at 4096 columns) computes too quickly on
  // AVX2 for its successor's lines to arrive in time.
  constexpr int64_t kAhead = 16;
  prefetch_first_group(w, r0, mn<int64_t>(8 + kAhead, r1 - r0));
  for (int64_t r = r0; r < r1; r += 8) {
    const uint8_t* rows[8];
    const uint8_t* srows[8];
    for (int j = 0; j < 8; ++j) {
      int64_t rr = mn(r + j, r1 - 1);  // a short group repeats its last row
      rows[j] = base + rr * rb;
      srows[j] = w.scales + rr * nb;
    }
    // A row group is one contiguous block (plus its scale bytes); rows are short (2 KiB at
    // 4096 columns), too short for the hardware prefetchers to lock onto 8 streams, so pull
    // the group kAhead rows on in linearly, a slice per span, while this one computes.
    const int64_t pr = r + kAhead, pr_end = mn<int64_t>(r1, pr + 8);
    const uint8_t* pf = pr < r1 ? base + pr * rb : nullptr;
    const int64_t pf_bytes = pf ? (pr_end - pr) * rb : 0;
    const int64_t pf_step = spans ? (pf_bytes / spans + 63) / 64 * 64 : 0;
    if (pf) {
      const uint8_t* ps = w.scales + pr * nb;
      for (int64_t o = 0; o < (pr_end - pr) * nb; o += 64) _mm_prefetch(reinterpret_cast<const char*>(ps + o), _MM_HINT_T0);
    }
    auto prefetch_span = [&](int64_t s) {
      if (!pf) return;
      for (int64_t o = s * pf_step; o < (s + 1) * pf_step && o < pf_bytes; o += 64)
        _mm_prefetch(reinterpret_cast<const char*>(pf + o), _MM_HINT_T0);
    };
    __m256 acc = _mm256_setzero_ps();
    __m256 sc[8];
    // Per-row int32 partial sums of span s (pairs hadd'ed into h[4]) -> blocks 2s, 2s+1.
    auto finish = [&](const __m256i* h, int64_t s) {
      __m256i ha = _mm256_hadd_epi32(h[0], h[1]), hb = _mm256_hadd_epi32(h[2], h[3]);
      const int64_t b = 2 * s;
      __m256i s0 = _mm256_sub_epi32(_mm256_permute2x128_si256(ha, hb, 0x20), _mm256_set1_epi32(q12[b]));
      __m256 c0 = _mm256_mul_ps(_mm256_set1_ps(d[b]), sc[b & 7]);
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), c0, acc);
      if (b + 1 < nb) {
        __m256i s1 = _mm256_sub_epi32(_mm256_permute2x128_si256(ha, hb, 0x31), _mm256_set1_epi32(q12[b + 1]));
        __m256 c1 = _mm256_mul_ps(_mm256_set1_ps(d[b + 1]), sc[(b + 1) & 7]);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), c1, acc);
      }
    };
    auto load_scales = [&](int64_t s) {  // 8 blocks = 4 spans of scales
      const int64_t b0 = 2 * s;
      const uint8_t* src[8];
      uint8_t tmp[8][8];
      for (int j = 0; j < 8; ++j) {
        if (b0 + 8 <= nb) {
          src[j] = srows[j] + b0;
        } else {
          for (int k = 0; k < 8; ++k) tmp[j][k] = b0 + k < nb ? srows[j][b0 + k] : 127;
          src[j] = tmp[j];
        }
      }
      scales_8x8(src, sc);
    };
    int64_t s = 0;
    for (; s < spans; ++s) {
      if ((s & 3) == 0) load_scales(s);
      prefetch_span(s);
      const __m256i xq[4] = {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + s * 64)),
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + s * 64 + 32)),
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + s * 64)),
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + s * 64 + 32))};
      __m256i h[4];
      if (s < full_spans) {
        DSV4_UNROLL for (int j = 0; j < 8; j += 2) {
          __m256i a = fp4_span_offset(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[j] + s * 32)), xq);
          __m256i b = fp4_span_offset(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[j + 1] + s * 32)), xq);
          h[j / 2] = _mm256_hadd_epi32(a, b);
        }
      } else {
        for (int j = 0; j < 8; j += 2) {
          alignas(32) uint8_t ta[32] = {}, tb[32] = {};
          std::memcpy(ta, rows[j] + s * 32, static_cast<size_t>(rb - s * 32));
          std::memcpy(tb, rows[j + 1] + s * 32, static_cast<size_t>(rb - s * 32));
          __m256i a = fp4_span_offset(_mm256_load_si256(reinterpret_cast<const __m256i*>(ta)), xq);
          __m256i b = fp4_span_offset(_mm256_load_si256(reinterpret_cast<const __m256i*>(tb)), xq);
          h[j / 2] = _mm256_hadd_epi32(a, b);
        }
      }
      finish(h, s);
    }
    alignas(32) float out[8];
    _mm256_store_ps(out, acc);
    for (int j = 0; j < 8 && r + j < r1; ++j) job.y[r + j] = out[j];
  }
}

#if defined(DSV4_SIMD_AVX512)
// AVX-512 matrix-vector: 16 rows at a time, two spans (128 columns, 64 packed bytes per row)
// per step. Each row's vector holds 4 int32 partial sums for each of blocks 2s .. 2s+3 (one
// 128-bit lane per block); unpack + add twice leaves [4 rows' full sums] per lane, and a 4x4
// transpose of 128-bit lanes gives, per block, the 16 rows' sums in one register: the float
// chain then runs on 16 rows (lanes) at once. The last step reads past the row end through
// masks (zero weights there meet zero activations: the columns past `cols` are padding).
static void fp4_matvec512(const MatmulJob& job, int64_t r0, int64_t r1) {
  const Matrix& w = job.w;
  const int64_t cols = w.cols, nb = ceil_div(cols, 32), pc = job.padded_cols, rb = cols / 2;
  const int64_t spans = pc / 64;
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const int8_t* q = job.q;
  const int8_t* ql = job.ql;
  const float* d = job.d;
  const int32_t* q12 = job.qsum12;
  prefetch_first_group(w, r0, mn<int64_t>(16, r1 - r0));
  for (int64_t r = r0; r < r1; r += 16) {
    const uint8_t* rows[16];
    const uint8_t* srows[16];
    for (int j = 0; j < 16; ++j) {
      int64_t rr = mn(r + j, r1 - 1);  // a short group repeats its last row
      rows[j] = base + rr * rb;
      srows[j] = w.scales + rr * nb;
    }
    // The next 16-row group is one contiguous block: pull it in linearly, a slice per step.
    const uint8_t* pf = r + 16 < r1 ? base + (r + 16) * rb : nullptr;
    const int64_t pf_rows = pf ? mn<int64_t>(r1, r + 32) - (r + 16) : 0;
    const int64_t pf_bytes = pf_rows * rb;
    const int64_t steps = ceil_div(spans, 2);
    const int64_t pf_step = steps ? (pf_bytes / steps + 63) / 64 * 64 : 0;
    if (pf) {
      const uint8_t* ps = w.scales + (r + 16) * nb;
      for (int64_t o = 0; o < pf_rows * nb; o += 64) _mm_prefetch(reinterpret_cast<const char*>(ps + o), _MM_HINT_T0);
    }
    __m512 acc = _mm512_setzero_ps();
    __m512 sc[8];
    for (int64_t s = 0; s < spans; s += 2) {
      if ((s & 3) == 0) {  // 8 blocks = 4 spans of scales, rows 0-7 and 8-15
        const int64_t b0 = 2 * s;
        __m128i bytes[2][4];
        DSV4_UNROLL for (int half = 0; half < 2; ++half) {
          const uint8_t* src[8];
          uint8_t tmp[8][8];
          if (b0 + 8 <= nb) {  // tested once, not per row (gcc kept it in the loop)
            DSV4_UNROLL for (int j = 0; j < 8; ++j) src[j] = srows[half * 8 + j] + b0;
          } else {
            for (int j = 0; j < 8; ++j) {
              for (int k = 0; k < 8; ++k) tmp[j][k] = b0 + k < nb ? srows[half * 8 + j][b0 + k] : 127;
              src[j] = tmp[j];
            }
          }
          scale_bytes_8x8(src, bytes[half]);
        }
        if (scales_normal(bytes[0], 4) && scales_normal(bytes[1], 4)) {
          // The usual case (see scales_normal): one 16-row conversion per block.
          DSV4_UNROLL for (int k = 0; k < 8; ++k) {
            const __m128i lo = bytes[0][k / 2], hi = bytes[1][k / 2];
            const __m512i e = _mm512_cvtepu8_epi32((k & 1) ? _mm_unpackhi_epi64(lo, hi) : _mm_unpacklo_epi64(lo, hi));
            sc[k] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23));
          }
        } else {
          __m256 lo[8], hi[8];
          scales_from_bytes(bytes[0], lo);
          scales_from_bytes(bytes[1], hi);
          for (int k = 0; k < 8; ++k) sc[k] = _mm512_insertf32x8(_mm512_castps256_ps512(lo[k]), hi[k], 1);
        }
      }
      if (pf)
        for (int64_t o = (s / 2) * pf_step; o < (s / 2 + 1) * pf_step && o < pf_bytes; o += 64)
          _mm_prefetch(reinterpret_cast<const char*>(pf + o), _MM_HINT_T0);
      const bool two = s + 1 < spans;
      __m512i xv[4];
      {
        const int8_t* src[4] = {q + s * 64, q + s * 64 + 32, ql + s * 64, ql + s * 64 + 32};
        for (int k = 0; k < 4; ++k) {
          __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src[k]));
          __m256i hi = two ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src[k] + 64)) : _mm256_setzero_si256();
          xv[k] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        }
      }
      const int64_t avail = rb - s * 32;  // packed bytes of the row from this step on
      const __mmask64 m = avail >= 64 ? ~__mmask64{0} : ((__mmask64{1} << avail) - 1);
      __m512i v[16];
      if (avail >= 64) {
        DSV4_UNROLL for (int j = 0; j < 16; ++j) v[j] = fp4_2span_offset(_mm512_loadu_si512(rows[j] + s * 32), xv);
      } else {
        DSV4_UNROLL for (int j = 0; j < 16; ++j) v[j] = fp4_2span_offset(_mm512_maskz_loadu_epi8(m, rows[j] + s * 32), xv);
      }
      __m512i t[8], u[4];
      DSV4_UNROLL for (int k = 0; k < 8; ++k)
        t[k] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * k], v[2 * k + 1]), _mm512_unpackhi_epi32(v[2 * k], v[2 * k + 1]));
      DSV4_UNROLL for (int k = 0; k < 4; ++k)
        u[k] = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2 * k], t[2 * k + 1]), _mm512_unpackhi_epi64(t[2 * k], t[2 * k + 1]));
      const __m512i a0 = _mm512_shuffle_i64x2(u[0], u[1], 0x44), a1 = _mm512_shuffle_i64x2(u[0], u[1], 0xee);
      const __m512i a2 = _mm512_shuffle_i64x2(u[2], u[3], 0x44), a3 = _mm512_shuffle_i64x2(u[2], u[3], 0xee);
      const __m512i blk[4] = {_mm512_shuffle_i64x2(a0, a2, 0x88), _mm512_shuffle_i64x2(a0, a2, 0xdd),
                              _mm512_shuffle_i64x2(a1, a3, 0x88), _mm512_shuffle_i64x2(a1, a3, 0xdd)};
      DSV4_UNROLL for (int k = 0; k < 4; ++k) {
        const int64_t b = 2 * s + k;
        if (b >= nb) break;
        const __m512i sum = _mm512_sub_epi32(blk[k], _mm512_set1_epi32(q12[b]));
        const __m512 c = _mm512_mul_ps(_mm512_set1_ps(d[b]), sc[b & 7]);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), c, acc);
      }
    }
    _mm512_mask_storeu_ps(job.y + r, static_cast<__mmask16>(r1 - r >= 16 ? 0xffff : (1u << (r1 - r)) - 1), acc);
  }
}
#endif

// ---------------------------------------------------------------------------------------
// Fast FP4, several activation rows: int16 x int16 products. A 32-row x 512-column tile is
// decoded once into int16 (the doubled E2M1 values) in an interleaved layout: per pair of
// columns, kVR rows x 2 values = one vector (kVR = 8 rows per 256-bit vector, 16 per 512-bit
// vector on AVX-512). A register tile of RG * kVR rows x NA activations then takes, per pair
// of columns, one weight vector per row group and one broadcast of an activation's two Q
// values (QuantizedInput::qg), and vpmaddwd + vpaddd (AVX2) or VNNI vpdpwssd (AVX-512) adds
// both products to the row's int32 block sum: exact (|sum| < 2^24), 16 products per 256 bits
// and instruction. (Two int8 planes through vpmaddubsw would need 2 multiplies per 32 products
// plus a widening multiply per 4: 25 % more of the multiply instructions that bound this loop.)

constexpr int kQTile = 32;
constexpr int kQSpans = 8;  // columns per chunk: 8 spans = 512 = 16 blocks
#if defined(DSV4_SIMD_AVX512)
constexpr int kVR = 16;  // rows per vector in the batched kernel
constexpr int kRT = 2;   // row groups (of kVR rows) per register tile
constexpr int kNA = 4;   // activations per register tile
#else
constexpr int kVR = 8;
constexpr int kRT = 1;
constexpr int kNA = 8;   // 8 int32 sums + 8 float chains + weights + broadcast: 16+ registers,
                         // but the float chains are touched once per block (spills are cheap)
#endif
constexpr int kRG = kQTile / kVR;              // row groups per tile
constexpr int kPairBytes = kVR * 4;            // one row group's pair of columns
constexpr int kRGBytes = kQSpans * 32 * kPairBytes;  // one row group of the tile

struct Fp4Tile {
  alignas(64) uint8_t w[kRG * kRGBytes];          // [row group][column pair][row kVR][2 x int16]
  alignas(64) float sc[kRG * 2 * kQSpans * kVR];  // [row group][block][row kVR]  scale / 2
};

// 8 vectors of 8 dwords (row j = v[j]) -> dword k of all rows at o + k * stride.
static inline void transpose8_store(const __m256i* v, uint8_t* o, int64_t stride) {
  __m256i a0 = _mm256_unpacklo_epi32(v[0], v[1]), a1 = _mm256_unpackhi_epi32(v[0], v[1]);
  __m256i a2 = _mm256_unpacklo_epi32(v[2], v[3]), a3 = _mm256_unpackhi_epi32(v[2], v[3]);
  __m256i a4 = _mm256_unpacklo_epi32(v[4], v[5]), a5 = _mm256_unpackhi_epi32(v[4], v[5]);
  __m256i a6 = _mm256_unpacklo_epi32(v[6], v[7]), a7 = _mm256_unpackhi_epi32(v[6], v[7]);
  __m256i b0 = _mm256_unpacklo_epi64(a0, a2), b1 = _mm256_unpackhi_epi64(a0, a2);
  __m256i b2 = _mm256_unpacklo_epi64(a1, a3), b3 = _mm256_unpackhi_epi64(a1, a3);
  __m256i b4 = _mm256_unpacklo_epi64(a4, a6), b5 = _mm256_unpackhi_epi64(a4, a6);
  __m256i b6 = _mm256_unpacklo_epi64(a5, a7), b7 = _mm256_unpackhi_epi64(a5, a7);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 0 * stride), _mm256_permute2x128_si256(b0, b4, 0x20));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 1 * stride), _mm256_permute2x128_si256(b1, b5, 0x20));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 2 * stride), _mm256_permute2x128_si256(b2, b6, 0x20));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 3 * stride), _mm256_permute2x128_si256(b3, b7, 0x20));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 4 * stride), _mm256_permute2x128_si256(b0, b4, 0x31));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 5 * stride), _mm256_permute2x128_si256(b1, b5, 0x31));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 6 * stride), _mm256_permute2x128_si256(b2, b6, 0x31));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 7 * stride), _mm256_permute2x128_si256(b3, b7, 0x31));
}

// Decodes rows [t0, t1) (up to 32), spans [s0, s0 + ns) into the tile, 8 rows at a time.
static void fp4_decode_tile(const Matrix& w, int64_t t0, int64_t t1, int64_t s0, int64_t ns, Fp4Tile& t) {
  const int64_t cols = w.cols, rb = cols / 2, full_spans = cols / 64, nb = ceil_div(cols, 32);
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const __m256i m4 = _mm256_set1_epi8(15);
  for (int sub = 0; sub < kQTile / 8; ++sub) {
    const int rg = sub * 8 / kVR, roff = sub * 8 % kVR;  // row group, first row inside it
    uint8_t* dst = t.w + rg * kRGBytes + roff * 4;
    float* sc = t.sc + rg * 2 * kQSpans * kVR + roff;
    for (int64_t ls = 0; ls < ns; ++ls) {
      const int64_t s = s0 + ls;
      __m256i v[4][8];  // [16 columns][row]: 8 pairs of int16 each
      DSV4_UNROLL for (int j = 0; j < 8; ++j) {
        int64_t r = t0 + sub * 8 + j;
        __m256i raw = _mm256_setzero_si256();
        if (r < t1) {
          if (s < full_spans) {
            raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + r * rb + s * 32));
          } else {
            alignas(32) uint8_t tmp[32] = {};
            std::memcpy(tmp, base + r * rb + s * 32, static_cast<size_t>(rb - s * 32));
            raw = _mm256_load_si256(reinterpret_cast<const __m256i*>(tmp));
          }
        }
        const __m256i ev = _mm256_shuffle_epi8(fp4_lut(), _mm256_and_si256(raw, m4));
        const __m256i od = _mm256_shuffle_epi8(fp4_lut(), _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4));
        const __m256i lo = _mm256_unpacklo_epi8(ev, od);  // columns [0-15 | 32-47] in order
        const __m256i hi = _mm256_unpackhi_epi8(ev, od);  // columns [16-31 | 48-63]
        v[0][j] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(lo));
        v[1][j] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(hi));
        v[2][j] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(lo, 1));
        v[3][j] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(hi, 1));
      }
      DSV4_UNROLL for (int k = 0; k < 4; ++k) transpose8_store(v[k], dst + (ls * 32 + k * 8) * kPairBytes, kPairBytes);
    }
    const int64_t lb_end = mn<int64_t>(2 * ns, nb - 2 * s0);
    for (int64_t lb = 0; lb < lb_end; ++lb)
      for (int j = 0; j < 8; ++j) {
        int64_t r = t0 + sub * 8 + j;
        sc[lb * kVR + j] = r < t1 ? kd::e8m0_half(w.scales[r * nb + 2 * s0 + lb]) : 0.0f;
      }
  }
}

#if defined(DSV4_SIMD_AVX512)
using FVec = __m512;
using IVec = __m512i;
static inline IVec iload(const void* p) { return _mm512_load_si512(p); }
static inline FVec fload(const float* p) { return _mm512_load_ps(p); }
static inline FVec fset1(float v) { return _mm512_set1_ps(v); }
static inline IVec iset1(int32_t v) { return _mm512_set1_epi32(v); }
static inline IVec izero() { return _mm512_setzero_si512(); }
static inline IVec imadd(IVec acc, IVec x, IVec w) { return _mm512_dpwssd_epi32(acc, x, w); }
static inline FVec fma_block(IVec i, FVec c, FVec acc) { return _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), c, acc); }
static inline FVec fmul(FVec a, FVec b) { return _mm512_mul_ps(a, b); }
static inline FVec fzero() { return _mm512_setzero_ps(); }
// Rows >= valid of the vector are neither read nor written (y may end there).
static inline FVec yload(const float* p, int valid) {
  return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << valid) - 1), p);
}
static inline void ystore(float* p, FVec v, int valid) {
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << valid) - 1), v);
}
#else
using FVec = __m256;
using IVec = __m256i;
static inline IVec iload(const void* p) { return _mm256_load_si256(static_cast<const __m256i*>(p)); }
static inline FVec fload(const float* p) { return _mm256_load_ps(p); }
static inline FVec fset1(float v) { return _mm256_set1_ps(v); }
static inline IVec iset1(int32_t v) { return _mm256_set1_epi32(v); }
static inline IVec izero() { return _mm256_setzero_si256(); }
#if defined(DSV4_SIMD_VNNI)
static inline IVec imadd(IVec acc, IVec x, IVec w) { return _mm256_dpwssd_epi32(acc, x, w); }
#else
static inline IVec imadd(IVec acc, IVec x, IVec w) { return _mm256_add_epi32(acc, _mm256_madd_epi16(x, w)); }
#endif
static inline FVec fma_block(IVec i, FVec c, FVec acc) { return _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), c, acc); }
static inline FVec fmul(FVec a, FVec b) { return _mm256_mul_ps(a, b); }
static inline FVec fzero() { return _mm256_setzero_ps(); }
static inline FVec yload(const float* p, int valid) { return _mm256_maskload_ps(p, mask_first(valid)); }
static inline void ystore(float* p, FVec v, int valid) { _mm256_maskstore_ps(p, mask_first(valid), v); }
#endif

// An empty asm that claims to modify v: the compiler must keep v in a register as is here.
static inline void reg_barrier(IVec& v) { __asm__("" : "+v"(v)); }

static inline int32_t load4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// RG row groups from rg0 of the tile x NA activations over nbl blocks of the chunk. Per block:
// exact int32 sums over its 16 column pairs, then facc = fma(float(sum), d * scale / 2, facc),
// the canonical chain, which starts from y (or 0 for the chunk at column 0); `valid` rows of y
// from the first row are read and written. xg: the first activation's Q in the qg layout at the
// chunk's first column pair; xd[a]: activation a's block scales from the chunk start.
template <int RG, int NA>
static void fp4_gemm_micro(const Fp4Tile& t, int rg0, const int16_t* xg, const float* const* xd, float* const* yo,
                           int valid, bool first, int64_t nbl) {
  const uint8_t* wt = t.w + rg0 * kRGBytes;
  const float* sc = t.sc + rg0 * 2 * kQSpans * kVR;
  constexpr int kCS = 2 * kQSpans * kVR;  // row group stride of sc
  int vr[RG];
  DSV4_UNROLL for (int r = 0; r < RG; ++r) vr[r] = valid - r * kVR < 0 ? 0 : (valid - r * kVR > kVR ? kVR : valid - r * kVR);
  FVec facc[RG * NA];
  DSV4_UNROLL for (int r = 0; r < RG; ++r) DSV4_UNROLL for (int a = 0; a < NA; ++a)
    facc[r * NA + a] = first ? fzero() : yload(yo[a] + r * kVR, vr[r]);
  for (int64_t b = 0; b < nbl; ++b) {
    const uint8_t* wb = wt + b * 16 * kPairBytes;
    const int16_t* xb = xg + b * 16 * 2 * kd::kActGroup;
    IVec iacc[RG * NA];
    DSV4_UNROLL for (int i = 0; i < RG * NA; ++i) iacc[i] = izero();
    DSV4_UNROLL for (int p = 0; p < 16; ++p) {
      IVec wv[RG];
      DSV4_UNROLL for (int r = 0; r < RG; ++r) wv[r] = iload(wb + r * kRGBytes + p * kPairBytes);
      DSV4_UNROLL for (int a = 0; a < NA; ++a) {
        const IVec xv = iset1(load4(xb + p * 2 * kd::kActGroup + a * 2));
        DSV4_UNROLL for (int r = 0; r < RG; ++r) iacc[r * NA + a] = imadd(iacc[r * NA + a], xv, wv[r]);
      }
      // Keep each sum one chain in its register: re-associated into a tree (integer adds
      // allow it), the 16 products per sum would be live at once and spill.
      DSV4_UNROLL for (int i = 0; i < RG * NA; ++i) reg_barrier(iacc[i]);
    }
    DSV4_UNROLL for (int r = 0; r < RG; ++r) {
      const FVec scv = fload(sc + r * kCS + b * kVR);
      DSV4_UNROLL for (int a = 0; a < NA; ++a)
        facc[r * NA + a] = fma_block(iacc[r * NA + a], fmul(fset1(xd[a][b]), scv), facc[r * NA + a]);
    }
  }
  DSV4_UNROLL for (int r = 0; r < RG; ++r) DSV4_UNROLL for (int a = 0; a < NA; ++a)
    ystore(yo[a] + r * kVR, facc[r * NA + a], vr[r]);
}

static void fp4_gemm(const MatmulJob& job, int64_t r0, int64_t r1) {
  static_assert(kd::kActGroup % kNA == 0, "register tiles must not straddle activation groups");
  static_assert(kRG % kRT == 0, "register tiles must not straddle weight tiles");
  const Matrix& w = job.w;
  const int64_t n = job.n, nb = ceil_div(w.cols, 32), pc = job.padded_cols, spans = pc / 64;
  Fp4Tile t;
  for (int64_t t0 = r0; t0 < r1; t0 += kQTile) {
    const int64_t t1 = mn(r1, t0 + kQTile);
    for (int64_t s0 = 0; s0 < spans; s0 += kQSpans) {
      const int64_t ns = mn<int64_t>(kQSpans, spans - s0);
      const int64_t nbl = mn<int64_t>(2 * ns, nb - 2 * s0);
      fp4_decode_tile(w, t0, t1, s0, ns, t);
      for (int64_t i0 = 0; i0 < n; i0 += kNA) {
        const int na = static_cast<int>(mn<int64_t>(kNA, n - i0));
        const int16_t* xg =
            job.qg + (i0 / kd::kActGroup) * kd::kActGroup * pc + s0 * 32 * 2 * kd::kActGroup + (i0 % kd::kActGroup) * 2;
        const float* xd[kNA];
        for (int a = 0; a < na; ++a) xd[a] = job.d + (i0 + a) * nb + 2 * s0;
        for (int rg = 0; rg * kVR < t1 - t0; rg += kRT) {
          const int64_t rbase = t0 + rg * kVR;
          const int valid = static_cast<int>(mn<int64_t>(kRT * kVR, t1 - rbase));
          float* yo[kNA];
          for (int a = 0; a < na; ++a) yo[a] = job.y + (i0 + a) * job.y_stride + rbase;
          const bool first = s0 == 0;
          switch (na) {
#if defined(DSV4_SIMD_AVX512)
            case 8: fp4_gemm_micro<kRT, 8>(t, rg, xg, xd, yo, valid, first, nbl); break;
            case 7: fp4_gemm_micro<kRT, 7>(t, rg, xg, xd, yo, valid, first, nbl); break;
            case 6: fp4_gemm_micro<kRT, 6>(t, rg, xg, xd, yo, valid, first, nbl); break;
            case 5: fp4_gemm_micro<kRT, 5>(t, rg, xg, xd, yo, valid, first, nbl); break;
#else
            case 8: if constexpr (kNA >= 8) fp4_gemm_micro<kRT, 8>(t, rg, xg, xd, yo, valid, first, nbl); break;
            case 7: if constexpr (kNA >= 8) fp4_gemm_micro<kRT, 7>(t, rg, xg, xd, yo, valid, first, nbl); break;
            case 6: if constexpr (kNA >= 8) fp4_gemm_micro<kRT, 6>(t, rg, xg, xd, yo, valid, first, nbl); break;
            case 5: if constexpr (kNA >= 8) fp4_gemm_micro<kRT, 5>(t, rg, xg, xd, yo, valid, first, nbl); break;
#endif
            case 4: if constexpr (kNA >= 4) fp4_gemm_micro<kRT, 4>(t, rg, xg, xd, yo, valid, first, nbl); break;
            case 3: if constexpr (kNA >= 4) fp4_gemm_micro<kRT, 3>(t, rg, xg, xd, yo, valid, first, nbl); break;
            case 2: fp4_gemm_micro<kRT, 2>(t, rg, xg, xd, yo, valid, first, nbl); break;
            default: fp4_gemm_micro<kRT, 1>(t, rg, xg, xd, yo, valid, first, nbl); break;
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------

static void matmul_rows(const MatmulJob& job, int64_t r0, int64_t r1) {
  const Matrix& w = job.w;
  const bool fast = job.numerics == Numerics::kFast;
  switch (w.format) {
    case WeightFormat::kF32: float_rows(job, DecF32{}, r0, r1); break;
    case WeightFormat::kBF16: float_rows(job, DecBF16{}, r0, r1); break;
    case WeightFormat::kFP8:
      if (fast) {
        float_rows(job, DecFP8Fast{}, r0, r1);
      } else {
        DecFP8Ref dec;
        dec.w = &w;
        float_rows(job, dec, r0, r1);
        fix_fp8_nan_rows(job, r0, r1);
      }
      break;
    case WeightFormat::kFP4:
      if (fast) {
        if (job.n == 1) {
#if defined(DSV4_SIMD_AVX512)
          fp4_matvec512(job, r0, r1);
#else
          fp4_matvec(job, r0, r1);
#endif
        } else {
          fp4_gemm(job, r0, r1);
        }
      } else {
        DecFP4Ref dec;
        dec.w = &w;
        float_rows(job, dec, r0, r1);
      }
      break;
  }
}

// ---------------------------------------------------------------------------------------
// Machine-limit probes.

// 12 independent chains in named registers (an array can end up in memory at -O2).
[[maybe_unused]] static double fma_probe(int64_t iters) {
  const __m256 m = _mm256_set1_ps(0.9999999f), c = _mm256_set1_ps(1e-7f);
  __m256 a0 = _mm256_set1_ps(1.0f), a1 = _mm256_set1_ps(1.1f), a2 = _mm256_set1_ps(1.2f), a3 = _mm256_set1_ps(1.3f),
         a4 = _mm256_set1_ps(1.4f), a5 = _mm256_set1_ps(1.5f), a6 = _mm256_set1_ps(1.6f), a7 = _mm256_set1_ps(1.7f),
         a8 = _mm256_set1_ps(1.8f), a9 = _mm256_set1_ps(1.9f), a10 = _mm256_set1_ps(2.0f), a11 = _mm256_set1_ps(2.1f);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = _mm256_fmadd_ps(a0, m, c), a1 = _mm256_fmadd_ps(a1, m, c), a2 = _mm256_fmadd_ps(a2, m, c);
    a3 = _mm256_fmadd_ps(a3, m, c), a4 = _mm256_fmadd_ps(a4, m, c), a5 = _mm256_fmadd_ps(a5, m, c);
    a6 = _mm256_fmadd_ps(a6, m, c), a7 = _mm256_fmadd_ps(a7, m, c), a8 = _mm256_fmadd_ps(a8, m, c);
    a9 = _mm256_fmadd_ps(a9, m, c), a10 = _mm256_fmadd_ps(a10, m, c), a11 = _mm256_fmadd_ps(a11, m, c);
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                           _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
  volatile float sink = hsum8(s);
  (void)sink;
  return 2.0 * 8 * 12 * static_cast<double>(iters);
}

static double read_probe(const void* p, int64_t bytes) {
  const __m256i* v = static_cast<const __m256i*>(p);
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
  int64_t nv = bytes / 32, k = 0;
  for (; k + 4 <= nv; k += 4) {
    s0 = _mm256_add_epi64(s0, _mm256_loadu_si256(v + k));
    s1 = _mm256_add_epi64(s1, _mm256_loadu_si256(v + k + 1));
    s2 = _mm256_add_epi64(s2, _mm256_loadu_si256(v + k + 2));
    s3 = _mm256_add_epi64(s3, _mm256_loadu_si256(v + k + 3));
  }
  __m256i s = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
  alignas(32) uint64_t o[4];  // unsigned: the checksum wraps
  _mm256_store_si256(reinterpret_cast<__m256i*>(o), s);
  return static_cast<double>(o[0] + o[1] + o[2] + o[3]);
}

}  // namespace
}  // namespace dsv4_simd

#undef DSV4_UNROLL
