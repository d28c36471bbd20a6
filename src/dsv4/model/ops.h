// Small element-wise operations of the forward pass, in float32. They are compiled once
// (no per-ISA variants), so they give the same bits whatever kernel path is active.
#pragma once

#include <cmath>
#include <cstdint>

#include "dsv4/util/portable_math.h"

namespace dsv4::ops {

// out = x * rsqrt(mean(x^2) + eps) * weight   (weight may be null: unweighted)
inline void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
  if (weight) {
    for (int64_t i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * scale);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale;
  }
}

// rms_norm of each of `rows` rows of n values (in place when out == x).
inline void rms_norm_rows(const float* x, const float* weight, int64_t rows, int64_t n, float eps, float* out) {
  for (int64_t r = 0; r < rows; ++r) rms_norm(x + r * n, weight, n, eps, out + r * n);
}

// exp and log1p from portable_math.h: the same bits on every OS.
inline float sigmoid(float x) { return 1.0f / (1.0f + portable::exp(-x)); }
inline float silu(float x) { return x / (1.0f + portable::exp(-x)); }
// torch.nn.functional.softplus with beta 1 and threshold 20.
inline float softplus(float x) { return x > 20.0f ? x : static_cast<float>(portable::log1p(portable::exp(static_cast<double>(x)))); }

}  // namespace dsv4::ops
