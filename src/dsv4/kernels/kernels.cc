// Temporary scalar implementation of the kernel interface; the SIMD paths and the
// canonical accumulation order live in the kernels work (issue: kernels).
#include "dsv4/kernels/kernels.h"

#include <algorithm>
#include <vector>

#include "dsv4/kernels/formats.h"
#include "dsv4/util/thread_pool.h"

namespace dsv4::kernels {

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
    case WeightFormat::kFP8: return ((rows + 127) / 128) * ((cols + 127) / 128);
    case WeightFormat::kFP4: return rows * ((cols + 31) / 32);
    default: return 0;
  }
}

void decode_row(const Matrix& w, int64_t r, float* out) {
  switch (w.format) {
    case WeightFormat::kF32: {
      const float* p = static_cast<const float*>(w.data) + r * w.cols;
      std::copy(p, p + w.cols, out);
      break;
    }
    case WeightFormat::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(w.data) + r * w.cols;
      for (int64_t c = 0; c < w.cols; ++c) out[c] = bf16_to_f32(p[c]);
      break;
    }
    case WeightFormat::kFP8: {
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + r * w.cols;
      const int64_t scale_cols = (w.cols + 127) / 128;
      const uint8_t* s = w.scales + (r / 128) * scale_cols;
      for (int64_t c = 0; c < w.cols; ++c) out[c] = fp8_e4m3_to_f32(p[c]) * e8m0_to_f32(s[c / 128]);
      break;
    }
    case WeightFormat::kFP4: {
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + r * (w.cols / 2);
      const uint8_t* s = w.scales + r * ((w.cols + 31) / 32);
      for (int64_t c = 0; c < w.cols; ++c) {
        uint8_t byte = p[c / 2];
        uint8_t code = (c & 1) ? (byte >> 4) : (byte & 15);
        out[c] = fp4_e2m1_to_f32(code) * e8m0_to_f32(s[c / 32]);
      }
      break;
    }
  }
}

void matmul(const Matrix& w, const float* x, int64_t n, float* y, Numerics, ThreadPool* pool,
            int64_t y_stride) {
  if (y_stride == 0) y_stride = w.rows;
  auto rows = [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(w.cols));
    for (int64_t r = r0; r < r1; ++r) {
      decode_row(w, r, row.data());
      for (int64_t i = 0; i < n; ++i) y[i * y_stride + r] = dot(row.data(), x + i * w.cols, w.cols);
    }
  };
  if (pool) {
    pool->parallel_for(w.rows, 16, rows);
  } else {
    rows(0, w.rows);
  }
}

float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

std::string active_path() { return "scalar"; }

}  // namespace dsv4::kernels
