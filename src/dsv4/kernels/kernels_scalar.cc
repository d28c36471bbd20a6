// The scalar reference path. Its loops ARE the definition of the canonical accumulation orders
// (docs/kernels.md); the SIMD paths reproduce them bit for bit. Every multiply-add is an
// explicit exact_fma (kernels_internal.h) so the compiler cannot fuse or split differently from the SIMD code.
#include <chrono>
#include <cmath>

#include "dsv4/kernels/kernels_internal.h"

namespace dsv4::kernels::detail {
namespace {

// Doubled E2M1 values: integers, so fast-mode block sums are exact.
constexpr int kFp4Doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Columns per pass over a row: the buffers below live on the stack (the steady state allocates
// nothing, on this path too). Every matrix of V4 Flash and Pro fits one pass; a longer row
// is decoded again for each activation row (float) or chunk by chunk (integer).
constexpr int64_t kChunkCols = 8192;
static_assert(kChunkCols % kQBlock == 0 && kChunkCols % kLanes == 0, "chunks hold whole blocks");

// Canonical float product (reference mode, and F32/BF16 in fast mode): 8 lane accumulators,
// lane l takes columns l, l+8, ... in order, the row zero-padded to a multiple of 8 (padding
// still goes through the FMA), then tree8. w: the row's columns [c0, c0 + len); acc carries the
// lanes across chunks.
void lane_fma(const float* w, const float* x, int64_t c0, int64_t len, int64_t cols, float* acc) {
  const int64_t whole = std::min(len, (cols - c0) / kLanes * kLanes);  // groups of 8 inside the row
  for (int64_t c = 0; c < whole; c += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = exact_fma(w[c + l], x[c0 + c + l], acc[l]);
  for (int64_t c = whole; c < len; c += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const int64_t col = c0 + c + l;
      acc[l] = exact_fma(col < cols ? w[c + l] : 0.0f, col < cols ? x[col] : 0.0f, acc[l]);
    }
}

void matmul_rows_scalar(const MatmulJob& job, int64_t r0, int64_t r1) {
  const Matrix& w = job.w;
  const int64_t cols = w.cols, n = job.n;
  const int64_t padded = ceil_div(cols, kLanes) * kLanes;

  if (job.numerics == Numerics::kFast && (w.format == WeightFormat::kFP4 || w.format == WeightFormat::kFP8)) {
    // Integer weights wq and a float scale sc per 32-column block (FP4: the doubled E2M1 value
    // and scale / 2; FP8: fp8_fast_weight and e8m0 * 2^-k), the exact integer sum per block
    // (|isum| < 2^31, and float(isum) is one rounding), then one float chain over the blocks:
    //   acc = fma(float(isum_b), d[i,b] * sc_b, acc),
    // carried through y from one chunk of columns to the next (a float store is exact).
    const int64_t nb = ceil_div(cols, kQBlock);
    const int64_t scale_cols = ceil_div(cols, kFp8Block);
    int32_t wq[kChunkCols];
    float sc[kChunkCols / kQBlock];
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c0 = 0; c0 < cols; c0 += kChunkCols) {
        const int64_t c1 = std::min(cols, c0 + kChunkCols), b0 = c0 / kQBlock, b1 = ceil_div(c1, kQBlock);
        if (w.format == WeightFormat::kFP4) {
          const uint8_t* p = static_cast<const uint8_t*>(w.data) + r * (cols / 2);
          const uint8_t* s = w.scales + r * nb;
          for (int64_t c = c0; c < c1; ++c) wq[c - c0] = kFp4Doubled[(c & 1) ? (p[c / 2] >> 4) : (p[c / 2] & 15)];
          for (int64_t b = b0; b < b1; ++b) sc[b - b0] = e8m0_half(s[b]);
        } else {
          const uint8_t* p = static_cast<const uint8_t*>(w.data) + r * cols;
          const uint8_t* s = w.scales + (r / kFp8Block) * scale_cols;
          for (int64_t b = b0; b < b1; ++b) {
            const int len = static_cast<int>(std::min<int64_t>(kQBlock, cols - b * kQBlock));
            const int k = fp8_fast_shift(p + b * kQBlock, len);
            for (int c = 0; c < len; ++c) wq[b * kQBlock + c - c0] = fp8_fast_weight(p[b * kQBlock + c], k);
            sc[b - b0] = e8m0_to_f32(s[b * kQBlock / kFp8Block]) * pow2_neg(k);
          }
        }
        for (int64_t i = 0; i < n; ++i) {
          const int8_t* q = job.q + i * job.padded_cols;
          const int8_t* ql = job.ql + i * job.padded_cols;
          const float* d = job.d + i * nb;
          float& y = job.y[i * job.y_stride + r];
          float acc = c0 == 0 ? 0.0f : y;
          for (int64_t b = b0; b < b1; ++b) {
            int32_t isum = 0;
            for (int64_t c = b * kQBlock; c < std::min(cols, (b + 1) * kQBlock); ++c) {
              const int64_t p = span_pos(c);
              isum += wq[c - c0] * (256 * q[p] + ql[p]);
            }
            acc = exact_fma(static_cast<float>(isum), d[b] * sc[b - b0], acc);
          }
          y = acc;
        }
      }
    }
    return;
  }

  // Float products: reference mode, and F32 / BF16 in fast mode.
  float wrow[kChunkCols];
  const bool one_chunk = padded <= kChunkCols;
  for (int64_t r = r0; r < r1; ++r) {
    if (one_chunk) decode_cols(w, r, 0, cols, wrow);
    for (int64_t i = 0; i < n; ++i) {
      float acc[kLanes] = {};
      for (int64_t c0 = 0; c0 < padded; c0 += kChunkCols) {
        const int64_t len = std::min(kChunkCols, padded - c0);
        if (!one_chunk) decode_cols(w, r, c0, std::min(len, cols - c0), wrow);
        lane_fma(wrow, job.x + i * cols, c0, len, cols, acc);
      }
      job.y[i * job.y_stride + r] = tree8(acc);
    }
  }
}

void quantize_rows_scalar(const float* xall, int64_t cols, int64_t pc, int64_t i0, int64_t i1,
                          const QuantPlanes& out) {
  const int64_t nb = ceil_div(cols, kQBlock);
  int32_t blk[kQBlock];
  for (int64_t i = i0; i < i1; ++i) {
    const float* x = xall + i * cols;
    int8_t* q = out.q + i * pc;
    int8_t* ql = out.ql + i * pc;
    float* d = out.d + i * nb;
    int16_t* qg = qg_row(out.qg, pc, i);
    zero_qg_row(pc, i, out.qg);
    for (int64_t c = 0; c < pc; ++c) q[c] = 0, ql[c] = 0;
    for (int64_t b = 0; b < nb; ++b) {
      int len = static_cast<int>(std::min<int64_t>(kQBlock, cols - b * kQBlock));
      quantize_block_ref(x + b * kQBlock, len, blk, &d[b]);
      int32_t sum = 0;
      for (int k = 0; k < len; ++k) {
        const int64_t c = b * kQBlock + k, p = span_pos(c);
        qg[(c / 2) * 2 * kActGroup + (c & 1)] = static_cast<int16_t>(blk[k]);
        q[p] = q_hi(blk[k]);
        ql[p] = q_lo(blk[k]);
        sum += blk[k];
      }
      out.qsum12[i * nb + b] = 12 * sum;
    }
  }
}

// Canonical dot: 32 lanes (lane = index mod 32), zero padding to a multiple of 32, then the
// four groups of 8 lanes added as (g0 + g1) + (g2 + g3), then tree8.
float dot_scalar(const float* a, const float* b, int64_t n) {
  float acc[32] = {};
  int64_t c = 0;
  for (; c + 32 <= n; c += 32)
    for (int l = 0; l < 32; ++l) acc[l] = exact_fma(a[c + l], b[c + l], acc[l]);
  if (c < n) {
    for (int l = 0; l < 32; ++l) {
      float av = c + l < n ? a[c + l] : 0.0f, bv = c + l < n ? b[c + l] : 0.0f;
      acc[l] = exact_fma(av, bv, acc[l]);
    }
  }
  float g[8];
  for (int l = 0; l < 8; ++l) g[l] = (acc[l] + acc[8 + l]) + (acc[16 + l] + acc[24 + l]);
  return tree8(g);
}

void axpy_scalar(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = exact_fma(a, x[i], y[i]);
}

// The definitions of the batched forms: the single products, one after another.
void dot_many_scalar(const float* q, int64_t q_stride, int64_t nq, const float* r, int64_t n, float* out) {
  for (int64_t h = 0; h < nq; ++h) out[h] = dot_scalar(q + h * q_stride, r, n);
}

void axpy_many_scalar(const float* p, int64_t p_stride, int64_t nh, const float* const* rows, int64_t nrows,
                      int64_t n, float* o, int64_t o_stride) {
  for (int64_t j = 0; j < nrows; ++j)
    for (int64_t h = 0; h < nh; ++h) axpy_scalar(p[h * p_stride + j], rows[j], o + h * o_stride, n);
}

double fma_probe_scalar(int64_t iters) {
  float acc[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const float m = 0.999999f, a = 1e-7f;
  for (int64_t k = 0; k < iters; ++k)
    for (int l = 0; l < 8; ++l) acc[l] = exact_fma(acc[l], m, a);
  volatile float sink = acc[0] + acc[7];
  (void)sink;
  return 2.0 * 8 * static_cast<double>(iters);
}

double read_probe_scalar(const void* p, int64_t bytes) {
  const uint64_t* q = static_cast<const uint64_t*>(p);
  uint64_t s = 0;
  for (int64_t k = 0; k < bytes / 8; ++k) s += q[k];
  return static_cast<double>(s);
}

}  // namespace

const Table& scalar_table() {
  static const Table t{"scalar",        matmul_rows_scalar, quantize_rows_scalar, dot_scalar,
                       axpy_scalar,     dot_many_scalar,    axpy_many_scalar,     fma_probe_scalar,
                       read_probe_scalar, ""};
  return t;
}

}  // namespace dsv4::kernels::detail
