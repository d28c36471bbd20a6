// The aarch64 path: NEON (Advanced SIMD, part of every ARMv8-A core, so no feature test).
// Built only for aarch64. Every function reproduces the canonical orders of kernels_scalar.cc
// bit for bit (docs/kernels.md):
//  - float products: 8 lanes per output (lane = column mod 8) as two float32x4, each lane an
//    FMA chain in column order over the row zero-padded to a multiple of 8, then tree8;
//  - fast FP4 / FP8: exact int32 block sums (any order; here int16 x int16 widening
//    multiply-accumulates, vmlal), then one FMA chain per output over the blocks.
// The integer kernel decodes 8 rows x 512 columns into int16 once and multiplies them with
// 4 activation rows at a time, the activations' two values per column pair coming straight from
// QuantizedInput::qg (8 activation rows side by side).
#include <arm_neon.h>

#include <cmath>
#include <cstring>

#include "dsv4/kernels/kernels_internal.h"

// Internal linkage and no standard-library templates, as in the x86 files.
namespace dsv4_neon {
namespace {

using dsv4::kernels::Matrix;
using dsv4::kernels::Numerics;
using dsv4::kernels::WeightFormat;
using dsv4::kernels::detail::ceil_div;
using dsv4::kernels::detail::MatmulJob;
namespace kd = dsv4::kernels::detail;

#define DSV4_UNROLL _Pragma("GCC unroll 16")

template <class T>
static inline T mn(T a, T b) {
  return a < b ? a : b;
}

// ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)) for lanes 0-3 in lo and 4-7 in hi: the canonical tree8.
static inline float tree8(float32x4_t lo, float32x4_t hi) {
  const float32x4_t s = vaddq_f32(lo, hi);                          // a0+a4, a1+a5, a2+a6, a3+a7
  const float32x2_t t = vadd_f32(vget_low_f32(s), vget_high_f32(s));  // (a0+a4)+(a2+a6), (a1+a5)+(a3+a7)
  return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
}

// ---------------------------------------------------------------------------------------
// dot / axpy

static float dot(const float* a, const float* b, int64_t n) {
  float32x4_t acc[8];
  DSV4_UNROLL for (int k = 0; k < 8; ++k) acc[k] = vdupq_n_f32(0.0f);
  int64_t c = 0;
  for (; c + 32 <= n; c += 32)
    DSV4_UNROLL for (int k = 0; k < 8; ++k) acc[k] = vfmaq_f32(acc[k], vld1q_f32(a + c + 4 * k), vld1q_f32(b + c + 4 * k));
  if (c < n) {
    float ta[32] = {}, tb[32] = {};
    std::memcpy(ta, a + c, static_cast<size_t>(n - c) * 4);
    std::memcpy(tb, b + c, static_cast<size_t>(n - c) * 4);
    DSV4_UNROLL for (int k = 0; k < 8; ++k) acc[k] = vfmaq_f32(acc[k], vld1q_f32(ta + 4 * k), vld1q_f32(tb + 4 * k));
  }
  // Lane l of the 32: acc[l / 4]; the groups of 8 add as (g0 + g1) + (g2 + g3).
  const float32x4_t lo = vaddq_f32(vaddq_f32(acc[0], acc[2]), vaddq_f32(acc[4], acc[6]));
  const float32x4_t hi = vaddq_f32(vaddq_f32(acc[1], acc[3]), vaddq_f32(acc[5], acc[7]));
  return tree8(lo, hi);
}

static void axpy(float a, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), a));
  for (; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);
}

// ---------------------------------------------------------------------------------------
// dot_many / axpy_many: the same products as dot / axpy, several at a time.

// Two queries against r, each chunk of r loaded once for both: each query's eight accumulators
// and their tree exactly as dot() builds them.
static inline void dot_pair(const float* q0, const float* q1, const float* r, int64_t n, float* out0, float* out1) {
  float32x4_t a0[8], a1[8];
  DSV4_UNROLL for (int k = 0; k < 8; ++k) a0[k] = a1[k] = vdupq_n_f32(0.0f);
  int64_t c = 0;
  for (; c + 32 <= n; c += 32) {
    DSV4_UNROLL for (int k = 0; k < 8; ++k) {
      const float32x4_t rv = vld1q_f32(r + c + 4 * k);
      a0[k] = vfmaq_f32(a0[k], vld1q_f32(q0 + c + 4 * k), rv);
      a1[k] = vfmaq_f32(a1[k], vld1q_f32(q1 + c + 4 * k), rv);
    }
  }
  if (c < n) {
    float t0[32] = {}, t1[32] = {}, tr[32] = {};
    std::memcpy(t0, q0 + c, static_cast<size_t>(n - c) * 4);
    std::memcpy(t1, q1 + c, static_cast<size_t>(n - c) * 4);
    std::memcpy(tr, r + c, static_cast<size_t>(n - c) * 4);
    DSV4_UNROLL for (int k = 0; k < 8; ++k) {
      const float32x4_t rv = vld1q_f32(tr + 4 * k);
      a0[k] = vfmaq_f32(a0[k], vld1q_f32(t0 + 4 * k), rv);
      a1[k] = vfmaq_f32(a1[k], vld1q_f32(t1 + 4 * k), rv);
    }
  }
  *out0 = tree8(vaddq_f32(vaddq_f32(a0[0], a0[2]), vaddq_f32(a0[4], a0[6])),
                vaddq_f32(vaddq_f32(a0[1], a0[3]), vaddq_f32(a0[5], a0[7])));
  *out1 = tree8(vaddq_f32(vaddq_f32(a1[0], a1[2]), vaddq_f32(a1[4], a1[6])),
                vaddq_f32(vaddq_f32(a1[1], a1[3]), vaddq_f32(a1[5], a1[7])));
}

static void dot_many(const float* q, int64_t q_stride, int64_t nq, const float* r, int64_t n, float* out) {
  int64_t h = 0;
  for (; h + 2 <= nq; h += 2) dot_pair(q + h * q_stride, q + (h + 1) * q_stride, r, n, out + h, out + h + 1);
  if (h < nq) out[h] = dot(q + h * q_stride, r, n);
}

// Four outputs x 16 columns held in registers across all rows (each element's FMA chain over
// the rows in order, as the row-by-row axpy calls build it); columns past the last full tile
// and leftover outputs go row by row through axpy.
static void axpy_many(const float* p, int64_t p_stride, int64_t nh, const float* const* rows, int64_t nrows,
                      int64_t n, float* o, int64_t o_stride) {
  constexpr int H = 4, C = 4;
  int64_t h = 0;
  for (; h + H <= nh; h += H) {
    int64_t c = 0;
    for (; c + 4 * C <= n; c += 4 * C) {
      float32x4_t acc[H][C];
      DSV4_UNROLL for (int i = 0; i < H; ++i) DSV4_UNROLL for (int k = 0; k < C; ++k)
        acc[i][k] = vld1q_f32(o + (h + i) * o_stride + c + 4 * k);
      for (int64_t j = 0; j < nrows; ++j) {
        float32x4_t rv[C];
        DSV4_UNROLL for (int k = 0; k < C; ++k) rv[k] = vld1q_f32(rows[j] + c + 4 * k);
        DSV4_UNROLL for (int i = 0; i < H; ++i) {
          const float a = p[(h + i) * p_stride + j];
          DSV4_UNROLL for (int k = 0; k < C; ++k) acc[i][k] = vfmaq_n_f32(acc[i][k], rv[k], a);
        }
      }
      DSV4_UNROLL for (int i = 0; i < H; ++i) DSV4_UNROLL for (int k = 0; k < C; ++k)
        vst1q_f32(o + (h + i) * o_stride + c + 4 * k, acc[i][k]);
    }
    if (c < n)
      for (int64_t j = 0; j < nrows; ++j)
        for (int i = 0; i < H; ++i) axpy(p[(h + i) * p_stride + j], rows[j] + c, o + (h + i) * o_stride + c, n - c);
  }
  for (; h < nh; ++h)
    for (int64_t j = 0; j < nrows; ++j) axpy(p[h * p_stride + j], rows[j], o + h * o_stride, n);
}

// ---------------------------------------------------------------------------------------
// Fast-mode activation quantization (definition: kd::quantize_block_ref), one 64-column span
// at a time in natural order on the stack, then written in the three layouts.

static void quantize_rows(const float* xall, int64_t cols, int64_t pc, int64_t i0, int64_t i1,
                          const kd::QuantPlanes& out) {
  const int64_t nb = ceil_div(cols, kd::kQBlock);
  for (int64_t i = i0; i < i1; ++i) {
    const float* x = xall + i * cols;
    int16_t* qg = kd::qg_row(out.qg, pc, i);
    for (int64_t s = 0; s < pc; s += 64) {
      int32_t nat[64] = {};
      for (int64_t b = s / 32; b < s / 32 + 2 && b < nb; ++b) {
        int32_t* q = nat + (b * 32 - s);
        const float* xb = x + b * 32;
        const int len = static_cast<int>(mn<int64_t>(32, cols - b * 32));
        if (len < 32) {
          kd::quantize_block_ref(xb, len, q, &out.d[i * nb + b]);
        } else {
          uint32x4_t m = vdupq_n_u32(0);
          DSV4_UNROLL for (int k = 0; k < 8; ++k)
            m = vmaxq_u32(m, vandq_u32(vreinterpretq_u32_f32(vld1q_f32(xb + 4 * k)), vdupq_n_u32(0x7fffffffu)));
          const uint32_t amax_bits = vmaxvq_u32(m);
          float amax;
          std::memcpy(&amax, &amax_bits, 4);
          float& d = out.d[i * nb + b];
          if (amax_bits >= 0x7f800000u) {
            d = std::numeric_limits<float>::quiet_NaN();  // Q stays 0
          } else {
            d = amax / static_cast<float>(kd::kQMax);
            if (d != 0.0f) {
              const float32x4_t vd = vdupq_n_f32(d);
              const int32x4_t lim = vdupq_n_s32(kd::kQMax), nlim = vdupq_n_s32(-kd::kQMax);
              DSV4_UNROLL for (int k = 0; k < 8; ++k) {
                // IEEE division and round-half-even conversion, as nearbyint(x / d)
                const int32x4_t v = vcvtnq_s32_f32(vdivq_f32(vld1q_f32(xb + 4 * k), vd));
                vst1q_s32(q + 4 * k, vmaxq_s32(vminq_s32(v, lim), nlim));
              }
            }
          }
        }
        int32_t sum = 0;
        for (int k = 0; k < len; ++k) sum += q[k];
        out.qsum12[i * nb + b] = 12 * sum;
      }
      int8_t* qh = out.q + i * pc;
      int8_t* ql = out.ql + i * pc;
      for (int k = 0; k < 64; ++k) {
        const int64_t p = kd::span_pos(s + k);
        qh[p] = kd::q_hi(nat[k]);
        ql[p] = kd::q_lo(nat[k]);
      }
      for (int p = 0; p < 32; ++p) {
        qg[(s / 2 + p) * 2 * kd::kActGroup] = static_cast<int16_t>(nat[2 * p]);
        qg[(s / 2 + p) * 2 * kd::kActGroup + 1] = static_cast<int16_t>(nat[2 * p + 1]);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Float products (reference mode; F32 / BF16 in fast mode). A row is decoded 512 columns at a
// time into floats (zero-padded to a multiple of 8), then each activation's 8 lanes take it.

constexpr int kChunk = 512;
constexpr int kActBlock = 64;  // activations per pass: bounds the lane accumulators (2 KiB)

// E4M3 -> value * 2^-8, exact and never denormal: the code's bits placed into FP16 bits (sign to
// bit 15, exponent and mantissa to bits 13..7) and widened by the FP16 conversion.
static inline void fp8_f16x8(const uint8_t* p, float32x4_t& lo, float32x4_t& hi) {
  const int16x8_t h = vandq_s16(vshlq_n_s16(vmovl_s8(vld1_s8(reinterpret_cast<const int8_t*>(p))), 7),
                                vdupq_n_s16(static_cast<int16_t>(0xbfff)));
  const float16x8_t f = vreinterpretq_f16_s16(h);
  lo = vcvt_f32_f16(vget_low_f16(f));
  hi = vcvt_high_f32_f16(f);
}

// Row r's columns [c0, c0 + len) as floats into w (len8 = len rounded up to 8, zeros past len).
static void decode_chunk(const Matrix& m, int64_t r, int64_t c0, int64_t len, float* w) {
  const int64_t cols = m.cols, len8 = ceil_div(len, 8) * 8;
  switch (m.format) {
    case WeightFormat::kF32: {
      const float* p = static_cast<const float*>(m.data) + r * cols + c0;
      std::memcpy(w, p, static_cast<size_t>(len) * 4);
      break;
    }
    case WeightFormat::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(m.data) + r * cols + c0;
      int64_t c = 0;
      for (; c + 8 <= len; c += 8) {
        const uint16x8_t v = vld1q_u16(p + c);
        vst1q_f32(w + c, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v), 16)));
        vst1q_f32(w + c + 4, vreinterpretq_f32_u32(vshll_high_n_u16(v, 16)));
      }
      for (; c < len; ++c) w[c] = dsv4::bf16_to_f32(p[c]);
      break;
    }
    case WeightFormat::kFP8: {
      // fp8 * scale with one rounding: (v * 2^-8) * (s * 2^8), or for E8M0 > 246 (s * 2^8 not
      // finite) times 2^8 (exact), then times s. NaN codes are fixed up by the caller.
      const uint8_t* p = static_cast<const uint8_t*>(m.data) + r * cols + c0;
      const uint8_t* srow = m.scales + (r / 128) * ceil_div(cols, 128);
      int64_t c = 0;
      for (; c + 8 <= len; c += 8) {
        const uint8_t e = srow[(c0 + c) / 128];
        const float s = dsv4::e8m0_to_f32(e);
        const bool two_step = e > 246 && e != 255;
        float32x4_t lo, hi;
        fp8_f16x8(p + c, lo, hi);
        lo = vmulq_n_f32(lo, two_step ? 0x1p8f : s * 0x1p8f);
        hi = vmulq_n_f32(hi, two_step ? 0x1p8f : s * 0x1p8f);
        if (two_step) lo = vmulq_n_f32(lo, s), hi = vmulq_n_f32(hi, s);
        vst1q_f32(w + c, lo);
        vst1q_f32(w + c + 4, hi);
      }
      for (; c < len; ++c) w[c] = dsv4::fp8_e4m3_to_f32(p[c]) * dsv4::e8m0_to_f32(srow[(c0 + c) / 128]);
      break;
    }
    case WeightFormat::kFP4: {
      const uint8_t* p = static_cast<const uint8_t*>(m.data) + r * (cols / 2);
      const uint8_t* s = m.scales + r * ceil_div(cols, 32);
      for (int64_t c = 0; c < len; ++c) {
        const int64_t col = c0 + c;
        const uint8_t code = (col & 1) ? (p[col / 2] >> 4) : (p[col / 2] & 15);
        w[c] = dsv4::fp4_e2m1_to_f32(code) * dsv4::e8m0_to_f32(s[col / 32]);
      }
      break;
    }
  }
  for (int64_t c = len; c < len8; ++c) w[c] = 0.0f;
}

static void float_rows(const MatmulJob& job, int64_t r0, int64_t r1) {
  const Matrix& w = job.w;
  const int64_t cols = w.cols, n = job.n;
  alignas(16) float wbuf[kChunk];
  alignas(16) float xbuf[kChunk];
  alignas(16) float acc[kActBlock * 8];
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t ib = 0; ib < n; ib += kActBlock) {
      const int64_t nab = mn<int64_t>(kActBlock, n - ib);
      for (int64_t k = 0; k < nab * 8; ++k) acc[k] = 0.0f;
      for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
        const int64_t len = mn<int64_t>(kChunk, cols - c0), len8 = ceil_div(len, 8) * 8;
        decode_chunk(w, r, c0, len, wbuf);
        for (int64_t i = 0; i < nab; ++i) {
          const float* x = job.x + (ib + i) * cols + c0;
          const float* xs = x;
          if (len8 != len) {  // the ragged end: zero padding, as the canonical order has it
            std::memcpy(xbuf, x, static_cast<size_t>(len) * 4);
            for (int64_t c = len; c < len8; ++c) xbuf[c] = 0.0f;
            xs = xbuf;
          }
          float32x4_t lo = vld1q_f32(acc + i * 8), hi = vld1q_f32(acc + i * 8 + 4);
          for (int64_t c = 0; c < len8; c += 8) {
            lo = vfmaq_f32(lo, vld1q_f32(wbuf + c), vld1q_f32(xs + c));
            hi = vfmaq_f32(hi, vld1q_f32(wbuf + c + 4), vld1q_f32(xs + c + 4));
          }
          vst1q_f32(acc + i * 8, lo);
          vst1q_f32(acc + i * 8 + 4, hi);
        }
      }
      for (int64_t i = 0; i < nab; ++i)
        job.y[(ib + i) * job.y_stride + r] = tree8(vld1q_f32(acc + i * 8), vld1q_f32(acc + i * 8 + 4));
    }
  }
}

// Reference FP8 with NaN codes: the decode above has no NaN, so rows holding a NaN code
// (0x7f / 0xff, never in real checkpoints) are recomputed by the scalar definition.
static void fix_fp8_nan_rows(const MatmulJob& job, int64_t r0, int64_t r1) {
  const Matrix& w = job.w;
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* p = base + r * w.cols;
    bool nan = false;
    int64_t c = 0;
    for (; c + 16 <= w.cols && !nan; c += 16)
      nan = vmaxvq_u8(vceqq_u8(vandq_u8(vld1q_u8(p + c), vdupq_n_u8(0x7f)), vdupq_n_u8(0x7f))) != 0;
    for (; c < w.cols && !nan; ++c) nan = (p[c] & 0x7f) == 0x7f;
    if (nan) kd::scalar_table().matmul_rows(job, r, r + 1);
  }
}

// ---------------------------------------------------------------------------------------
// Fast FP4 / FP8: integer weights of 8 rows x 512 columns (16 blocks) decoded once into int16,
// [column][row], with each (block, row)'s float scale; then 4 activations at a time take
// every column: per column one weight vector (8 rows) and per activation two widening
// multiply-accumulates by a lane of the column pair's activation vector from qg. Per block the
// int32 sums (exact) join the float chain: acc = fma(float(sum), d * scale, acc), which carries
// through y from one 512-column chunk to the next.

constexpr int kTileCols = 512;
constexpr int kTileBlocks = kTileCols / 32;

struct IntTile {
  alignas(16) int16_t w[kTileCols * 8];    // [column][row]
  alignas(16) float sc[kTileBlocks * 8];   // [block][row]
};

// Doubled E2M1 values by nibble.
static inline int8x16_t fp4_lut() {
  static const int8_t v[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  return vld1q_s8(v);
}

// Rows [t0, t0 + 8) (those below t1; the others zero), columns [c0, c0 + 512) into the tile.
static void decode_int_tile(const Matrix& m, int64_t t0, int64_t t1, int64_t c0, IntTile& t) {
  const int64_t cols = m.cols, nb = ceil_div(cols, 32), len = mn<int64_t>(kTileCols, cols - c0);
  std::memset(t.w, 0, sizeof(t.w));
  std::memset(t.sc, 0, sizeof(t.sc));
  alignas(16) int16_t row[kTileCols];
  for (int j = 0; j < 8 && t0 + j < t1; ++j) {
    const int64_t r = t0 + j;
    std::memset(row, 0, sizeof(row));
    if (m.format == WeightFormat::kFP4) {
      const uint8_t* p = static_cast<const uint8_t*>(m.data) + r * (cols / 2) + c0 / 2;
      const int8x16_t lut = fp4_lut();
      int64_t c = 0;
      for (; c + 32 <= len; c += 32) {  // 16 bytes: even columns from the low nibbles, odd from the high
        const uint8x16_t b = vld1q_u8(p + c / 2);
        const int8x16_t ev = vqtbl1q_s8(lut, vandq_u8(b, vdupq_n_u8(15)));
        const int8x16_t od = vqtbl1q_s8(lut, vshrq_n_u8(b, 4));
        const int8x16x2_t z = vzipq_s8(ev, od);  // columns in order
        vst1q_s16(row + c, vmovl_s8(vget_low_s8(z.val[0])));
        vst1q_s16(row + c + 8, vmovl_high_s8(z.val[0]));
        vst1q_s16(row + c + 16, vmovl_s8(vget_low_s8(z.val[1])));
        vst1q_s16(row + c + 24, vmovl_high_s8(z.val[1]));
      }
      static const int8_t doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
      for (; c < len; ++c) {
        const int64_t col = c0 + c;
        row[c] = doubled[(col & 1) ? (p[c / 2] >> 4) : (p[c / 2] & 15)];
      }
      const uint8_t* s = m.scales + r * nb + c0 / 32;
      for (int64_t b = 0; b < ceil_div(len, 32); ++b) t.sc[b * 8 + j] = kd::e8m0_half(s[b]);
    } else {  // FP8: each block's shift k from its codes, weights round(fp8 * 2^k)
      const uint8_t* p = static_cast<const uint8_t*>(m.data) + r * cols + c0;
      const uint8_t* srow = m.scales + (r / 128) * ceil_div(cols, 128);
      for (int64_t b = 0; b < ceil_div(len, 32); ++b) {
        const int blen = static_cast<int>(mn<int64_t>(32, len - b * 32));
        const int k = kd::fp8_fast_shift(p + b * 32, blen);
        const int32x4_t addk = vdupq_n_s32((8 + k) << 23);
        int c = 0;
        for (; c + 8 <= blen; c += 8) {
          // F16C-style decode gives v * 2^-8 (normal or zero); + (8 + k) on the exponent makes it
          // v * 2^k (a zero becomes 2^(8+k-127), which rounds to 0); round half to even.
          float32x4_t lo, hi;
          fp8_f16x8(p + b * 32 + c, lo, hi);
          const int32x4_t ilo = vcvtnq_s32_f32(vreinterpretq_f32_s32(vaddq_s32(vreinterpretq_s32_f32(lo), addk)));
          const int32x4_t ihi = vcvtnq_s32_f32(vreinterpretq_f32_s32(vaddq_s32(vreinterpretq_s32_f32(hi), addk)));
          vst1q_s16(row + b * 32 + c, vcombine_s16(vmovn_s32(ilo), vmovn_s32(ihi)));
        }
        for (; c < blen; ++c) row[b * 32 + c] = static_cast<int16_t>(kd::fp8_fast_weight(p[b * 32 + c], k));
        t.sc[b * 8 + j] = dsv4::e8m0_to_f32(srow[(c0 + b * 32) / 128]) * kd::pow2_neg(k);
      }
    }
    for (int64_t c = 0; c < kTileCols; ++c) t.w[c * 8 + j] = row[c];
  }
}

// One activation's lane in the qg vectors of a column pair: activations a0..a3 in the first
// vector, a4..a7 in the second, each as (even column, odd column).
template <int NA>
static void int_micro(const IntTile& t, int64_t nblocks, const int16_t* qg, int a0, const float* const* xd,
                      float* const* yo, int valid, bool first) {
  float32x4_t facc[NA][2];
  DSV4_UNROLL for (int a = 0; a < NA; ++a) {
    if (first) {
      facc[a][0] = facc[a][1] = vdupq_n_f32(0.0f);
    } else {
      float tmp[8] = {};
      std::memcpy(tmp, yo[a], static_cast<size_t>(valid) * 4);
      facc[a][0] = vld1q_f32(tmp), facc[a][1] = vld1q_f32(tmp + 4);
    }
  }
  for (int64_t b = 0; b < nblocks; ++b) {
    int32x4_t acc[NA][2];
    DSV4_UNROLL for (int a = 0; a < NA; ++a) acc[a][0] = acc[a][1] = vdupq_n_s32(0);
    for (int p = 0; p < 16; ++p) {
      const int64_t pair = b * 16 + p;
      const int16x8_t q0 = vld1q_s16(qg + pair * 16), q1 = vld1q_s16(qg + pair * 16 + 8);
      const int16x8_t we = vld1q_s16(t.w + (2 * pair) * 8), wo = vld1q_s16(t.w + (2 * pair + 1) * 8);
#define DSV4_NEON_MAC(A, LANE_E, LANE_O, Q)                                                \
  acc[A][0] = vmlal_laneq_s16(acc[A][0], vget_low_s16(we), Q, LANE_E);                    \
  acc[A][1] = vmlal_high_laneq_s16(acc[A][1], we, Q, LANE_E);                             \
  acc[A][0] = vmlal_laneq_s16(acc[A][0], vget_low_s16(wo), Q, LANE_O);                    \
  acc[A][1] = vmlal_high_laneq_s16(acc[A][1], wo, Q, LANE_O);
      // Activation a0 + a sits at lanes 2 (a0 + a) % 8 and +1 of q0 (a0 + a < 4) or q1.
      if (a0 == 0) {
        if constexpr (NA > 0) { DSV4_NEON_MAC(0, 0, 1, q0) }
        if constexpr (NA > 1) { DSV4_NEON_MAC(1, 2, 3, q0) }
        if constexpr (NA > 2) { DSV4_NEON_MAC(2, 4, 5, q0) }
        if constexpr (NA > 3) { DSV4_NEON_MAC(3, 6, 7, q0) }
      } else {
        if constexpr (NA > 0) { DSV4_NEON_MAC(0, 0, 1, q1) }
        if constexpr (NA > 1) { DSV4_NEON_MAC(1, 2, 3, q1) }
        if constexpr (NA > 2) { DSV4_NEON_MAC(2, 4, 5, q1) }
        if constexpr (NA > 3) { DSV4_NEON_MAC(3, 6, 7, q1) }
      }
#undef DSV4_NEON_MAC
    }
    const float32x4_t s0 = vld1q_f32(t.sc + b * 8), s1 = vld1q_f32(t.sc + b * 8 + 4);
    DSV4_UNROLL for (int a = 0; a < NA; ++a) {
      const float d = xd[a][b];
      facc[a][0] = vfmaq_f32(facc[a][0], vcvtq_f32_s32(acc[a][0]), vmulq_n_f32(s0, d));
      facc[a][1] = vfmaq_f32(facc[a][1], vcvtq_f32_s32(acc[a][1]), vmulq_n_f32(s1, d));
    }
  }
  DSV4_UNROLL for (int a = 0; a < NA; ++a) {
    float tmp[8];
    vst1q_f32(tmp, facc[a][0]);
    vst1q_f32(tmp + 4, facc[a][1]);
    std::memcpy(yo[a], tmp, static_cast<size_t>(valid) * 4);
  }
}

static void int_rows(const MatmulJob& job, int64_t r0, int64_t r1) {
  const Matrix& w = job.w;
  const int64_t n = job.n, nb = ceil_div(w.cols, 32), pc = job.padded_cols;
  IntTile t;
  for (int64_t t0 = r0; t0 < r1; t0 += 8) {
    const int valid = static_cast<int>(mn<int64_t>(8, r1 - t0));
    for (int64_t c0 = 0; c0 < w.cols; c0 += kTileCols) {
      decode_int_tile(w, t0, r1, c0, t);
      const int64_t nblocks = mn<int64_t>(kTileBlocks, nb - c0 / 32);
      for (int64_t i0 = 0; i0 < n; i0 += 4) {
        const int na = static_cast<int>(mn<int64_t>(4, n - i0));
        // The 4 activations share one group of 8 (i0 is a multiple of 4).
        const int16_t* qg = job.qg + (i0 / kd::kActGroup) * kd::kActGroup * pc + c0 * kd::kActGroup;
        const float* xd[4];
        float* yo[4];
        for (int a = 0; a < na; ++a) {
          xd[a] = job.d + (i0 + a) * nb + c0 / 32;
          yo[a] = job.y + (i0 + a) * job.y_stride + t0;
        }
        const int a0 = static_cast<int>(i0 % kd::kActGroup);
        switch (na) {
          case 4: int_micro<4>(t, nblocks, qg, a0, xd, yo, valid, c0 == 0); break;
          case 3: int_micro<3>(t, nblocks, qg, a0, xd, yo, valid, c0 == 0); break;
          case 2: int_micro<2>(t, nblocks, qg, a0, xd, yo, valid, c0 == 0); break;
          default: int_micro<1>(t, nblocks, qg, a0, xd, yo, valid, c0 == 0); break;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------

static void matmul_rows(const MatmulJob& job, int64_t r0, int64_t r1) {
  const Matrix& w = job.w;
  const bool fast = job.numerics == Numerics::kFast;
  if (fast && (w.format == WeightFormat::kFP4 || w.format == WeightFormat::kFP8)) {
    int_rows(job, r0, r1);
    return;
  }
  float_rows(job, r0, r1);
  if (w.format == WeightFormat::kFP8) fix_fp8_nan_rows(job, r0, r1);
}

// Machine-limit probes: 12 independent 4-lane FMA chains; a vectorized read.
static double fma_probe(int64_t iters) {
  const float32x4_t m = vdupq_n_f32(0.9999999f), c = vdupq_n_f32(1e-7f);
  float32x4_t a[12];
  DSV4_UNROLL for (int k = 0; k < 12; ++k) a[k] = vdupq_n_f32(1.0f + 0.1f * k);
  for (int64_t i = 0; i < iters; ++i) DSV4_UNROLL for (int k = 0; k < 12; ++k) a[k] = vfmaq_f32(c, a[k], m);
  float32x4_t s = a[0];
  for (int k = 1; k < 12; ++k) s = vaddq_f32(s, a[k]);
  volatile float sink = vaddvq_f32(s);
  (void)sink;
  return 2.0 * 4 * 12 * static_cast<double>(iters);
}

static double read_probe(const void* p, int64_t bytes) {
  const uint64_t* q = static_cast<const uint64_t*>(p);
  uint64x2_t s0 = vdupq_n_u64(0), s1 = s0, s2 = s0, s3 = s0;
  int64_t k = 0;
  for (; k + 8 <= bytes / 8; k += 8) {
    s0 = vaddq_u64(s0, vld1q_u64(q + k));
    s1 = vaddq_u64(s1, vld1q_u64(q + k + 2));
    s2 = vaddq_u64(s2, vld1q_u64(q + k + 4));
    s3 = vaddq_u64(s3, vld1q_u64(q + k + 6));
  }
  const uint64x2_t s = vaddq_u64(vaddq_u64(s0, s1), vaddq_u64(s2, s3));
  return static_cast<double>(vgetq_lane_u64(s, 0) + vgetq_lane_u64(s, 1));
}

}  // namespace
}  // namespace dsv4_neon

#undef DSV4_UNROLL

namespace dsv4::kernels::detail {

const Table& neon_table() {
  static const Table t{"neon",          dsv4_neon::matmul_rows, dsv4_neon::quantize_rows, dsv4_neon::dot,
                       dsv4_neon::axpy, dsv4_neon::dot_many,    dsv4_neon::axpy_many,     dsv4_neon::fma_probe,
                       dsv4_neon::read_probe,   ""};
  return t;
}

}  // namespace dsv4::kernels::detail
