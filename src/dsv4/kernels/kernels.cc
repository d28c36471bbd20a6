// The kernel front end: argument checks, activation preparation and threading. The arithmetic
// lives in one table per instruction-set path (kernels_scalar.cc, kernels_avx2.cc, ...).
#include "dsv4/kernels/kernels.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "dsv4/kernels/kernels_internal.h"
#include "dsv4/util/error.h"
#include "dsv4/util/thread_pool.h"

namespace dsv4::kernels {

using detail::ceil_div;

const char* format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kF32: return "f32";
    case WeightFormat::kBF16: return "bf16";
    case WeightFormat::kFP8: return "fp8";
    case WeightFormat::kFP4: return "fp4";
  }
  return "?";
}

const char* numerics_name(Numerics n) { return n == Numerics::kReference ? "reference" : "fast"; }

int64_t Matrix::data_bytes() const {
  switch (format) {
    case WeightFormat::kF32: return rows * cols * 4;
    case WeightFormat::kBF16: return rows * cols * 2;
    case WeightFormat::kFP8: return rows * cols;
    case WeightFormat::kFP4: return rows * cols / 2;
  }
  return 0;
}

int64_t Matrix::scale_bytes() const {
  switch (format) {
    case WeightFormat::kFP8: return ceil_div(rows, 128) * ceil_div(cols, 128);
    case WeightFormat::kFP4: return rows * ceil_div(cols, 32);
    default: return 0;
  }
}

namespace {

void check_matrix(const Matrix& w) {
  if (w.rows < 0 || w.cols < 0) fail("kernels: matrix has negative shape [{}, {}]", w.rows, w.cols);
  if (w.rows == 0 || w.cols == 0) return;
  if (!w.data) fail("kernels: {} matrix [{}, {}] has no data", format_name(w.format), w.rows, w.cols);
  if (w.format == WeightFormat::kFP4 && (w.cols & 1))
    fail("kernels: fp4 matrix [{}, {}] needs an even column count", w.rows, w.cols);
  if ((w.format == WeightFormat::kFP8 || w.format == WeightFormat::kFP4) && !w.scales)
    fail("kernels: {} matrix [{}, {}] has no scales", format_name(w.format), w.rows, w.cols);
}

// Rows per task. Multiples of 32 keep the batched kernels' row tiles (and FP8's 128-row scale
// blocks) inside one task; enough tasks per thread keeps the two cores evenly loaded.
int64_t row_grain(const Matrix& w, int64_t n, int threads) {
  int64_t grain = (w.format == WeightFormat::kFP8 && n == 1) ? 128 : 64;
  while (grain > 32 && w.rows < grain * 4 * threads) grain /= 2;
  return grain;
}

}  // namespace

namespace detail {

void prepare_input_with(const Table& t, const float* x, int64_t n, int64_t cols, Numerics numerics,
                        QuantizedInput* in, ThreadPool* pool) {
  if (n < 0 || cols < 0) fail("kernels: prepare_input with negative shape [{}, {}]", n, cols);
  in->x = x;
  in->n = n;
  in->cols = cols;
  in->padded_cols = ceil_div(cols, kSpan) * kSpan;
  in->quantized = false;
  if (numerics != Numerics::kFast || n == 0 || cols == 0) return;
  size_t qn = static_cast<size_t>(n * in->padded_cols);
  in->q.resize(qn);
  in->ql.resize(qn);
  in->qg.resize(static_cast<size_t>(qg_elems(n, in->padded_cols)));
  in->d.resize(static_cast<size_t>(n * ceil_div(cols, kQBlock)));
  in->qsum12.resize(in->d.size());
  // The batched layout's padding rows (up to the next multiple of 8) hold zero activations.
  // Their cells are interleaved with the real rows' (per column pair, 8 rows' 4-byte cells side
  // by side), so the last group is cleared whole, before its rows are written: one memset, where
  // clearing cell by cell was most of prepare_input's time in a decode pass (one row, 7 padding).
  if (n % kActGroup) {
    int16_t* last = qg_row(in->qg.data(), in->padded_cols, n / kActGroup * kActGroup);
    std::memset(last, 0, static_cast<size_t>(kActGroup * in->padded_cols) * sizeof(int16_t));
  }
  const QuantPlanes planes{in->q.data(), in->ql.data(), in->qg.data(), in->d.data(), in->qsum12.data()};
  auto body = [&](int64_t i0, int64_t i1) { t.quantize_rows(x, cols, in->padded_cols, i0, i1, planes); };
  if (pool && n >= 8) {
    pool->parallel_for(n, std::max<int64_t>(1, n / (4 * pool->size())), body);
  } else {
    body(0, n);
  }
  // A few rows also in the FP8 matrix-vector kernel's order, from qg (a column pair's two
  // values side by side there, and q16_pos keeps a pair's columns together: 4 bytes at a time).
  // Sized for every n so that a buffer grown once never grows again.
  static_assert(kQ16Rows <= kActGroup, "the q16 rows come from the first activation group");
  in->q16.resize(static_cast<size_t>(kQ16Rows * in->padded_cols));
  if (n <= kQ16Rows) {
    for (int64_t i = 0; i < n; ++i) {
      const int16_t* pairs = qg_row(in->qg.data(), in->padded_cols, i);
      int16_t* row = in->q16.data() + i * in->padded_cols;
      for (int64_t p = 0; p < in->padded_cols / 2; ++p)
        std::memcpy(row + q16_pos(2 * p), pairs + p * 2 * kActGroup, 4);
    }
  }
  in->quantized = true;
}

namespace {

// Validates one product and fills its job; returns false if there is nothing to compute.
bool make_job(const Matrix& w, const QuantizedInput& in, float* y, Numerics numerics, int64_t y_stride,
              MatmulJob* job) {
  check_matrix(w);
  if (y_stride == 0) y_stride = w.rows;
  if (y_stride < w.rows) fail("kernels: y_stride {} < rows {}", y_stride, w.rows);
  if (in.n == 0 || w.rows == 0) return false;
  if (!y) fail("kernels: output is null");
  if (w.cols == 0) {
    for (int64_t i = 0; i < in.n; ++i) std::fill(y + i * y_stride, y + i * y_stride + w.rows, 0.0f);
    return false;
  }
  if (!in.x) fail("kernels: input activations are null");
  if (uses_quantized_input(w, numerics) && !in.quantized)
    fail("kernels: fast fp4 matmul needs an input prepared with Numerics::kFast");
  job->w = w;
  job->x = in.x;
  job->q = in.quantized ? in.q.data() : nullptr;
  job->ql = in.quantized ? in.ql.data() : nullptr;
  job->qg = in.quantized ? in.qg.data() : nullptr;
  job->q16 = in.quantized && in.n <= kQ16Rows ? in.q16.data() : nullptr;
  job->d = in.quantized ? in.d.data() : nullptr;
  job->qsum12 = in.quantized ? in.qsum12.data() : nullptr;
  job->n = in.n;
  job->padded_cols = in.padded_cols;
  job->y = y;
  job->y_stride = y_stride;
  job->numerics = numerics;
  return true;
}

}  // namespace

void matmul_batch_with(const Table& t, const MatmulTask* tasks, int64_t count, Numerics numerics,
                       ThreadPool* pool) {
  // Up to kGroup products share one parallel_for; more are done a group at a time (each output
  // is computed by one task either way, so the grouping never changes a bit). Fixed arrays:
  // the forward pass calls this per expert, and it must not allocate.
  constexpr int64_t kGroup = 16;
  const int threads = pool ? pool->size() : 1;
  for (int64_t g0 = 0; g0 < count; g0 += kGroup) {
    MatmulJob jobs[kGroup];
    int64_t grain[kGroup], first_piece[kGroup + 1] = {0};
    int64_t n_jobs = 0;
    for (int64_t k = g0; k < std::min(count, g0 + kGroup); ++k) {
      const MatmulTask& tk = tasks[k];
      if (!tk.w || !tk.in) fail("kernels: matmul_batch task {} has no matrix or input", k);
      if (tk.in->cols != tk.w->cols)
        fail("kernels: matmul_batch task {}: input has {} columns but the matrix is [{}, {}]", k, tk.in->cols,
             tk.w->rows, tk.w->cols);
      if (!make_job(*tk.w, *tk.in, tk.y, numerics, tk.y_stride, &jobs[n_jobs])) continue;
      grain[n_jobs] = row_grain(*tk.w, tk.in->n, threads);
      first_piece[n_jobs + 1] = first_piece[n_jobs] + ceil_div(tk.w->rows, grain[n_jobs]);
      ++n_jobs;
    }
    const int64_t pieces = first_piece[n_jobs];
    auto body = [&](int64_t b, int64_t e) {
      for (int64_t p = b, j = 0; p < e; ++p) {
        while (p >= first_piece[j + 1]) ++j;
        const int64_t r0 = (p - first_piece[j]) * grain[j];
        t.matmul_rows(jobs[j], r0, std::min(jobs[j].w.rows, r0 + grain[j]));
      }
    };
    if (pool && threads > 1 && pieces > 1) {
      pool->parallel_for(pieces, 1, body);
    } else {
      body(0, pieces);
    }
  }
}

void matmul_with(const Table& t, const Matrix& w, const QuantizedInput& in, float* y,
                 Numerics numerics, ThreadPool* pool, int64_t y_stride) {
  if (in.cols != w.cols)
    fail("kernels: input has {} columns but the {} matrix is [{}, {}]", in.cols, format_name(w.format),
         w.rows, w.cols);
  MatmulJob job;
  if (!make_job(w, in, y, numerics, y_stride, &job)) return;
  auto body = [&](int64_t r0, int64_t r1) { t.matmul_rows(job, r0, r1); };
  int threads = pool ? pool->size() : 1;
  int64_t grain = row_grain(w, in.n, threads);
  if (pool && threads > 1 && w.rows > grain) {
    pool->parallel_for(w.rows, grain, body);
  } else {
    body(0, w.rows);
  }
}

void decode_cols(const Matrix& w, int64_t r, int64_t c0, int64_t len, float* out) {
  switch (w.format) {
    case WeightFormat::kF32: {
      const float* p = static_cast<const float*>(w.data) + r * w.cols + c0;
      std::copy(p, p + len, out);
      break;
    }
    case WeightFormat::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(w.data) + r * w.cols;
      for (int64_t c = c0; c < c0 + len; ++c) out[c - c0] = bf16_to_f32(p[c]);
      break;
    }
    case WeightFormat::kFP8: {
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + r * w.cols;
      const int64_t scale_cols = ceil_div(w.cols, 128);
      const uint8_t* s = w.scales + (r / 128) * scale_cols;
      for (int64_t c = c0; c < c0 + len; ++c) out[c - c0] = fp8_e4m3_to_f32(p[c]) * e8m0_to_f32(s[c / 128]);
      break;
    }
    case WeightFormat::kFP4: {
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + r * (w.cols / 2);
      const uint8_t* s = w.scales + r * ceil_div(w.cols, 32);
      for (int64_t c = c0; c < c0 + len; ++c) {
        uint8_t byte = p[c / 2];
        uint8_t code = (c & 1) ? (byte >> 4) : (byte & 15);
        out[c - c0] = fp4_e2m1_to_f32(code) * e8m0_to_f32(s[c / 32]);
      }
      break;
    }
  }
}

}  // namespace detail

void decode_row(const Matrix& w, int64_t r, float* out) { detail::decode_cols(w, r, 0, w.cols, out); }

uint64_t quantized_input_bytes(int64_t n, int64_t cols) {
  const int64_t padded = ceil_div(cols, detail::kSpan) * detail::kSpan, blocks = n * ceil_div(cols, detail::kQBlock);
  return static_cast<uint64_t>(2 * n * padded + 2 * detail::qg_elems(n, padded) + 2 * detail::kQ16Rows * padded +
                               blocks * (4 + 4));
}

void prepare_input(const float* x, int64_t n, int64_t cols, Numerics numerics, QuantizedInput* in,
                   ThreadPool* pool) {
  detail::prepare_input_with(detail::active_table(), x, n, cols, numerics, in, pool);
}

void matmul(const Matrix& w, const QuantizedInput& in, float* y, Numerics numerics, ThreadPool* pool,
            int64_t y_stride) {
  detail::matmul_with(detail::active_table(), w, in, y, numerics, pool, y_stride);
}

void matmul_batch(const MatmulTask* tasks, int64_t count, Numerics numerics, ThreadPool* pool) {
  detail::matmul_batch_with(detail::active_table(), tasks, count, numerics, pool);
}

void matmul(const Matrix& w, const float* x, int64_t n, float* y, Numerics numerics, ThreadPool* pool,
            int64_t y_stride, QuantizedInput* scratch) {
  const detail::Table& t = detail::active_table();
  QuantizedInput temporary;
  QuantizedInput& in = scratch ? *scratch : temporary;
  const Numerics prep = uses_quantized_input(w, numerics) ? Numerics::kFast : Numerics::kReference;
  detail::prepare_input_with(t, x, n, w.cols, prep, &in, pool);
  detail::matmul_with(t, w, in, y, numerics, pool, y_stride);
}

void dot_many(const float* q, int64_t q_stride, int64_t nq, const float* r, int64_t n, float* out) {
  detail::active_table().dot_many(q, q_stride, nq, r, n, out);
}

void axpy_many(const float* p, int64_t p_stride, int64_t nh, const float* const* rows, int64_t nrows, int64_t n,
               float* o, int64_t o_stride) {
  detail::active_table().axpy_many(p, p_stride, nh, rows, nrows, n, o, o_stride);
}

std::string active_path() { return detail::active_table().name; }
std::string active_tuning() { return detail::active_table().tuning; }

}  // namespace dsv4::kernels
