#include "dsv4/model/mhc.h"

#include <algorithm>
#include <cmath>

#include "dsv4/model/ops.h"
#include "dsv4/util/thread_pool.h"
#include "dsv4/util/portable_math.h"

namespace dsv4 {
namespace {

// ws.mix_m [T, fn.rows] = fn · rmsnorm(flatten(X_t)) for every token (unweighted RMS norm
// over hc·D).
const float* stream_mixes(const Pass& p, const Matrix& fn, const float* X, int64_t T) {
  const int64_t width = int64_t(p.c.hc_mult) * p.c.hidden_size;
  float* normed = p.ws.mix_normed.data();
  ops::rms_norm_rows(X, nullptr, T, width, static_cast<float>(p.c.rms_norm_eps), normed);
  float* m = p.ws.mix_m.data();
  kernels::matmul(fn, normed, T, m, kernels::Numerics::kReference, &p.pool);
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
    for (int k = 0; k < n; ++k) sum += (row[k] = portable::exp(row[k] - mx));
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

HcMix workspace_mix(ForwardWorkspace& ws) { return {ws.mix_pre.data(), ws.mix_post.data(), ws.mix_comb.data()}; }

void hc_pre(const Pass& p, const HyperConnectionWeights& w, const float* X, HcMix mix, float* x_out) {
  const int hc = p.c.hc_mult;
  const int64_t D = p.c.hidden_size, T = p.T;
  const float eps = static_cast<float>(p.c.hc_eps);
  const float* m = stream_mixes(p, w.fn, X, T);
  const int64_t n_mix = w.fn.rows;  // (2 + hc) * hc
  for (int64_t t = 0; t < T; ++t) {
    const float* mt = m + t * n_mix;
    float* pre = mix.pre + t * hc;
    float* post = mix.post + t * hc;
    float* C = mix.comb + t * hc * hc;
    for (int j = 0; j < hc; ++j) {
      pre[j] = ops::sigmoid(mt[j] * w.scale[0] + w.base[j]) + eps;
      post[j] = 2.0f * ops::sigmoid(mt[hc + j] * w.scale[1] + w.base[hc + j]);
    }
    for (int i = 0; i < hc * hc; ++i) C[i] = mt[2 * hc + i] * w.scale[2] + w.base[2 * hc + i];
    sinkhorn(C, hc, p.c.hc_sinkhorn_iters, eps);
    collapse(X + t * hc * D, pre, hc, D, x_out + t * D);
  }
}

void hc_post(const Pass& p, HcMix mix, const float* y, float* X) {
  const int hc = p.c.hc_mult;
  const int64_t D = p.c.hidden_size;
  float* out = p.ws.mix_out.data();  // [hc, D]
  for (int64_t t = 0; t < p.T; ++t) {
    float* Xt = X + t * hc * D;
    const float* post = mix.post + t * hc;
    const float* C = mix.comb + t * hc * hc;
    const float* yt = y + t * D;
    for (int k = 0; k < hc; ++k) {
      for (int64_t d = 0; d < D; ++d) {
        float acc = 0.0f;
        for (int j = 0; j < hc; ++j) acc += C[j * hc + k] * Xt[j * D + d];
        out[k * D + d] = post[k] * yt[d] + acc;
      }
    }
    std::copy_n(out, hc * D, Xt);
  }
}

void hc_head(const Pass& p, const Matrix& fn, const std::vector<float>& base, const std::vector<float>& scale,
             const float* X, int64_t rows, float* x_out) {
  const int hc = p.c.hc_mult;
  const int64_t D = p.c.hidden_size;
  const float* m = stream_mixes(p, fn, X, rows);
  float* pre = p.ws.mix_pre.data();  // [hc] per token
  for (int64_t t = 0; t < rows; ++t) {
    for (int j = 0; j < hc; ++j)
      pre[j] = ops::sigmoid(m[t * hc + j] * scale[0] + base[j]) + static_cast<float>(p.c.hc_eps);
    collapse(X + t * hc * D, pre, hc, D, x_out + t * D);
  }
}

}  // namespace dsv4
