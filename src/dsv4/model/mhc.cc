#include "dsv4/model/mhc.h"

#include <algorithm>
#include <cmath>

#include "dsv4/model/ops.h"

namespace dsv4 {
namespace {

// m[T, rows] = fn · rmsnorm(flatten(X_t)) for every token (unweighted RMS norm over hc·D).
std::vector<float> stream_mixes(const ModelConfig& c, const Matrix& fn, const float* X, int64_t T, ThreadPool* pool) {
  const int64_t width = int64_t(c.hc_mult) * c.hidden_size;
  std::vector<float> normed(static_cast<size_t>(T * width));
  for (int64_t t = 0; t < T; ++t)
    ops::rms_norm(X + t * width, nullptr, width, static_cast<float>(c.rms_norm_eps), normed.data() + t * width);
  std::vector<float> m(static_cast<size_t>(T * fn.rows));
  kernels::matmul(fn, normed.data(), T, m.data(), kernels::Numerics::kReference, pool);
  return m;
}

// Softmax over each row, +eps, then alternate column / row normalization so C becomes
// (nearly) doubly stochastic. The first and the last normalization are over columns.
void sinkhorn(float* C, int n, int iters, float eps) {
  for (int j = 0; j < n; ++j) {
    float* row = C + j * n;
    float mx = row[0];
    for (int k = 1; k < n; ++k) mx = std::max(mx, row[k]);
    float sum = 0.0f;
    for (int k = 0; k < n; ++k) sum += (row[k] = std::exp(row[k] - mx));
    for (int k = 0; k < n; ++k) row[k] = row[k] / sum + eps;
  }
  auto normalize_columns = [&] {
    for (int k = 0; k < n; ++k) {
      float sum = 0.0f;
      for (int j = 0; j < n; ++j) sum += C[j * n + k];
      for (int j = 0; j < n; ++j) C[j * n + k] /= sum + eps;
    }
  };
  auto normalize_rows = [&] {
    for (int j = 0; j < n; ++j) {
      float sum = 0.0f;
      for (int k = 0; k < n; ++k) sum += C[j * n + k];
      for (int k = 0; k < n; ++k) C[j * n + k] /= sum + eps;
    }
  };
  normalize_columns();
  for (int it = 1; it < iters; ++it) {
    normalize_rows();
    normalize_columns();
  }
}

void collapse(const float* X, const float* pre, int hc, int64_t D, float* out) {
  for (int64_t d = 0; d < D; ++d) {
    float acc = 0.0f;
    for (int j = 0; j < hc; ++j) acc += pre[j] * X[j * D + d];
    out[d] = acc;
  }
}

}  // namespace

void hc_pre(const ModelConfig& c, const HyperConnectionWeights& w, const float* X, int64_t T, ThreadPool* pool,
            HcMix* mix, float* x_out) {
  const int hc = c.hc_mult;
  const int64_t D = c.hidden_size;
  const float eps = static_cast<float>(c.hc_eps);
  std::vector<float> m = stream_mixes(c, w.fn, X, T, pool);
  const int64_t n_mix = w.fn.rows;  // (2 + hc) * hc
  mix->pre.resize(static_cast<size_t>(T * hc));
  mix->post.resize(static_cast<size_t>(T * hc));
  mix->comb.resize(static_cast<size_t>(T * hc * hc));
  for (int64_t t = 0; t < T; ++t) {
    const float* mt = m.data() + t * n_mix;
    float* pre = mix->pre.data() + t * hc;
    float* post = mix->post.data() + t * hc;
    float* C = mix->comb.data() + t * hc * hc;
    for (int j = 0; j < hc; ++j) {
      pre[j] = ops::sigmoid(mt[j] * w.scale[0] + w.base[j]) + eps;
      post[j] = 2.0f * ops::sigmoid(mt[hc + j] * w.scale[1] + w.base[hc + j]);
    }
    for (int i = 0; i < hc * hc; ++i) C[i] = mt[2 * hc + i] * w.scale[2] + w.base[2 * hc + i];
    sinkhorn(C, hc, c.hc_sinkhorn_iters, eps);
    collapse(X + t * hc * D, pre, hc, D, x_out + t * D);
  }
}

void hc_post(const ModelConfig& c, const HcMix& mix, const float* y, int64_t T, float* X) {
  const int hc = c.hc_mult;
  const int64_t D = c.hidden_size;
  std::vector<float> out(static_cast<size_t>(hc * D));
  for (int64_t t = 0; t < T; ++t) {
    float* Xt = X + t * hc * D;
    const float* post = mix.post.data() + t * hc;
    const float* C = mix.comb.data() + t * hc * hc;
    const float* yt = y + t * D;
    for (int k = 0; k < hc; ++k) {
      for (int64_t d = 0; d < D; ++d) {
        float acc = 0.0f;
        for (int j = 0; j < hc; ++j) acc += C[j * hc + k] * Xt[j * D + d];
        out[k * D + d] = post[k] * yt[d] + acc;
      }
    }
    std::copy(out.begin(), out.end(), Xt);
  }
}

void hc_head(const ModelConfig& c, const Matrix& fn, const std::vector<float>& base, const std::vector<float>& scale,
             const float* X, int64_t T, ThreadPool* pool, float* x_out) {
  const int hc = c.hc_mult;
  const int64_t D = c.hidden_size;
  std::vector<float> m = stream_mixes(c, fn, X, T, pool);
  std::vector<float> pre(static_cast<size_t>(hc));
  for (int64_t t = 0; t < T; ++t) {
    for (int j = 0; j < hc; ++j)
      pre[j] = ops::sigmoid(m[t * hc + j] * scale[0] + base[j]) + static_cast<float>(c.hc_eps);
    collapse(X + t * hc * D, pre.data(), hc, D, x_out + t * D);
  }
}

}  // namespace dsv4
